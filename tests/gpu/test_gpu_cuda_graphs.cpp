// training.cuda_graphs: CapturedWork replays what it captured on new inputs,
// its private pool keeps the captured blocks from later allocations, and a
// run whose micro-batches are replayed from a graph equals the eager run
// bitwise (losses, gradient norms, every parameter), in bf16 and in fp16
// (whose loss-gradient tensor is refilled when the loss scale moves), and
// with dropout (whose step and sample offset the replay reads from device
// words refilled per micro-batch).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "parallel/decomposition.hpp"
#include "tensor/device_allocator.hpp"
#include "train/cuda_graph.hpp"
#include "train/trainer.hpp"

namespace meshtron {
namespace {

#define REQUIRE_GPU() \
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no GPU"

TEST(GpuCudaGraphs, ReplayReadsTheNewInputAndKeepsItsBlocks) {
  REQUIRE_GPU();
  const Shape shape{1 << 18};
  Tensor x = Tensor::empty(shape, DType::F32, MemorySpace::Cuda);
  Tensor y = Tensor::empty(shape, DType::F32, MemorySpace::Cuda);
  void* scratch_address = nullptr;
  CapturedWork work([&] {
    Tensor scratch = Tensor::empty(shape, DType::F32, MemorySpace::Cuda);  // freed in the capture
    scratch_address = scratch.raw();
    scratch.copy_from(x);
    y.copy_from(scratch);
  });
  EXPECT_GE(work.nodes(), 2u);
  // A block freed inside the capture belongs to the graph: never handed out
  // to work outside it, which would overwrite what the replay reads.
  Tensor other = Tensor::empty(shape, DType::F32, MemorySpace::Cuda);
  EXPECT_NE(other.raw(), scratch_address);
  for (double value : {7.0, -3.5}) {
    x.fill(value);
    y.fill(0.0);
    work.replay();
    const std::vector<double> got = y.to_doubles();
    EXPECT_EQ(got.front(), value);
    EXPECT_EQ(got.back(), value);
  }
}

struct GraphCase {
  const char* precision;
  const char* dropout;  ///< hidden and attention
};

/// The tiny GPT on one GPU, 6 steps on one fixed batch of 4 micro-batches
/// (memorisation, so the loss falls); `graphs` replays steps 2.. from a CUDA
/// graph.
testing::MemorisedRun train(const GraphCase& c, bool graphs, int steps) {
  const std::string precision = c.precision;
  return testing::memorise(
      {"run.device=cuda", "training.precision=" + precision, "training.global_batch_size=4",
       "optimizer.lr=1e-2", "optimizer.min_lr=1e-3",
       std::string("model.hidden_dropout=") + c.dropout,
       std::string("model.attention_dropout=") + c.dropout,
       std::string("training.cuda_graphs=") + (graphs ? "true" : "false")},
      precision == "fp16" ? DType::F16 : DType::BF16, steps);
}

class GpuCudaGraphsTraining : public ::testing::TestWithParam<GraphCase> {};

TEST_P(GpuCudaGraphsTraining, ReplayedRunEqualsEagerRunBitwise) {
  REQUIRE_GPU();
  const int steps = 6;
  const testing::MemorisedRun eager = train(GetParam(), false, steps);
  const testing::MemorisedRun graphed = train(GetParam(), true, steps);
  for (int k = 0; k < steps; ++k) {
    const StepReport &e = eager.steps[std::size_t(k)], &g = graphed.steps[std::size_t(k)];
    EXPECT_EQ(g.loss, e.loss) << "step " << k + 1;
    EXPECT_EQ(g.grad_norm, e.grad_norm) << "step " << k + 1;
    EXPECT_EQ(g.skipped, e.skipped) << "step " << k + 1;
  }
  EXPECT_LT(eager.steps.back().loss, eager.steps.front().loss);  // it trains
  for (const auto& [name, values] : eager.params)
    EXPECT_EQ(graphed.params.at(name), values) << name;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuCudaGraphsTraining,
                         ::testing::Values(GraphCase{"bf16", "0"}, GraphCase{"fp16", "0"},
                                           GraphCase{"bf16", "0.1"}),
                         [](const auto& info) {
                           return std::string(info.param.precision) +
                                  (std::string(info.param.dropout) == "0" ? "" : "_dropout");
                         });

}  // namespace
}  // namespace meshtron
