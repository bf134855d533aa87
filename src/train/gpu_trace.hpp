// GPU kernel trace of a few training steps (deck: logging.profile), the
// answer to "where does the step's time go" without nsys: CUPTI's activity
// API records every kernel, copy and set on every stream with device
// timestamps, and this module turns them into
//   - a Chrome trace per rank (chrome://tracing, ui.perfetto.dev), one row
//     per CUDA stream, and
//   - a time split per step: busy / compute / communication, how much of
//     the communication no compute kernel hid ("exposed"), idle gaps, and
//     the kernels that took the most time.
// Communication = NCCL's kernels (their names start with "nccl") and copies
// between GPUs (the copy-engine collectives); other copies and sets are
// counted as busy but in neither class.
//
// The split is pure interval arithmetic (summarize_trace), tested on the
// host; GpuTracer needs the CUDA build with CUPTI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace meshtron {

struct TraceEvent {
  enum class Kind { Compute, Communication, Copy };
  Kind kind = Kind::Compute;
  std::uint64_t start_ns = 0, end_ns = 0;  ///< device timestamps
  std::uint32_t stream = 0;
  std::string name;  ///< demangled kernel name up to its parameter list, or "memcpy DtoD" ...
  std::uint64_t bytes = 0;  ///< copies and memsets: their size (the trace's "args"), else 0
};

struct KernelTotal {
  std::string name;
  double ms_per_step = 0;
  double calls_per_step = 0;
};

/// Milliseconds per step inside the traced window.
struct TraceSummary {
  int steps = 0;
  double window_ms = 0;   ///< wall time of the window / steps
  double busy_ms = 0;     ///< some kernel, copy or set running
  double compute_ms = 0;  ///< some non-NCCL kernel running
  double comm_ms = 0;     ///< some NCCL kernel running
  double exposed_comm_ms = 0;  ///< NCCL running and no compute kernel
  double idle_ms = 0;     ///< nothing running
  std::vector<KernelTotal> top;  ///< by time, longest first

  /// One line: "step 79.6 ms: busy 78.1 (compute 70.2, comm 12.3 of which exposed 6.5), idle 1.5".
  std::string line() const;
};

/// The split of `events` (clipped to [begin_ns, end_ns)) over `steps`
/// steps, with the `top_kernels` longest kernel names.
TraceSummary summarize_trace(const std::vector<TraceEvent>& events, std::uint64_t begin_ns,
                             std::uint64_t end_ns, int steps, int top_kernels = 25);

/// Chrome trace JSON (process = rank, thread = stream, times in us from begin_ns).
std::string chrome_trace_json(const std::vector<TraceEvent>& events, std::uint64_t begin_ns,
                              int rank);

/// Records the GPU activity between start() and stop(). CUPTI delivers its
/// records through process-wide callbacks, so at most one GpuTracer may be
/// recording at a time in a process (checked).
class GpuTracer {
 public:
  /// Whether this build can trace (CUDA with CUPTI).
  static bool available();
  GpuTracer();
  ~GpuTracer();
  GpuTracer(const GpuTracer&) = delete;
  GpuTracer& operator=(const GpuTracer&) = delete;

  /// Waits for the device, then records from now on.
  void start();
  /// Waits for the device, flushes CUPTI and stops recording.
  void stop();

  const std::vector<TraceEvent>& events() const { return events_; }
  std::uint64_t begin_ns() const { return begin_ns_; }
  std::uint64_t end_ns() const { return end_ns_; }

  /// Called from CUPTI's buffer callback with one record (internal).
  void add(TraceEvent e) { events_.push_back(std::move(e)); }

 private:
  std::vector<TraceEvent> events_;
  std::uint64_t begin_ns_ = 0, end_ns_ = 0;
  bool recording_ = false;
};

}  // namespace meshtron
