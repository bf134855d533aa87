// BERT in the decomposition suite (DESIGN.md invariant 1): Megatron's
// BertModel split over the ranks (the embedding on the first stage, the
// final norm, MLM, pooler and binary heads on the last, the tied word table
// summed over the embedding group), with tp, sequence parallelism (the
// heads read the gathered final hidden states), the three schedules, the
// distributed optimizer with overlapped reduction and gathers and
// recompute, trains 3 steps of synthetic BERT batches (padding, token
// types, masked labels, next-sentence classes) with dropout on and matches
// the single-rank run: fp32 1e-5 per step and 1e-4 for the weights, fp64
// 1e-10 (the tolerances of test_decomposition.cpp).
//
// Run: ctest -R parallel_bert_decomposition --output-on-failure   (from the build folder)
#include <gtest/gtest.h>
#include <mpi.h>

#include "common/mpi_test_util.hpp"
#include "decomposition_expect.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;

const std::vector<std::string> kBert{"model.arch=bert"};

const RunResult& bert_reference(DType dtype) {
  static const RunResult fp32 = train_layout(MPI_COMM_SELF, Layout{.overrides = kBert}, DType::F32);
  static const RunResult fp64 = train_layout(MPI_COMM_SELF, Layout{.overrides = kBert}, DType::F64);
  return dtype == DType::F64 ? fp64 : fp32;
}

/// The layouts of 8 ranks (those of 4 when the world is 4) that take every
/// part of the split: tp x pp x dp, pp 4 with gpipe and interleaved, SP on
/// tp 2 and 4, the distributed optimizer with its overlaps and recompute.
std::vector<Layout> bert_layouts(int world) {
  const std::vector<std::string> overlaps{"parallel.overlap_grad_reduce=true",
                                          "parallel.overlap_param_gather=true"};
  std::vector<Layout> out = {
      {2, 2, world / 4, "1f1b"},
      {2, 2, world / 4, "interleaved", false, true},
      {2, 2, world / 4, "1f1b", true, true, overlaps},
      {1, 2, world / 2, "1f1b", false, false, {"training.recompute=full"}},
      {4, 1, world / 4, "1f1b", false, true, {"training.recompute=selective"}},
  };
  if (world % 8 == 0) {
    out.push_back({1, 4, world / 4, "gpipe"});
    out.push_back({1, 4, world / 4, "interleaved", true});
  }
  for (Layout& l : out) l.overrides.insert(l.overrides.begin(), kBert.begin(), kBert.end());
  return out;
}

class BertDecomposition : public ::testing::TestWithParam<Layout> {};

TEST_P(BertDecomposition, MatchesSingleRankRun) {
  const Layout& layout = GetParam();
  {
    SCOPED_TRACE("fp32");
    expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F32),
                    bert_reference(DType::F32), 1e-5, 1e-4);
  }
  {
    SCOPED_TRACE("fp64");
    expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F64),
                    bert_reference(DType::F64), 1e-10, 1e-10);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, BertDecomposition,
                         ::testing::ValuesIn(world_size() % 4 ? std::vector<Layout>{}
                                                              : bert_layouts(world_size())),
                         [](const auto& info) { return info.param.name(); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BertDecomposition);

// The reference is BERT's (its heads and token types among the weights) and
// it trains: every part moves in 3 steps.
TEST(BertDecomposition, ReferenceIsBertAndTrains) {
  const RunResult& bert = bert_reference(DType::F64);
  for (const char* head : {"pooler.weight", "binary_head.weight", "mlm_head.bias",
                           "embedding.token_type.weight"})
    EXPECT_EQ(bert.params.count(head), 1u) << head;
  const RunResult untrained = train_layout(MPI_COMM_SELF, Layout{.overrides = kBert}, DType::F64, 0);
  for (const auto& [name, values] : bert.params)
    EXPECT_GT(norm_rel_error(values, untrained.params.at(name)), 1e-6) << name << " never moved";
}

}  // namespace
}  // namespace meshtron::testing
