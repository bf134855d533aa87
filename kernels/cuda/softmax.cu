// ==================================================== Scaled causal softmax ==
//
// Same math as kernels/kokkos/softmax.hpp: scores [B, S, S] as B*S rows of S
// columns; row r is query i = r mod S and sees keys j <= i. Scale, causal
// mask and softmax are one kernel (one read of the scores, one write of the
// probabilities); masked entries are written as exact zeros and never take
// part in exp(). One warp per row, fp32 max/sum by shuffles; the row is
// re-read from L1 for the exp pass and the normalising pass.
//
// Backward: ds[j] = scale p[j] (dp[j] - sum_k dp[k] p[k]) for j <= i, else 0.
#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <class T>
__global__ void softmax_forward_kernel(const T* __restrict__ scores, kindex rows, kindex S,
                                       float scale, T* __restrict__ probs) {
  start_after_prior_grid();
  const kindex r = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const kindex last = r % S;  // keys 0..last are visible
  const T* s = scores + r * S;
  T* p = probs + r * S;
  float m = -INFINITY;
  for (kindex j = lane; j <= last; j += 32) m = fmaxf(m, scale * load_f(s, j));
  m = warp_max(m);
  float sum = 0.f;
  for (kindex j = lane; j <= last; j += 32) sum += expf(scale * load_f(s, j) - m);
  const float inv_sum = 1.f / warp_sum(sum);
  for (kindex j = lane; j < S; j += 32)
    store_f(p, j, j <= last ? expf(scale * load_f(s, j) - m) * inv_sum : 0.f);
}

template <class T>
__global__ void softmax_backward_kernel(const T* __restrict__ dprobs, const T* __restrict__ probs,
                                        kindex rows, kindex S, float scale,
                                        T* __restrict__ dscores) {
  start_after_prior_grid();
  const kindex r = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const kindex last = r % S;
  const T* dp = dprobs + r * S;
  const T* p = probs + r * S;
  float dot = 0.f;
  for (kindex j = lane; j <= last; j += 32) dot += load_f(dp, j) * load_f(p, j);
  dot = warp_sum(dot);
  T* ds = dscores + r * S;
  for (kindex j = lane; j < S; j += 32)
    store_f(ds, j, j <= last ? scale * (load_f(p, j) * (load_f(dp, j) - dot)) : 0.f);
}

}  // namespace

void scaled_causal_softmax_forward(DType t, const void* scores, index_t batch_heads, index_t S,
                                   double scale, void* probs) {
  const kindex rows = batch_heads * S;
  if (rows == 0) return;
  with_storage_type(t, "scaled_causal_softmax_forward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(softmax_forward_kernel<T>, grid_for(rows, kWarpsPerBlock, 1LL << 31),
                     kWarpsPerBlock * 32, 0, compute_stream(), static_cast<const T*>(scores), rows,
                     S, float(scale), static_cast<T*>(probs));
  });
}

void scaled_causal_softmax_backward(DType t, const void* dprobs, const void* probs,
                                    index_t batch_heads, index_t S, double scale, void* dscores) {
  const kindex rows = batch_heads * S;
  if (rows == 0) return;
  with_storage_type(t, "scaled_causal_softmax_backward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(softmax_backward_kernel<T>, grid_for(rows, kWarpsPerBlock, 1LL << 31),
                     kWarpsPerBlock * 32, 0, compute_stream(), static_cast<const T*>(dprobs),
                     static_cast<const T*>(probs), rows, S, float(scale), static_cast<T*>(dscores));
  });
}

}  // namespace meshtron::cuda
