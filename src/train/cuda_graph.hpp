// One piece of device work captured once into a CUDA graph and replayed:
// training.cuda_graphs captures a micro-batch's forward and backward
// (Trainer::run_schedule) so that a replay costs one launch instead of ~1,000.
//
// Capture records what `work` queues on the compute stream
// (tensor/device_stream.hpp) without running it; replay() runs it with the
// same kernel arguments and the same addresses. So, for a replay to be the
// same computation on new data:
// - inputs live in buffers made before the capture and refilled before each
//   replay (the caller's), outputs in tensors made during it (kept by the
//   caller and read after each replay);
// - the memory the captured kernels use stays theirs: the capture allocates
//   from a private pool of the caching allocator (device_allocator.hpp),
//   which the graph owns until it is destroyed;
// - nothing in `work` may wait for the host or depend on host values that
//   change between replays (the caller sees to it: dropout reads its step
//   and sample offset from device words, LayerContext::dropout_live; the
//   loss gradient's value is a device tensor; GEMM algorithms, cuDNN plans
//   and workspaces are made by an eager warm-up step).
// A capture that cannot be made (an operation that is not capturable) throws
// with CUDA's reason; no half-made graph is kept.
//
// CUDA builds only.
#pragma once

#ifdef MESHTRON_HAVE_CUDA

#include <cuda_runtime.h>

#include <functional>

#include "tensor/device_allocator.hpp"

namespace meshtron {

class CapturedWork {
 public:
  /// Captures `work` (nothing runs). Throws if CUDA refuses the capture.
  explicit CapturedWork(const std::function<void()>& work);
  ~CapturedWork();
  CapturedWork(const CapturedWork&) = delete;
  CapturedWork& operator=(const CapturedWork&) = delete;

  /// Queues the captured work on the compute stream.
  void replay();
  /// Kernel and copy nodes in the graph (tests and the log).
  std::size_t nodes() const { return nodes_; }

 private:
  device::PoolId pool_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::size_t nodes_ = 0;
};

}  // namespace meshtron

#endif
