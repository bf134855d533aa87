// The collective watchdog's parts that need no hang: which members a
// waiting rank reports as not arrived, the report line, the test hook's
// deck value, and (on 2 ranks) the one-sided read of a peer's published
// state and a watched communicator's collective count. The hang itself is
// tests/parallel/watchdog.sh (meshtron train on 4 and 8 ranks).
#include <gtest/gtest.h>
#include <mpi.h>

#include "common/error.hpp"
#include "parallel/communicator.hpp"
#include "parallel/watchdog.hpp"

namespace meshtron::testing {
namespace {

RankState started(GroupKind g, long n) {
  RankState s;
  s.started[int(g)] = n;
  return s;
}

TEST(Watchdog, CollectiveMissingAreTheMembersBehind) {
  const std::vector<int> members{4, 5, 6, 7};
  const std::vector<RankState> states{started(GroupKind::Dp, 9), started(GroupKind::Dp, 8),
                                      started(GroupKind::Dp, 10), started(GroupKind::Tp, 12)};
  const WaitSite site{GroupKind::Dp, WaitOp::AllReduce, 9, -1, members, 4};
  // Rank 5 has started 8 dp collectives, rank 7 none (its tp count is another group's).
  EXPECT_EQ(missing_peers(site, states), (std::vector<int>{5, 7}));
}

TEST(Watchdog, PointToPointMissingIsThePeerOrEveryOtherMember) {
  const std::vector<int> members{1, 5};
  const std::vector<RankState> states(2);
  const WaitSite recv{GroupKind::Pp, WaitOp::Recv, 0, 5, members, 1};
  EXPECT_EQ(missing_peers(recv, states), (std::vector<int>{5}));
  const WaitSite sends{GroupKind::Pp, WaitOp::WaitSends, 0, -1, members, 5};
  EXPECT_EQ(missing_peers(sends, states), (std::vector<int>{1}));
}

TEST(Watchdog, ReportNamesOperationGroupPositionAndMissingRank) {
  const std::vector<int> members{0, 1};
  RankState self = started(GroupKind::Tp, 41);
  self.step = 2;
  self.micro_batch = 3;
  RankState peer = started(GroupKind::Tp, 40);
  peer.step = 2;
  peer.op = int(WaitOp::Recv);
  peer.group = int(GroupKind::Pp);
  const std::vector<RankState> states{self, peer};
  const WaitSite site{GroupKind::Tp, WaitOp::AllReduce, 41, -1, members, 0};
  EXPECT_EQ(timeout_report(0, site, 5.04, self, states),
            "meshtron: watchdog: rank 0 waited 5.0 s in all_reduce on the tp group (world "
            "ranks 0 1) at step 2 micro-batch 3 (collective 41 of the group); not arrived: "
            "rank 1 (started 40; in recv on the pp group at step 2)");
}

TEST(Watchdog, SkipHookParsesAndRejects) {
  const SkipHook h = SkipHook::parse("3:7:dp");
  EXPECT_EQ(h.rank, 3);
  EXPECT_EQ(h.step, 7);
  EXPECT_EQ(h.group, int(GroupKind::Dp));
  EXPECT_EQ(SkipHook::parse("1:2").group, -1);
  EXPECT_EQ(SkipHook::parse("").rank, -1);
  for (const char* bad : {"1", "x:2", "1:0", "1:2:nope", "1:2x", "-1:2"})
    EXPECT_THROW(SkipHook::parse(bad), UserError) << bad;
}

TEST(Watchdog, PeersReadEachOthersPublishedState) {
  CollectiveWatchdog dog(MPI_COMM_WORLD, 60.0);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dog.set_position(10 + rank, rank);
  MpiCommunicator world(MPI_COMM_WORLD);
  world.watch(dog, GroupKind::World);
  world.barrier();  // a watched collective: counted on every rank alike
  const double sum = world.all_reduce_scalar(1.0);
  EXPECT_EQ(sum, double(size));
  MPI_Barrier(MPI_COMM_WORLD);  // every rank past its watched waits
  std::vector<int> all(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) all[std::size_t(r)] = r;
  const std::vector<RankState> states = dog.read_states(all);
  for (int r = 0; r < size; ++r) {
    const RankState& s = states[std::size_t(r)];
    EXPECT_EQ(s.step, 10 + r);
    EXPECT_EQ(s.micro_batch, r);
    // A group of one rank starts no collective (no MPI call at all).
    EXPECT_EQ(s.started[int(GroupKind::World)], size > 1 ? 2 : 0);
    EXPECT_EQ(s.op, -1);  // not waiting any more
  }
  MPI_Barrier(MPI_COMM_WORLD);  // no rank frees the window while a peer reads it
}

TEST(Watchdog, WatchedOperationsGiveTheirResults) {
  CollectiveWatchdog dog(MPI_COMM_WORLD, 60.0);
  MpiCommunicator c(MPI_COMM_WORLD);
  c.watch(dog, GroupKind::Dp);
  const int n = c.size(), me = c.rank();
  const auto un = static_cast<std::size_t>(n);
  std::vector<double> v(un, double(me + 1)), out(un, 0.0);
  c.all_reduce(v.data(), un, DType::F64, ReduceOp::Sum);
  EXPECT_EQ(v[0], n * (n + 1) / 2.0);
  std::vector<double> send(un, double(me + 1));
  c.reduce_scatter(send.data(), out.data(), 1, DType::F64, ReduceOp::Max);
  EXPECT_EQ(out[0], double(n));
  const double mine = me;
  c.all_gather(&mine, out.data(), 1, DType::F64);
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[std::size_t(r)], r);
  double root_value = me == 0 ? 7.0 : 0.0;
  c.broadcast(&root_value, 1, DType::F64, 0);
  EXPECT_EQ(root_value, 7.0);
  const std::vector<std::size_t> ones(un, 1);
  std::fill(out.begin(), out.end(), 0.0);
  c.ireduce_scatter(send.data(), out.data(), ones, DType::F64, ReduceOp::Sum);
  c.wait_collectives();
  EXPECT_EQ(out[0], n * (n + 1) / 2.0);
  const long ticket = c.iall_gather(&mine, out.data(), ones, DType::F64);
  c.wait_collective(ticket);
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[std::size_t(r)], r);
  // Point-to-point around the ring: isend + recv, then send/recv as a batch.
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  double got = -1;
  c.isend(&mine, 1, DType::F64, next, 3);
  c.recv(&got, 1, DType::F64, prev, 3);
  c.wait_sends();
  EXPECT_EQ(got, prev);
  got = -1;
  const P2POp ops[] = {{P2POp::Send, const_cast<double*>(&mine), 1, DType::F64, next, 4},
                       {P2POp::Recv, &got, 1, DType::F64, prev, 4}};
  c.batch_p2p(ops);
  EXPECT_EQ(got, prev);
  c.barrier();
  // all_reduce, reduce_scatter, all_gather, broadcast, ireduce_scatter,
  // iall_gather, barrier: 7 collectives (none on a group of one rank).
  EXPECT_EQ(dog.state().started[int(GroupKind::Dp)], n > 1 ? 7 : 0);
  EXPECT_EQ(dog.state().op, -1);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace meshtron::testing
