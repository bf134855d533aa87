// The compute stream: the one CUDA stream of every meshtron kernel, library
// call (cuBLASLt, cuDNN, NCCL's blocking collectives) and device-to-device
// copy, on the GPU this process selected.
//
// It is a created stream, not the legacy default stream (handle 0), because
// only a created stream can be captured into a CUDA graph. It is created
// without cudaStreamNonBlocking, so it still synchronises with the legacy
// default stream: a synchronous cudaMemcpy / cudaMemset (the host <-> device
// transfers of Tensor) stays ordered after the kernels queued before it and
// before those queued after it, as when everything ran on the legacy stream.
// Everything else that shares device memory (the caching allocator's block
// reuse, device_allocator.hpp) relies on this one stream's order.
//
// CUDA builds only (callers include it under MESHTRON_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>

namespace meshtron::device {

/// The compute stream of the current device, created on first use there.
cudaStream_t compute_stream();

}  // namespace meshtron::device
