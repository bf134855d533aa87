// Every collective and p2p of the MPI Communicator against a serial
// computation of the same result, for fp32 and bf16 payloads. Each rank's
// data is a deterministic function of (rank, index), so every rank can
// compute what the whole group should produce.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <vector>

#include "parallel/communicator.hpp"

namespace meshtron {
namespace {

// Small integers and halves: exact in bf16 and in any summation order.
float value(int rank, std::size_t i) { return float((rank * 7 + int(i) * 3) % 13) * 0.5f - 3.0f; }

template <class T>
std::vector<T> payload(int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(value(rank, i));
  return v;
}

template <class T>
float as_float(T v) { return float(v); }

template <class T>
class CommunicatorTest : public ::testing::Test {
 protected:
  MpiCommunicator comm{MPI_COMM_WORLD};
  int rank = comm.rank(), size = comm.size();
  DType dtype = dtype_v<T>;
};

using Payloads = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(CommunicatorTest, Payloads);

TYPED_TEST(CommunicatorTest, AllReduceSumAndMax) {
  for (std::size_t n : {1u, 7u, 1000u}) {
    auto sum = payload<TypeParam>(this->rank, n), mx = sum;
    this->comm.all_reduce(sum.data(), n, this->dtype, ReduceOp::Sum);
    this->comm.all_reduce(mx.data(), n, this->dtype, ReduceOp::Max);
    for (std::size_t i = 0; i < n; ++i) {
      float s = 0, m = -1e30f;
      for (int r = 0; r < this->size; ++r) {
        s += value(r, i);
        m = std::max(m, value(r, i));
      }
      ASSERT_EQ(as_float(sum[i]), s) << "i=" << i;
      ASSERT_EQ(as_float(mx[i]), m) << "i=" << i;
    }
  }
}

TYPED_TEST(CommunicatorTest, ReduceScatterAndAllGather) {
  const std::size_t block = 5;
  auto send = payload<TypeParam>(this->rank, block * this->size);
  std::vector<TypeParam> recv(block);
  this->comm.reduce_scatter(send.data(), recv.data(), block, this->dtype, ReduceOp::Sum);
  for (std::size_t i = 0; i < block; ++i) {
    float s = 0;
    for (int r = 0; r < this->size; ++r) s += value(r, this->rank * block + i);
    ASSERT_EQ(as_float(recv[i]), s);
  }
  auto mine = payload<TypeParam>(this->rank, block);
  std::vector<TypeParam> all(block * this->size);
  this->comm.all_gather(mine.data(), all.data(), block, this->dtype);
  for (int r = 0; r < this->size; ++r)
    for (std::size_t i = 0; i < block; ++i)
      ASSERT_EQ(as_float(all[r * block + i]), value(r, i));
}

TYPED_TEST(CommunicatorTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < this->size; ++root) {
    auto v = payload<TypeParam>(this->rank, 9);
    this->comm.broadcast(v.data(), v.size(), this->dtype, root);
    for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(as_float(v[i]), value(root, i));
  }
  this->comm.barrier();
}

TYPED_TEST(CommunicatorTest, RingSendRecvAndBatchedP2P) {
  if (this->size < 2) GTEST_SKIP() << "p2p needs 2 ranks";
  const int next = (this->rank + 1) % this->size;
  const int prev = (this->rank + this->size - 1) % this->size;
  auto mine = payload<TypeParam>(this->rank, 11);
  std::vector<TypeParam> got(11);
  // Blocking ring: even ranks send first to avoid a cycle of waits.
  if (this->rank % 2 == 0) {
    this->comm.send(mine.data(), 11, this->dtype, next, 1);
    this->comm.recv(got.data(), 11, this->dtype, prev, 1);
  } else {
    this->comm.recv(got.data(), 11, this->dtype, prev, 1);
    this->comm.send(mine.data(), 11, this->dtype, next, 1);
  }
  for (std::size_t i = 0; i < 11; ++i) ASSERT_EQ(as_float(got[i]), value(prev, i));

  // Batched exchange with both neighbours at once, as pipeline p2p does.
  std::vector<TypeParam> from_prev(11), from_next(11);
  const P2POp ops[] = {
      {P2POp::Send, mine.data(), 11, this->dtype, next, 2},
      {P2POp::Send, mine.data(), 11, this->dtype, prev, 3},
      {P2POp::Recv, from_prev.data(), 11, this->dtype, prev, 2},
      {P2POp::Recv, from_next.data(), 11, this->dtype, next, 3},
  };
  this->comm.batch_p2p(ops);
  for (std::size_t i = 0; i < 11; ++i) {
    ASSERT_EQ(as_float(from_prev[i]), value(prev, i));
    ASSERT_EQ(as_float(from_next[i]), value(next, i));
  }
}

TEST(CommunicatorStats, CountsCallsByKind) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  float x = 1;
  comm.all_reduce(&x, 1, DType::F32, ReduceOp::Sum);
  comm.all_reduce(&x, 1, DType::F32, ReduceOp::Sum);
  comm.barrier();
  EXPECT_EQ(comm.stats().count(CollectiveKind::AllReduce), 2);
  EXPECT_EQ(comm.stats().count(CollectiveKind::Barrier), 1);
  EXPECT_EQ(comm.stats().count(CollectiveKind::AllGather), 0);
  comm.reset_stats();
  EXPECT_EQ(comm.stats().count(CollectiveKind::AllReduce), 0);
}

TEST(HalfTypes, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float(bf16(1.00390625f)), 1.0f);       // halfway: ties to even
  EXPECT_EQ(float(bf16(1.01171875f)), 1.015625f);  // halfway: ties to even (up)
  EXPECT_TRUE(std::isnan(float(bf16(std::nanf("")))));
  EXPECT_EQ(float(fp16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(float(fp16(1e6f))));
  EXPECT_EQ(float(fp16(5.9604645e-8f)), 5.9604645e-8f);  // smallest subnormal
  for (float f : {0.0f, -2.5f, 0.333f, 1000.1f}) EXPECT_NEAR(float(fp16(f)), f, 1e-3 * (1 + std::fabs(f)));
}

}  // namespace
}  // namespace meshtron
