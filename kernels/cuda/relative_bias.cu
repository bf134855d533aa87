// ================================================ T5 relative position bias ==
//
// As kernels/kokkos/relative_bias.hpp:
//   forward   bias[h, i, j] = table[buckets[i, j], h] in fp32, one thread per
//             element (the table is tiny and stays in L1/L2).
//   backward  dtable[buckets[i, j], h] += dbias[h, i, j] in fp32 by atomics:
//             sq * sk elements land in num_buckets entries per head, so each
//             block first sums its elements into a shared-memory copy of the
//             table (shared atomics), then adds its non-zero entries to
//             dtable with one global atomic each. The order of the fp32 adds
//             (so the last bits) depends on scheduling; the table's gradient
//             is one small sum per step, where that does not matter. A table
//             over kMaxSharedTable floats adds straight to global memory.
#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kThreads = 256;
constexpr kindex kMaxSharedTable = 12 * 1024;  // 48 KB of fp32: the default shared limit

template <class T>
__global__ void relative_bias_forward_kernel(const T* __restrict__ table, kindex H,
                                             const std::int32_t* __restrict__ buckets, kindex n,
                                             float* __restrict__ bias) {
  start_after_prior_grid();
  GRID_STRIDE(k, H * n) {
    const kindex h = k / n, e = k % n;
    bias[k] = load_f(table, kindex(buckets[e]) * H + h);
  }
}

/// One thread per (i, j) position, walking the heads.
__global__ void relative_bias_backward_shared_kernel(const float* __restrict__ dbias,
                                                     const std::int32_t* __restrict__ buckets,
                                                     kindex n, kindex num_buckets, kindex H,
                                                     float* __restrict__ dtable) {
  extern __shared__ float partial[];  // [num_buckets, H]
  const kindex entries = num_buckets * H;
  for (kindex k = threadIdx.x; k < entries; k += blockDim.x) partial[k] = 0.f;
  __syncthreads();
  start_after_prior_grid();
  GRID_STRIDE(e, n) {
    const kindex row = kindex(buckets[e]) * H;
    for (kindex h = 0; h < H; ++h) atomicAdd(&partial[row + h], dbias[h * n + e]);
  }
  __syncthreads();
  for (kindex k = threadIdx.x; k < entries; k += blockDim.x)
    if (partial[k] != 0.f) atomicAdd(&dtable[k], partial[k]);
}

__global__ void relative_bias_backward_global_kernel(const float* __restrict__ dbias,
                                                     const std::int32_t* __restrict__ buckets,
                                                     kindex n, kindex H,
                                                     float* __restrict__ dtable) {
  start_after_prior_grid();
  GRID_STRIDE(k, H * n) {
    const kindex h = k / n, e = k % n;
    atomicAdd(&dtable[kindex(buckets[e]) * H + h], dbias[k]);
  }
}

}  // namespace

void relative_bias_forward(DType t, const void* table, index_t num_buckets, index_t H,
                           const std::int32_t* buckets, index_t n, float* bias) {
  if (H * n == 0) return;
  with_storage_type(t, "relative_bias_forward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(relative_bias_forward_kernel<T>, grid_for(H * n, kThreads), kThreads, 0,
                     compute_stream(), static_cast<const T*>(table), kindex(H), buckets,
                     kindex(n), bias);
  });
}

void relative_bias_backward(const float* dbias, const std::int32_t* buckets, index_t n,
                            index_t num_buckets, index_t H, float* dtable) {
  if (H * n == 0) return;
  if (num_buckets * H <= kMaxSharedTable) {
    // Few blocks: each flushes its whole partial table, so a block should
    // cover many positions (4 waves of 256 threads over n would add 32 x H
    // entries per 1024 positions: one flush per ~30 positions per entry).
    const unsigned blocks = grid_for((n + 15) / 16, kThreads, multiprocessor_count() * 4);
    launch_dependent(relative_bias_backward_shared_kernel, blocks, kThreads,
                     std::size_t(num_buckets * H) * sizeof(float), compute_stream(), dbias,
                     buckets, kindex(n), kindex(num_buckets), kindex(H), dtable);
    return;
  }
  launch_dependent(relative_bias_backward_global_kernel, grid_for(H * n, kThreads), kThreads, 0,
                   compute_stream(), dbias, buckets, kindex(n), kindex(H), dtable);
}

}  // namespace meshtron::cuda
