// parallel.tp_interleave (Domino-style tp overlap): a step's micro-batches
// run in pairs on two fibers that switch at every tp collective
// (parallel/fiber_pair.hpp, Communicator::set_interleave).
//
//  * Job a's k-th segment always runs before job b's, so every gradient adds
//    its micro-batches in the same order as without interleaving, except the
//    tied word table, which adds a micro-batch's head and embedding
//    contributions at the two ends of its backward: h0 e0 h1 e1 becomes
//    h0 h1 e0 e1. So one step (without clipping, which the table's norm
//    would carry to every parameter) leaves every other parameter bit for
//    bit as without interleaving, and the table within rounding. Checked on
//    tp layouts with and without sequence parallelism, with the SP variants
//    that use the non-blocking gathers (keep_gathered, the split
//    column-parallel forward), with recomputation, and with dp and the
//    distributed optimizer's overlapped reductions.
//  * Interleaved runs repeat bit for bit (the switching is deterministic).
//  * The switching really happens: the trainer reports each step's switches.
//  * Three steps match the 1-rank run at the decomposition tolerances.
#include <gtest/gtest.h>
#include <mpi.h>

#include "common/mpi_test_util.hpp"
#include "decomposition_expect.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;

Layout interleaved(Layout l) {
  l.overrides.push_back("parallel.tp_interleave=true");
  return l;
}

std::vector<Layout> layouts(int world) {
  if (world != 4) return {};
  const std::vector<std::string> keep = {"parallel.sequence_parallel_keep_gathered=true"};
  const std::vector<std::string> split = {"parallel.split_column_parallel_forward=true"};
  const std::vector<std::string> overlap = {"parallel.overlap_grad_reduce=true",
                                            "parallel.overlap_param_gather=true",
                                            "parallel.grad_bucket_size=20000"};
  return {
      {2, 1, 2, "1f1b", false, true},
      {2, 1, 2, "1f1b", false, false},
      {4, 1, 1, "1f1b", false, true, keep},
      {2, 1, 2, "1f1b", false, true, split},
      {2, 1, 2, "gpipe", false, true, {"training.recompute=full"}},
      {2, 1, 2, "1f1b", true, true, overlap},
      {1, 1, 4, "1f1b", true, false},
  };
}

class TpInterleave : public ::testing::TestWithParam<Layout> {};

TEST_P(TpInterleave, OneStepEqualsThePlainOneExceptTheTiedWordTable) {
  Layout layout = GetParam();
  layout.overrides.push_back("training.clip_grad=0");
  const RunResult plain = train_layout(MPI_COMM_WORLD, layout, DType::F32, 1);
  const RunResult paired = train_layout(MPI_COMM_WORLD, interleaved(layout), DType::F32, 1);
  EXPECT_EQ(paired.losses, plain.losses);
  for (const auto& [name, values] : plain.params) {
    if (name == "embedding.word.weight")
      EXPECT_LE(norm_rel_error(paired.params.at(name), values), 1e-7);
    else
      EXPECT_EQ(paired.params.at(name), values) << name;
  }
  // Each pair switches at least twice per layer in the forward and in the
  // backward (tp 1: the layers call no tp collective).
  const long pairs = 16 / GetParam().dp / 2, layers = 8;
  EXPECT_GE(paired.interleave_switches.at(0), GetParam().tp > 1 ? pairs * layers * 4 : 0);
  EXPECT_EQ(plain.interleave_switches.at(0), 0);
}

TEST_P(TpInterleave, RepeatsBitForBit) {
  const Layout layout = interleaved(GetParam());
  expect_bitwise_equal(train_layout(MPI_COMM_WORLD, layout, DType::F32),
                       train_layout(MPI_COMM_WORLD, layout, DType::F32));
}

TEST_P(TpInterleave, MatchesSingleRankRun) {
  expect_matches_single_rank(interleaved(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Layouts, TpInterleave, ::testing::ValuesIn(layouts(world_size())),
                         [](const auto& info) {
                           std::string n = info.param.name();
                           for (const std::string& o : info.param.overrides)
                             n += "_" + o.substr(o.find('.') + 1, o.find('=') - o.find('.') - 1);
                           return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TpInterleave);

}  // namespace
}  // namespace meshtron::testing
