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
// The pure elementwise ones go through map3() (common.cuh): 16-byte packs.
// bias_add has a packed kernel too (C a multiple of V = 16 / sizeof(T) and
// y, bias 16-byte aligned): one thread per pack of columns, its bias pack
// in registers, rows on grid y; per element the same y + bias in fp32 and
// one rounding to T as the scalar kernel, so the same bits. Otherwise the
// scalar kernel.
//   axpy            y += alpha x
//   scale           x *= alpha
//   sum_of_squares  sum x^2 (16-byte packs), each thread and block in double, block partials
//                   summed by one block in a fixed order (deterministic:
//                   the gradient-norm clip must not depend on scheduling)
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

/// bias_add on packs: column pack cp = grid x, rows grid-strided on y.
template <class T>
__global__ void bias_add_packed_kernel(T* __restrict__ y, const T* __restrict__ bias, kindex N,
                                       kindex packs_per_row) {
  const kindex cp = kindex(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cp >= packs_per_row) return;
  const Pack<T> b = reinterpret_cast<const Pack<T>*>(bias)[cp];
  Pack<T>* rows = reinterpret_cast<Pack<T>*>(y);
  for (kindex r = blockIdx.y; r < N; r += gridDim.y) {
    const Pack<T> in = rows[r * packs_per_row + cp];
    Pack<T> out;
#pragma unroll
    for (int j = 0; j < kPack<T>; ++j) out.v[j] = from_f<T>(to_f(in.v[j]) + to_f(b.v[j]));
    rows[r * packs_per_row + cp] = out;
  }
}

struct Add {
  __device__ float operator()(float a, float b, float) const { return a + b; }
};
struct Axpy {  // inputs (y, x)
  float alpha;
  __device__ float operator()(float y, float x, float) const { return y + alpha * x; }
};
struct Scale {
  float alpha;
  __device__ float operator()(float x, float, float) const { return alpha * x; }
};

template <class T>
__global__ void sum_of_squares_partial_kernel(const T* __restrict__ x, kindex n,
                                              double* __restrict__ partial) {
  __shared__ double scratch[32];
  double acc = 0.0;
  // 16-byte packs where x is aligned (gradients always are), the rest (and
  // any unaligned tensor) element by element.
  constexpr int V = kPack<T>;
  const kindex packs = (reinterpret_cast<std::uintptr_t>(x) & 15u) == 0 ? n / V : 0;
  GRID_STRIDE(k, packs) {
    const Pack<T> p = reinterpret_cast<const Pack<T>*>(x)[k];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const double v = to_f(p.v[j]);
      acc += v * v;
    }
  }
  for (kindex i = packs * V + kindex(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += kindex(gridDim.x) * blockDim.x) {
    const double v = load_f(x, i);
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_partials_kernel(const double* __restrict__ partial, int count,
                                    double* __restrict__ total) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *total = acc;
}

}  // namespace

void bias_add(DType t, void* y, const void* bias, index_t N, index_t C) {
  if (N * C == 0) return;
  with_storage_type(t, "bias_add", [&](auto zero) {
    using T = decltype(zero);
    const unsigned row_blocks = unsigned(N < 8192 ? N : 8192);
    if (C % kPack<T> == 0 && aligned16(y) && aligned16(bias)) {
      constexpr int kPackThreads = 128;  // C = 768 bf16 is 96 packs
      const kindex packs = C / kPack<T>;
      const dim3 grid(unsigned((packs + kPackThreads - 1) / kPackThreads), row_blocks);
      bias_add_packed_kernel<T><<<grid, kPackThreads, 0, kStream>>>(
          static_cast<T*>(y), static_cast<const T*>(bias), N, packs);
      MESH_CUDA_LAUNCHED();
      return;
    }
    const dim3 grid(unsigned((C + kThreads - 1) / kThreads), row_blocks);
    bias_add_kernel<T><<<grid, kThreads, 0, kStream>>>(static_cast<T*>(y),
                                                       static_cast<const T*>(bias), N, C);
    MESH_CUDA_LAUNCHED();
  });
}

void bias_backward(DType t, DType g, const void* dy, index_t N, index_t C, void* dbias) {
  with_storage_and_grad_type(t, g, "bias_backward", [&](auto tz, auto gz) {
    using T = decltype(tz);
    using G = decltype(gz);
    plain_column_sums(static_cast<const T*>(dy), N, C, static_cast<G*>(dbias));
  });
}

void add(DType t, const void* a, const void* b, index_t n, void* out) {
  if (n == 0) return;
  with_storage_type(t, "add", [&](auto zero) {
    using T = decltype(zero);
    map3(Add{}, static_cast<const T*>(a), static_cast<const T*>(b),
         static_cast<const T*>(nullptr), n, static_cast<T*>(out));
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
  constexpr kindex kMaxBlocks = 1024;  // ~8 per SM: enough loads in flight
  std::vector<unsigned> blocks(std::size_t(count), 0);
  kindex slots = 0;
  for (int k = 0; k < count; ++k) {
    if (ns[k] > 0) blocks[k] = grid_for(ns[k], kThreads, kMaxBlocks);
    slots += blocks[k];
  }
  if (slots == 0) return 0.0;
  device::Buffer partial(std::size_t(slots + 1) * sizeof(double));
  double* total_dev = partial.as<double>() + slots;
  kindex at = 0;
  for (int k = 0; k < count; ++k) {
    if (blocks[k] == 0) continue;
    with_storage_type(types[k], "sum_of_squares", [&](auto zero) {
      using T = decltype(zero);
      sum_of_squares_partial_kernel<T><<<blocks[k], kThreads, 0, kStream>>>(
          static_cast<const T*>(xs[k]), ns[k], partial.as<double>() + at);
      MESH_CUDA_LAUNCHED();
    });
    at += blocks[k];
  }
  sum_partials_kernel<<<1, 1024, 0, kStream>>>(partial.as<double>(), int(slots), total_dev);
  MESH_CUDA_LAUNCHED();
  double total = 0.0;
  CUDA_CHECK(cudaMemcpy(&total, total_dev, sizeof(double), cudaMemcpyDeviceToHost));
  return total;
}

}  // namespace meshtron::cuda
