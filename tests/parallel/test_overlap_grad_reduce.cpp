// Overlapped gradient reduction (parallel.overlap_grad_reduce, Megatron's
// --overlap-grad-reduce): the dp reduce-scatter of each gradient bucket
// starts during the last backward instead of after it.
//
//  * Every layout with dp >= 2 and the distributed optimizer, with and
//    without pp (all schedules), matches the 1-rank run at the decomposition
//    tolerances (fp32 1e-5 / 1e-4, fp64 1e-10).
//  * With dp = 2 the overlapped run is bit-for-bit the non-overlapped one:
//    each bucket's reduce-scatter sums the same two values per element
//    (a + b is commutative), on the same shard layout.
//  * The buckets really start before step(): the optimizer counts the
//    buckets started from the backward hook, and the dp communicator counts
//    its non-blocking reduce-scatters (one per bucket), so a silent fall
//    back to the single reduce-scatter after the backward fails here.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "common/mpi_test_util.hpp"
#include "decomposition_expect.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;

// About two layers of the tiny model per bucket (a layer holds ~12.6 k).
const std::vector<std::string> kOverlap = {"parallel.overlap_grad_reduce=true",
                                           "parallel.grad_bucket_size=20000"};


Layout with_overlap(Layout l) {
  l.overrides.insert(l.overrides.end(), kOverlap.begin(), kOverlap.end());
  return l;
}

/// Layouts with dp >= 2 and the distributed optimizer (with overlap).
std::vector<Layout> overlap_layouts(int world) {
  std::vector<Layout> out;
  for (int tp = 1; tp <= world; tp *= 2)
    for (int pp = 1; tp * pp <= world; pp *= 2) {
      if (world % (tp * pp) || world / (tp * pp) < 2) continue;
      const int dp = world / (tp * pp);
      for (std::string schedule : {"gpipe", "1f1b", "interleaved"}) {
        if (schedule == "interleaved" && (pp == 1 || 8 % (2 * pp) || (16 / dp) % pp)) continue;
        if (pp == 1 && schedule != "1f1b") continue;  // one chunk: the schedules coincide
        out.push_back(with_overlap({tp, pp, dp, schedule, true, tp > 1}));
      }
    }
  return out;
}

class OverlapGradReduce : public ::testing::TestWithParam<Layout> {};

TEST_P(OverlapGradReduce, MatchesSingleRankRun) {
  const RunResult fp32 = expect_matches_single_rank(GetParam());
  // Several buckets, all but (with pp > 1) the tied word table's started
  // during the backward, and each one a non-blocking reduce-scatter.
  ASSERT_GE(fp32.bucket_count, 3);
  for (std::size_t k = 0; k < fp32.buckets_started_early.size(); ++k) {
    EXPECT_GE(fp32.buckets_started_early[k], fp32.bucket_count - 1) << "step " << k + 1;
    EXPECT_EQ(fp32.dp_nonblocking_started[k], fp32.bucket_count) << "step " << k + 1;
  }
}

TEST_P(OverlapGradReduce, BitwiseEqualToTheSingleReduceScatterWhenDpIsTwo) {
  Layout plain = GetParam();
  if (plain.dp != 2) GTEST_SKIP() << "dp = 2 only: a + b is order-free";
  plain.overrides.clear();
  const RunResult without = train_layout(MPI_COMM_WORLD, plain, DType::F32);
  const RunResult with = train_layout(MPI_COMM_WORLD, GetParam(), DType::F32);
  expect_bitwise_equal(with, without);
  for (long n : without.dp_nonblocking_started) EXPECT_EQ(n, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, OverlapGradReduce,
                         ::testing::ValuesIn(overlap_layouts(world_size())),
                         [](const auto& info) { return info.param.name() + "_overlap"; });

TEST(OverlapGradReduce, NeedsTheDistributedOptimizer) {
  Layout l = with_overlap({1, 1, world_size(), "1f1b", false});
  EXPECT_THROW(tiny_config(l, world_size()), UserError);
}

}  // namespace
}  // namespace meshtron::testing
