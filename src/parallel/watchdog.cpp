#include "parallel/watchdog.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iomanip>
#include <new>
#include <sstream>
#include <thread>

#include "common/error.hpp"

namespace meshtron {

namespace {

constexpr const char* kGroupNames[] = {"world", "tp", "dp", "pp", "model-parallel", "embedding",
                                       "stack"};
static_assert(std::size(kGroupNames) == std::size_t(GroupKind::kCount));

constexpr const char* kOpNames[] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "send", "recv",
    "batch_p2p", "wait_sends", "wait_collectives", "wait_collective", "stream synchronise"};
static_assert(std::size(kOpNames) == std::size_t(WaitOp::kCount));

/// A peer's state read: the read itself gets this long (a peer whose MPI
/// needs it to progress for a one-sided read may be stuck outside MPI).
constexpr double kReadDeadlineS = 2.0;
constexpr std::int64_t kUnreadable = -2;

std::string position(const RankState& s) {
  std::ostringstream os;
  os << "step " << s.step;
  if (s.micro_batch >= 0) os << " micro-batch " << s.micro_batch;
  return os.str();
}

std::string ranks_text(std::span<const int> ranks) {
  std::ostringstream os;
  for (std::size_t i = 0; i < ranks.size(); ++i) os << (i ? " " : "") << ranks[i];
  return os.str();
}

}  // namespace

const char* group_name(GroupKind kind) { return kGroupNames[int(kind)]; }
const char* op_name(WaitOp op) { return kOpNames[int(op)]; }

std::vector<int> missing_peers(const WaitSite& site, std::span<const RankState> states) {
  std::vector<int> missing;
  for (std::size_t i = 0; i < site.members.size(); ++i) {
    const int r = site.members[i];
    const bool behind = site.collective > 0 ? states[i].started[int(site.group)] < site.collective
                        : site.peer >= 0    ? r == site.peer
                                            : r != site.self;
    if (behind) missing.push_back(r);
  }
  return missing;
}

std::string describe(const RankState& s) {
  if (s.op == kUnreadable) return "state unreadable";
  std::ostringstream os;
  if (s.op < 0 || s.op >= int(WaitOp::kCount))
    os << "outside communication";
  else
    os << "in " << op_name(WaitOp(s.op)) << " on the " << group_name(GroupKind(s.group))
       << " group";
  os << " at " << position(s);
  return os.str();
}

std::string timeout_report(int world_rank, const WaitSite& site, double waited_s,
                           const RankState& self, std::span<const RankState> states) {
  std::ostringstream os;
  os << "meshtron: watchdog: rank " << world_rank << " waited " << std::fixed
     << std::setprecision(1) << waited_s << " s in " << op_name(site.op);
  if (site.peer >= 0) os << (site.op == WaitOp::Recv ? " from" : " to") << " rank " << site.peer;
  os << " on the " << group_name(site.group) << " group (world ranks "
     << ranks_text(site.members) << ") at " << position(self);
  if (site.collective > 0) os << " (collective " << site.collective << " of the group)";
  const std::vector<int> missing = missing_peers(site, states);
  os << "; not arrived:";
  if (missing.empty()) os << " none (every member has started it)";
  for (std::size_t k = 0; k < missing.size(); ++k) {
    std::size_t i = 0;
    while (site.members[i] != missing[k]) ++i;
    os << (k ? ";" : "") << " rank " << missing[k] << " (";
    if (site.collective > 0) os << "started " << states[i].started[int(site.group)] << "; ";
    os << describe(states[i]) << ")";
  }
  return os.str();
}

SkipHook SkipHook::parse(const std::string& text) {
  SkipHook h;
  if (text.empty()) return h;
  const std::string what = "parallel.debug_skip_collective = '" + text +
                           "': expected RANK:STEP or RANK:STEP:GROUP (GROUP one of world, "
                           "tp, dp, pp, model-parallel, embedding)";
  std::istringstream in(text);
  std::string rank, step, group;
  std::getline(in, rank, ':');
  std::getline(in, step, ':');
  std::getline(in, group);
  try {
    std::size_t used_rank = 0, used_step = 0;
    h.rank = std::stoi(rank, &used_rank);
    h.step = std::stol(step, &used_step);
    MESH_REQUIRE(used_rank == rank.size() && used_step == step.size() && h.rank >= 0 &&
                     h.step >= 1,
                 what);
  } catch (const std::logic_error&) {  // stoi's invalid_argument / out_of_range
    MESH_REQUIRE(false, what);
  }
  if (!group.empty()) {
    for (int g = 0; g < int(GroupKind::kCount); ++g)
      if (group == kGroupNames[g]) h.group = g;
    MESH_REQUIRE(h.group >= 0, what);
  }
  return h;
}

std::vector<int> world_ranks_of(MPI_Comm comm, MPI_Comm world) {
  MPI_Group group, world_group;
  MPI_CHECK(MPI_Comm_group(comm, &group));
  MPI_CHECK(MPI_Comm_group(world, &world_group));
  int n = 0;
  MPI_CHECK(MPI_Group_size(group, &n));
  std::vector<int> local(static_cast<std::size_t>(n)), global(local.size());
  for (int i = 0; i < n; ++i) local[std::size_t(i)] = i;
  MPI_CHECK(MPI_Group_translate_ranks(group, n, local.data(), world_group, global.data()));
  MPI_CHECK(MPI_Group_free(&group));
  MPI_CHECK(MPI_Group_free(&world_group));
  return global;
}

CollectiveWatchdog::CollectiveWatchdog(MPI_Comm world, double timeout_s, SkipHook skip)
    : timeout_s_(timeout_s), skip_(skip) {
  MPI_CHECK(MPI_Comm_dup(world, &world_));
  MPI_CHECK(MPI_Comm_rank(world_, &world_rank_));
  MPI_CHECK(MPI_Win_allocate(MPI_Aint(sizeof(RankState)), 1, MPI_INFO_NULL, world_, &mine_,
                             &win_));
  new (mine_) RankState{};
  // One passive epoch for the run: reads need no further synchronisation
  // with the peer they read.
  MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
  MPI_CHECK(MPI_Barrier(world_));  // every window initialised before any read
}

CollectiveWatchdog::~CollectiveWatchdog() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
  MPI_Comm_free(&world_);
}

void CollectiveWatchdog::publish(std::int64_t& word, std::int64_t value) {
  // The window's memory (MPI's unified model on shared memory): a plain
  // atomic store, read by peers' MPI_Rget.
  std::atomic_ref<std::int64_t>(word).store(value, std::memory_order_relaxed);
}

void CollectiveWatchdog::set_position(long step, int micro_batch) {
  publish(mine_->step, step);
  publish(mine_->micro_batch, micro_batch);
}

long CollectiveWatchdog::start_collective(GroupKind group) {
  std::int64_t& started = mine_->started[int(group)];
  const long next = long(started) + 1;
  if (!skipped_ && skip_.rank == world_rank_ && skip_.step == mine_->step &&
      (skip_.group < 0 || skip_.group == int(group))) {
    skipped_ = true;
    stall(group, next);
  }
  publish(started, next);
  return next;
}

void CollectiveWatchdog::stall(GroupKind group, long collective) {
  std::fprintf(stderr,
               "meshtron: parallel.debug_skip_collective: rank %d does not arrive at "
               "collective %ld of the %s group (step %ld)\n",
               world_rank_, collective, group_name(group), long(mine_->step));
  std::fflush(stderr);
  // Wait outside the collective, in MPI now and then (a one-sided read of
  // this rank may need it), until a peer's watchdog ends the job; a few
  // timeouts later, end it from here.
  const double t0 = MPI_Wtime();
  while (MPI_Wtime() - t0 < 4 * timeout_s_ + 10) {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, world_, &flag, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::fprintf(stderr, "meshtron: parallel.debug_skip_collective: no peer timed out\n");
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void CollectiveWatchdog::yield_core() { std::this_thread::yield(); }

void CollectiveWatchdog::begin_wait(const WaitSite& site) {
  publish(mine_->group, int(site.group));
  publish(mine_->op, int(site.op));
}

void CollectiveWatchdog::end_wait(double waited_s) {
  publish(mine_->op, -1);
  waited_s_ += waited_s;
}

void CollectiveWatchdog::wait(std::span<MPI_Request> requests, const WaitSite& site) {
  begin_wait(site);
  const double t0 = MPI_Wtime();
  int done = 0;
  for (;;) {
    MPI_CHECK(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
    if (done) break;
    if (MPI_Wtime() - t0 > timeout_s_) expire(site, MPI_Wtime() - t0);
    yield_core();
  }
  end_wait(MPI_Wtime() - t0);
}

std::vector<RankState> CollectiveWatchdog::read_states(std::span<const int> world_ranks) {
  std::vector<RankState> states(world_ranks.size());
  for (std::size_t i = 0; i < world_ranks.size(); ++i) {
    MPI_Request r;
    MPI_CHECK(MPI_Rget(&states[i], int(sizeof(RankState)), MPI_BYTE, world_ranks[i], 0,
                       int(sizeof(RankState)), MPI_BYTE, win_, &r));
    const double t0 = MPI_Wtime();
    int done = 0;
    while (!done && MPI_Wtime() - t0 < kReadDeadlineS)
      MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (!done) states[i].op = kUnreadable;  // the request is abandoned: the job aborts
  }
  return states;
}

void CollectiveWatchdog::expire(const WaitSite& site, double waited_s) {
  const std::vector<RankState> states = read_states(site.members);
  const std::string report = timeout_report(world_rank_, site, waited_s, *mine_, states);
  std::fprintf(stderr, "%s\n", report.c_str());
  const std::vector<int> missing = missing_peers(site, states);
  std::ostringstream summary;
  summary << "meshtron: watchdog: aborting the job: " << op_name(site.op) << " on the "
          << group_name(site.group) << " group timed out after " << std::fixed
          << std::setprecision(1) << waited_s << " s (parallel.collective_timeout_s = "
          << timeout_s_ << ") on rank " << world_rank_ << ", waiting for rank(s) "
          << (missing.empty() ? std::string("?") : ranks_text(missing));
  std::fprintf(stderr, "%s\n", summary.str().c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace meshtron
