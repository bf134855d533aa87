// ================================================== Elementwise and biases ==
//
// The memory-bound ops of kernels/kokkos/elementwise.hpp, fp32 arithmetic
// for either storage type, grid-stride loops (any grid covers any n):
//   bias_add        y[n, c] += bias[c]
//   bias_backward   dbias[c] += sum_n dy[n, c]    (column_sums.cuh: split
//                                                 rows, 16-byte packs of
//                                                 columns, fixed-order finish)
//   add             out = a + b    (out may alias a or b: each thread reads
//                                  its elements before writing them)
//   add_residual_bias  out = a + b + residual + bias[column] (the
//                   copy-engine tp all-reduce's sum with a row-parallel
//                   layer's epilogue, PeerExchange)
// The pure elementwise ones go through map3() (common.cuh): 16-byte packs.
// bias_add has a packed kernel too (C a multiple of V = 16 / sizeof(T) and
// y, bias 16-byte aligned): one thread per pack of columns, its bias pack
// in registers, rounds of rows on grid y; per element the same y + bias in fp32 and
// one rounding to T as the scalar kernel, so the same bits. Otherwise the
// scalar kernel.
//   axpy            y += alpha x
//   scale           x *= alpha
//   sum_of_squares  sum x^2 (16-byte packs), each thread and block in double
//                   (16-bit packs: their 8 squares in fp32 first), block
//                   partials summed by the last block to finish, in slot
//                   order (deterministic: the gradient-norm clip must not
//                   depend on scheduling; the atomic ticket only picks WHICH
//                   block adds, not the order), total written to mapped
//                   pinned host memory: one launch per tensor, then a
//                   stream synchronisation instead of a pageable cudaMemcpy;
//                   sum_of_squares_many_to writes it to device memory and
//                   does not wait (the training step's gradient norm)
#include <limits>
#include <vector>

#include "kernels/cuda/column_sums.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kThreads = 256;

/// Columns on grid x, rows grid-strided on grid y: no per-element division.
template <class T>
__global__ void bias_add_kernel(T* __restrict__ y, const T* __restrict__ bias, kindex N,
                                kindex C) {
  const kindex c = kindex(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float b = load_f(bias, c);
  for (kindex r = blockIdx.y; r < N; r += gridDim.y) store_f(y, r * C + c, load_f(y, r * C + c) + b);
}

/// Rows of bias_add_packed_kernel per round of a thread: their loads are
/// issued before any add.
constexpr int kBiasAddRows = 4;

/// bias_add on packs: column pack cp = grid x, rounds of kBiasAddRows rows
/// grid-strided on y. The grid is what fits on the GPU at once (one block
/// per row makes 8192 x 3 blocks of one 16-byte pack per thread at [8192,
/// 3072] bf16, whose scheduling, not DRAM, sets the pace: 0.76 of the copy on
/// an H200, perf/bench_cuda_ops memory).
template <class T>
__global__ void bias_add_packed_kernel(T* __restrict__ y, const T* __restrict__ bias, kindex N,
                                       kindex packs_per_row) {
  start_after_prior_grid();
  const kindex cp = kindex(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cp >= packs_per_row) return;
  const Pack<T> b = reinterpret_cast<const Pack<T>*>(bias)[cp];
  Pack<T>* rows = reinterpret_cast<Pack<T>*>(y);
  for (kindex r0 = kindex(blockIdx.y) * kBiasAddRows; r0 < N;
       r0 += kindex(gridDim.y) * kBiasAddRows) {
    Pack<T> in[kBiasAddRows];
#pragma unroll
    for (int u = 0; u < kBiasAddRows; ++u)
      if (r0 + u < N) in[u] = rows[(r0 + u) * packs_per_row + cp];
#pragma unroll
    for (int u = 0; u < kBiasAddRows; ++u) {
      if (r0 + u >= N) continue;
      Pack<T> out;
      const Widened<T> wi = widen(in[u]), wb = widen(b);
#pragma unroll
      for (int j = 0; j < kPack<T>; ++j) out.v[j] = from_f<T>(wi.v[j] + wb.v[j]);
      rows[(r0 + u) * packs_per_row + cp] = out;
    }
  }
}

struct Add {
  __device__ float operator()(float a, float b, float) const { return a + b; }
};

/// add_residual_bias on 16-byte packs: pack k of the call is pack
/// (first_pack + k) of the row-major output, whose bias pack is its column
/// pack. The sum in the order ((a + b) + residual) + bias, rounded once.
template <class T>
__global__ void add_residual_bias_packed_kernel(const T* a, const T* b,
                                                const T* __restrict__ residual,
                                                const T* __restrict__ bias, kindex packs_per_row,
                                                kindex first_pack, kindex packs, T* out) {
  start_after_prior_grid();
  constexpr int V = kPack<T>;
  GRID_STRIDE(k, packs) {
    const Pack<T> pa = reinterpret_cast<const Pack<T>*>(a)[k];
    const Pack<T> pb = reinterpret_cast<const Pack<T>*>(b)[k];
    Pack<T> pr{}, pbias{};
    if (residual) pr = reinterpret_cast<const Pack<T>*>(residual)[k];
    if (bias) pbias = reinterpret_cast<const Pack<T>*>(bias)[(first_pack + k) % packs_per_row];
    Pack<T> po;
#pragma unroll
    for (int j = 0; j < V; ++j)
      po.v[j] = from_f<T>(to_f(pa.v[j]) + to_f(pb.v[j]) + to_f(pr.v[j]) + to_f(pbias.v[j]));
    reinterpret_cast<Pack<T>*>(out)[k] = po;
  }
}

/// The same element by element (unaligned pointers or widths).
template <class T>
__global__ void add_residual_bias_kernel(const T* a, const T* b, const T* __restrict__ residual,
                                         const T* __restrict__ bias, kindex C, kindex first,
                                         kindex n, T* out) {
  GRID_STRIDE(i, n) {
    const float r = residual ? to_f(residual[i]) : 0.f;
    const float c = bias ? to_f(bias[(first + i) % C]) : 0.f;
    out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]) + r + c);
  }
}

struct Axpy {  // inputs (y, x)
  float alpha;
  __device__ float operator()(float y, float x, float) const { return y + alpha * x; }
};
struct Scale {
  float alpha;
  __device__ float operator()(float x, float, float) const { return alpha * x; }
};

/// Squares of one pack, added into acc: per element in double for fp32
/// (x^2 is exact in double); for 16-bit types the V squares (each exact in
/// fp32: at most 2 x 11 significant bits) are added in fp32 and converted
/// once, because the fp32 -> fp64 conversion runs at 16 per clock per SM
/// on sm_90 and one per element would cost about as much as the loads.
/// (A bf16 value above 1.8e19 squares to inf in fp32 where double would
/// not: a gradient that large has diverged anyway.)
/// widen() converts a 16-bit pair once, where fmaf(to_f(v), to_f(v), s)
/// asked for two conversions of every value. The same values, in the same
/// order: the same bits.
template <class T>
__device__ __forceinline__ void add_squares(const Pack<T> p, double& acc) {
  const Widened<T> w = widen(p);
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int j = 0; j < kPack<T>; ++j) {
      const double v = w.v[j];
      acc += v * v;
    }
  } else {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kPack<T>; ++j) s = fmaf(w.v[j], w.v[j], s);
    acc += double(s);
  }
}

/// Blocks finished so far in the current sum_of_squares_many call; the
/// block that takes the last ticket resets it to 0 for the next call (calls
/// run one after another on the compute stream).
__device__ unsigned int g_squares_tickets = 0;

/// Writes this block's sum of x^2 to partial[slot0 + blockIdx.x]; the last
/// block of the whole call (all its kernels: `slots` blocks in all) then
/// adds partial[0 .. slots) in index order (a fixed order: deterministic)
/// and writes the total to *total (mapped host memory, or device memory for
/// sum_of_squares_many_to). One launch per
/// tensor and no separate finishing kernel. Launch bounds: 32 registers,
/// so 8 blocks of 256 fit an SM and the 1024-block grid is one wave of an
/// H100's 132 SMs (at 40 registers, 6 fit: 1.3 waves).
template <class T>
__global__ void __launch_bounds__(kThreads, 8)
    sum_of_squares_kernel(const T* __restrict__ x, kindex n, double* partial, unsigned slot0,
                          unsigned slots, double* total) {
  start_after_prior_grid();
  __shared__ double scratch[32];
  double acc = 0.0;
  // 16-byte packs where x is aligned (gradients always are), the rest (and
  // any unaligned tensor) element by element.
  constexpr int V = kPack<T>;
  const kindex packs = (reinterpret_cast<std::uintptr_t>(x) & 15u) == 0 ? n / V : 0;
  const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(x);
  const kindex stride = kindex(gridDim.x) * blockDim.x;
  kindex k = kindex(blockIdx.x) * blockDim.x + threadIdx.x;
  // Four packs' loads in flight per thread (64 bytes), added in order.
  constexpr int kUnroll = 4;
  for (; k + (kUnroll - 1) * stride < packs; k += kUnroll * stride) {
    Pack<T> p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) p[u] = xp[k + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) add_squares(p[u], acc);
  }
  for (; k < packs; k += stride) add_squares(xp[k], acc);
  for (kindex i = packs * V + kindex(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += kindex(gridDim.x) * blockDim.x) {
    const double v = load_f(x, i);
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[slot0 + blockIdx.x] = acc;
  if (!last_block_to_finish(&g_squares_tickets, slots)) return;
  double sum = 0.0;
  for (unsigned i = threadIdx.x; i < slots; i += blockDim.x) sum += __ldcg(partial + i);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    *total = sum;
    g_squares_tickets = 0;
  }
}

/// A mapped, pinned host double: the kernel writes the sum straight into
/// host memory, and the host waits for the stream instead of a copy.
/// One per process, used by one call at a time (each call synchronises).
double* squares_result() {
  static double* mapped = [] {
    void* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p, sizeof(double), cudaHostAllocMapped));
    return static_cast<double*>(p);
  }();
  return mapped;
}

}  // namespace

void bias_add(DType t, void* y, const void* bias, index_t N, index_t C) {
  if (N * C == 0) return;
  with_storage_type(t, "bias_add", [&](auto zero) {
    using T = decltype(zero);
    if (C % kPack<T> == 0 && aligned16(y) && aligned16(bias)) {
      constexpr int kPackThreads = 128;  // C = 768 bf16 is 96 packs
      const kindex packs = C / kPack<T>;
      static const kindex resident = resident_blocks(bias_add_packed_kernel<T>, kPackThreads);
      const kindex col_blocks = (packs + kPackThreads - 1) / kPackThreads;
      const kindex rounds = (N + kBiasAddRows - 1) / kBiasAddRows;
      kindex round_blocks = resident / col_blocks;
      if (round_blocks > rounds) round_blocks = rounds;
      if (round_blocks < 1) round_blocks = 1;
      const dim3 grid{unsigned(col_blocks), unsigned(round_blocks)};
      launch_dependent(bias_add_packed_kernel<T>, grid, kPackThreads, 0, compute_stream(),
                       static_cast<T*>(y), static_cast<const T*>(bias), N, packs);
      return;
    }
    const unsigned row_blocks = unsigned(N < 8192 ? N : 8192);
    const dim3 grid(unsigned((C + kThreads - 1) / kThreads), row_blocks);
    bias_add_kernel<T><<<grid, kThreads, 0, compute_stream()>>>(static_cast<T*>(y),
                                                       static_cast<const T*>(bias), N, C);
    MESH_CUDA_LAUNCHED();
  });
}

void bias_backward(DType t, DType g, const void* dy, index_t N, index_t C, void* dbias,
                   bool accumulate) {
  with_storage_and_grad_type(t, g, "bias_backward", [&](auto tz, auto gz) {
    using T = decltype(tz);
    using G = decltype(gz);
    plain_column_sums(static_cast<const T*>(dy), N, C, static_cast<G*>(dbias), accumulate);
  });
}

void add(DType t, const void* a, const void* b, index_t n, void* out) {
  add_on_stream(t, a, b, n, out, compute_stream());
}

void add_on_stream(DType t, const void* a, const void* b, index_t n, void* out,
                   CUstream_st* stream) {
  if (n == 0) return;
  with_storage_type(t, "add", [&](auto zero) {
    using T = decltype(zero);
    map3_on(stream, Add{}, static_cast<const T*>(a), static_cast<const T*>(b),
            static_cast<const T*>(nullptr), n, static_cast<T*>(out));
  });
}

void add_residual_bias_on_stream(DType t, const void* a, const void* b, const void* residual,
                                 const void* bias, index_t C, index_t first, index_t n,
                                 void* out, CUstream_st* stream) {
  if (n == 0) return;
  MESH_VERIFY(C > 0, "add_residual_bias: " << C << " columns");
  with_storage_type(t, "add_residual_bias", [&](auto zero) {
    using T = decltype(zero);
    constexpr int V = kPack<T>;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    const T* pr = static_cast<const T*>(residual);
    const T* pbias = static_cast<const T*>(bias);
    T* po = static_cast<T*>(out);
    const bool packed = aligned16(pa) && aligned16(pb) && (!pr || aligned16(pr)) &&
                        (!pbias || aligned16(pbias)) && aligned16(po) && C % V == 0 &&
                        first % V == 0 && n % V == 0;
    if (packed) {
      launch_dependent(add_residual_bias_packed_kernel<T>, grid_for(n / V, kThreads), kThreads, 0,
                       stream, pa, pb, pr, pbias, C / V, first / V, n / V, po);
      return;
    }
    add_residual_bias_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        pa, pb, pr, pbias, C, first, n, po);
    MESH_CUDA_LAUNCHED();
  });
}

void axpy(DType t, double alpha, const void* x, index_t n, void* y) {
  if (n == 0) return;
  with_storage_type(t, "axpy", [&](auto zero) {
    using T = decltype(zero);
    map3(Axpy{float(alpha)}, static_cast<const T*>(y), static_cast<const T*>(x),
         static_cast<const T*>(nullptr), n, static_cast<T*>(y));
  });
}

void scale(DType t, void* x, index_t n, double alpha) {
  if (n == 0) return;
  with_storage_type(t, "scale", [&](auto zero) {
    using T = decltype(zero);
    map3(Scale{float(alpha)}, static_cast<const T*>(x), static_cast<const T*>(nullptr),
         static_cast<const T*>(nullptr), n, static_cast<T*>(x));
  });
}

double sum_of_squares(DType t, const void* x, index_t n) {
  return sum_of_squares_many(1, &t, &x, &n);
}

double sum_of_squares_many(int count, const DType* types, const void* const* xs,
                           const index_t* ns) {
  double* host_total = squares_result();
  double* total_dev = nullptr;
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&total_dev), host_total, 0));
  *host_total = std::numeric_limits<double>::quiet_NaN();  // shows a missing write
  sum_of_squares_many_to(count, types, xs, ns, total_dev);
  CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  return *static_cast<volatile double*>(host_total);
}

void sum_of_squares_many_to(int count, const DType* types, const void* const* xs,
                            const index_t* ns, double* total) {
  constexpr kindex kMaxBlocks = 1024;  // ~8 per SM: enough loads in flight
  std::vector<unsigned> blocks(std::size_t(count), 0);
  kindex slots = 0;
  for (int k = 0; k < count; ++k) {
    if (ns[k] > 0) blocks[k] = grid_for(ns[k], kThreads, kMaxBlocks);
    slots += blocks[k];
  }
  if (slots == 0) {
    CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(double), compute_stream()));  // +0.0
    return;
  }
  MESH_VERIFY(slots < kindex(UINT32_MAX), "sum_of_squares: " << slots << " blocks");
  // Freed on return, before the kernels run: the allocator hands the block
  // out again only to work queued after them on the compute stream.
  device::Buffer partial(std::size_t(slots) * sizeof(double));
  kindex at = 0;
  for (int k = 0; k < count; ++k) {
    if (blocks[k] == 0) continue;
    with_storage_type(types[k], "sum_of_squares", [&](auto zero) {
      using T = decltype(zero);
      launch_dependent(sum_of_squares_kernel<T>, blocks[k], kThreads, 0, compute_stream(),
                       static_cast<const T*>(xs[k]), ns[k], partial.as<double>(), unsigned(at),
                       unsigned(slots), total);
    });
    at += blocks[k];
  }
}

}  // namespace meshtron::cuda
