// Two GPUs, two ranks (mpirun -np 2; skips with fewer GPUs or ranks).
//
//  * NcclCommunicator: every collective on device buffers against values
//    computed by hand (fp32, and bf16 sums through ncclBfloat16), batch_p2p
//    (NCCL group), device-to-device send/recv/isend over the per-link
//    communicators (16 MiB messages posted send-first on both ranks, lanes
//    in the crossed orders of interleaved 1F1B; a buffer written after
//    wait_sends() still arrives intact), and host buffers falling back to
//    MPI; every call counted in CommStats.
//  * The pipeline executor's messages (a model of trainer.cpp) for gpipe,
//    1f1b and interleaved schedules, pp 2..4: every lane is received in send
//    order, and a simulation of the streams (sends block until matched)
//    completes with one link per (sender, receiver, lane), while one stream
//    per lane deadlocks (no GPU needed).
//  * Decomposition invariance on the GPU path (fp32, dropout on, 3 steps of
//    the tiny GPT of tests/parallel/decomposition.hpp): (tp, pp, dp) =
//    (2, 1, 1) with sequence parallelism, (1, 2, 1) with gpipe, 1F1B and
//    interleaved 1F1B (2 virtual stages), (1, 1, 2) with the distributed
//    optimizer, each against the 1-GPU run: losses and
//    gradient norms to 1e-5 relative, every parameter to 1e-4 norm-wise (the
//    host path's tolerances; see tests/parallel/test_decomposition.cpp).
//    The 1-GPU reference is also held to the host run (same tolerances), so
//    a bug common to both GPU runs cannot pass. BERT likewise: its 1-GPU run
//    against the host's, tp 2 + SP and pp 2 against its 1-GPU run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <tuple>

#include "ops/ops_cuda.hpp"
#include "parallel/communicator_nccl.hpp"
#include "parallel/decomposition.hpp"
#include "parallel/peer_exchange.hpp"
#include "train/schedule.hpp"
#include "tensor/device_allocator.hpp"
#include "tensor/device_stream.hpp"

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

// PeerExchange (copy-engine all-gather over CUDA IPC, flags raised and
// awaited by the driver's stream memory operations): every rank's arena holds
// every rank's shard in its block, the same bytes as NCCL's all-gather, call
// after call (the sequence numbers grow), at an offset, and with the shard
// already in place in this rank's block (its copy skipped).
TEST_F(Nccl, CopyEngineAllGatherEqualsNcclAllGather) {
  if (!PeerExchange::available()) GTEST_SKIP() << "driver without stream memory operations";
  const std::size_t n = std::size_t(1) << 20, bytes = n * sizeof(float);  // 4 MiB shards
  const std::size_t offset = 4096;
  PeerExchange exchange(MPI_COMM_WORLD, offset + 2 * bytes);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (int call = 0; call < 4; ++call) {
    std::vector<float> mine(n);
    for (std::size_t i = 0; i < n; ++i)
      mine[i] = float(rank) * 1000.f + float(call) + float(i % 977) * 0.001f;
    const Tensor shard = device_from(mine);
    Tensor expected = Tensor::empty({index_t(2 * n)}, DType::F32, MemorySpace::Cuda);
    comm->all_gather(shard.raw(), expected.raw(), n, DType::F32);
    const std::size_t at = call % 2 == 0 ? 0 : offset;
    const void* source = shard.raw();
    if (call == 3) {  // in place: the shard already sits in this rank's block
      char* own_block = exchange.arena() + at + std::size_t(rank) * bytes;
      ASSERT_EQ(cudaMemcpy(own_block, shard.raw(), bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
      source = own_block;
    }
    exchange.all_gather(source, bytes, at, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const Tensor gathered =
        Tensor::view(exchange.arena() + at, {index_t(2 * n)}, DType::F32, MemorySpace::Cuda);
    EXPECT_TRUE(gathered.to_doubles() == expected.to_doubles()) << "call " << call;
    MPI_Barrier(MPI_COMM_WORLD);  // both ranks have read their arena before the next call
  }
  cudaStreamDestroy(stream);
}

// PeerExchange::reduce_scatter, and the copy-engine communicator's blocking
// reduce_scatter and ireduce_scatter (the SP input gradient's, on the side
// stream): each rank's output block is the sum of that block of both ranks'
// partials, bit for bit NCCL's reduce-scatter in fp32 and in bf16 (two
// ranks: one rounding of a + b either way), call after call.
TEST_F(Nccl, CopyEngineReduceScatterEqualsNcclReduceScatter) {
  if (!PeerExchange::available()) GTEST_SKIP() << "driver without stream memory operations";
  const std::size_t n = std::size_t(1) << 20;  // elements per block
  PeerExchange exchange(MPI_COMM_WORLD, 2 * n * sizeof(float));
  NcclCommunicator copy_engines(MPI_COMM_WORLD);
  copy_engines.use_copy_engine();
  for (DType dt : {DType::F32, DType::BF16})
    for (int call = 0; call < 5; ++call) {
      std::vector<float> mine(2 * n);
      for (std::size_t i = 0; i < 2 * n; ++i)
        mine[i] = float(rank + 1) * 0.37f + float(call) - float(i % 1013) * 0.01f;
      const Tensor partial = device_from(mine, dt);
      Tensor expected = Tensor::empty({index_t(n)}, dt, MemorySpace::Cuda);
      comm->reduce_scatter(partial.raw(), expected.raw(), n, dt, ReduceOp::Sum);
      Tensor out = Tensor::empty({index_t(n)}, dt, MemorySpace::Cuda);
      exchange.reduce_scatter(partial.raw(), n, dt, out.raw(), 0, device::compute_stream());
      Tensor blocking = Tensor::empty({index_t(n)}, dt, MemorySpace::Cuda);
      copy_engines.reduce_scatter(partial.raw(), blocking.raw(), n, dt, ReduceOp::Sum);
      Tensor async = Tensor::empty({index_t(n)}, dt, MemorySpace::Cuda);
      const std::size_t counts[] = {n, n};
      copy_engines.ireduce_scatter(partial.raw(), async.raw(), counts, dt, ReduceOp::Sum);
      copy_engines.wait_collectives();
      for (const Tensor* t : {&out, &blocking, &async})
        EXPECT_TRUE(t->to_doubles() == expected.to_doubles()) << dtype_name(dt) << " call " << call;
      MPI_Barrier(MPI_COMM_WORLD);  // both ranks have summed before the next call's copies
    }
}

/// How many of `got` are further from the exact sum of their four terms
/// (`terms(i)`, the values as stored) than one rounding in 16-bit dtypes or
/// a few fp32 roundings, relative to the terms' magnitudes.
std::size_t sums_off_by_more_than_a_rounding(
    DType dt, const std::vector<double>& got,
    const std::function<std::array<double, 4>(std::size_t)>& terms) {
  const double unit = dt == DType::F32 ? 4 * std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double exact = 0, magnitude = 0;
    for (double t : terms(i)) exact += t, magnitude += std::abs(t);
    if (!(std::abs(got[i] - exact) <= unit * magnitude + 1e-30)) ++bad;
  }
  return bad;
}

// reduce_scatter_adding (the row-parallel forward under SP on the copy
// engines): this rank's shard of both ranks' partial sums plus its residual
// shard and a bias broadcast over rows, added once: within one rounding
// (16-bit) or a few fp32 roundings of the exact sum, at a width that packs
// (1280) and one that does not (1000). NCCL alone does not add.
TEST_F(Nccl, CopyEngineReduceScatterAddsResidualShardAndBiasOnce) {
  if (!PeerExchange::available()) GTEST_SKIP() << "driver without stream memory operations";
  NcclCommunicator copy_engines(MPI_COMM_WORLD);
  copy_engines.use_copy_engine();
  for (DType dt : {DType::F32, DType::BF16})
    for (const std::size_t columns : {std::size_t(1280), std::size_t(1000)}) {
      const std::size_t rows = 512, n = rows * columns;  // elements per rank's shard
      EXPECT_FALSE(comm->adds_in_reduce_scatter(n, dt));
      ASSERT_TRUE(copy_engines.adds_in_reduce_scatter(n, dt));
      const auto partial_of = [&](int r) {
        std::vector<float> v(2 * n);
        for (std::size_t i = 0; i < 2 * n; ++i)
          v[i] = float(r + 1) * 0.37f - float(i % 1013) * 0.01f;
        return v;
      };
      std::vector<float> residual(n), bias(columns);  // this rank's shard
      for (std::size_t i = 0; i < n; ++i)
        residual[i] = float((i + std::size_t(rank) * 31) % 977) * 0.003f - 1.5f;
      for (std::size_t c = 0; c < columns; ++c) bias[c] = 0.25f - float(c % 61) * 0.01f;
      const Tensor partial = device_from(partial_of(rank), dt);
      const Tensor residual_dev = device_from(residual, dt), bias_dev = device_from(bias, dt);
      Tensor out = Tensor::empty({index_t(n)}, dt, MemorySpace::Cuda);
      copy_engines.reduce_scatter_adding(partial.raw(), out.raw(), n, dt, residual_dev.raw(),
                                         bias_dev.raw(), columns);
      // The exact sum of the values as stored in dt, over this rank's block.
      const std::vector<double> p0 = device_from(partial_of(0), dt).to_doubles(),
                                p1 = device_from(partial_of(1), dt).to_doubles(),
                                res = residual_dev.to_doubles(), b = bias_dev.to_doubles(),
                                got = out.to_doubles();
      const std::size_t first = std::size_t(rank) * n;  // this shard's place in the partials
      const std::size_t bad = sums_off_by_more_than_a_rounding(dt, got, [&](std::size_t i) {
        return std::array<double, 4>{p0[first + i], p1[first + i], res[i], b[i % columns]};
      });
      EXPECT_EQ(bad, 0u) << dtype_name(dt) << " columns " << columns;
      MPI_Barrier(MPI_COMM_WORLD);  // both ranks have read their arena before the next call
    }
}

// PeerExchange::all_reduce (reduce-scatter, in-place adds, all-gather, all on
// one stream), the communicator's copy-engine all-reduce, and iall_reduce on
// NCCL and on the copy engines: bit for bit
// NCCL's all-reduce in fp32 and bf16 (two ranks: one rounding of a + b),
// call after call through the rotating regions.
TEST_F(Nccl, CopyEngineAllReduceEqualsNcclAllReduce) {
  if (!PeerExchange::available()) GTEST_SKIP() << "driver without stream memory operations";
  const std::size_t n = std::size_t(1) << 20;  // 4 MiB in fp32: above the copy-engine threshold
  NcclCommunicator copy_engines(MPI_COMM_WORLD);
  copy_engines.use_copy_engine();
  PeerExchange exchange(MPI_COMM_WORLD, 2 * n * sizeof(float));
  for (DType dt : {DType::F32, DType::BF16})
    for (int call = 0; call < 5; ++call) {
      std::vector<float> mine(n);
      for (std::size_t i = 0; i < n; ++i)
        mine[i] = float(rank + 1) * 0.37f + float(call) - float(i % 1013) * 0.01f;
      Tensor expected = device_from(mine, dt);
      comm->all_reduce(expected, ReduceOp::Sum);
      Tensor direct = device_from(mine, dt);
      exchange.all_reduce(direct.raw(), n, dt, 0, n * dtype_size(dt), device::compute_stream());
      Tensor through_comm = device_from(mine, dt);
      copy_engines.all_reduce(through_comm, ReduceOp::Sum);
      // The non-blocking ones (the column-parallel backward's), NCCL and copy engines.
      Tensor nccl_async = device_from(mine, dt), ce_async = device_from(mine, dt);
      comm->wait_collective(
          comm->iall_reduce(nccl_async.raw(), n, dt, ReduceOp::Sum));
      copy_engines.wait_collective(
          copy_engines.iall_reduce(ce_async.raw(), n, dt, ReduceOp::Sum));
      for (const Tensor* t : {&direct, &through_comm, &nccl_async, &ce_async})
        EXPECT_TRUE(t->to_doubles() == expected.to_doubles()) << dtype_name(dt) << " call " << call;
      MPI_Barrier(MPI_COMM_WORLD);  // both ranks have read their arena before the next call
    }
}

// all_reduce_adding (the row-parallel forward without SP on the copy
// engines): the sum of both ranks' blocks plus a residual and a bias
// broadcast over rows, added once, within one rounding (16-bit) or a few
// fp32 roundings of the exact sum; at a width that packs (1280) and one
// that does not (1000). NCCL alone does not add (adds_in_all_reduce false),
// nor do the copy engines below their smallest all-reduce.
TEST_F(Nccl, CopyEngineAllReduceAddsResidualAndBiasOnce) {
  if (!PeerExchange::available()) GTEST_SKIP() << "driver without stream memory operations";
  NcclCommunicator copy_engines(MPI_COMM_WORLD);
  copy_engines.use_copy_engine();
  for (DType dt : {DType::F32, DType::BF16})
    for (const std::size_t columns : {std::size_t(1280), std::size_t(1000)}) {
      const std::size_t rows = 1024, n = rows * columns;  // >= 1 MiB in either dtype
      EXPECT_FALSE(comm->adds_in_all_reduce(n, dt));
      EXPECT_FALSE(copy_engines.adds_in_all_reduce(64, dt));
      ASSERT_TRUE(copy_engines.adds_in_all_reduce(n, dt));
      const auto partial_of = [&](int r) {
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = float(r + 1) * 0.37f - float(i % 1013) * 0.01f;
        return v;
      };
      std::vector<float> residual(n), bias(columns);
      for (std::size_t i = 0; i < n; ++i) residual[i] = float(i % 977) * 0.003f - 1.5f;
      for (std::size_t c = 0; c < columns; ++c) bias[c] = 0.25f - float(c % 61) * 0.01f;
      Tensor sum = device_from(partial_of(rank), dt);
      const Tensor residual_dev = device_from(residual, dt), bias_dev = device_from(bias, dt);
      copy_engines.all_reduce_adding(sum.raw(), n, dt, residual_dev.raw(), bias_dev.raw(),
                                     columns);
      // The exact sum of the values as stored in dt.
      const std::vector<double> p0 = device_from(partial_of(0), dt).to_doubles(),
                                p1 = device_from(partial_of(1), dt).to_doubles(),
                                res = residual_dev.to_doubles(), b = bias_dev.to_doubles(),
                                got = sum.to_doubles();
      const std::size_t bad = sums_off_by_more_than_a_rounding(dt, got, [&](std::size_t i) {
        return std::array<double, 4>{p0[i], p1[i], res[i], b[i % columns]};
      });
      EXPECT_EQ(bad, 0u) << dtype_name(dt) << " columns " << columns;
      MPI_Barrier(MPI_COMM_WORLD);  // both ranks have read their arena before the next call
    }
}

TEST_F(Nccl, Bf16SumIsReducedOnTheDevice) {
  // 1 + 2^-7 is exact in bf16 (7 stored mantissa bits); the sum 2 + 2^-6 too.
  const float x = 1.0f + 1.0f / 128;
  Tensor t = device_from({x, float(rank + 1)}, DType::BF16);
  comm->all_reduce(t, ReduceOp::Sum);
  EXPECT_EQ(t.dtype(), DType::BF16);
  EXPECT_EQ(host_values(t), (std::vector<double>{2 * double(x), 3}));
}

TEST_F(Nccl, PointToPointCrossedOrderOnBothRanks) {
  const int peer = 1 - rank;
  comm->connect_ring_p2p(2);
  EXPECT_EQ(comm->p2p_links(), 4);  // (0 -> 1, 1 -> 0) x 2 lanes
  comm->connect_ring_p2p(2);        // again: nothing new
  EXPECT_EQ(comm->p2p_links(), 4);
  // 16 MiB messages: far above NCCL's buffers, so a send really waits for
  // its receive. Both ranks send before they receive, on the same lane
  // (two links, one per direction, so neither send waits behind a receive).
  const index_t n = index_t(4) << 20;
  auto pattern = [&](int from, int k) {
    Tensor h = Tensor::empty({n}, DType::F32);
    for (index_t i = 0; i < n; ++i) h.data<float>()[i] = float(1000 * from + 10 * k) + float(i % 7);
    return h.to_device();
  };
  auto expect_pattern = [&](const Tensor& got, int from, int k) {
    const Tensor want = pattern(from, k);
    EXPECT_EQ(host_values(got), host_values(want)) << "message " << k << " from " << from;
  };
  Tensor a0 = pattern(rank, 0), a1 = pattern(rank, 1), b0 = pattern(rank, 2);
  Tensor in_a0 = Tensor::empty({n}, DType::F32, MemorySpace::Cuda);
  Tensor in_a1 = Tensor::empty({n}, DType::F32, MemorySpace::Cuda);
  Tensor in_b0 = Tensor::empty({n}, DType::F32, MemorySpace::Cuda);
  // Lane 0: two isends then two receives. Lane 1: rank 0 receives before
  // it sends, rank 1 sends (blocking) before it receives: the orders of
  // interleaved 1F1B that deadlock on one stream.
  comm->isend(a0.raw(), std::size_t(n), DType::F32, peer, 0, 0);
  comm->isend(a1.raw(), std::size_t(n), DType::F32, peer, 1, 0);
  if (rank == 0) {
    comm->recv(in_b0.raw(), std::size_t(n), DType::F32, peer, 2, 1);
    comm->send(b0.raw(), std::size_t(n), DType::F32, peer, 2, 1);
  } else {
    comm->send(b0.raw(), std::size_t(n), DType::F32, peer, 2, 1);
    comm->recv(in_b0.raw(), std::size_t(n), DType::F32, peer, 2, 1);
  }
  comm->recv(in_a0.raw(), std::size_t(n), DType::F32, peer, 0, 0);
  comm->recv(in_a1.raw(), std::size_t(n), DType::F32, peer, 1, 0);
  comm->wait_sends();
  // No explicit synchronization: the host copies wait for the compute
  // stream, which waits for the receives.
  expect_pattern(in_a0, peer, 0);
  expect_pattern(in_a1, peer, 1);
  expect_pattern(in_b0, peer, 2);
  EXPECT_EQ(comm->stats().count(CollectiveKind::Send), 3);
  EXPECT_EQ(comm->stats().count(CollectiveKind::Recv), 3);
}

TEST_F(Nccl, WaitSendsOrdersLaterWritesAfterTheSend) {
  const int peer = 1 - rank;
  comm->connect_ring_p2p(1);
  const index_t n = index_t(4) << 20;
  Tensor sent = Tensor::empty({n}, DType::F32);
  for (index_t i = 0; i < n; ++i) sent.data<float>()[i] = float(i % 11) + 1;
  if (rank == 0) {
    Tensor out = sent.to_device();
    comm->isend(out.raw(), std::size_t(n), DType::F32, peer, 0, 0);
    comm->wait_sends();
    out.fill(0.0);  // compute stream: must wait until the send has read `out`
    // The receive is posted only after this sleep: an overwrite not ordered
    // after the send would have run by then, and rank 1 would get zeros.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    Tensor in = Tensor::empty({n}, DType::F32, MemorySpace::Cuda);
    comm->recv(in.raw(), std::size_t(n), DType::F32, peer, 0, 0);
    EXPECT_EQ(host_values(in), host_values(sent));
  }
  device::synchronize();
}

TEST_F(Nccl, GroupedExchange) {
  const int peer = 1 - rank;
  Tensor send = device_from({float(100 + rank)});
  Tensor recv = Tensor::empty({1}, DType::F32, MemorySpace::Cuda);
  const P2POp ops[] = {{P2POp::Send, send.raw(), 1, DType::F32, peer},
                       {P2POp::Recv, recv.raw(), 1, DType::F32, peer}};
  comm->batch_p2p(ops);
  EXPECT_EQ(host_values(recv), (std::vector<double>{double(100 + peer)}));
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

// ------------------------------------------------- pipeline p2p lanes ---

/// One send or receive of the pipeline executor, as trainer.cpp's
/// run_schedule issues them: a task receives its input first, computes, then
/// sends its output. Global chunk g = c pp + rank; chunk 0 embeds, the last
/// one holds the head; activations on lane 0 to rank + 1, gradients on lane
/// 1 to rank - 1 (mod pp), tag (micro-batch, receiving chunk, lane).
struct PipelineMessage {
  bool send;
  int peer, lane, tag;
};
struct PipelineStep {  // one task: its receive (if any), then its send (if any)
  std::vector<PipelineMessage> before, after;
};

/// The tasks of `rank`; name "evaluate" gives Trainer::evaluate's order.
std::vector<PipelineTask> tasks_of(const ScheduleShape& shape, int rank) {
  if (shape.name != "evaluate") return schedule_tasks(shape, rank);
  std::vector<PipelineTask> tasks;
  for (int m = 0; m < shape.micro_batches; ++m)
    for (int c = 0; c < shape.virtual_stages; ++c) tasks.push_back({PipelineTask::Forward, m, c});
  return tasks;
}

std::vector<std::vector<PipelineStep>> pipeline_program(const ScheduleShape& shape) {
  const int pp = shape.pp, total = pp * shape.virtual_stages;
  std::vector<std::vector<PipelineStep>> program(static_cast<std::size_t>(pp));
  for (int r = 0; r < pp; ++r)
    for (const PipelineTask& t : tasks_of(shape, r)) {
      const int g = t.chunk * pp + r, next = (r + 1) % pp, prev = (r + pp - 1) % pp;
      auto tag = [&](int to, int lane) { return (t.micro_batch * total + to) * 2 + lane; };
      PipelineStep step;
      if (t.kind == PipelineTask::Forward) {
        if (g > 0) step.before.push_back({false, prev, 0, tag(g, 0)});
        if (g < total - 1) step.after.push_back({true, next, 0, tag(g + 1, 0)});
      } else {
        if (g < total - 1) step.before.push_back({false, next, 1, tag(g, 1)});
        if (g > 0) step.after.push_back({true, prev, 1, tag(g - 1, 1)});
      }
      program[std::size_t(r)].push_back(step);
    }
  return program;
}

std::vector<ScheduleShape> pipeline_shapes() {
  std::vector<ScheduleShape> shapes;
  for (int pp = 2; pp <= 4; ++pp) {
    for (int m : {1, pp, 2 * pp + 1, 8}) {
      shapes.push_back({"gpipe", pp, 1, m});
      shapes.push_back({"1f1b", pp, 1, m});
    }
    for (int v = 2; v <= 3; ++v)
      for (int m : {pp, 2 * pp, 4 * pp}) shapes.push_back({"interleaved", pp, v, m});
    for (int v = 1; v <= 2; ++v) shapes.push_back({"evaluate", pp, v, 5});
  }
  return shapes;
}

std::string shape_name(const ScheduleShape& s) {
  return s.name + " pp" + std::to_string(s.pp) + " v" + std::to_string(s.virtual_stages) +
         " m" + std::to_string(s.micro_batches);
}

TEST(PipelineLanes, RingLinksAreEveryDirectedNeighbourPairOnce) {
  EXPECT_TRUE(ring_links(1, 0, 2).empty());
  // Two ranks: next and previous coincide; one link each way per lane.
  const std::vector<DirectedLink> two{{0, 0, 1}, {0, 1, 0}, {1, 0, 1}, {1, 1, 0}};
  EXPECT_EQ(ring_links(2, 0, 2), two);
  EXPECT_EQ(ring_links(2, 1, 2), (std::vector<DirectedLink>{{1, 0, 1}, {1, 1, 0}}));
  // Four ranks: 8 links per lane, each rank in 4 of them (to and from each
  // neighbour), the wrap-around 3 -> 0 and 0 -> 3 included.
  const auto four = ring_links(4, 0, 1);
  EXPECT_EQ(four.size(), 8u);
  for (int r = 0; r < 4; ++r) {
    int in = 0, out = 0;
    for (const DirectedLink& l : four) {
      EXPECT_EQ(std::abs(l.sender - l.receiver) % 2, 1);  // neighbours (mod 4)
      in += l.receiver == r;
      out += l.sender == r;
    }
    EXPECT_EQ(in, 2) << r;
    EXPECT_EQ(out, 2) << r;
  }
  EXPECT_NE(std::find(four.begin(), four.end(), DirectedLink{0, 3, 0}), four.end());
  EXPECT_NE(std::find(four.begin(), four.end(), DirectedLink{0, 0, 3}), four.end());
}

TEST(PipelineLanes, EveryLaneIsReceivedInSendOrder) {
  for (const ScheduleShape& shape : pipeline_shapes()) {
    // (sender, receiver, lane) -> tags in the sender's / the receiver's order
    std::map<std::tuple<int, int, int>, std::vector<int>> sent, received;
    const auto program = pipeline_program(shape);
    for (int r = 0; r < shape.pp; ++r)
      for (const PipelineStep& step : program[std::size_t(r)]) {
        for (const auto& m : step.before) received[{m.peer, r, m.lane}].push_back(m.tag);
        for (const auto& m : step.after) sent[{r, m.peer, m.lane}].push_back(m.tag);
      }
    EXPECT_EQ(sent, received) << shape_name(shape);
    // Lanes used: both directions, wrap-around links only with virtual stages.
    const int lanes = shape.name == "evaluate" ? 1 : 2;
    const int links_per_lane = shape.virtual_stages > 1 ? shape.pp : shape.pp - 1;
    EXPECT_EQ(sent.size(), std::size_t(lanes * links_per_lane)) << shape_name(shape);
  }
}

/// Simulate the GPU path: per rank a compute stream (receive waits and
/// tasks, in program order) and one stream per `stream_of(message)`. A send
/// or receive can start when it heads its stream and the compute work issued
/// before it is done, and completes only together with its partner (the n-th
/// message of the same sender, receiver and lane), as a blocking ncclSend /
/// ncclRecv. True when everything completes.
template <class StreamOf>
bool streams_complete(const ScheduleShape& shape, StreamOf stream_of) {
  using Link = std::tuple<int, int, int>;  // sender, receiver, lane
  struct Op {
    int rank;
    std::size_t compute_before;  // compute items issued before it
    bool done = false;
    int partner = -1;
  };
  struct Rank {
    std::vector<int> compute;  // -1: a task; otherwise the receive it waits for
    std::size_t compute_done = 0;
    std::map<int, std::vector<int>> streams;  // stream -> ops in issue order
    std::map<int, std::size_t> heads;
  };
  std::vector<Op> ops;
  std::vector<Rank> ranks(std::size_t(shape.pp));
  std::map<std::tuple<Link, bool, int>, int> by_position;  // (link, send, n) -> op
  std::map<std::pair<Link, bool>, int> counts;
  auto issue = [&](int r, const PipelineMessage& m) {
    const Link link = m.send ? Link{r, m.peer, m.lane} : Link{m.peer, r, m.lane};
    const int id = int(ops.size());
    ops.push_back({r, ranks[std::size_t(r)].compute.size()});
    by_position[{link, m.send, counts[{link, m.send}]++}] = id;
    ranks[std::size_t(r)].streams[stream_of(m)].push_back(id);
    return id;
  };
  const auto program = pipeline_program(shape);
  for (int r = 0; r < shape.pp; ++r)
    for (const PipelineStep& step : program[std::size_t(r)]) {
      for (const auto& m : step.before) ranks[std::size_t(r)].compute.push_back(issue(r, m));
      ranks[std::size_t(r)].compute.push_back(-1);
      for (const auto& m : step.after) issue(r, m);
    }
  for (const auto& [key, id] : by_position) {
    const auto& [link, send, n] = key;
    const auto partner = by_position.find({link, !send, n});
    if (partner == by_position.end()) return false;  // never received (or sent)
    ops[std::size_t(id)].partner = partner->second;
  }
  auto startable = [&](int id) {  // heads its stream, compute before it done
    const Op& op = ops[std::size_t(id)];
    const Rank& rank = ranks[std::size_t(op.rank)];
    if (rank.compute_done < op.compute_before) return false;
    for (const auto& [stream, queue] : rank.streams) {
      const std::size_t head = rank.heads.count(stream) ? rank.heads.at(stream) : 0;
      if (head < queue.size() && queue[head] == id) return true;
    }
    return false;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (Rank& rank : ranks) {
      while (rank.compute_done < rank.compute.size()) {
        const int wait = rank.compute[rank.compute_done];
        if (wait >= 0 && !ops[std::size_t(wait)].done) break;
        ++rank.compute_done;
        progress = true;
      }
      for (const auto& [stream, queue] : rank.streams) {
        std::size_t& head = rank.heads[stream];
        if (head == queue.size()) continue;
        const int id = queue[head];
        if (!ops[std::size_t(id)].done && startable(id) &&
            startable(ops[std::size_t(id)].partner)) {
          ops[std::size_t(id)].done = ops[std::size_t(ops[std::size_t(id)].partner)].done = true;
          progress = true;
        }
      }
      for (const auto& [stream, queue] : rank.streams) {
        std::size_t& head = rank.heads[stream];
        while (head < queue.size() && ops[std::size_t(queue[head])].done) ++head;
      }
    }
  }
  for (const Op& op : ops)
    if (!op.done) return false;
  for (const Rank& rank : ranks)
    if (rank.compute_done != rank.compute.size()) return false;
  return true;
}

TEST(PipelineLanes, StreamsCompleteWithOneLinkPerSenderReceiverAndLane) {
  for (const ScheduleShape& shape : pipeline_shapes()) {
    // The NCCL backend: one communicator and stream per directed link.
    EXPECT_TRUE(streams_complete(shape, [](const PipelineMessage& m) {
      return (m.peer * 2 + m.lane) * 2 + int(m.send);
    })) << shape_name(shape);
  }
  // Controls (the simulation can fail). One stream (and communicator) per
  // lane carrying a rank's sends and receives deadlocks under every
  // interleaved shape: with pp = 2, rank 0 sends activation 1 before it
  // receives the wrap-around activation 0, and rank 1 sends that before it
  // receives activation 1. One stream for everything deadlocks 1F1B.
  for (const ScheduleShape& shape : pipeline_shapes()) {
    if (shape.name != "interleaved") continue;
    EXPECT_FALSE(streams_complete(shape, [](const PipelineMessage& m) { return m.lane; }))
        << shape_name(shape);
  }
  EXPECT_FALSE(streams_complete(ScheduleShape{"1f1b", 2, 1, 4},
                                [](const PipelineMessage&) { return 0; }));
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

// training.bias_in_weight_gemm: auto (the reference above) puts qkv's and
// fc's biases in their GEMMs on the device (the ones column); = false runs
// the bias epilogues and column-sum kernels. The same run to rounding.
TEST(GpuTraining, BiasInWeightGemmMatchesTheBiasKernels) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  if (!is_rank0()) return;  // see one_gpu_reference()
  const RunResult kernels = testing::train_layout(
      MPI_COMM_SELF, Layout{.overrides = {"training.bias_in_weight_gemm=false"}}, DType::F32, 3,
      MemorySpace::Cuda);
  expect_same_run(one_gpu_reference(), kernels);
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
                      Layout{1, 2, 1, "gpipe", false, false},
                      Layout{1, 2, 1, "interleaved", false, false},
                      Layout{1, 1, 2, "1f1b", true, false}),
    [](const auto& info) { return info.param.name(); });

// BERT through the trainer on the device: its 1-GPU run equals the host's
// (padding mask, token types, both heads), and tp 2 + SP (the heads on the
// gathered final hidden states) and pp 2 (the last stage's word-table copy
// summed over the embedding group on NCCL) equal the 1-GPU run.
const std::vector<std::string> kBert{"model.arch=bert"};

const RunResult& one_gpu_bert_reference() {  // rank 0 only, as one_gpu_reference()
  static const RunResult ref = testing::train_layout(MPI_COMM_SELF, Layout{.overrides = kBert},
                                                     DType::F32, 3, MemorySpace::Cuda);
  return ref;
}

TEST(GpuTraining, BertOneGpuRunMatchesTheHostRun) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  if (!is_rank0()) return;  // see one_gpu_reference()
  const RunResult host =
      testing::train_layout(MPI_COMM_SELF, Layout{.overrides = kBert}, DType::F32, 3);
  ASSERT_EQ(host.params.count("pooler.weight"), 1u);
  expect_same_run(one_gpu_bert_reference(), host);
}

TEST(GpuTraining, BertSequenceAndPipelineParallelMatchOneGpuRun) {
  REQUIRE_TWO_GPUS();
  for (Layout layout : {Layout{2, 1, 1, "1f1b", false, true}, Layout{1, 2, 1, "1f1b"}}) {
    layout.overrides = kBert;
    SCOPED_TRACE(layout.name());
    const RunResult got =
        testing::train_layout(MPI_COMM_WORLD, layout, DType::F32, 3, MemorySpace::Cuda);
    if (is_rank0()) expect_same_run(got, one_gpu_bert_reference());
  }
}

// parallel.tp_copy_engine: the tp group's forward all-gathers and
// reduce-scatters (SP; the row-parallel bias and residual in the
// reduce-scatter's sum) on PeerExchange instead of NCCL, with and without
// the kept gathered input (which moves the backward's re-gathers too); the
// input gradients' overlapped reduce-scatters too (tp_copy_engine_min_bytes
// = 0: the test model's are a few KB).
TEST(GpuTraining, CopyEngineTpCollectivesMatchOneGpuRun) {
  REQUIRE_TWO_GPUS();
  if (!PeerExchange::available()) GTEST_SKIP() << "driver without stream memory operations";
  for (const char* keep : {"false", "true"}) {
    Layout ce{2, 1, 1, "1f1b", false, true};
    ce.overrides = {"parallel.tp_copy_engine=true", "parallel.tp_copy_engine_min_bytes=0",
                    std::string("parallel.sequence_parallel_keep_gathered=") + keep};
    const RunResult got = testing::train_layout(MPI_COMM_WORLD, ce, DType::F32, 3, MemorySpace::Cuda);
    if (is_rank0()) expect_same_run(got, one_gpu_reference());
  }
}

// Without SP on the copy engines (the 774M tp 2 runs' layout), every
// all-reduce on them (tp_copy_engine_min_bytes = 0: the test model's sums
// are a few KB), so the row-parallel layers' bias and residual ride in the
// sums (all_reduce_adding); plain and with interleaved micro-batches.
TEST(GpuTraining, CopyEngineTpWithoutSpMatchesOneGpuRun) {
  REQUIRE_TWO_GPUS();
  if (!PeerExchange::available()) GTEST_SKIP() << "driver without stream memory operations";
  for (const bool interleave : {false, true}) {
    SCOPED_TRACE(interleave ? "tp_interleave" : "plain");
    Layout ce{2, 1, 1, "1f1b", false, false};
    ce.overrides = {"parallel.tp_copy_engine=true", "parallel.tp_copy_engine_min_bytes=0"};
    if (interleave) ce.overrides.push_back("parallel.tp_interleave=true");
    const RunResult got = testing::train_layout(MPI_COMM_WORLD, ce, DType::F32, 3, MemorySpace::Cuda);
    if (is_rank0()) expect_same_run(got, one_gpu_reference());
  }
}

// parallel.tp_interleave at tp 2: with SP (the gathered input kept, as the
// 774M runs) on NCCL and on the copy engines, and without SP on NCCL, each
// with one side stream and with one per job (parallel.tp_interleave_streams):
// the paired micro-batches' blocking tp collectives run on a side stream
// with an event per call (and the copy-engine reduce-scatter's adds after
// the switch). One step without clipping equals the plain run bit for bit
// except the tied word table (test_tp_interleave.cpp says why), and three
// steps the 1-GPU run.
TEST(GpuTraining, TpInterleaveEqualsThePlainRunAndTheOneGpuRun) {
  REQUIRE_TWO_GPUS();
  const std::vector<std::pair<const char*, std::vector<std::string>>> transports = {
      {"SP, NCCL", {"parallel.sequence_parallel_keep_gathered=true"}},
      {"SP, copy engines",
       {"parallel.sequence_parallel_keep_gathered=true", "parallel.tp_copy_engine=true",
        "parallel.tp_copy_engine_min_bytes=0"}},
      {"no SP, NCCL", {}}};
  for (const auto& [label, overrides] : transports) {
    const bool sp = std::string(label).rfind("SP", 0) == 0;
    if (std::string(label).find("copy") != std::string::npos && !PeerExchange::available()) continue;
    for (const int streams : {1, 2}) {
      SCOPED_TRACE(std::string(label) + ", " + std::to_string(streams) + " side streams");
      Layout plain{2, 1, 1, "1f1b", false, sp};
      plain.overrides = overrides;
      Layout paired = plain;
      paired.overrides.push_back("parallel.tp_interleave=true");
      paired.overrides.push_back("parallel.tp_interleave_streams=" + std::to_string(streams));
      Layout plain_1 = plain, paired_1 = paired;
      plain_1.overrides.push_back("training.clip_grad=0");
      paired_1.overrides.push_back("training.clip_grad=0");
      const RunResult p =
          testing::train_layout(MPI_COMM_WORLD, plain_1, DType::F32, 1, MemorySpace::Cuda);
      const RunResult i =
          testing::train_layout(MPI_COMM_WORLD, paired_1, DType::F32, 1, MemorySpace::Cuda);
      EXPECT_EQ(i.losses, p.losses);
      EXPECT_GE(i.interleave_switches.at(0), 8 * 8 * 4);  // 8 pairs, 8 layers
      for (const auto& [name, values] : p.params) {
        if (name == "embedding.word.weight")
          EXPECT_LE(testing::norm_rel_error(i.params.at(name), values), 1e-6);
        else
          EXPECT_EQ(i.params.at(name), values) << name;
      }
      const RunResult got =
          testing::train_layout(MPI_COMM_WORLD, paired, DType::F32, 3, MemorySpace::Cuda);
      if (is_rank0()) expect_same_run(got, one_gpu_reference());
    }
  }
}

// training.cuda_graphs at tp 2 + SP: NCCL's collectives (and the backward's
// side-stream all-gathers) captured with the kernels; steps 2.. replayed
// equal the eager run bitwise, and so the 1-GPU run as every layout does.
TEST(GpuTraining, CudaGraphsAtTp2EqualTheEagerRunBitwise) {
  REQUIRE_TWO_GPUS();
  Layout eager{2, 1, 1, "1f1b", false, true};
  Layout graphed = eager;
  graphed.overrides = {"training.cuda_graphs=true"};
  const int steps = 3;  // as one_gpu_reference(); steps 2 and 3 replayed
  const RunResult e = testing::train_layout(MPI_COMM_WORLD, eager, DType::F32, steps,
                                            MemorySpace::Cuda);
  const RunResult g = testing::train_layout(MPI_COMM_WORLD, graphed, DType::F32, steps,
                                            MemorySpace::Cuda);
  EXPECT_EQ(g.losses, e.losses);
  EXPECT_EQ(g.grad_norms, e.grad_norms);
  for (const auto& [name, values] : e.params) EXPECT_EQ(g.params.at(name), values) << name;
  if (is_rank0()) expect_same_run(g, one_gpu_reference());
}

// tp 2 + SP with the gathered input of qkv/fc1 kept for the backward
// (parallel.sequence_parallel_keep_gathered) on NCCL.
TEST(GpuTraining, KeepingGatheredInputMatchesOneGpuRun) {
  REQUIRE_TWO_GPUS();
  Layout kept{2, 1, 1, "1f1b", false, true};
  kept.overrides = {"parallel.sequence_parallel_keep_gathered=true"};
  const RunResult got = testing::train_layout(MPI_COMM_WORLD, kept, DType::F32, 3, MemorySpace::Cuda);
  if (is_rank0()) expect_same_run(got, one_gpu_reference());
}

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

// Overlapped parameter all-gather on the device: step() leaves one grouped
// ncclBroadcast per bucket on the communicator's non-blocking stream and the
// forward hook makes the compute stream wait for each bucket's event; the
// result must equal the 1-GPU run (alone and with the overlapped reduction).
TEST(GpuTraining, OverlappedParamGatherMatchesOneGpuRun) {
  REQUIRE_TWO_GPUS();
  for (bool with_grad_overlap : {false, true}) {
    SCOPED_TRACE(with_grad_overlap ? "both overlaps" : "gather overlap");
    Layout layout{1, 1, 2, "1f1b", true, false};
    layout.overrides = {"parallel.overlap_param_gather=true", "parallel.grad_bucket_size=20000"};
    if (with_grad_overlap) layout.overrides.push_back("parallel.overlap_grad_reduce=true");
    const RunResult got =
        testing::train_layout(MPI_COMM_WORLD, layout, DType::F32, 3, MemorySpace::Cuda);
    ASSERT_GE(got.bucket_count, 3);
    if (is_rank0()) expect_same_run(got, one_gpu_reference());
  }
}

// training.attention_dropout_rng = cudnn at tp 2 + SP and at dp 2 with the
// distributed optimizer (a bf16 GPT with cuDNN's fused attention, dropout
// 0.1): both ranks run it, a rerun gives the same bits, and the run trains
// like the 1-GPU run with meshtron's own mask, within the noise of other
// masks. cuDNN's generator is by design not decomposition-invariant, so no
// bitwise comparison with one GPU; that each rank draws its own masks (the
// seed takes the sample offset and the first local head) is
// GpuCudnnAttention.DropoutSeedFollowsTheCallSite.
TEST(GpuTraining, CudnnDropoutRngAtTp2AndDp2IsReproducibleAndTrains) {
  REQUIRE_TWO_GPUS();
  // Per-rank attention shapes: tp 2 (2 of 4 heads, 2 samples), dp 2 (4 heads).
  for (const index_t heads : {2, 4}) {
    const cuda::CudnnAttentionSupport s =
        cuda::cudnn_attention_support(DType::BF16, 256, 2, heads, 64, 0.1);
    if (!s.forward || !s.backward) GTEST_SKIP() << "cuDNN cannot run the attention: " << s.why_not;
  }
  const std::vector<std::string> bf16_gpt = {
      "training.precision=bf16",     "model.attention_backend=fused",
      "model.num_layers=2",          "model.hidden_size=256",
      "model.num_attention_heads=4", "model.seq_length=256",
      "model.hidden_dropout=0",      "model.attention_dropout=0.1",
      "training.micro_batch_size=2", "training.global_batch_size=8",
      "training.train_iters=4"};
  const int steps = 4;
  RunResult ours;  // one GPU, meshtron's mask (rank 0 only: see one_gpu_reference())
  if (is_rank0()) {
    Layout one;
    one.overrides = bf16_gpt;
    ours = testing::train_layout(MPI_COMM_SELF, one, DType::BF16, steps, MemorySpace::Cuda);
  }
  const Layout tp2_sp{2, 1, 1, "1f1b", false, true}, dp2_distopt{1, 1, 2, "1f1b", true, false};
  for (Layout layout : {tp2_sp, dp2_distopt}) {
    SCOPED_TRACE(layout.name());
    layout.overrides = bf16_gpt;
    layout.overrides.push_back("training.attention_dropout_rng=cudnn");
    const RunResult dnn =
        testing::train_layout(MPI_COMM_WORLD, layout, DType::BF16, steps, MemorySpace::Cuda);
    const RunResult again =
        testing::train_layout(MPI_COMM_WORLD, layout, DType::BF16, steps, MemorySpace::Cuda);
    EXPECT_EQ(dnn.losses, again.losses);
    EXPECT_EQ(dnn.params, again.params);
    if (!is_rank0()) continue;
    EXPECT_NE(dnn.losses, ours.losses) << "cuDNN drew meshtron's mask?";
    for (int i = 0; i < steps; ++i) {
      EXPECT_TRUE(std::isfinite(dnn.losses[i]));
      EXPECT_NEAR(dnn.losses[i], ours.losses[i], 5e-2) << "step " << i + 1;
    }
    std::printf("%s losses, cuDNN's dropout / one GPU with meshtron's: first %.6f / %.6f, "
                "last %.6f / %.6f\n",
                layout.name().c_str(), dnn.losses.front(), ours.losses.front(), dnn.losses.back(),
                ours.losses.back());
  }
}
}  // namespace
}  // namespace meshtron
