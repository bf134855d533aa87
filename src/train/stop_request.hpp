// Stopping a run early and cleanly: on SIGTERM, SIGINT or SIGUSR1 (what
// Slurm and PBS send ahead of a walltime kill or a preemption) or when
// run.exit_duration_mins has passed, every rank agrees at the next step
// boundary, the run saves a checkpoint and exits 0 with a line saying why.
//
// The handler only records the signal (async-signal-safe); the ranks agree
// through one small all-reduce per step, so a signal delivered to a single
// rank (or to all of them at slightly different steps) stops them all
// after the same step.
#pragma once

#include <chrono>
#include <string>

#include "parallel/communicator.hpp"

namespace meshtron {

class StopRequest {
 public:
  /// Installs the handlers (restored by the destructor); 0 minutes = no
  /// time limit. The clock starts now.
  explicit StopRequest(double exit_duration_mins);
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  /// Collective over `comm`: why every rank should stop after this step
  /// ("received SIGTERM", "run.exit_duration_mins = 30 reached"), or "".
  std::string agree(Communicator& comm) const;
  /// This rank's own view, no collective: "received SIGTERM" once a stop
  /// signal has reached it, else "" (a server's rank 0 between requests).
  std::string received() const;

 private:
  double exit_after_s_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace meshtron
