// StreamHold (stream_hold.hpp): a one-thread kernel polling a flag in mapped
// pinned host memory.
#include "perf/stream_hold.hpp"

#include <atomic>

#include "common/error.hpp"

namespace meshtron::perf {
namespace {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Spins until flags[0] is set by the host, or sets flags[1] and returns
/// after give_up_ns (so a host that cannot release it, e.g. one blocked on
/// a full launch queue behind it, is not deadlocked).
__global__ void hold_until_released(volatile int* flags, unsigned long long give_up_ns) {
  const unsigned long long start = global_timer_ns();
  while (flags[0] == 0) {
    if (global_timer_ns() - start > give_up_ns) {
      flags[1] = 1;
      return;
    }
    __nanosleep(1000);
  }
}

}  // namespace

StreamHold::StreamHold() {
  void* host = nullptr;
  CUDA_CHECK(cudaHostAlloc(&host, 2 * sizeof(int), cudaHostAllocMapped));
  host_flags_ = static_cast<int*>(host);
  void* device = nullptr;
  CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
  device_flags_ = static_cast<int*>(device);
}

StreamHold::~StreamHold() { cudaFreeHost(host_flags_); }

void StreamHold::hold(cudaStream_t stream) {
  CUDA_CHECK(cudaStreamSynchronize(stream));  // no earlier hold still reads the flags
  std::atomic_ref<int>(host_flags_[0]).store(0);
  std::atomic_ref<int>(host_flags_[1]).store(0);
  hold_until_released<<<1, 1, 0, stream>>>(device_flags_,
                                            static_cast<unsigned long long>(kGiveUpMs * 1e6));
  CUDA_CHECK(cudaGetLastError());
}

void StreamHold::release() { std::atomic_ref<int>(host_flags_[0]).store(1); }

bool StreamHold::gave_up() const { return std::atomic_ref<int>(host_flags_[1]).load() != 0; }

}  // namespace meshtron::perf
