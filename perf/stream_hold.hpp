// Holding a stream while the host fills it, for timing kernels the way the
// training step queues them (NVBench's "blocking kernel" method).
//
// Timed eagerly from an idle GPU, a batch of short kernels between two CUDA
// events also times the host: the start event runs at once, the first kernel
// only once the host has queued it (the launch path, ~5 us), and while the
// host queues each next call no faster than the GPU runs the one before, the
// GPU waits in between. The training step never waits so: its host runs
// ahead of the GPU through every GEMM, or replays the step from a CUDA graph.
// A StreamHold queues a one-thread kernel that spins until release(), so the
// host queues the start event, the whole batch and the stop event behind it;
// what the events measure is then the GPU's time for the queued batch.
//
// CUDA builds only: bench_cuda_ops, and its test tests/gpu/test_gpu_stream_hold.cpp.
#pragma once

#include <cuda_runtime.h>

namespace meshtron::perf {

class StreamHold {
 public:
  StreamHold();
  ~StreamHold();
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;

  /// Queues the holding kernel on `stream`: nothing queued after it on that
  /// stream (or, for the legacy stream, on a blocking stream) runs until
  /// release(), or until the kernel gives up after kGiveUpMs.
  void hold(cudaStream_t stream);
  /// Lets the holding kernel finish.
  void release();
  /// Whether the last hold ended by giving up rather than by release()
  /// (the host took longer than kGiveUpMs to queue, or could not queue it
  /// all): then what was timed behind it included the host. Read after the
  /// stream has been synchronised.
  bool gave_up() const;

  static constexpr double kGiveUpMs = 200.0;

 private:
  int* host_flags_ = nullptr;    // [0] released, [1] gave up: mapped pinned memory
  int* device_flags_ = nullptr;  // the same two ints as the GPU addresses them
};

}  // namespace meshtron::perf
