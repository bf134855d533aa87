// ======================================================= Logit candidates ==
//
// Device twin of ops::logit_candidates (src/ops/ops_logit_candidates.cpp):
// what a tp rank's sampler needs of its vocabulary shard, so that the
// logits [rows, cols] never leave the GPU. One block per row:
//   1. the row's max and sum of exp(x - max) over its real columns;
//   2. its n largest (value, column) pairs, larger value first, lower column
//      first among equals: n passes of a block arg-max, each over the entries
//      ordered after the previous winner. O(n cols) reads per row, no sort
//      buffer: n is 1 (greedy) or top_k (at most kMaxCandidates).
// Columns >= real (the padded vocabulary) are never candidates.
#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kThreads = 256;

/// (v, c) ranks before (w, d): larger value, then lower column; c < 0 is none.
__device__ __forceinline__ bool ranks_before(float v, int c, float w, int d) {
  return c >= 0 && (d < 0 || v > w || (v == w && c < d));
}

/// The block's best (value, column) pair; every thread gets it.
__device__ void block_best(float& v, int& c, float* values, int* columns) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  auto warp_best = [&] {
    for (int o = 16; o > 0; o >>= 1) {
      const float w = __shfl_xor_sync(0xffffffffu, v, o);
      const int d = __shfl_xor_sync(0xffffffffu, c, o);
      if (ranks_before(w, d, v, c)) {
        v = w;
        c = d;
      }
    }
  };
  warp_best();
  __syncthreads();  // the scratch may still be read by the previous pass
  if (lane == 0) {
    values[warp] = v;
    columns[warp] = c;
  }
  __syncthreads();
  v = lane < warps ? values[lane] : -INFINITY;
  c = lane < warps ? columns[lane] : -1;
  warp_best();
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    logit_candidates_kernel(const T* __restrict__ logits, kindex cols, kindex real, int n,
                            float* __restrict__ out) {
  __shared__ float values[32];
  __shared__ int columns[32];
  __shared__ float scratch[32];
  const kindex row = blockIdx.x;
  const T* x = logits + row * cols;
  float* o = out + row * (2 + 2 * kindex(n));
  float max = -INFINITY;
  for (kindex c = threadIdx.x; c < real; c += kThreads) max = fmaxf(max, load_f(x, c));
  max = block_max(max, scratch);
  float sum = 0.f;
  for (kindex c = threadIdx.x; c < real; c += kThreads) sum += expf(load_f(x, c) - max);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    o[0] = max;
    o[1] = sum;
  }
  float last_v = INFINITY;
  int last_c = -1;
  for (int k = 0; k < n; ++k) {
    float v = -INFINITY;
    int best = -1;
    for (kindex c = threadIdx.x; c < real; c += kThreads) {
      const float w = load_f(x, c);
      const bool after = w < last_v || (w == last_v && int(c) > last_c);
      if (after && ranks_before(w, int(c), v, best)) {
        v = w;
        best = int(c);
      }
    }
    block_best(v, best, values, columns);
    if (threadIdx.x == 0) {
      o[2 + 2 * k] = best >= 0 ? v : -INFINITY;
      o[3 + 2 * k] = float(best);
    }
    if (best < 0) {  // fewer real columns than n: the rest stay empty
      for (int rest = k + 1 + int(threadIdx.x); rest < n; rest += kThreads) {
        o[2 + 2 * rest] = -INFINITY;
        o[3 + 2 * rest] = -1.f;
      }
      return;
    }
    last_v = v;
    last_c = best;
  }
}

}  // namespace

void logit_candidates(DType t, const void* logits, index_t rows, index_t cols, index_t real,
                      int n, float* out) {
  MESH_VERIFY(n >= 1 && n <= kMaxCandidates && real >= 0 && real <= cols &&
                  cols < (index_t(1) << 24),
              "logit_candidates: " << n << " candidates of " << real << " real columns out of "
                                   << cols << " (at most " << kMaxCandidates
                                   << " candidates; columns below 2^24, exact in fp32)");
  if (rows == 0) return;
  with_storage_type(t, "logit_candidates", [&](auto tag) {
    using T = decltype(tag);
    logit_candidates_kernel<T><<<unsigned(rows), kThreads, 0, compute_stream()>>>(
        static_cast<const T*>(logits), cols, real, n, out);
    MESH_CUDA_LAUNCHED();
  });
}

}  // namespace meshtron::cuda
