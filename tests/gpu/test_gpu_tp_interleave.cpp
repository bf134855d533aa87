// parallel.tp_interleave on one GPU (tp 1): each pair of micro-batches runs
// as two fibers (src/parallel/fiber_pair.hpp) whose stacks call cuBLASLt,
// cuDNN and the CUDA kernels. With no tp collective to switch at, the pair's
// micro-batches run one after the other, as in the plain run, so the run
// equals the plain one: losses, gradient norms and every parameter, in bf16,
// with and without dropout (whose offsets come from the micro-batch index).
// The switching itself is covered on two GPUs by test_gpu_parallel.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "parallel/decomposition.hpp"
#include "tensor/device_allocator.hpp"
#include "train/trainer.hpp"

namespace meshtron {
namespace {

#define REQUIRE_GPU() \
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no GPU"

/// The tiny GPT on one GPU, 4 steps on one fixed batch of 4 micro-batches.
testing::MemorisedRun train(const std::string& dropout, bool interleave) {
  return testing::memorise(
      {"run.device=cuda", "training.precision=bf16", "training.global_batch_size=4",
       "optimizer.lr=1e-2", "optimizer.min_lr=1e-3", "model.hidden_dropout=" + dropout,
       "model.attention_dropout=" + dropout,
       std::string("parallel.tp_interleave=") + (interleave ? "true" : "false")},
      DType::BF16, 4);
}

TEST(GpuTpInterleave, FibersOnOneGpuEqualThePlainRun) {
  REQUIRE_GPU();
  for (const std::string dropout : {"0", "0.1"}) {
    SCOPED_TRACE("dropout " + dropout);
    const testing::MemorisedRun plain = train(dropout, false);
    const testing::MemorisedRun paired = train(dropout, true);
    ASSERT_EQ(paired.steps.size(), plain.steps.size());
    for (std::size_t k = 0; k < plain.steps.size(); ++k) {
      EXPECT_EQ(paired.steps[k].loss, plain.steps[k].loss) << "step " << k + 1;
      EXPECT_EQ(paired.steps[k].grad_norm, plain.steps[k].grad_norm) << "step " << k + 1;
      EXPECT_EQ(paired.steps[k].max_in_flight, 2) << "step " << k + 1 << ": not paired";
    }
    EXPECT_LT(plain.steps.back().loss, plain.steps.front().loss);  // it trains
    for (const auto& [name, values] : plain.params)
      EXPECT_EQ(paired.params.at(name), values) << name;
  }
}

}  // namespace
}  // namespace meshtron
