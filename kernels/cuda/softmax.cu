// ==================================================== Scaled causal softmax ==
//
// Same math as kernels/kokkos/softmax.hpp: scores [B, S, S] as B*S rows of S
// columns; row r is query i = r mod S and sees keys j <= i. Scale, causal
// mask and softmax are one kernel (one read of the scores, one write of the
// probabilities); masked entries are written as exact zeros and never take
// part in exp(). One warp per row, fp32 max/sum by shuffles; the row is
// re-read from L1 for the exp pass and the normalising pass. Where 16-bit
// rows are whole 16-byte packs (S % 8 == 0, aligned pointers: every model
// shape) the forward moves a pack per lane and access, with 32-bit column
// indices and exp(scale x - m) as one FMA in the log2 domain and
// ex2.approx: column by column with expf it is instruction-bound (bf16
// [96, 1024, 1024] at 2.66 TB/s on both an H100 and an H200, 0.63 of the
// H200's copy, against 1.09 packed; perf/bench_cuda_ops memory).
//
// ALiBi (slopes [H] in fp32, matrix b of B being head b mod H) adds
// slope * (j - i) to each logit in fp32 inside the kernel, never to the
// stored 16-bit scores: at bf16's 8 bits a bias of hundreds would round
// away the score differences near the diagonal. It takes the column-by-
// column kernel.
//
// Backward: ds[j] = scale p[j] (dp[j] - sum_k dp[k] p[k]) for j <= i, else 0
// (the same with ALiBi: its bias is a constant).
//
// The masked softmax (bidirectional attention with a key-padding mask,
// kernels/kokkos/softmax.hpp's ScaledMaskedSoftmaxForward) reads the
// sample's mask row beside the scores, column by column; its backward is
// the causal one over the whole row.
//
// The attention softmax (kernels/kokkos/softmax.hpp's AttentionSoftmaxForward:
// scores [B, Sq, Sk], an fp32 bias [heads, Sq, Sk] added to the fp32 logit,
// key mask and causal mask with the queries the last Sq of Sk positions)
// is the masked kernel's shape with the visibility and the bias read per
// column; its backward is the full-row one with scale 1. The bias gradient
// sums dlogits over the samples: one thread per (head, i, j), walking the
// samples in order into an fp32 sum (no atomics, reproducible).
#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

/// alibi_slopes: [heads] or null (then the bias is 0 and the logits are
/// scale * s exactly: scale * s + 0 rounds as scale * s).
template <class T>
__global__ void softmax_forward_kernel(const T* __restrict__ scores, kindex rows, kindex S,
                                       float scale, T* __restrict__ probs,
                                       const float* __restrict__ alibi_slopes, kindex heads) {
  start_after_prior_grid();
  const kindex r = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const kindex last = r % S;  // keys 0..last are visible
  const float slope = alibi_slopes ? alibi_slopes[(r / S) % heads] : 0.f;
  const T* s = scores + r * S;
  T* p = probs + r * S;
  const auto logit = [&](kindex j) { return scale * load_f(s, j) + slope * float(j - last); };
  float m = -INFINITY;
  for (kindex j = lane; j <= last; j += 32) m = fmaxf(m, logit(j));
  m = warp_max(m);
  float sum = 0.f;
  for (kindex j = lane; j <= last; j += 32) sum += expf(logit(j) - m);
  const float inv_sum = 1.f / warp_sum(sum);
  for (kindex j = lane; j < S; j += 32)
    store_f(p, j, j <= last ? expf(logit(j) - m) * inv_sum : 0.f);
}

/// softmax_forward_kernel on 16-byte packs (S % V == 0, 16-byte aligned rows).
template <class T>
__global__ void softmax_forward_packed_kernel(const T* __restrict__ scores, kindex rows, int S,
                                              float scale, T* __restrict__ probs) {
  constexpr int V = kPack<T>;
  start_after_prior_grid();
  const kindex r = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const int last = int(r % S);  // keys 0..last are visible
  const int visible_packs = last / V + 1, packs = S / V;
  const Pack<T>* s = reinterpret_cast<const Pack<T>*>(scores + r * S);
  Pack<T>* p = reinterpret_cast<Pack<T>*>(probs + r * S);
  float m = -INFINITY;
  for (int k = lane; k < visible_packs; k += 32) {
    const Pack<T> x = s[k];
#pragma unroll
    for (int e = 0; e < V; ++e)
      if (k * V + e <= last) m = fmaxf(m, scale * to_f(x.v[e]));
  }
  const float m_log2e = warp_max(m) * kLog2e, scale_log2e = scale * kLog2e;
  float sum = 0.f;
  for (int k = lane; k < visible_packs; k += 32) {
    const Pack<T> x = s[k];
#pragma unroll
    for (int e = 0; e < V; ++e)
      if (k * V + e <= last) sum += fast_exp2(fmaf(to_f(x.v[e]), scale_log2e, -m_log2e));
  }
  const float inv_sum = 1.f / warp_sum(sum);
  for (int k = lane; k < packs; k += 32) {
    Pack<T> out;
    if (k < visible_packs) {
      const Pack<T> x = s[k];
#pragma unroll
      for (int e = 0; e < V; ++e)
        out.v[e] = from_f<T>(k * V + e <= last
                                 ? fast_exp2(fmaf(to_f(x.v[e]), scale_log2e, -m_log2e)) * inv_sum
                                 : 0.f);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = from_f<T>(0.f);
    }
    p[k] = out;
  }
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

/// Bidirectional softmax over the real keys of row r's sample (key_mask
/// [batch, S], matrix r / S of sample r / S / heads); padding keys exactly 0.
template <class T>
__global__ void masked_softmax_forward_kernel(const T* __restrict__ scores,
                                              const std::int32_t* __restrict__ key_mask,
                                              kindex rows, kindex S, kindex heads, float scale,
                                              T* __restrict__ probs) {
  start_after_prior_grid();
  const kindex r = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const std::int32_t* real = key_mask + (r / S / heads) * S;
  const T* s = scores + r * S;
  T* p = probs + r * S;
  float m = -INFINITY;
  for (kindex j = lane; j < S; j += 32)
    if (real[j]) m = fmaxf(m, scale * load_f(s, j));
  m = warp_max(m);
  float sum = 0.f;
  for (kindex j = lane; j < S; j += 32)
    if (real[j]) sum += expf(scale * load_f(s, j) - m);
  sum = warp_sum(sum);
  const float inv_sum = sum > 0.f ? 1.f / sum : 0.f;  // no real key: a row of zeros
  for (kindex j = lane; j < S; j += 32)
    store_f(p, j, real[j] ? expf(scale * load_f(s, j) - m) * inv_sum : 0.f);
}

/// The whole row's softmax Jacobian (p = 0 at padding keys gives ds = 0 there).
template <class T>
__global__ void full_softmax_backward_kernel(const T* __restrict__ dprobs,
                                             const T* __restrict__ probs, kindex rows, kindex S,
                                             float scale, T* __restrict__ dscores) {
  start_after_prior_grid();
  const kindex r = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const T* dp = dprobs + r * S;
  const T* p = probs + r * S;
  float dot = 0.f;
  for (kindex j = lane; j < S; j += 32) dot += load_f(dp, j) * load_f(p, j);
  dot = warp_sum(dot);
  T* ds = dscores + r * S;
  for (kindex j = lane; j < S; j += 32)
    store_f(ds, j, scale * (load_f(p, j) * (load_f(dp, j) - dot)));
}

/// Row r = (matrix m, query i) of the attention softmax: key j visible
/// unless masked by the sample's key mask or, causal, j > i + causal_shift.
template <class T>
__global__ void attention_softmax_forward_kernel(const T* __restrict__ scores, kindex rows,
                                                 kindex Sq, kindex Sk, float scale, kindex heads,
                                                 const float* __restrict__ bias,
                                                 const std::int32_t* __restrict__ key_mask,
                                                 bool causal, T* __restrict__ probs) {
  start_after_prior_grid();
  const kindex r = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const kindex i = r % Sq, m = r / Sq;
  const kindex last = causal ? i + (Sk - Sq) : Sk - 1;  // keys past it are masked
  const std::int32_t* real = key_mask ? key_mask + (m / heads) * Sk : nullptr;
  const float* b = bias ? bias + ((m % heads) * Sq + i) * Sk : nullptr;
  const T* s = scores + r * Sk;
  T* p = probs + r * Sk;
  const auto visible = [&](kindex j) { return j <= last && (!real || real[j] != 0); };
  const auto logit = [&](kindex j) { return scale * load_f(s, j) + (b ? b[j] : 0.f); };
  float m_max = -INFINITY;
  for (kindex j = lane; j < Sk; j += 32)
    if (visible(j)) m_max = fmaxf(m_max, logit(j));
  m_max = warp_max(m_max);
  float sum = 0.f;
  for (kindex j = lane; j < Sk; j += 32)
    if (visible(j)) sum += expf(logit(j) - m_max);
  sum = warp_sum(sum);
  const float inv_sum = sum > 0.f ? 1.f / sum : 0.f;  // no visible key: a row of zeros
  for (kindex j = lane; j < Sk; j += 32)
    store_f(p, j, visible(j) ? expf(logit(j) - m_max) * inv_sum : 0.f);
}

template <class T>
__global__ void attention_bias_backward_kernel(const T* __restrict__ dlogits, kindex batch_heads,
                                               kindex n, kindex heads, float* __restrict__ dbias) {
  start_after_prior_grid();
  GRID_STRIDE(k, heads * n) {
    const kindex h = k / n, e = k % n;
    float sum = 0.f;
    for (kindex m = h; m < batch_heads; m += heads) sum += load_f(dlogits, m * n + e);
    dbias[k] += sum;
  }
}

}  // namespace

void scaled_causal_softmax_forward(DType t, const void* scores, index_t batch_heads, index_t S,
                                   double scale, void* probs, const float* alibi_slopes,
                                   index_t heads) {
  const kindex rows = batch_heads * S;
  if (rows == 0) return;
  with_storage_type(t, "scaled_causal_softmax_forward", [&](auto zero) {
    using T = decltype(zero);
    // fp32 stays column by column: packed it reads at 0.94 of the copy on an
    // H200 against 1.05 (perf/bench_cuda_ops memory).
    if (!alibi_slopes && sizeof(T) == 2 && S % kPack<T> == 0 && S < (kindex(1) << 30) && aligned16(scores) &&
        aligned16(probs)) {
      launch_dependent(softmax_forward_packed_kernel<T>,
                       grid_for(rows, kWarpsPerBlock, 1LL << 31), kWarpsPerBlock * 32, 0,
                       compute_stream(), static_cast<const T*>(scores), rows, int(S),
                       float(scale), static_cast<T*>(probs));
      return;
    }
    launch_dependent(softmax_forward_kernel<T>, grid_for(rows, kWarpsPerBlock, 1LL << 31),
                     kWarpsPerBlock * 32, 0, compute_stream(), static_cast<const T*>(scores), rows,
                     S, float(scale), static_cast<T*>(probs), alibi_slopes, kindex(heads));
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

void scaled_masked_softmax_forward(DType t, const void* scores, const std::int32_t* key_mask,
                                   index_t batch_heads, index_t heads, index_t S, double scale,
                                   void* probs) {
  const kindex rows = batch_heads * S;
  if (rows == 0) return;
  with_storage_type(t, "scaled_masked_softmax_forward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(masked_softmax_forward_kernel<T>, grid_for(rows, kWarpsPerBlock, 1LL << 31),
                     kWarpsPerBlock * 32, 0, compute_stream(), static_cast<const T*>(scores),
                     key_mask, rows, S, kindex(heads), float(scale), static_cast<T*>(probs));
  });
}

void scaled_masked_softmax_backward(DType t, const void* dprobs, const void* probs,
                                    index_t batch_heads, index_t S, double scale, void* dscores) {
  const kindex rows = batch_heads * S;
  if (rows == 0) return;
  with_storage_type(t, "scaled_masked_softmax_backward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(full_softmax_backward_kernel<T>, grid_for(rows, kWarpsPerBlock, 1LL << 31),
                     kWarpsPerBlock * 32, 0, compute_stream(), static_cast<const T*>(dprobs),
                     static_cast<const T*>(probs), rows, S, float(scale),
                     static_cast<T*>(dscores));
  });
}

void attention_softmax_forward(DType t, const void* scores, index_t batch_heads, index_t Sq,
                               index_t Sk, double scale, index_t heads, const float* bias,
                               const std::int32_t* key_mask, bool causal, void* probs) {
  const kindex rows = batch_heads * Sq;
  if (rows == 0) return;
  with_storage_type(t, "attention_softmax_forward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(attention_softmax_forward_kernel<T>,
                     grid_for(rows, kWarpsPerBlock, 1LL << 31), kWarpsPerBlock * 32, 0,
                     compute_stream(), static_cast<const T*>(scores), rows, kindex(Sq),
                     kindex(Sk), float(scale), kindex(heads), bias, key_mask, causal,
                     static_cast<T*>(probs));
  });
}

void attention_softmax_backward(DType t, const void* dprobs, const void* probs, index_t rows,
                                index_t cols, void* dlogits) {
  if (rows == 0) return;
  with_storage_type(t, "attention_softmax_backward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(full_softmax_backward_kernel<T>, grid_for(rows, kWarpsPerBlock, 1LL << 31),
                     kWarpsPerBlock * 32, 0, compute_stream(), static_cast<const T*>(dprobs),
                     static_cast<const T*>(probs), kindex(rows), kindex(cols), 1.f,
                     static_cast<T*>(dlogits));
  });
}

void attention_bias_backward(DType t, const void* dlogits, index_t batch_heads, index_t n,
                             index_t heads, float* dbias) {
  if (heads * n == 0) return;
  with_storage_type(t, "attention_bias_backward", [&](auto zero) {
    using T = decltype(zero);
    constexpr int kThreads = 256;
    launch_dependent(attention_bias_backward_kernel<T>, grid_for(heads * n, kThreads), kThreads,
                     0, compute_stream(), static_cast<const T*>(dlogits), kindex(batch_heads),
                     kindex(n), kindex(heads), dbias);
  });
}

}  // namespace meshtron::cuda
