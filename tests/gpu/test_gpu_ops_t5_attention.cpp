// T5's attention ops on the device against the host (src/ops/
// ops_relative_bias.cpp, ops_attention.cpp's Attention softmax): the
// relative bias gather and its atomic scatter (shared-memory and global
// paths), the general attention softmax (bias, key mask, causal with
// Sq != Sk, rows with no key), its backward and the bias gradient.
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include "gpu_ops_test_util.hpp"
#include "tests/ops/attention_softmax_case.hpp"

namespace meshtron::ops {
namespace {

using namespace gpu_ops_test;

// ================================================ T5 relative position bias ==

TEST_F(GpuOps, RelativeBiasForwardMatchesHost) {
  for (DType dt : kDtypes)
    for (bool bidirectional : {true, false}) {
      const std::string what = "relative_bias_forward " + name(dt);
      const index_t sq = 17, sk = 33, H = 6, nb = 32;
      const Tensor buckets = relative_position_buckets(sq, sk, bidirectional, int(nb), 128, 3);
      const Pair table = input({nb, H}, dt);
      Pair bias = output({H, sq, sk}, DType::F32);
      relative_bias_forward(table.host, buckets, bias.host);
      relative_bias_forward(table.dev, buckets.to_device(), bias.dev);
      EXPECT_TRUE(same_bits(bias.dev, bias.host)) << what << ": a gather is exact";
      expect_close(bias, DType::F32, what);
    }
}

TEST_F(GpuOps, RelativeBiasBackwardMatchesHost) {
  // [257, 257] x 6 heads into 32 x 6 entries: the shared-memory partial
  // tables over several blocks; 32 x 512 entries (past the 48 KB of shared
  // memory): the global atomics.
  struct Case {
    index_t sq, sk, H;
  };
  for (const Case c : {Case{257, 257, 6}, Case{5, 9, 512}, Case{1, 3, 1}}) {
    const std::string what = "relative_bias_backward [" + std::to_string(c.sq) + ", " +
                             std::to_string(c.sk) + "] x " + std::to_string(c.H);
    const index_t nb = 32;
    const Tensor buckets = relative_position_buckets(c.sq, c.sk, true, int(nb), 128);
    const Pair dbias = input({c.H, c.sq, c.sk}, DType::F32);
    Pair dtable = input({nb, c.H}, DType::F32);  // accumulates onto these
    relative_bias_backward(dbias.host, buckets, dtable.host);
    relative_bias_backward(dbias.dev, buckets.to_device(), dtable.dev);
    expect_close(dtable, DType::F32, what);
  }
}

// ======================================================= Attention softmax ==

using test_support::key_mask_for;
using test_support::SoftmaxCase;

TEST_F(GpuOps, AttentionSoftmaxForwardBackwardAndBiasGradientMatchHost) {
  const std::vector<SoftmaxCase> cases = {
      {2, 3, 17, 33, false, false, false},  // Sq < Sk
      {2, 2, 33, 5, false, false, true},    // causal Sq > Sk: the first rows see no key
      {1, 4, 3, 64, false, false, true},    // decoding after a prefix: shift 61
      {3, 2, 17, 64, false, true, false},   // key mask, sample 1 masked whole
      {3, 2, 17, 130, true, true, true},    // bias + key mask + causal
      {2, 6, 64, 64, true, false, false},   // bias alone (T5's encoder without padding)
  };
  for (DType dt : kDtypes)
    for (const SoftmaxCase& c : cases) {
      const index_t B = c.batch * c.heads;
      const Shape shape{B, c.Sq, c.Sk};
      const std::string what = "attention softmax " + name(dt) + " " + shape_string(shape) +
                               (c.bias ? " bias" : "") + (c.key_mask ? " key_mask" : "") +
                               (c.causal ? " causal" : "");
      SoftmaxMasks host_masks, dev_masks;
      host_masks.heads = dev_masks.heads = c.heads;
      host_masks.causal = dev_masks.causal = c.causal;
      if (c.bias) {
        host_masks.bias = random_host({c.heads, c.Sq, c.Sk}, -4.0, 4.0);
        dev_masks.bias = host_masks.bias.to_device();
      }
      if (c.key_mask) {
        host_masks.key_mask = key_mask_for(c.batch, c.Sk);
        dev_masks.key_mask = host_masks.key_mask.to_device();
      }
      const Pair scores = input(shape, dt, -8.0, 8.0);
      Pair probs = output(shape, dt);
      attention_softmax_forward(scores.host, 0.5, host_masks, probs.host);
      attention_softmax_forward(scores.dev, 0.5, dev_masks, probs.dev);
      expect_close(probs, dt, what + " probs");
      const std::vector<double> host_p = probs.host.to_doubles(), dev_p = probs.dev.to_doubles();
      for (std::size_t e = 0; e < host_p.size(); ++e)
        if (host_p[e] == 0.0) ASSERT_EQ(dev_p[e], 0.0) << what << ": masked element " << e;

      const Pair dprobs = input(shape, dt);
      const Tensor p_rounded = probs.host.to(dt);
      Pair dlogits = output(shape, dt);
      attention_softmax_backward(dprobs.host, p_rounded.to(DType::F32), dlogits.host);
      attention_softmax_backward(dprobs.dev, p_rounded.to_device(), dlogits.dev);
      expect_close(dlogits, dt, what + " dlogits");

      const Tensor dl_rounded = dlogits.host.to(dt);
      Pair dbias = input({c.heads, c.Sq, c.Sk}, DType::F32);  // accumulates
      attention_bias_backward(dl_rounded.to(DType::F32), c.heads, dbias.host);
      attention_bias_backward(dl_rounded.to_device(), c.heads, dbias.dev);
      expect_close(dbias, DType::F32, what + " dbias");
    }
}

}  // namespace
}  // namespace meshtron::ops
