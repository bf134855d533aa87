// Device memory for Tensors in MemorySpace::Cuda: a caching allocator.
//
// cudaMalloc and cudaFree synchronise the device and cost tens to hundreds
// of microseconds each, and a training step allocates and frees the same
// activation sizes every micro-batch. So freed blocks are not returned to
// CUDA but kept in size-bucketed free lists, one set per device, and handed
// out again to later requests of a similar size; in steady state no
// cudaMalloc or cudaFree happens. Only release_cached() (called on its own,
// or when cudaMalloc reports out-of-memory) gives cached blocks back.
//
// Buckets: sizes are rounded up to 512 bytes below 4 KiB, and above that to
// one of four steps per power of two (1, 1.25, 1.5, 1.75 x 2^k), so a block
// wastes at most 25% and similar sizes share a bucket.
//
// Streams: every meshtron kernel and device copy runs on the compute stream
// (device_stream.hpp; host <-> device copies are synchronous and ordered
// with it), so a block freed by the host while a kernel that used it is
// still queued is only reused by work queued after it, on the same stream:
// safe without events. (A multi-stream design must record an event per
// freed block.)
//
// Without MESHTRON_HAVE_CUDA every function here stops with "CUDA path not
// built" except cuda_device_count(), which returns 0.
#pragma once

#include <cstddef>

namespace meshtron::device {

/// Bytes held by the allocator, summed over devices.
struct AllocatorStats {
  std::size_t current_bytes = 0;  ///< handed out and not yet freed (rounded sizes)
  std::size_t peak_bytes = 0;     ///< highest current_bytes so far
  std::size_t cached_bytes = 0;   ///< freed, kept in the free lists
  std::size_t cuda_mallocs = 0;   ///< cudaMalloc calls so far (cache misses)
};

/// Number of CUDA devices, 0 when the CUDA path is not built or no GPU is present.
int cuda_device_count();

/// Total memory of the current device, bytes.
std::size_t device_memory_bytes();

/// A block of at least `bytes` on the current device (256-byte aligned).
void* allocate(std::size_t bytes);
/// Return a block from allocate() to its free list (never cudaFree).
void deallocate(void* ptr);
/// cudaFree every cached (free) block of every device.
void release_cached();
AllocatorStats allocator_stats();
/// Peak back to the current value (benchmarks measure one phase at a time).
void reset_peak();

// Private pools for CUDA graphs (train/cuda_graph.hpp). A captured graph
// replays the addresses its kernels were captured with, so the blocks they
// touch must stay its own: while this host thread captures into pool P,
// allocate() takes P's free blocks or fresh ones (tagged P), and a P block,
// whenever it is freed, goes back to P's free list only; a general block
// freed during the capture (the graph may read it at replay) is held by P,
// unused, until P is released. Outside a capture, allocate() never hands out
// a P block.
using PoolId = int;  ///< 0: the general pool
/// A new, empty private pool.
PoolId create_pool();
/// This thread's allocations and frees go through `pool` until end_pool_capture().
void begin_pool_capture(PoolId pool);
void end_pool_capture();
/// Wait for the device, then give every block of `pool` (free, held, and
/// later the live ones when freed) to the general pool. For the graph's
/// destructor.
void release_pool(PoolId pool);

/// Copy between any two spaces (cudaMemcpyDefault); synchronous for the host.
void copy_bytes(void* dst, const void* src, std::size_t bytes);
/// Host-to-device copy queued on the compute stream: from pageable memory
/// CUDA stages the bytes before returning, so the host neither waits for
/// the kernels queued before it nor keeps `src` (a training step's token ids
/// go up this way while the previous update still runs).
void upload_bytes(void* dst, const void* src, std::size_t bytes);
/// Device-to-device copy, queued on the compute stream (device_stream.hpp);
/// the host does not wait for it.
void copy_device_bytes(void* dst, const void* src, std::size_t bytes);
/// Set `bytes` of device memory to zero (asynchronous on the compute stream).
void zero_bytes(void* ptr, std::size_t bytes);
/// Wait for all device work (tests and benchmarks).
void synchronize();

/// A point in the compute stream's work (a CUDA event), and copies to the
/// host that wait for the work queued before that point but not for what was
/// queued after it: a training step reads its loss and gradient norm this
/// way once its optimizer update is queued, rather than draining the stream
/// before the update (the device would idle while the host launches it).
/// The source memory must stay allocated until the copy (keep its Tensor).
class StreamMark {
 public:
  StreamMark() = default;
  ~StreamMark();
  StreamMark(const StreamMark&) = delete;
  StreamMark& operator=(const StreamMark&) = delete;
  /// The mark at the end of the work queued so far on the compute stream.
  void record();
  /// Copies `bytes` of device memory written before record() into host
  /// memory `dst`; returns when they have arrived.
  void copy_to_host(void* dst, const void* src, std::size_t bytes);
  bool recorded() const { return event_ != nullptr; }

 private:
  friend class SideStream;
  void* event_ = nullptr;   ///< Owned cudaEvent_t, created by the first record().
  void* pinned_ = nullptr;  ///< Owned page-locked staging (cudaHostAlloc).
  std::size_t pinned_bytes_ = 0;
};

/// A stream beside the compute stream, at the device's highest priority, for
/// work that should take the SMs the compute stream's kernels leave free
/// (the attention masks drawn under the optimizer update: integer-bound
/// draws beside a bandwidth-bound update). Its work starts after a point
/// of the compute stream (fork_after) and the compute stream's next work
/// waits for it (join). Memory it writes must not be the caching
/// allocator's to reuse while it runs (hold it in a live Tensor).
class SideStream {
 public:
  SideStream() = default;
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  /// Work queued here from now on waits for the compute stream's work
  /// queued before `mark` (recorded), or before now (fork_now: also every
  /// earlier use of memory the allocator hands out after it).
  void fork_after(const StreamMark& mark);
  void fork_now();
  /// The compute stream's work queued from now on waits for all queued here.
  void join();
  /// The cudaStream_t, created on first use.
  void* raw();

 private:
  void* stream_ = nullptr;  ///< Owned cudaStream_t.
  void* forked_ = nullptr;  ///< Owned cudaEvent_t: fork_now's point of the compute stream.
  void* joined_ = nullptr;  ///< Owned cudaEvent_t: the end of this stream's work.
};

/// An owned scratch buffer from the allocator (kernels' partial sums).
class Buffer {
 public:
  explicit Buffer(std::size_t bytes) : ptr_(bytes ? allocate(bytes) : nullptr) {}
  ~Buffer() {
    if (ptr_) deallocate(ptr_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  /// The block, no longer owned: the caller gives it back with deallocate().
  void* release() {
    void* p = ptr_;
    ptr_ = nullptr;
    return p;
  }

 private:
  void* ptr_;  ///< Owned.
};

}  // namespace meshtron::device
