// Google BERT's layout (model.norm_placement = post, model.embedding_norm =
// true: transformers' BertForPreTraining) in the decomposition suite on 2
// ranks: tp 2 with sequence parallelism and selective recompute, and pp 2
// with full recompute (the embedding norm on the first stage, the last
// block's norm feeding the heads directly), dropout on, 3 steps of synthetic
// BERT batches against the single-rank run: fp32 1e-5 per step and 1e-4 for
// the weights, fp64 1e-10 (the tolerances of test_bert_decomposition.cpp).
//
// Run: ctest -R parallel_bert_postnorm --output-on-failure   (from the build folder)
#include <gtest/gtest.h>
#include <mpi.h>

#include "common/mpi_test_util.hpp"
#include "decomposition_expect.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;

const std::vector<std::string> kGoogleBert{"model.arch=bert", "model.norm_placement=post",
                                           "model.embedding_norm=true"};

const RunResult& reference(DType dtype) {
  static const RunResult fp32 =
      train_layout(MPI_COMM_SELF, Layout{.overrides = kGoogleBert}, DType::F32);
  static const RunResult fp64 =
      train_layout(MPI_COMM_SELF, Layout{.overrides = kGoogleBert}, DType::F64);
  return dtype == DType::F64 ? fp64 : fp32;
}

std::vector<Layout> layouts() {
  std::vector<Layout> out = {
      {2, 1, 1, "1f1b", false, true, {"training.recompute=selective"}},
      {1, 2, 1, "1f1b", false, false, {"training.recompute=full"}},
  };
  for (Layout& l : out) l.overrides.insert(l.overrides.begin(), kGoogleBert.begin(), kGoogleBert.end());
  return out;
}

class BertPostNormDecomposition : public ::testing::TestWithParam<Layout> {};

TEST_P(BertPostNormDecomposition, MatchesSingleRankRun) {
  const Layout& layout = GetParam();
  {
    SCOPED_TRACE("fp32");
    expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F32), reference(DType::F32),
                    1e-5, 1e-4);
  }
  {
    SCOPED_TRACE("fp64");
    expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F64), reference(DType::F64),
                    1e-10, 1e-10);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, BertPostNormDecomposition,
                         ::testing::ValuesIn(world_size() == 2 ? layouts() : std::vector<Layout>{}),
                         [](const auto& info) { return info.param.name(); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BertPostNormDecomposition);

// The reference is Google BERT's layout: the embedding norm, no final norm.
TEST(BertPostNormDecomposition, ReferenceHasGoogleBertNorms) {
  const RunResult& bert = reference(DType::F64);
  EXPECT_EQ(bert.params.count("embedding.norm.weight"), 1u);
  EXPECT_EQ(bert.params.count("layers.0.ln_1.weight"), 1u);
  EXPECT_EQ(bert.params.count("final_norm.weight"), 0u);
}

}  // namespace
}  // namespace meshtron::testing
