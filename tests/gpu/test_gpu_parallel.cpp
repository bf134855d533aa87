// Two GPUs, two ranks (mpirun -np 2; skips with fewer GPUs or ranks).
//
//  * NcclCommunicator: every collective on device buffers against values
//    computed by hand (fp32, and bf16 sums through ncclBfloat16), batch_p2p
//    (NCCL group), staged isend/recv, and host buffers falling back to MPI;
//    every call counted in CommStats.
//  * Decomposition invariance on the GPU path (fp32, dropout on, 3 steps of
//    the tiny GPT of tests/parallel/decomposition.hpp): (tp, pp, dp) =
//    (2, 1, 1) with sequence parallelism, (1, 2, 1) with 1F1B, (1, 1, 2)
//    with the distributed optimizer, each against the 1-GPU run: losses and
//    gradient norms to 1e-5 relative, every parameter to 1e-4 norm-wise (the
//    host path's tolerances; see tests/parallel/test_decomposition.cpp).
//    The 1-GPU reference is also held to the host run (same tolerances), so
//    a bug common to both GPU runs cannot pass.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "parallel/communicator_nccl.hpp"
#include "parallel/decomposition.hpp"
#include "tensor/device_allocator.hpp"

namespace meshtron {
namespace {

using testing_util::world_size;

/// Skip unless there are exactly two ranks and at least two GPUs (the same
/// answer on both ranks of one node).
#define REQUIRE_TWO_GPUS()                                                     \
  do {                                                                         \
    if (world_size() != 2) GTEST_SKIP() << "needs mpirun -np 2";               \
    if (device::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";       \
  } while (0)

std::vector<double> host_values(const Tensor& t) { return t.to_doubles(); }

Tensor device_from(const std::vector<float>& v, DType dtype = DType::F32) {
  Tensor h = Tensor::empty({index_t(v.size())}, DType::F32);
  std::copy(v.begin(), v.end(), h.data<float>());
  return h.to(dtype).to_device();
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_TWO_GPUS();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    comm = std::make_unique<NcclCommunicator>(MPI_COMM_WORLD);
  }
  int rank = 0;
  std::unique_ptr<NcclCommunicator> comm;
};

TEST_F(Nccl, CollectivesOnDeviceBuffers) {
  const float r = float(rank);
  // all_reduce sum and max: rank r holds {r + 1, 10 r, -r}.
  Tensor a = device_from({r + 1, 10 * r, -r});
  comm->all_reduce(a, ReduceOp::Sum);
  EXPECT_EQ(host_values(a), (std::vector<double>{3, 10, -1}));
  Tensor m = device_from({r, -r});
  comm->all_reduce(m, ReduceOp::Max);
  EXPECT_EQ(host_values(m), (std::vector<double>{1, 0}));
  // reduce_scatter: 4 elements {r, 1, 2, 3 + r} -> rank 0 gets {1, 2}, rank 1 {4, 7}.
  Tensor rs_in = device_from({r, 1, 2, 3 + r});
  Tensor rs_out = Tensor::empty({2}, DType::F32, MemorySpace::Cuda);
  comm->reduce_scatter(rs_in.raw(), rs_out.raw(), 2, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(host_values(rs_out),
            rank == 0 ? (std::vector<double>{1, 2}) : (std::vector<double>{4, 7}));
  // all_gather: rank r contributes {r, r + 0.5}.
  Tensor ag_in = device_from({r, r + 0.5f});
  Tensor ag_out = Tensor::empty({4}, DType::F32, MemorySpace::Cuda);
  comm->all_gather(ag_in.raw(), ag_out.raw(), 2, DType::F32);
  EXPECT_EQ(host_values(ag_out), (std::vector<double>{0, 0.5, 1, 1.5}));
  // broadcast from rank 1.
  Tensor b = device_from({r * 7, r * 9});
  comm->broadcast(b, 1);
  EXPECT_EQ(host_values(b), (std::vector<double>{7, 9}));
  EXPECT_EQ(comm->stats().count(CollectiveKind::AllReduce), 2);
  EXPECT_EQ(comm->stats().count(CollectiveKind::ReduceScatter), 1);
  EXPECT_EQ(comm->stats().count(CollectiveKind::AllGather), 1);
  EXPECT_EQ(comm->stats().count(CollectiveKind::Broadcast), 1);
}

TEST_F(Nccl, Bf16SumIsReducedOnTheDevice) {
  // 1 + 2^-7 is exact in bf16 (7 stored mantissa bits); the sum 2 + 2^-6 too.
  const float x = 1.0f + 1.0f / 128;
  Tensor t = device_from({x, float(rank + 1)}, DType::BF16);
  comm->all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(t.dtype(), DType::BF16);
  EXPECT_EQ(host_values(t), (std::vector<double>{2 * double(x), 3}));
}

TEST_F(Nccl, PointToPointStagedAndGrouped) {
  const int peer = 1 - rank;
  // Staged isend before the matching recv on both ranks (as the pipeline
  // executor posts them): must not deadlock.
  Tensor out = device_from({float(rank), float(10 + rank)});
  Tensor in = Tensor::empty({2}, DType::F32, MemorySpace::Cuda);
  comm->isend(out.raw(), 2, DType::F32, peer, 5);
  comm->recv(in.raw(), 2, DType::F32, peer, 5);
  comm->wait_sends();
  EXPECT_EQ(host_values(in), (std::vector<double>{double(peer), double(10 + peer)}));
  // Grouped exchange over NCCL.
  Tensor send = device_from({float(100 + rank)});
  Tensor recv = Tensor::empty({1}, DType::F32, MemorySpace::Cuda);
  const P2POp ops[] = {{P2POp::Send, send.raw(), 1, DType::F32, peer},
                       {P2POp::Recv, recv.raw(), 1, DType::F32, peer}};
  comm->batch_p2p(ops);
  EXPECT_EQ(host_values(recv), (std::vector<double>{double(100 + peer)}));
  EXPECT_EQ(comm->stats().count(CollectiveKind::Send), 1);
  EXPECT_EQ(comm->stats().count(CollectiveKind::Recv), 1);
  EXPECT_EQ(comm->stats().count(CollectiveKind::BatchP2P), 1);
}

TEST_F(Nccl, HostBuffersGoThroughMpi) {
  EXPECT_EQ(comm->all_reduce_scalar(double(rank) + 0.25), 1.5);
  double gathered[2];
  const double mine = 3.0 * rank;
  comm->all_gather(&mine, gathered, 1, DType::F64);
  EXPECT_EQ(gathered[0], 0.0);
  EXPECT_EQ(gathered[1], 3.0);
  EXPECT_FALSE(is_device_pointer(&mine));
}

// ------------------------------------------------------------ training ---

using testing::Layout;
using testing::RunResult;

void expect_same_run(const RunResult& got, const RunResult& ref) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (std::size_t k = 0; k < ref.losses.size(); ++k) {
    EXPECT_NEAR(got.losses[k], ref.losses[k], 1e-5 * std::fabs(ref.losses[k]))
        << "step " << k + 1;
    EXPECT_NEAR(got.grad_norms[k], ref.grad_norms[k], 1e-5 * ref.grad_norms[k])
        << "step " << k + 1;
  }
  for (const auto& [name, values] : ref.params)
    EXPECT_LE(testing::norm_rel_error(got.params.at(name), values), 1e-4) << name;
}

/// The 1-GPU run, on world rank 0 only (MPI_COMM_SELF; its runtime picks
/// GPU 0, rank 0's own GPU). A process keeps one GPU for life: the GEMM
/// engine's cuBLASLt handle and workspace live on the first GPU it used, so
/// rank 1 (GPU 1) must never run a one-rank runtime (which would pick GPU 0).
/// train_layout gives every rank the full result, so rank 0 compares.
const RunResult& one_gpu_reference() {
  static const RunResult ref =
      testing::train_layout(MPI_COMM_SELF, Layout{}, DType::F32, 3, MemorySpace::Cuda);
  return ref;
}

bool is_rank0() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

TEST(GpuTraining, OneGpuRunMatchesTheHostRun) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  if (!is_rank0()) return;  // see one_gpu_reference()
  const RunResult host = testing::train_layout(MPI_COMM_SELF, Layout{}, DType::F32, 3);
  for (double l : one_gpu_reference().losses) EXPECT_TRUE(std::isfinite(l));
  expect_same_run(one_gpu_reference(), host);
}

class GpuDecomposition : public ::testing::TestWithParam<Layout> {};

TEST_P(GpuDecomposition, MatchesOneGpuRun) {
  REQUIRE_TWO_GPUS();
  const RunResult got =
      testing::train_layout(MPI_COMM_WORLD, GetParam(), DType::F32, 3, MemorySpace::Cuda);
  if (is_rank0()) expect_same_run(got, one_gpu_reference());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GpuDecomposition,
    ::testing::Values(Layout{2, 1, 1, "1f1b", false, true}, Layout{1, 2, 1, "1f1b", false, false},
                      Layout{1, 1, 2, "1f1b", true, false}),
    [](const auto& info) { return info.param.name(); });

// Overlapped gradient reduction on the device: the buckets' reduce-scatters
// run as grouped ncclReduce on the communicator's non-blocking stream while
// the backward continues; the result must equal the 1-GPU run, and the
// buckets must really have started from the backward hook.
TEST(GpuTraining, OverlappedGradReduceMatchesOneGpuRun) {
  REQUIRE_TWO_GPUS();
  Layout layout{1, 1, 2, "1f1b", true, false};
  layout.overrides = {"parallel.overlap_grad_reduce=true", "parallel.grad_bucket_size=20000"};
  const RunResult got =
      testing::train_layout(MPI_COMM_WORLD, layout, DType::F32, 3, MemorySpace::Cuda);
  ASSERT_GE(got.bucket_count, 3);
  for (std::size_t k = 0; k < got.buckets_started_early.size(); ++k) {
    EXPECT_GE(got.buckets_started_early[k], got.bucket_count - 1) << "step " << k + 1;
    EXPECT_EQ(got.dp_nonblocking_started[k], got.bucket_count) << "step " << k + 1;
  }
  if (is_rank0()) expect_same_run(got, one_gpu_reference());
}

}  // namespace
}  // namespace meshtron
