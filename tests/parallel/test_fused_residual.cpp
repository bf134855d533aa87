// Without hidden dropout the transformer layer's residual adds ride in the
// projections' GEMM epilogues (gemm_bias_residual: on one tp rank, and on tp
// rank 0 before the all-reduce without SP; under SP the reduce-scatter, then
// the add) and in the layernorm backwards. The other decomposition tests
// train with dropout on, which keeps the unfused adds, so this one turns
// dropout off: tp2 + SP x dp2, tp2 x dp2 without SP, pp2 x dp2 (1f1b) and
// tp2 x pp2 must still equal the 1-rank run with the same deck, and a
// 1-rank run with dropout off must differ from the run with dropout on
// (the overrides really took effect).
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include "decomposition_expect.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;

const std::vector<std::string> kNoDropout = {"model.hidden_dropout=0",
                                             "model.attention_dropout=0"};

Layout without_dropout(Layout l) {
  l.overrides.insert(l.overrides.end(), kNoDropout.begin(), kNoDropout.end());
  return l;
}

const RunResult& no_dropout_reference() {
  static const RunResult ref = train_layout(MPI_COMM_SELF, without_dropout(Layout{}), DType::F32);
  return ref;
}

TEST(FusedResidual, OneRankRunWithoutDropoutDiffersFromTheDropoutRun) {
  EXPECT_NE(no_dropout_reference().losses, single_rank_reference(DType::F32).losses);
}

class FusedResidual : public ::testing::TestWithParam<Layout> {};

TEST_P(FusedResidual, MatchesOneRankRunWithoutDropout) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const RunResult got = train_layout(MPI_COMM_WORLD, GetParam(), DType::F32);
  expect_same_run(got, no_dropout_reference(), 1e-5, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Layouts, FusedResidual,
                         ::testing::Values(without_dropout({2, 1, 2, "1f1b", false, true}),
                                           without_dropout({2, 1, 2, "1f1b", false, false}),
                                           without_dropout({1, 2, 2, "1f1b", false, false}),
                                           without_dropout({2, 2, 1, "1f1b", false, true})),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace meshtron::testing
