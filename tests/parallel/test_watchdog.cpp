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

}  // namespace
}  // namespace meshtron::testing
