// Caching device allocator (see device_allocator.hpp for the design).
#include "tensor/device_allocator.hpp"

#include "common/error.hpp"

#ifdef MESHTRON_HAVE_CUDA

#include <cuda_runtime.h>

#include "tensor/device_stream.hpp"

#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace meshtron::device {
namespace {

/// Rounded block size of a request (see the bucket comment in the header).
std::size_t bucket_size(std::size_t bytes) {
  constexpr std::size_t kSmall = 4096, kGrain = 512;
  if (bytes <= kSmall) return bytes == 0 ? kGrain : (bytes + kGrain - 1) / kGrain * kGrain;
  std::size_t octave = kSmall;
  while (octave * 2 < bytes) octave *= 2;
  const std::size_t step = octave / 4;  // four steps in [octave, 2 * octave]
  return (bytes + step - 1) / step * step;
}

struct Block {
  std::size_t size;
  int device;
  PoolId pool;  ///< 0: general; else a private pool (see the header)
};

/// The private pool this host thread captures into, 0 when none.
thread_local PoolId capturing_pool = 0;

class CachingAllocator {
 public:
  void* allocate(std::size_t bytes) {
    const std::size_t size = bucket_size(bytes);
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex_);
    const PoolId pool = capturing_pool;
    std::size_t block_size = size;  // a cached block may be one bucket larger
    void* ptr = take_cached(device, pool, block_size);
    if (!ptr) ptr = malloc_fresh(size);
    live_[ptr] = {block_size, device, pool};
    stats_.current_bytes += block_size;
    if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
    return ptr;
  }

  void deallocate(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    MESH_VERIFY(it != live_.end(), "device::deallocate of a pointer it did not allocate");
    Block b = it->second;
    live_.erase(it);
    stats_.current_bytes -= b.size;
    stats_.cached_bytes += b.size;
    if (b.pool != 0 && !live_pools_.count(b.pool)) b.pool = 0;  // its graph is gone
    if (b.pool == 0 && capturing_pool != 0) {
      held_[capturing_pool].push_back({ptr, b});  // the graph may read it at replay
      return;
    }
    free_[{b.device, b.pool}][b.size].push_back(ptr);
  }

  PoolId create_pool() {
    std::lock_guard<std::mutex> lock(mutex_);
    live_pools_.insert(++last_pool_);
    return last_pool_;
  }

  void release_pool(PoolId pool) {
    CUDA_CHECK(cudaDeviceSynchronize());  // no replay still reads the blocks
    std::lock_guard<std::mutex> lock(mutex_);
    live_pools_.erase(pool);
    for (auto it = free_.begin(); it != free_.end();) {
      const auto [device, owner] = it->first;
      if (owner != pool) {
        ++it;
        continue;
      }
      for (auto& [size, ptrs] : it->second)
        for (void* p : ptrs) free_[{device, 0}][size].push_back(p);
      it = free_.erase(it);
    }
    for (const auto& [ptr, b] : held_[pool]) free_[{b.device, 0}][b.size].push_back(ptr);
    held_.erase(pool);
  }

  void release_cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached_locked();
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes = stats_.current_bytes;
  }

 private:
  /// A cached block of `size`, or of a larger bucket if that wastes at most
  /// a quarter (`size` becomes the block's real size); null if none.
  void* take_cached(int device, PoolId pool, std::size_t& size) {
    auto& lists = free_[{device, pool}];
    auto it = lists.lower_bound(size);
    if (it == lists.end() || it->first > size + size / 4) return nullptr;
    void* ptr = it->second.back();
    it->second.pop_back();
    size = it->first;
    stats_.cached_bytes -= size;
    if (it->second.empty()) lists.erase(it);
    return ptr;
  }

  void* malloc_fresh(std::size_t size) {
    // Inside a capture, cudaMalloc is a "potentially unsafe" call that would
    // invalidate it: allowed here (relaxed for this call only), since the
    // block belongs to the pool, hence to the graph, for the graph's life.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (capturing_pool != 0) CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, size);
    if (capturing_pool != 0) CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (err == cudaErrorMemoryAllocation) {  // give the cache back, then retry once
      (void)cudaGetLastError();
      release_cached_locked();
      err = cudaMalloc(&ptr, size);
    }
    MESH_VERIFY(err == cudaSuccess, "cudaMalloc(" << size << " bytes) failed: "
                                                  << cudaGetErrorString(err) << " (in use "
                                                  << stats_.current_bytes << " bytes)");
    ++stats_.cuda_mallocs;
    return ptr;
  }

  /// cudaFree the general pool's free blocks (a private pool's belong to its graph).
  void release_cached_locked() {
    CUDA_CHECK(cudaDeviceSynchronize());
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->first.second != 0) {
        ++it;
        continue;
      }
      for (auto& [size, ptrs] : it->second)
        for (void* p : ptrs) {
          CUDA_CHECK(cudaFree(p));
          stats_.cached_bytes -= size;
        }
      it = free_.erase(it);
    }
  }

  std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  /// (device, pool) -> size -> free blocks
  std::map<std::pair<int, PoolId>, std::map<std::size_t, std::vector<void*>>> free_;
  /// General blocks freed while a pool was captured into, held for its graph.
  std::map<PoolId, std::vector<std::pair<void*, Block>>> held_;
  std::set<PoolId> live_pools_;
  PoolId last_pool_ = 0;
  AllocatorStats stats_;
};

/// Never destroyed: tensors freed during static destruction still find it,
/// and nothing calls cudaFree after the CUDA runtime has shut down.
CachingAllocator& allocator() {
  static CachingAllocator* instance = new CachingAllocator;
  return *instance;
}

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error here
    return 0;
  }
  return count;
}

std::size_t device_memory_bytes() {
  std::size_t free_bytes = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return total;
}

void* allocate(std::size_t bytes) { return allocator().allocate(bytes); }
void deallocate(void* ptr) { allocator().deallocate(ptr); }
void release_cached() { allocator().release_cached(); }
AllocatorStats allocator_stats() { return allocator().stats(); }
void reset_peak() { allocator().reset_peak(); }
PoolId create_pool() { return allocator().create_pool(); }
void begin_pool_capture(PoolId pool) {
  MESH_VERIFY(capturing_pool == 0, "device::begin_pool_capture: already capturing into pool "
                                       << capturing_pool);
  capturing_pool = pool;
}
void end_pool_capture() { capturing_pool = 0; }
void release_pool(PoolId pool) { allocator().release_pool(pool); }

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void upload_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_stream()));
}

void copy_device_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_stream()));
}

void zero_bytes(void* ptr, std::size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, compute_stream()));
}

namespace {

/// One stream per device, shared by all host threads, created with `flags`
/// on first use there.
class PerDeviceStreams {
 public:
  PerDeviceStreams(unsigned flags, const char* name) : flags_(flags), name_(name) {}
  cudaStream_t of(int device) {
    MESH_VERIFY(device >= 0 && std::size_t(device) < streams_.size(),
                name_ << ": device " << device << " out of range");
    std::lock_guard<std::mutex> lock(mutex_);
    cudaStream_t& stream = streams_[std::size_t(device)];
    if (stream == nullptr) CUDA_CHECK(cudaStreamCreateWithFlags(&stream, flags_));
    return stream;
  }

 private:
  unsigned flags_;
  const char* name_;
  std::mutex mutex_;
  std::array<cudaStream_t, 64> streams_{};
};

int current_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

}  // namespace

cudaStream_t compute_stream() {
  // Called for every launch: the last answer is kept per host thread, the
  // table is only locked when the current device changes.
  thread_local int cached_device = -1;
  thread_local cudaStream_t cached = nullptr;
  const int device = current_device();
  if (device == cached_device) return cached;
  static PerDeviceStreams streams(cudaStreamDefault, "compute_stream");  // blocking: see the header
  cached = streams.of(device);
  cached_device = device;
  return cached;
}

void synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

namespace {

/// The stream of StreamMark's copies on the current device: non-blocking, so
/// that it waits for nothing on the compute stream but the mark's event.
cudaStream_t readback_stream() {
  static PerDeviceStreams streams(cudaStreamNonBlocking, "readback_stream");
  return streams.of(current_device());
}

}  // namespace

StreamMark::~StreamMark() {
  if (event_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  if (pinned_) (void)cudaFreeHost(pinned_);
}

void StreamMark::record() {
  if (event_ == nullptr) {
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    event_ = event;
  }
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), compute_stream()));
}

namespace {
cudaEvent_t new_event() {
  cudaEvent_t event = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}
}  // namespace

SideStream::~SideStream() {
  if (stream_) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (forked_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(forked_));
  if (joined_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(joined_));
}

void* SideStream::raw() {
  if (stream_ == nullptr) {
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
    stream_ = stream;
  }
  return stream_;
}

void SideStream::fork_after(const StreamMark& mark) {
  MESH_VERIFY(mark.event_ != nullptr, "SideStream::fork_after an unrecorded mark");
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(raw()),
                                 static_cast<cudaEvent_t>(mark.event_), 0));
}

void SideStream::fork_now() {
  if (forked_ == nullptr) forked_ = new_event();
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(forked_), compute_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(raw()),
                                 static_cast<cudaEvent_t>(forked_), 0));
}

void SideStream::join() {
  if (joined_ == nullptr) joined_ = new_event();
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(joined_), static_cast<cudaStream_t>(raw())));
  CUDA_CHECK(cudaStreamWaitEvent(compute_stream(), static_cast<cudaEvent_t>(joined_), 0));
}

void StreamMark::copy_to_host(void* dst, const void* src, std::size_t bytes) {
  MESH_VERIFY(event_ != nullptr, "StreamMark::copy_to_host before record()");
  if (bytes == 0) return;
  if (bytes > pinned_bytes_) {  // page-locked: the copy is truly asynchronous
    if (pinned_) CUDA_CHECK(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    CUDA_CHECK(cudaHostAlloc(&pinned_, bytes, cudaHostAllocDefault));
    pinned_bytes_ = bytes;
  }
  cudaStream_t stream = readback_stream();
  CUDA_CHECK(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(event_), 0));
  CUDA_CHECK(cudaMemcpyAsync(pinned_, src, bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::memcpy(dst, pinned_, bytes);
}

}  // namespace meshtron::device

#else  // no CUDA path

namespace meshtron::device {
namespace {
[[noreturn]] void not_built(const char* what) {
  ::meshtron::fatal(MESH_MSG(what << ": device memory, but the CUDA path is not built"), __FILE__,
                    __LINE__);
}
}  // namespace

int cuda_device_count() { return 0; }
std::size_t device_memory_bytes() { not_built("device::device_memory_bytes"); }
void* allocate(std::size_t) { not_built("device::allocate"); }
void deallocate(void*) { not_built("device::deallocate"); }
void release_cached() {}
AllocatorStats allocator_stats() { return {}; }
void reset_peak() {}
PoolId create_pool() { not_built("device::create_pool"); }
void begin_pool_capture(PoolId) { not_built("device::begin_pool_capture"); }
void end_pool_capture() {}
void release_pool(PoolId) {}
void copy_bytes(void*, const void*, std::size_t) { not_built("device::copy_bytes"); }
void upload_bytes(void*, const void*, std::size_t) { not_built("device::upload_bytes"); }
void copy_device_bytes(void*, const void*, std::size_t) { not_built("device::copy_device_bytes"); }
void zero_bytes(void*, std::size_t) { not_built("device::zero_bytes"); }
void synchronize() {}

StreamMark::~StreamMark() = default;
SideStream::~SideStream() = default;
void SideStream::fork_after(const StreamMark&) { not_built("device::SideStream::fork_after"); }
void SideStream::fork_now() { not_built("device::SideStream::fork_now"); }
void SideStream::join() { not_built("device::SideStream::join"); }
void* SideStream::raw() { not_built("device::SideStream::raw"); }
void StreamMark::record() {}
void StreamMark::copy_to_host(void*, const void*, std::size_t) {
  not_built("device::StreamMark::copy_to_host");
}

}  // namespace meshtron::device

#endif
