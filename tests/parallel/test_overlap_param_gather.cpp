// Overlapped parameter all-gather (parallel.overlap_param_gather, Megatron's
// --overlap-param-gather): the distributed optimizer's step() starts one
// non-blocking all-gather per bucket and returns; the next forward waits for
// each bucket just before the layers that use it.
//
//  * dp4, tp2 x dp2 (sequence parallel) and pp2 x dp2 (1f1b, interleaved),
//    with the gather overlap alone and with both overlaps, match the 1-rank
//    run at the decomposition tolerances (fp32 1e-5 / 1e-4, fp64 1e-10).
//  * The gathers only copy, so with the gather overlap alone every layout is
//    bit for bit the blocking all-gather's run; with both overlaps dp 2 is
//    too (a + b is order-free in the reduce-scatter).
//  * The gathers really are left in flight by step() and completed from the
//    forward hook: after every step the dp communicator has started one
//    non-blocking all-gather per bucket and all of them are still pending;
//    in steps 2.. the forward hook waited for every bucket. The blocking
//    path starts none.
//  * A checkpoint written right after a step (gathers in flight) holds the
//    updated weights: 2 steps + save + load (without the overlap) + 1 step
//    equals 3 straight blocking steps bit for bit.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "common/mpi_test_util.hpp"
#include "decomposition_expect.hpp"
#include "io/checkpoint.hpp"
#include "config/model_spec_from_deck.hpp"
#include "train/data_source.hpp"
#include "train/optimizer.hpp"
#include "train/trainer_checkpoint.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_rank;
using testing_util::world_size;

// About two layers of the tiny model per bucket (a layer holds ~12.6 k).
const std::vector<std::string> kGather = {"parallel.overlap_param_gather=true",
                                          "parallel.grad_bucket_size=20000"};
const std::string kGradOverlap = "parallel.overlap_grad_reduce=true";

bool both_overlaps(const Layout& l) {
  for (const std::string& o : l.overrides)
    if (o == kGradOverlap) return true;
  return false;
}

std::string label(const Layout& l) {
  return l.name() + (both_overlaps(l) ? "_both_overlaps" : "_gather_overlap");
}

std::vector<Layout> gather_layouts(int world) {
  std::vector<Layout> base;
  if (world == 4)
    base = {{1, 1, 4, "1f1b", true, false},
            {2, 1, 2, "1f1b", true, true},
            {1, 2, 2, "1f1b", true, false},
            {1, 2, 2, "interleaved", true, false}};
  std::vector<Layout> out;
  for (Layout l : base) {
    l.overrides = kGather;
    out.push_back(l);
    l.overrides.push_back(kGradOverlap);
    out.push_back(l);
  }
  return out;
}

class OverlapParamGather : public ::testing::TestWithParam<Layout> {};

TEST_P(OverlapParamGather, MatchesSingleRankRun) { expect_matches_single_rank(GetParam()); }

TEST_P(OverlapParamGather, BitwiseEqualToTheBlockingAllGather) {
  const Layout overlapped = GetParam();
  if (both_overlaps(overlapped) && overlapped.dp != 2)
    GTEST_SKIP() << "the overlapped reduce-scatter is bitwise only at dp = 2";
  Layout plain = overlapped;
  plain.overrides.clear();
  expect_bitwise_equal(train_layout(MPI_COMM_WORLD, overlapped, DType::F32),
                       train_layout(MPI_COMM_WORLD, plain, DType::F32));
}

/// A trainer of `layout` on the world with its data, for step-by-step checks.
struct SteppedRun {
  RunConfig config;
  std::unique_ptr<ParallelRuntime> rt;
  ModelSpec model;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<Trainer> trainer;

  explicit SteppedRun(const Layout& layout) : config(tiny_config(layout, world_size())) {
    rt = std::make_unique<ParallelRuntime>(MPI_COMM_WORLD, config.parallel.degrees(),
                                           MemorySpace::Host);
    model = model_spec_from_deck(config, 100, rt->topo.tp());
    DataLayout d{model.seq_length, config.training.micro_batch_size,
                 config.training.global_batch_size, rt->topo.dp_rank(), rt->topo.dp(),
                 config.training.train_iters, 1, config.run.seed};
    data = make_synthetic_data(d, 100);
    trainer = std::make_unique<Trainer>(config, model, *rt, DType::F32);
  }
  StepReport step(long k) { return trainer->train_step(k, data->train_step(k)); }
  /// This rank's parameter values, in parameter order.
  std::vector<std::vector<double>> values() {
    std::vector<std::vector<double>> out;
    for (Parameter* p : trainer->parameters()) out.push_back(p->value.to_doubles());
    return out;
  }
  DistributedAdamW& optimizer() { return dynamic_cast<DistributedAdamW&>(trainer->optimizer()); }
};

TEST_P(OverlapParamGather, GathersStartInStepAndCompleteInTheForward) {
  SteppedRun run(GetParam());
  DistributedAdamW& opt = run.optimizer();
  const int buckets = opt.bucket_count();
  ASSERT_GE(buckets, 2);
  for (long k = 1; k <= 3; ++k) {
    run.rt->dp.reset_stats();
    const StepReport r = run.step(k);
    ASSERT_FALSE(r.skipped);
    EXPECT_EQ(run.rt->dp.nonblocking_gathers_started(), buckets) << "step " << k;
    EXPECT_EQ(opt.param_gathers_pending(), buckets) << "step " << k << ": step() waited";
    // Step 1's forward ran on the initial weights: nothing was in flight.
    EXPECT_EQ(opt.buckets_waited_in_forward(), k == 1 ? 0 : buckets) << "step " << k;
  }
  run.values();  // what a reader of the values does
  EXPECT_EQ(opt.param_gathers_pending(), 0);
}

TEST_P(OverlapParamGather, BlockingPathStartsNoGather) {
  Layout plain = GetParam();
  plain.overrides.clear();
  SteppedRun run(plain);
  run.rt->dp.reset_stats();
  run.step(1);
  EXPECT_EQ(run.rt->dp.nonblocking_gathers_started(), 0);
  EXPECT_EQ(run.trainer->optimizer().param_gather_hook(), nullptr);
}

std::string shared_temp_dir() {
  char name[256] = "/tmp/meshtron_param_gather_XXXXXX";
  if (world_rank() == 0) MESH_VERIFY(mkdtemp(name) != nullptr, "mkdtemp failed");
  MPI_Bcast(name, int(sizeof(name)), MPI_CHAR, 0, MPI_COMM_WORLD);
  return name;
}

TEST_P(OverlapParamGather, CheckpointRightAfterAStepHoldsTheUpdatedWeights) {
  if (both_overlaps(GetParam())) GTEST_SKIP() << "the gather overlap alone suffices";
  Layout plain = GetParam();
  plain.overrides.clear();
  SteppedRun straight(plain);
  std::vector<double> straight_losses;
  for (long k = 1; k <= 3; ++k) straight_losses.push_back(straight.step(k).loss);

  const std::string dir = shared_temp_dir();
  SteppedRun overlapped(GetParam());
  overlapped.step(1);
  overlapped.step(2);
  ASSERT_GT(overlapped.optimizer().param_gathers_pending(), 0);
  io::TrainState state;
  state.iteration = 2;
  save_trainer_checkpoint(*overlapped.trainer, dir, state, 0);

  SteppedRun resumed(plain);
  load_trainer_checkpoint(*resumed.trainer, dir + "/" + io::checkpoint_file_name(2));
  EXPECT_EQ(resumed.step(3).loss, straight_losses[2]);
  EXPECT_EQ(resumed.values(), straight.values());
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, OverlapParamGather,
                         ::testing::ValuesIn(gather_layouts(world_size())),
                         [](const auto& info) { return label(info.param); });

TEST(OverlapParamGatherConfig, NeedsTheDistributedOptimizer) {
  Layout l{1, 1, world_size(), "1f1b", false};
  l.overrides = kGather;
  EXPECT_THROW(tiny_config(l, world_size()), UserError);
}

}  // namespace
}  // namespace meshtron::testing
