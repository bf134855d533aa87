#include "train/stop_request.hpp"

#include <csignal>
#include <cstring>
#include <sstream>

#include "common/error.hpp"

namespace meshtron {

namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};
/// A stop for the time limit, as a code beside the signal numbers.
constexpr int kTimeLimit = 1000;

/// The one piece of process-wide state: a signal handler can reach nothing
/// else. Holds the last stop signal received, 0 before any.
volatile std::sig_atomic_t g_received_signal = 0;

extern "C" void record_stop_signal(int signal) { g_received_signal = signal; }

struct sigaction g_previous[std::size(kStopSignals)];

std::string signal_line(int signal) {
  return MESH_MSG("received " << (signal == SIGTERM  ? "SIGTERM"
                                  : signal == SIGINT ? "SIGINT"
                                                     : "SIGUSR1"));
}

}  // namespace

StopRequest::StopRequest(double exit_duration_mins)
    : exit_after_s_(60 * exit_duration_mins), start_(std::chrono::steady_clock::now()) {
  g_received_signal = 0;
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i)
    sigaction(kStopSignals[i], &action, &g_previous[i]);
}

StopRequest::~StopRequest() {
  for (std::size_t i = 0; i < std::size(kStopSignals); ++i)
    sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

std::string StopRequest::agree(Communicator& comm) const {
  int mine = g_received_signal;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (mine == 0 && exit_after_s_ > 0 && elapsed >= exit_after_s_) mine = kTimeLimit;
  // Through the communicator, so the collective watchdog covers this
  // per-step collective like every other.
  const int agreed = int(comm.all_reduce_scalar(double(mine), ReduceOp::Max));
  if (agreed == 0) return "";
  if (agreed == kTimeLimit)
    return MESH_MSG("run.exit_duration_mins = " << exit_after_s_ / 60 << " reached");
  return signal_line(agreed);
}

std::string StopRequest::received() const {
  const int signal = g_received_signal;
  return signal == 0 ? "" : signal_line(signal);
}

}  // namespace meshtron
