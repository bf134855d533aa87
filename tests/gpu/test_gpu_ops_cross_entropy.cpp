// The vocab-parallel cross-entropy ops on the device against the host
// (src/ops/ops_cross_entropy.cpp).
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include "gpu_ops_test_util.hpp"

namespace meshtron::ops {
namespace {

using namespace gpu_ops_test;

// ======================================================== Cross-entropy ==

TEST_F(GpuOps, VocabParallelCrossEntropyMatchesHost) {
  struct Shard {
    index_t V_local, vocab_begin, vocab_valid;
  };
  // Whole vocabulary; a middle shard; a last shard with padded columns.
  const std::vector<Shard> shards = {{130, 0, 130}, {768, 768, 50257}, {3000, 1000, 3900}};
  for (DType dt : kDtypes)
    for (index_t N : kRows)
      for (const Shard& s : shards) {
        const std::string what = "cross_entropy " + name(dt) + " N=" + std::to_string(N) +
                                 " V_local=" + std::to_string(s.V_local);
        const Pair logits = input({N, s.V_local}, dt, -6.0, 6.0);
        const Tensor targets = random_ids(N, int(s.vocab_begin), int(std::min(s.vocab_valid, s.vocab_begin + s.V_local)));
        const Tensor targets_dev = targets.to_device();
        Pair row_max = output({N}, DType::F32);
        cross_entropy_row_max(logits.host, s.vocab_begin, s.vocab_valid, row_max.host);
        cross_entropy_row_max(logits.dev, s.vocab_begin, s.vocab_valid, row_max.dev);
        expect_close(row_max, DType::F32, what + " row_max");

        Pair sum_exp = output({N}, DType::F32), target_logit = output({N}, DType::F32);
        cross_entropy_partials(logits.host, targets, row_max.host, s.vocab_begin, s.vocab_valid,
                               sum_exp.host, target_logit.host);
        cross_entropy_partials(logits.dev, targets_dev, row_max.dev, s.vocab_begin,
                               s.vocab_valid, sum_exp.dev, target_logit.dev);
        expect_close(sum_exp, DType::F32, what + " sum_exp");
        expect_close(target_logit, dt, what + " target_logit");

        Pair loss = output({N}, DType::F32);
        cross_entropy_loss(sum_exp.host, target_logit.host, loss.host);
        cross_entropy_loss(sum_exp.dev, target_logit.dev, loss.dev);
        expect_close(loss, DType::F32, what + " loss");

        const Pair dloss = input({N}, DType::F32, 0.1, 1.0);
        Pair dlogits = output({N, s.V_local}, dt);
        cross_entropy_backward(logits.host, targets, row_max.host, sum_exp.host, dloss.host,
                               s.vocab_begin, s.vocab_valid, dlogits.host);
        cross_entropy_backward(logits.dev, targets_dev, row_max.dev, sum_exp.dev, dloss.dev,
                               s.vocab_begin, s.vocab_valid, dlogits.dev);
        expect_close(dlogits, dt, what + " dlogits");
        if (dt == DType::F32) {  // fp32 logits -> bf16 dlogits (the LM head under bf16)
          Pair narrow = output({N, s.V_local}, DType::BF16);
          cross_entropy_backward(logits.dev, targets_dev, row_max.dev, sum_exp.dev, dloss.dev,
                                 s.vocab_begin, s.vocab_valid, narrow.dev);
          expect_close(narrow.dev, dlogits.host, tolerance(DType::BF16), what + " bf16 dlogits");
        }
      }
}

// cross_entropy_row_stats (the LM head's statistics in one pass on one tp
// rank: an online softmax on the device) against the two passes it stands
// for: on the host (the same kernels, so the same bits) and on the device
// (the max and the target logit exactly, the rescaled sum to fp32
// tolerance), deterministic; the shards above, GPT-2's padded vocabulary
// (the packed path) and 50257 columns (V % 8 != 0: column by column), a row
// whose logits rise along the columns (the running max grows at every
// column, so every step rescales), a shard of padding only (no valid
// column: max -inf, sum 0, target 0).
TEST_F(GpuOps, CrossEntropyRowStatsMatchTheTwoPasses) {
  struct Shard {
    index_t V_local, vocab_begin, vocab_valid;
  };
  const std::vector<Shard> shards = {{130, 0, 130},     {768, 768, 50257}, {3000, 1000, 3900},
                                     {50304, 0, 50257}, {50257, 0, 50257}, {64, 4000, 3900}};
  for (DType dt : kDtypes)
    for (index_t N : {index_t(1), index_t(33)})
      for (const Shard& s : shards) {
        const std::string what = "cross_entropy_row_stats " + name(dt) + " N=" +
                                 std::to_string(N) + " V_local=" + std::to_string(s.V_local) +
                                 " begin=" + std::to_string(s.vocab_begin);
        Tensor values = random_host({N, s.V_local}, -6.0, 6.0);
        for (index_t v = 0; v < s.V_local; ++v)  // row 0 rises
          values.data<float>()[v] = float(-6.0 + 12.0 * double(v) / double(s.V_local));
        const Tensor rounded = values.to(dt);
        const Pair logits{rounded.to(DType::F32), rounded.to_device()};
        const index_t local_end = std::min(s.vocab_valid, s.vocab_begin + s.V_local);
        const bool no_valid_column = local_end <= s.vocab_begin;
        const Tensor targets = no_valid_column
                                   ? random_ids(N, 0, int(s.vocab_valid))
                                   : random_ids(N, int(s.vocab_begin), int(local_end));
        const Tensor targets_dev = targets.to_device();
        struct Stats {
          Tensor row_max, sum_exp, target_logit;
        };
        const auto stats = [&](const Tensor& l, const Tensor& t, bool one_pass) {
          const MemorySpace space = l.space();
          Stats r{Tensor::empty({N}, DType::F32, space), Tensor::empty({N}, DType::F32, space),
                  Tensor::empty({N}, DType::F32, space)};
          if (one_pass) {
            cross_entropy_row_stats(l, t, s.vocab_begin, s.vocab_valid, r.row_max, r.sum_exp,
                                    r.target_logit);
          } else {
            cross_entropy_row_max(l, s.vocab_begin, s.vocab_valid, r.row_max);
            cross_entropy_partials(l, t, r.row_max, s.vocab_begin, s.vocab_valid, r.sum_exp,
                                   r.target_logit);
          }
          return r;
        };
        const auto same = [](const Tensor& a, const Tensor& b) {
          return a.to_doubles() == b.to_doubles();
        };
        const Stats host_two = stats(logits.host, targets, false);
        const Stats host_one = stats(logits.host, targets, true);
        EXPECT_TRUE(same(host_one.row_max, host_two.row_max) &&
                    same(host_one.sum_exp, host_two.sum_exp) &&
                    same(host_one.target_logit, host_two.target_logit))
            << what << ": the host's one pass is not its two";
        const Stats dev_two = stats(logits.dev, targets_dev, false);
        const Stats dev_one = stats(logits.dev, targets_dev, true);
        const Stats again = stats(logits.dev, targets_dev, true);
        EXPECT_TRUE(same(dev_one.row_max, again.row_max) && same(dev_one.sum_exp, again.sum_exp) &&
                    same(dev_one.target_logit, again.target_logit))
            << what << ": not deterministic";
        EXPECT_TRUE(same(dev_one.row_max, dev_two.row_max)) << what << ": row_max";
        EXPECT_TRUE(same(dev_one.target_logit, dev_two.target_logit)) << what << ": target_logit";
        if (no_valid_column) {
          for (double m : dev_one.row_max.to_doubles()) EXPECT_EQ(m, -INFINITY) << what;
          for (double z : dev_one.sum_exp.to_doubles()) EXPECT_EQ(z, 0.0) << what;
          for (double t : dev_one.target_logit.to_doubles()) EXPECT_EQ(t, 0.0) << what;
          continue;
        }
        expect_close(dev_one.sum_exp, host_two.sum_exp, tolerance(DType::F32), what + " sum_exp");
        expect_close(dev_one.sum_exp, dev_two.sum_exp.to_host(), tolerance(DType::F32),
                     what + " sum_exp against the device's two passes");
        expect_close(dev_one.target_logit, host_two.target_logit, tolerance(dt),
                     what + " target_logit");
      }
}

}  // namespace
}  // namespace meshtron::ops
