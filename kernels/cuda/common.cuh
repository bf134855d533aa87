// Shared vocabulary of the CUDA kernels (kernels/cuda/*.cu).
//
// Storage types are float, __nv_bfloat16 and __half; every kernel loads
// through load_f() and stores through store_f(), so the arithmetic is always
// fp32 (bf16 and fp16 are storage formats only, as on the host path's
// types.hpp).
// All work runs on the compute stream (tensor/device_stream.hpp; see
// device_allocator.hpp for why the caching allocator relies on one stream). Launchers check the launch with
// CUDA_CHECK(cudaGetLastError()) right after it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "common/error.hpp"
#include "tensor/device_stream.hpp"
#include "tensor/types.hpp"

namespace meshtron::cuda {

using kindex = std::int64_t;
using bf16_t = __nv_bfloat16;
using f16_t = __half;

using device::compute_stream;  // every launch below is queued there

// ------------------------------------------------------ storage <-> fp32 ---

__device__ __forceinline__ float load_f(const float* p, kindex i) { return p[i]; }
__device__ __forceinline__ float load_f(const bf16_t* p, kindex i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load_f(const f16_t* p, kindex i) { return __half2float(p[i]); }
__device__ __forceinline__ void store_f(float* p, kindex i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(bf16_t* p, kindex i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store_f(f16_t* p, kindex i, float v) { p[i] = __float2half_rn(v); }

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16_t v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(f16_t v) { return __half2float(v); }
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16_t from_f<bf16_t>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ f16_t from_f<f16_t>(float v) {
  return __float2half_rn(v);
}

/// The two values of a 32-bit word of two 16-bit ones (low half first) as
/// fp32, exactly (to_f's values): bf16 by a shift and a mask, one
/// instruction each (a bf16 is the upper half of its fp32), fp16 by the
/// conversion of each half.
template <class T>
__device__ __forceinline__ float2 widen_pair(std::uint32_t w) {
  static_assert(sizeof(T) == 2, "two 16-bit values per word");
  if constexpr (std::is_same_v<T, bf16_t>) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
    __half2 h;
    __builtin_memcpy(&h, &w, sizeof(h));
    return __half22float2(h);
  }
}

/// v rounded to the storage type T and back (identity for fp32).
template <class T>
__device__ __forceinline__ float round_to(float v) {
  return to_f(from_f<T>(v));
}

/// dx as stored by a norm backward (layernorm.cu, rmsnorm.cu): the norm's
/// gradient rounded to T, plus the residual branch's gradient at element i
/// when there is one (the rounding add() does). __fadd_rn keeps the compiler
/// from contracting the last product of dx and this sum into one FMA, which
/// would round differently.
template <class T>
__device__ __forceinline__ float with_residual(float dx, const T* residual, kindex i) {
  return residual ? __fadd_rn(round_to<T>(dx), load_f(residual, i)) : dx;
}

// --------------------------------------------------------------- launches ---

/// Blocks for n items at `threads` per block, capped for grid-stride loops.
inline unsigned grid_for(kindex n, int threads, kindex cap = 65535LL * 8) {
  kindex blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  return unsigned(blocks < cap ? blocks : cap);
}

#define MESH_CUDA_LAUNCHED() CUDA_CHECK(cudaGetLastError())

/// SMs of the current GPU.
inline kindex multiprocessor_count() {
  int device = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return kindex(sms);
}

/// Dynamic shared memory one block of the current GPU may opt in to (227 KiB
/// on sm_90; 48 KiB without the opt-in).
inline int max_shared_per_block_optin() {
  int device = 0, bytes = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

/// Lets Kernel be launched with more than 48 KiB of dynamic shared memory,
/// up to the GPU's opt-in limit less the kernel's static shared memory (more
/// is "invalid argument"; each launch's own bytes still set what it takes).
/// Once per kernel and process (one GPU per process), not per launch.
template <auto Kernel>
void opt_in_max_shared_memory() {
  static const bool opted_in = [] {
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, Kernel));
    CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    max_shared_per_block_optin() -
                                        int(attributes.sharedSizeBytes)));
    return true;
  }();
  (void)opted_in;
}

/// Blocks of `kernel` (block_threads each, `shared_bytes` of dynamic shared
/// memory) that the whole GPU holds at once, from the occupancy calculator:
/// the largest grid that runs in one wave. Callers cache it per kernel where
/// the block shape is fixed (one GPU per process).
template <class Kernel>
kindex resident_blocks(Kernel kernel, int block_threads, std::size_t shared_bytes = 0) {
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_threads,
                                                           shared_bytes));
  return multiprocessor_count() * (per_sm > 0 ? per_sm : 1);
}

/// Grid-stride loop over [0, n): any grid size covers any n.
#define GRID_STRIDE(i, n)                                                    \
  for (::meshtron::cuda::kindex i = ::meshtron::cuda::kindex(blockIdx.x) * blockDim.x + \
                                    threadIdx.x;                             \
       i < (n); i += ::meshtron::cuda::kindex(gridDim.x) * blockDim.x)

/// Calls f(T{}) with T = float, bf16_t or f16_t for a device storage dtype.
template <class F>
void with_storage_type(DType dtype, const char* op, F&& f) {
  if (dtype == DType::F32)
    f(float{});
  else if (dtype == DType::BF16)
    f(bf16_t{});
  else if (dtype == DType::F16)
    f(f16_t{});
  else
    MESH_VERIFY(false,
                op << ": the CUDA path stores fp32, bf16 or fp16, got " << dtype_name(dtype));
}

/// Calls f(T{}, G{}) where G, the dtype of accumulated parameter gradients,
/// is the storage type or fp32 (fp32 main_grad under bf16/fp16 activations).
template <class F>
void with_storage_and_grad_type(DType dtype, DType grad_dtype, const char* op, F&& f) {
  with_storage_type(dtype, op, [&](auto t) {
    using T = decltype(t);
    if (grad_dtype == DType::F32)
      f(T{}, float{});
    else if (grad_dtype == dtype)
      f(T{}, T{});
    else
      MESH_VERIFY(false, op << ": gradients accumulate in fp32 or the input dtype, got "
                            << dtype_name(grad_dtype));
  });
}

// ------------------------------------------------------------ reductions ---

template <class V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
/// thread gets the result. `scratch` holds 32 values.
template <class V>
__device__ V block_sum(V v, V* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : V(0);
  return warp_sum(v);
}

__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

/// log2(e): exp(x) = 2^(x log2 e), the form fast_exp2 takes.
inline constexpr float kLog2e = 1.4426950408889634f;

/// 2^x on the special function unit (ex2.approx, flush-to-zero): one
/// instruction, where exp2f adds a range fix-up (about three more) for
/// results below 2^-126, which vanish in the sums and the bf16/fp16 values
/// they feed. The same instruction on the same input gives the same bits.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------- asynchronous shared copies ---
//
// cp.async (sm_80+): 16-byte global -> shared copies that hold no registers
// while in flight. The "memory" clobbers keep the compiler from moving
// shared-memory accesses across the copy, the commit and the wait (a thread
// may read what it copied right after its wait, with no barrier between).

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return std::uint32_t(__cvta_generic_to_shared(p));
}
/// 16 bytes global -> shared; zero-filled when !valid (src is not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
/// 4 bytes global -> shared (a row's statistic, a word of a bit mask);
/// zero-filled when !valid (src is not read).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid = true) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ------------------------------------ programmatic dependent launch (PDL) ---
//
// The memory-bound kernels of the training step (elementwise, dropout,
// layernorm, embedding, softmax, cross-entropy, AdamW, column sums; their
// packed paths, the scalar fallbacks launch ordinarily) are launched as
// programmatic dependents of the stream's previous kernel (sm_90;
// launch_dependent below): their blocks are
// scheduled while the previous kernel still runs (once all of that kernel's
// blocks have called allow_dependent_launch() or exited) and wait in
// wait_for_prior_grid() until it has finished and its writes are visible.
// The launch gap and the ramp-up of the second grid then overlap the first
// one's tail: +0.03-0.07 of the copy bandwidth per row of
// perf/bench_cuda_ops memory at 12-100 MB (H100). Such a kernel
// begins with start_after_prior_grid() (wait, then allow the next), and
// every kernel waits before it allows the next, so when a kernel starts,
// every kernel before the previous one has finished. Hence:
// - before its wait a kernel writes no global memory (the previous kernel
//   may still read it) and reads only what the previous kernel cannot have
//   written (the layernorm backward's x and gamma; the layernorm
//   forward's gamma and beta);
// - a kernel that only finishes what the one before it wrote (the sum of a
//   backward kernel's per-block partial rows) may start even earlier: the
//   primary allows it at its own start.
// Both calls are no-ops for a kernel launched the ordinary way, and below sm_90;
// kernels launched ordinarily (cuBLASLt's, NCCL's) wait for everything
// before them as usual.

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// For a kernel launched with launch_dependent: waits until the stream's
/// previous kernel has finished and its writes are visible, then lets the
/// next kernel's blocks start up behind this one. Such a kernel calls it
/// before it writes global memory (the previous kernel may still be reading
/// what this one overwrites) or reads what the previous kernel may write.
__device__ __forceinline__ void start_after_prior_grid() {
  wait_for_prior_grid();
  allow_dependent_launch();
}

/// Whether this block is the last of `blocks` to take a ticket (a device
/// counter, 0 before the first): the finishing block of a "last block adds
/// the partials" kernel, which resets the ticket itself. Every thread of the
/// block calls it after writing its share of the partials; on true, every
/// other block's partials are visible to every thread of this one (read
/// them through L2, __ldcg: L1 is not coherent). One fence per block, by
/// thread 0 between barriers, as cooperative groups' grid sync does (fences
/// are cumulative: they order the writes the barrier made precede them),
/// instead of one per thread: bias_backward bf16 [8192, 3072] 0.77 of copy
/// against 0.76 (H100, perf/bench_cuda_ops memory). The ticket is one
/// acquire-release atomic (release: the partials before the ticket that
/// counts them; acquire: the other blocks' partials after their tickets),
/// not two __threadfence() (fence.sc: sequentially consistent, which
/// nothing here needs: no block stores then loads another's data) around
/// a relaxed atomicAdd; the same message passing as CUTLASS's
/// GenericBarrier (a release by one thread after the block's barrier). It
/// is on the critical path of every kernel that finishes this way: the last
/// block's chain after the final loads.
__device__ __forceinline__ bool last_block_to_finish(unsigned int* ticket, unsigned int blocks) {
  __shared__ bool last;
  __syncthreads();  // the block's writes happen before thread 0's release
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    unsigned int taken;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n"
                 : "=r"(taken)
                 : "l"(ticket)
                 : "memory");
    last = taken == blocks - 1;
  }
  __syncthreads();
  return last;
}

/// kernel<<<grid, block, shared_bytes, stream>>>(args...) as a programmatic
/// dependent of the stream's previous kernel (see above).
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t shared_bytes,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// ------------------------------------------------ vectorised elementwise ---
//
// A pure elementwise op reads and writes each element once, so its speed is
// the memory system's, and that needs wide accesses: a warp of scalar bf16
// loads asks for 64 bytes per instruction, a warp of 16-byte loads for 512.
// map3() applies out[i] = f(a[i], b[i], c[i]) (unused inputs null) with one
// 16-byte pack (4 fp32 or 8 bf16) per thread and iteration when every
// pointer is 16-byte aligned, else element by element. Each thread reads
// its pack before writing it, so out may alias an input.

template <class T>
inline constexpr int kPack = 16 / int(sizeof(T));
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
template <class T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

/// W consecutive values of T: one element (W = 1) or a 16-byte pack (W =
/// kPack<T>), for kernels written once for either width (rmsnorm.cu, glu.cu).
template <class T, int W>
struct alignas(sizeof(T) * W) Values {
  T v[W];
};

/// Calls f(std::integral_constant<int, W>) with W = kPack<T> when n is a
/// multiple of it and every pointer is 16-byte aligned, else W = 1.
template <class T, class F>
void with_pack_width(kindex n, std::initializer_list<const void*> pointers, F&& f) {
  bool packed = n % kPack<T> == 0;
  for (const void* p : pointers) packed = packed && aligned16(p);
  if (packed)
    f(std::integral_constant<int, kPack<T>>{});
  else
    f(std::integral_constant<int, 1>{});
}

/// A pack's values as fp32, exactly to_f's. A 16-bit pack is widened a
/// 32-bit word at a time (widen_pair): a bf16 value costs one shift or one
/// mask, where to_f on the upper half of a word compiles to an extract and
/// a shift (PRMT + SHF in the sm_90 code of the layernorm backward). On an
/// H200 (perf/bench_cuda_ops memory), against to_f per value: bf16 dropout
/// forward 0.83 of the copy against 0.72, dropout_add 0.96 against 0.90,
/// layernorm backward +0.01-0.03; not used where it measures no better:
/// map3 (gelu_backward 0.78 against 0.81), the layernorm forward, the
/// embedding backward, the bias column sums.
template <class T>
struct Widened {
  float v[kPack<T>];
};

/// p by value: a copy in registers. (From a reference into shared or global
/// memory the word copy below compiled to byte loads: 16 LDS.U8 per pack.)
template <class T>
__device__ __forceinline__ Widened<T> widen(const Pack<T> p) {
  Widened<T> w;
  if constexpr (sizeof(T) == 2) {
    std::uint32_t words[kPack<T> / 2];
    __builtin_memcpy(words, &p, sizeof(words));
#pragma unroll
    for (int i = 0; i < kPack<T> / 2; ++i) {
      const float2 f = widen_pair<T>(words[i]);
      w.v[2 * i] = f.x;
      w.v[2 * i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPack<T>; ++j) w.v[j] = to_f(p.v[j]);
  }
  return w;
}

/// *p, loaded where the call stands: asm volatile, so the compiler cannot
/// sink the load below a branch to where its value is first used (as it
/// does with a plain load, whose latency then adds to the branch's).
/// Read-only data (ld.global.nc).
__device__ __forceinline__ std::int32_t load_unconditionally(const std::int32_t* p) {
  std::int32_t v;
  asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

/// Two floats rounded to the 16-bit T as one 32-bit word, `lo` in the low
/// half (the lower column): one cvt.rn.bf16x2 / f16x2.
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ std::uint32_t pack2<bf16_t>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<f16_t>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

/// V fp32 values rounded to T as one pack, from_f's values: 16-bit types
/// two at a time (pack2: one conversion per pair where from_f per value
/// compiles to a conversion each and a PRMT per pair).
template <class T>
__device__ __forceinline__ Pack<T> narrow(const float (&v)[kPack<T>]) {
  Pack<T> p;
  if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) {
#pragma unroll
    for (int i = 0; i < kPack<T> / 2; ++i) {
      const std::uint32_t word = pack2<T>(v[2 * i], v[2 * i + 1]);
      __builtin_memcpy(&p.v[2 * i], &word, sizeof(word));
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPack<T>; ++j) p.v[j] = from_f<T>(v[j]);
  }
  return p;
}

template <class T, class F>
__global__ void map3_packed_kernel(F f, const T* a, const T* b, const T* c, kindex n, T* out) {
  start_after_prior_grid();
  constexpr int V = kPack<T>;
  const kindex packs = n / V;
  GRID_STRIDE(k, packs) {
    Pack<T> pa{}, pb{}, pc{}, po;
    if (a) pa = reinterpret_cast<const Pack<T>*>(a)[k];
    if (b) pb = reinterpret_cast<const Pack<T>*>(b)[k];
    if (c) pc = reinterpret_cast<const Pack<T>*>(c)[k];
#pragma unroll
    for (int j = 0; j < V; ++j) po.v[j] = from_f<T>(f(to_f(pa.v[j]), to_f(pb.v[j]), to_f(pc.v[j])));
    reinterpret_cast<Pack<T>*>(out)[k] = po;
  }
  if (blockIdx.x == 0)  // the n % V elements past the last whole pack
    for (kindex i = packs * V + threadIdx.x; i < n; i += blockDim.x)
      out[i] = from_f<T>(f(a ? to_f(a[i]) : 0.f, b ? to_f(b[i]) : 0.f, c ? to_f(c[i]) : 0.f));
}

template <class T, class F>
__global__ void map3_scalar_kernel(F f, const T* a, const T* b, const T* c, kindex n, T* out) {
  GRID_STRIDE(i, n)
  out[i] = from_f<T>(f(a ? to_f(a[i]) : 0.f, b ? to_f(b[i]) : 0.f, c ? to_f(c[i]) : 0.f));
}

/// map3 on `stream` (the compute stream unless a caller says otherwise).
template <class T, class F>
void map3_on(cudaStream_t stream, F f, const T* a, const T* b, const T* c, kindex n, T* out) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const bool packed = (!a || aligned16(a)) && (!b || aligned16(b)) && (!c || aligned16(c)) &&
                      aligned16(out);
  if (packed)
    launch_dependent(map3_packed_kernel<T, F>, grid_for(n / kPack<T> + 1, kThreads), kThreads, 0,
                     stream, f, a, b, c, n, out);
  else
    map3_scalar_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(f, a, b, c, n, out);
  MESH_CUDA_LAUNCHED();
}

template <class T, class F>
void map3(F f, const T* a, const T* b, const T* c, kindex n, T* out) {
  map3_on(compute_stream(), f, a, b, c, n, out);
}

}  // namespace meshtron::cuda
