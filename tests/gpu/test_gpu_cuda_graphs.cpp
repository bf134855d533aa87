// training.cuda_graphs: CapturedWork replays what it captured on new inputs,
// its private pool keeps the captured blocks from later allocations, and a
// run whose micro-batches are replayed from a graph equals the eager run
// bitwise (losses, gradient norms, every parameter), in bf16 and in fp16
// (whose loss-gradient tensor is refilled when the loss scale moves), and
// with dropout (whose step and sample offset the replay reads from device
// words refilled per micro-batch): the dropout kernels, and the fused
// attention kernels' attention dropout (head dim 64). A GEMM autotuned while its stream is
// captured is timed outside the graph.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "ops/ops.hpp"
#include "ops/ops_cuda.hpp"
#include "parallel/decomposition.hpp"
#include "tensor/device_allocator.hpp"
#include "train/cuda_graph.hpp"
#include "train/trainer.hpp"

namespace meshtron {
namespace {

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
  /// model.attention_backend: "auto" takes the unfused path at the tiny
  /// deck's head dim 4; "fused" also sets head dim 64 (hidden 128, 2 heads).
  const char* attention = "auto";
};

/// The tiny GPT on one GPU, 6 steps on one fixed batch of 4 micro-batches
/// (memorisation, so the loss falls); `graphs` replays steps 2.. from a CUDA
/// graph.
testing::MemorisedRun train(const GraphCase& c, bool graphs, int steps) {
  const std::string precision = c.precision, attention = c.attention;
  std::vector<std::string> overrides = {
      "run.device=cuda", "training.precision=" + precision, "training.global_batch_size=4",
      "optimizer.lr=1e-2", "optimizer.min_lr=1e-3",
      std::string("model.hidden_dropout=") + c.dropout,
      std::string("model.attention_dropout=") + c.dropout,
      "model.attention_backend=" + attention,
      std::string("training.cuda_graphs=") + (graphs ? "true" : "false")};
  if (attention == "fused")
    overrides.insert(overrides.end(), {"model.hidden_size=128", "model.num_attention_heads=2"});
  return testing::memorise(overrides, precision == "fp16" ? DType::F16 : DType::BF16, steps);
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
                                           GraphCase{"bf16", "0.1"},
                                           GraphCase{"bf16", "0.1", "fused"}),
                         [](const auto& info) {
                           const std::string attention = info.param.attention;
                           return std::string(info.param.precision) +
                                  (std::string(info.param.dropout) == "0" ? "" : "_dropout") +
                                  (attention == "auto" ? "" : "_" + attention);
                         });

// run.gemm_autotune with training.cuda_graphs: a GEMM problem met first in
// the captured step (with deferred gradient zeroing, a weight gradient the
// capture overwrites where the eager first step accumulated) is timed on a
// stream of its own, outside the graph, which records the one launch of the
// chosen algorithm; the replay computes what that algorithm computes eagerly.
TEST(GpuCudaGraphs, GemmAutotunedInsideACaptureIsTimedOutsideIt) {
  REQUIRE_GPU();
  const index_t M = 256, N = 192, K = 320;  // large enough for several candidates
  const Tensor a64 = gpu_test::random_rounded({M, K}, DType::BF16, 11, -1.0, 1.0);
  const Tensor b64 = gpu_test::random_rounded({K, N}, DType::BF16, 12, -1.0, 1.0);
  const Tensor a = a64.to(DType::BF16).to_space(MemorySpace::Cuda);
  const Tensor b = b64.to(DType::BF16).to_space(MemorySpace::Cuda);
  Tensor c = gpu_test::poisoned({M, N}, DType::BF16);
  const auto product = [&] { ops::gemm(a, false, b, false, c, 1.0, 0.0); };
  std::size_t untuned_nodes = 0;
  {
    CapturedWork untuned(product);
    untuned_nodes = untuned.nodes();
  }
  cuda::set_gemm_autotune(true);  // forgets the choices: the capture meets the problem first
  const std::uint64_t tuned_before = cuda::gemm_autotuned_problems();
  {
    CapturedWork tuned(product);
    EXPECT_EQ(cuda::gemm_autotuned_problems(), tuned_before + 1);
    EXPECT_EQ(tuned.nodes(), untuned_nodes);  // no timing launch in the graph
    tuned.replay();
  }
  const std::vector<double> replayed = c.to_doubles();
  c.fill(std::nan(""));
  product();  // eagerly, with the algorithm chosen in the capture (cached)
  cuda::set_gemm_autotune(false);
  EXPECT_EQ(c.to_doubles(), replayed);
  Tensor reference = Tensor::empty({M, N}, DType::F64);
  ops::gemm(a64, false, b64, false, reference, 1.0, 0.0);
  for (index_t i = 0; i < M * N; ++i) {
    const double want = reference.data<double>()[i];
    ASSERT_NEAR(replayed[std::size_t(i)], want, 1e-2 * (1.0 + std::fabs(want))) << "element " << i;
  }
}

}  // namespace
}  // namespace meshtron
