// CollectiveWatchdog: parallel.collective_timeout_s. A rank that waits
// longer than the timeout for a collective, a point-to-point transfer or a
// non-blocking collective names what it waits in and who has not arrived,
// then aborts the job, instead of hanging until the batch system kills it.
//
// How. Each rank publishes its RankState (below) in an MPI RMA window over
// a duplicate of the world communicator: the trainer's position, the
// operation it is waiting in, and per group the number of collectives it
// has started. A watched communicator starts every operation non-blocking
// and waits in an MPI_Test loop with a deadline. On expiry the rank reads
// the states of its group's members with MPI_Rget (one-sided: on one node
// Open MPI reads the peer's memory directly, whatever the peer is doing;
// each read has its own short deadline, so an unreadable peer is reported
// as such rather than hanging the report), and the members that have not
// started the collective it waits in are the missing ones:
//
//   meshtron: watchdog: rank 0 waited 5.0 s in all_reduce on the tp group
//   (world ranks 0 1) at step 2 micro-batch 0 (collective 41 of the group);
//   not arrived: rank 1 (started 40; outside communication at step 2 ...)
//
// then MPI_Abort. With the timeout 0 (the default) nothing here exists and
// the communicators make their blocking calls as before.
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace meshtron {

/// The groups of a rank (one communicator of each kind per rank).
enum class GroupKind : int { World, Tp, Dp, Pp, Model, Embedding, Stack, kCount };
/// "world", "tp", "dp", "pp", "model-parallel", "embedding", "stack".
const char* group_name(GroupKind kind);

/// What a rank waits in.
enum class WaitOp : int {
  AllReduce, ReduceScatter, AllGather, Broadcast, Barrier, Send, Recv, BatchP2P,
  WaitSends, WaitCollectives, WaitCollective, StreamSync, kCount
};
/// "all_reduce", "recv", "wait_collectives", ...
const char* op_name(WaitOp op);

/// One rank's published state (int64 words: a peer's read sees each word
/// whole; a snapshot may mix two moments, harmless for a report).
struct RankState {
  std::int64_t step = 0;
  std::int64_t micro_batch = -1;  ///< -1: outside the pipeline schedule
  std::int64_t op = -1;           ///< WaitOp waited in; -1: not waiting
  std::int64_t group = -1;        ///< GroupKind of that wait
  /// Collectives started on each group (a group of one rank starts none).
  std::array<std::int64_t, int(GroupKind::kCount)> started{};
};

/// Where a rank waits: filled by the communicator.
struct WaitSite {
  GroupKind group;
  WaitOp op;
  long collective = 0;  ///< the group's collective number waited for; 0 for p2p
  int peer = -1;        ///< world rank of a point-to-point peer, else -1
  std::span<const int> members;  ///< the group's world ranks
  int self = -1;        ///< the waiting rank's world rank
};

/// The members (world ranks; `states[i]` is `members[i]`'s) that have not
/// started collective number `collective` of `group`; for a point-to-point
/// wait (collective 0) the peer, or where the wait has several peers
/// (wait_sends, batch_p2p: peer -1) every other member.
std::vector<int> missing_peers(const WaitSite& site, std::span<const RankState> states);
/// "outside communication at step 2 micro-batch 0", "in recv on the pp
/// group at step ...".
std::string describe(const RankState& s);
/// The report line of a rank that waited `waited_s` at `site` in `self`.
std::string timeout_report(int world_rank, const WaitSite& site, double waited_s,
                           const RankState& self, std::span<const RankState> states);

/// parallel.debug_skip_collective = RANK:STEP[:GROUP] (a test aid): world
/// rank RANK never arrives at its first collective of step STEP (on GROUP,
/// or on any group): it stops there, outside MPI's collective, as a rank
/// stuck in compute or I/O would.
struct SkipHook {
  int rank = -1;  ///< -1: off
  long step = 0;
  int group = -1;  ///< GroupKind, -1: any
  /// Parses the deck value ("" = off); UserError naming the key otherwise.
  static SkipHook parse(const std::string& text);
};

/// The deck's parallel.collective_timeout_s and parallel.debug_skip_collective.
struct WatchdogSettings {
  double timeout_s = 0;  ///< 0: no watchdog
  SkipHook skip;
};

class CollectiveWatchdog {
 public:
  /// Collective over `world`.
  CollectiveWatchdog(MPI_Comm world, double timeout_s, SkipHook skip = {});
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  double timeout_s() const { return timeout_s_; }
  MPI_Comm world() const { return world_; }

  /// The trainer's position, printed in a report (micro_batch -1: outside
  /// the pipeline schedule, e.g. in the optimizer step).
  void set_position(long step, int micro_batch);

  /// A collective of `group` starts: returns its number in the group.
  /// Where the test hook says so, never returns.
  long start_collective(GroupKind group);
  /// MPI_Waitall of `requests` with the deadline; on expiry report and abort.
  void wait(std::span<MPI_Request> requests, const WaitSite& site);
  /// For waits that are not MPI requests (a CUDA stream): mark the wait,
  /// `done()` polled until true or the deadline; `on_expiry` runs before the
  /// report (ncclCommAbort).
  template <class Done, class OnExpiry>
  void wait_until(Done done, const WaitSite& site, OnExpiry on_expiry) {
    begin_wait(site);
    const double t0 = MPI_Wtime();
    while (!done()) {
      if (MPI_Wtime() - t0 > timeout_s_) {
        on_expiry();
        expire(site, MPI_Wtime() - t0);
      }
      yield_core();
    }
    end_wait(MPI_Wtime() - t0);
  }

  /// Seconds this rank has spent in watched waits so far (the stragglers'
  /// line: a step's time less its waits is the rank's own work).
  double waited_seconds() const { return waited_s_; }

  /// This rank's state (tests).
  const RankState& state() const { return *mine_; }
  /// Reads the states of `world_ranks` (one-sided; an unreadable one comes
  /// back with op = -2).
  std::vector<RankState> read_states(std::span<const int> world_ranks);

 private:
  void begin_wait(const WaitSite& site);
  void end_wait(double waited_s);
  [[noreturn]] void expire(const WaitSite& site, double waited_s);
  [[noreturn]] void stall(GroupKind group, long collective);
  void publish(std::int64_t& word, std::int64_t value);
  /// Between two polls: CPU ranks oversubscribing their cores (the tests)
  /// would otherwise spin away the time of the peer they wait for.
  static void yield_core();

  MPI_Comm world_ = MPI_COMM_NULL;  ///< Owned: a duplicate of the world given.
  MPI_Win win_ = MPI_WIN_NULL;
  RankState* mine_ = nullptr;  ///< The window's memory (MPI_Win_allocate).
  double timeout_s_;
  SkipHook skip_;
  bool skipped_ = false;
  double waited_s_ = 0;
  int world_rank_ = 0;
};

/// The world ranks of `comm`'s members, in `comm`'s rank order.
std::vector<int> world_ranks_of(MPI_Comm comm, MPI_Comm world);

}  // namespace meshtron
