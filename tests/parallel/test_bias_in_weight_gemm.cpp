// training.bias_in_weight_gemm = true on the host (auto turns it on only on
// the device): qkv's and fc's biases ride in their GEMMs through the ones
// column (ColumnParallelLinear). Decomposed runs with it match the
// single-rank run without it (fp32 and fp64 tolerances of the decomposition
// test): tp 2 and 4 with SP (the gathered X', split forward, kept gathered
// input), tp 2 without SP, pp 2, and dp with the distributed optimizer,
// whose flat buffers and buckets keep each bias's padding rows.
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include "decomposition_expect.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;

const std::string kOnes = "training.bias_in_weight_gemm=true";

Layout with_ones_column(Layout layout, std::vector<std::string> more = {}) {
  layout.overrides = {kOnes};
  layout.overrides.insert(layout.overrides.end(), more.begin(), more.end());
  return layout;
}

TEST(BiasInWeightGemm, SequenceParallelLayoutsMatchSingleRankRun) {
  const int world = world_size();
  if (world % 4) GTEST_SKIP() << "needs a world of 4 or 8";
  expect_matches_single_rank(with_ones_column({2, 1, world / 2, "1f1b", false, true}));
  expect_matches_single_rank(
      with_ones_column({4, 1, world / 4, "1f1b", false, true},
                       {"parallel.split_column_parallel_forward=true",
                        "parallel.sequence_parallel_keep_gathered=true"}));
}

TEST(BiasInWeightGemm, TensorAndPipelineLayoutsMatchSingleRankRun) {
  const int world = world_size();
  if (world % 4) GTEST_SKIP() << "needs a world of 4 or 8";
  expect_matches_single_rank(with_ones_column({2, 2, world / 4, "1f1b", false, false}));
}

TEST(BiasInWeightGemm, DistributedOptimizerWithOverlapMatchesSingleRankRun) {
  const int world = world_size();
  if (world % 4) GTEST_SKIP() << "needs a world of 4 or 8";
  expect_matches_single_rank(with_ones_column(
      {1, 1, world, "1f1b", true, false},
      {"parallel.overlap_grad_reduce=true", "parallel.overlap_param_gather=true",
       "parallel.grad_bucket_size=3000"}));
}

// The ones column needs a LayerNorm with a bias to write it and biases to
// carry: `true` with an RMSNorm is a user error (`auto` turns itself off).
TEST(BiasInWeightGemm, TrueNeedsALayerNormBeforeBiasedLinears) {
  Layout rmsnorm = with_ones_column({}, {"model.normalization=RMSNorm"});
  try {
    train_layout(MPI_COMM_SELF, rmsnorm, DType::F32, 1);
    ADD_FAILURE() << "training.bias_in_weight_gemm = true with an RMSNorm was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("training.bias_in_weight_gemm = true needs"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtron::testing
