// CapturedWork (see cuda_graph.hpp).
#ifdef MESHTRON_HAVE_CUDA

#include "train/cuda_graph.hpp"

#include "common/error.hpp"
#include "tensor/device_stream.hpp"

namespace meshtron {

CapturedWork::CapturedWork(const std::function<void()>& work) : pool_(device::create_pool()) {
  const cudaStream_t stream = device::compute_stream();
  // Drained first (once per capture): what runs outside the graph while it
  // is captured, GEMM autotuning on its own stream (gemm.cu), then shares
  // nothing in flight, the cuBLASLt workspace among it.
  CUDA_CHECK(cudaStreamSynchronize(stream));
  // Relaxed: calls that only might be unsafe (cudaMalloc for the pool, a
  // kernel's cudaFuncSetAttribute) are allowed; what really breaks a
  // capture (a synchronous copy, which waits for the capturing stream)
  // still fails, with CUDA's error at that call.
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  device::begin_pool_capture(pool_);
  try {
    work();
  } catch (...) {
    device::end_pool_capture();
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(stream, &partial);
    if (partial) cudaGraphDestroy(partial);
    (void)cudaGetLastError();
    device::release_pool(pool_);
    throw;
  }
  device::end_pool_capture();
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph_);
  if (ended != cudaSuccess || graph_ == nullptr) {
    (void)cudaGetLastError();
    device::release_pool(pool_);
    MESH_VERIFY(false, "CUDA graph capture failed: " << cudaGetErrorString(ended)
                           << " (some operation of the captured work is not capturable)");
  }
  CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &nodes_));
  CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

CapturedWork::~CapturedWork() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  device::release_pool(pool_);  // waits for the device first
}

void CapturedWork::replay() { CUDA_CHECK(cudaGraphLaunch(exec_, device::compute_stream())); }

}  // namespace meshtron

#endif
