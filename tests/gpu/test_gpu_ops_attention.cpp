// The attention ops on the device against the host (src/ops/ops_attention.cpp):
// the causal and the masked softmax, and the head layout of the token-major attention.
// The fused attention kernels: test_gpu_flash_attention.cpp and
// test_gpu_cudnn_attention.cpp.
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include "gpu_ops_test_util.hpp"
#include "ops/head_layout.hpp"

namespace meshtron::ops {
namespace {

using namespace gpu_ops_test;

// ============================================================== Softmax ==

TEST_F(GpuOps, ScaledCausalSoftmaxForwardAndBackwardMatchHost) {
  // kRows' odd lengths take the column-by-column forward, 64 and 136 (whole
  // 16-byte packs) the packed one in bf16 and fp16.
  std::vector<index_t> lengths = kRows;
  lengths.insert(lengths.end(), {64, 136});
  for (DType dt : kDtypes)
    for (index_t S : lengths) {
      const std::string what = "softmax " + name(dt) + " S=" + std::to_string(S);
      const index_t B = 5;
      const double scale = 0.125;
      const Pair scores = input({B, S, S}, dt, -8.0, 8.0);
      Pair probs = output({B, S, S}, dt);
      scaled_causal_softmax_forward(scores.host, scale, probs.host);
      scaled_causal_softmax_forward(scores.dev, scale, probs.dev);
      expect_close(probs, dt, what + " probs");
      const Pair dprobs = input({B, S, S}, dt);
      const Pair p_in{probs.host, probs.host.to(dt).to_device()};
      Pair dscores = output({B, S, S}, dt);
      scaled_causal_softmax_backward(dprobs.host, probs.host.to(dt).to(DType::F32), scale,
                                     dscores.host);
      scaled_causal_softmax_backward(dprobs.dev, p_in.dev, scale, dscores.dev);
      expect_close(dscores, dt, what + " dscores");
    }
}

TEST_F(GpuOps, AlibiSoftmaxMatchesHost) {
  // 6 heads (interpolated slopes) over B = 2 x 6; S = 64 would take the
  // packed kernel without ALiBi.
  for (DType dt : kDtypes)
    for (index_t S : {index_t(17), index_t(64)}) {
      const std::string what = "alibi softmax " + name(dt) + " S=" + std::to_string(S);
      const index_t heads = 6, B = 2 * heads;
      Tensor slopes = Tensor::empty({heads}, DType::F32);
      const std::vector<double> all = alibi_slopes(heads);
      for (index_t h = 0; h < heads; ++h) slopes.data<float>()[h] = float(all[std::size_t(h)]);
      const Pair scores = input({B, S, S}, dt, -8.0, 8.0);
      Pair probs = output({B, S, S}, dt);
      scaled_causal_softmax_forward(scores.host, 0.25, probs.host, slopes);
      scaled_causal_softmax_forward(scores.dev, 0.25, probs.dev, slopes.to_device());
      expect_close(probs, dt, what);
    }
}

TEST_F(GpuOps, MaskedSoftmaxForwardAndBackwardMatchHost) {
  // Bidirectional with a key-padding mask: B = 3 samples x 2 heads, sample
  // k's last k keys padding; exact zeros there on the device too.
  for (DType dt : kDtypes)
    for (index_t S : {index_t(17), index_t(64)}) {
      const std::string what = "masked softmax " + name(dt) + " S=" + std::to_string(S);
      const index_t batch = 3, B = 2 * batch;
      Tensor mask = Tensor::empty({batch, S}, DType::I32);
      for (index_t k = 0; k < batch; ++k)
        for (index_t j = 0; j < S; ++j) mask.data<std::int32_t>()[k * S + j] = j < S - k;
      const Pair scores = input({B, S, S}, dt, -8.0, 8.0);
      Pair probs = output({B, S, S}, dt);
      scaled_masked_softmax_forward(scores.host, mask, 0.125, probs.host);
      scaled_masked_softmax_forward(scores.dev, mask.to_device(), 0.125, probs.dev);
      expect_close(probs, dt, what + " probs");
      const std::vector<double> dev = probs.dev.to_doubles();
      for (index_t r = 0; r < B * S; ++r)
        if (r / S / 2 == 2) EXPECT_EQ(dev[std::size_t(r * S + S - 1)], 0.0) << what;
      const Pair dprobs = input({B, S, S}, dt);
      const Pair p_in{probs.host, probs.host.to(dt).to_device()};
      Pair dscores = output({B, S, S}, dt);
      scaled_masked_softmax_backward(dprobs.host, probs.host.to(dt).to(DType::F32), 0.125,
                                     dscores.host);
      scaled_masked_softmax_backward(dprobs.dev, p_in.dev, 0.125, dscores.dev);
      expect_close(dscores, dt, what + " dscores");
    }
}

// ========================================================== Head layout ==

TEST_F(GpuOps, SplitAndMergeHeadsMatchHostExactly) {
  for (DType dt : kDtypes)
    for (int parts : {1, 3}) {
      const index_t s = 17, b = 3, heads = 5, d = 7;
      const Pair x = input({s * b, parts * heads * d}, dt);
      const Tensor x_host = x.host.to(dt);
      Tensor host_parts[3], dev_parts[3];
      split_heads(x_host, s, b, heads, parts, host_parts);
      split_heads(x.dev, s, b, heads, parts, dev_parts);
      for (int p = 0; p < parts; ++p) {
        EXPECT_EQ(dev_parts[p].space(), MemorySpace::Cuda);
        expect_close(dev_parts[p], host_parts[p], 0.0, "split_heads part " + std::to_string(p));
      }
      Tensor merged;
      merge_heads(dev_parts, parts, s, b, heads, merged);
      EXPECT_EQ(merged.space(), MemorySpace::Cuda);
      expect_close(merged, x_host, 0.0, "merge_heads(split_heads(x)) " + name(dt));
    }
}

}  // namespace
}  // namespace meshtron::ops
