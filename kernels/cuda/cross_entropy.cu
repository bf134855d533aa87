// ============================================ Vocab-parallel cross-entropy ==
//
// Megatron's three local passes of kernels/kokkos/cross_entropy.hpp (see its
// comment for the math and where the tp all-reduces go), on logits
// [N, V_local] in fp32 or bf16 with fp32 per-row statistics:
//   row_max    m = max of the valid local columns (-inf if none)
//   partials   sum_exp = sum exp(l - m) (0 if none), target_logit = l[t] - m
//              if the target is local, else 0
//   row_stats  row_max and partials in one pass (the whole vocabulary on one
//              rank): an online softmax, the logits read once
//   loss       log(sum_exp) - target_logit
//   backward   dlogits = dloss exp(l - m) / Z - dloss [v == t], 0 in padding;
//              written in bf16/fp16 straight from fp32 logits when asked
// One block per row: a row is a whole vocabulary shard (thousands of
// columns), read with coalesced strides by 256 threads and reduced through
// shared memory. Where a row is a whole number of 16-byte words (V % 8 == 0
// and aligned pointers: always at Megatron's padded vocabulary sizes) each
// thread moves 8 columns per access (one 16-byte word of bf16/fp16, two of
// fp32; the backward one word, 4 fp32 columns) with 32-bit column indices;
// otherwise column by column. The
// exponentials are exp2 of a fused multiply-add in the log2 domain (one
// MUFU instruction; a libm expf per element made the 16-bit passes
// compute-bound at ~40 % of the copy bandwidth).
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPacked = 8;  // columns per access of the packed kernels

/// exp(x - m) as exp2(x log2e - m log2e): m_log2e = m * log2e, precomputed;
/// ex2.approx flushing results below 2^-126 (which no sum or bf16 gradient
/// of a softmax keeps).
__device__ __forceinline__ float exp_shifted(float x, float m_log2e) {
  return m_log2e == -INFINITY ? 0.f : fast_exp2(fmaf(x, kLog2e, -m_log2e));
}

/// The C columns at p as floats: one element (C = 1), or 8 read as 16-byte
/// words (p 16-byte aligned).
template <int C, class T>
__device__ __forceinline__ void load_chunk(const T* __restrict__ p, float (&x)[C]) {
  if constexpr (C == 1) {
    x[0] = to_f(p[0]);
  } else {
    constexpr int kWords = C * int(sizeof(T)) / 16;
    uint4 w[kWords];
#pragma unroll
    for (int k = 0; k < kWords; ++k) w[k] = reinterpret_cast<const uint4*>(p)[k];
    const T* e = reinterpret_cast<const T*>(w);
#pragma unroll
    for (int j = 0; j < C; ++j) x[j] = to_f(e[j]);
  }
}

template <int C, class O>
__device__ __forceinline__ void store_chunk(O* __restrict__ p, const float (&x)[C]) {
  if constexpr (C == 1) {
    p[0] = from_f<O>(x[0]);
  } else if constexpr (C * sizeof(O) == 8) {  // 4 fp32 logits' 16-bit gradients
    uint2 w;
    O* e = reinterpret_cast<O*>(&w);
#pragma unroll
    for (int j = 0; j < C; ++j) e[j] = from_f<O>(x[j]);
    *reinterpret_cast<uint2*>(p) = w;
  } else {
    constexpr int kWords = C * int(sizeof(O)) / 16;
    uint4 w[kWords];
    O* e = reinterpret_cast<O*>(w);
#pragma unroll
    for (int j = 0; j < C; ++j) e[j] = from_f<O>(x[j]);
#pragma unroll
    for (int k = 0; k < kWords; ++k) reinterpret_cast<uint4*>(p)[k] = w[k];
  }
}

/// Columns G of a group (float (&)[G]) of for_valid_groups.
template <class Group>
inline constexpr int kGroupSize = int(std::extent_v<std::remove_reference_t<Group>>);

/// Calls f(x, n) for the valid columns of row l, a group x[G] at a time of
/// which the first n are valid, C columns per thread and round. C = 1:
/// column by column (G = 1). C > 1: 16-byte words of G = E = 16 / sizeof(T)
/// columns, the round's C / E words of a thread a block apart (words w,
/// w + blockDim.x, ...), so each load instruction of a warp reads 512
/// contiguous bytes. (Two adjacent words per thread, the fp32 case, left half
/// of every sector to a second instruction: Nsight Compute counted 16 of 32
/// bytes used, and the fp32 partials read at 0.74 of the copy bandwidth.)
/// The reductions only: the order of the columns within a thread is free.
template <int C, class T, class F>
__device__ __forceinline__ void for_valid_groups(const T* l, int valid, F&& f) {
  if constexpr (C == 1) {
    for (int c = threadIdx.x; c < valid; c += blockDim.x) {
      const float x[1] = {to_f(l[c])};
      f(x, 1);
    }
  } else {
    constexpr int E = 16 / int(sizeof(T)), W = C / E;
    static_assert(W >= 1 && W * E == C, "C is a whole number of 16-byte words");
    const int words = (valid + E - 1) / E;
    const uint4* p = reinterpret_cast<const uint4*>(l);
    for (int w0 = threadIdx.x; w0 < words; w0 += W * int(blockDim.x)) {
      uint4 raw[W];
#pragma unroll
      for (int k = 0; k < W; ++k)
        if (w0 + k * int(blockDim.x) < words) raw[k] = p[w0 + k * int(blockDim.x)];
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const int w = w0 + k * int(blockDim.x);
        if (w >= words) continue;
        const T* e = reinterpret_cast<const T*>(&raw[k]);
        float x[E];
#pragma unroll
        for (int j = 0; j < E; ++j) x[j] = to_f(e[j]);
        f(x, valid - w * E < E ? valid - w * E : E);
      }
    }
  }
}

/// Calls f(x) for each valid column of row l (for_valid_groups' order).
template <int C, class T, class F>
__device__ __forceinline__ void for_valid_columns(const T* l, int valid, F&& f) {
  for_valid_groups<C>(l, valid, [&](const auto& x, int count) {
#pragma unroll
    for (int j = 0; j < kGroupSize<decltype(x)>; ++j)
      if (j < count) f(x[j]);
  });
}

template <class T, int C>
__global__ void row_max_kernel(const T* __restrict__ logits, int V, int valid,
                               float* __restrict__ row_max) {
  start_after_prior_grid();
  __shared__ float scratch[32];
  float m = -INFINITY;
  for_valid_columns<C>(logits + kindex(blockIdx.x) * V, valid,
                       [&](float x) { m = fmaxf(m, x); });
  m = block_max(m, scratch);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <class T, int C>
__global__ void partials_kernel(const T* __restrict__ logits,
                                const std::int32_t* __restrict__ targets,
                                const float* __restrict__ row_max, int V, kindex vocab_begin,
                                int valid, float* __restrict__ sum_exp,
                                float* __restrict__ target_logit) {
  start_after_prior_grid();
  __shared__ float scratch[32];
  const kindex n = blockIdx.x;
  const T* l = logits + n * V;
  const float m = row_max[n], m_log2e = m * kLog2e;
  float sum = 0.f;
  for_valid_columns<C>(l, valid, [&](float x) { sum += exp_shifted(x, m_log2e); });
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    const kindex t = kindex(targets[n]) - vocab_begin;
    sum_exp[n] = sum;
    target_logit[n] = (t >= 0 && t < valid) ? load_f(l, t) - m : 0.f;
  }
}

/// row_max_kernel and partials_kernel in one pass: thread-local running max
/// m and sum s of exp(x - m), a group of columns (a 16-byte word) at a time:
/// the group's max first, s rescaled by exp(m - max) where that raises m
/// (which a thread's first groups do and random later ones rarely), then
/// the group's exps; then the block's max M and the sum of the threads'
/// s exp(m - M), in fixed orders (deterministic).
template <class T, int C>
__global__ void row_stats_kernel(const T* __restrict__ logits,
                                 const std::int32_t* __restrict__ targets, int V,
                                 kindex vocab_begin, int valid, float* __restrict__ row_max,
                                 float* __restrict__ sum_exp, float* __restrict__ target_logit) {
  start_after_prior_grid();
  __shared__ float scratch[32];
  const kindex n = blockIdx.x;
  const T* l = logits + n * V;
  float m = -INFINITY, m_log2e = -INFINITY, sum = 0.f;
  for_valid_groups<C>(l, valid, [&](const auto& x, int count) {
    constexpr int G = kGroupSize<decltype(x)>;
    if (count == G) {
      // A whole group (all but a row's last): no per-column bounds checks,
      // one -inf check per group, exp2 in one instruction, the max as a tree
      // (max is exact in any order). Per column with the checks, the kernel
      // is instruction-bound: bf16 read at ~2.6 TB/s on both an H100 and an
      // H200 (perf/bench_cuda_ops memory).
      float pair_max[G];
#pragma unroll
      for (int j = 0; j < G; ++j) pair_max[j] = x[j];
#pragma unroll
      for (int width = G / 2; width >= 1; width /= 2)
#pragma unroll
        for (int j = 0; j < width; ++j) pair_max[j] = fmaxf(pair_max[j], pair_max[j + width]);
      if (pair_max[0] > m) {  // rescale the sum to the new max (from m = -inf: 0 * 0)
        sum *= fast_exp2(fmaf(-pair_max[0], kLog2e, m_log2e));
        m = pair_max[0];
        m_log2e = m * kLog2e;
      }
      if (m_log2e == -INFINITY) return;  // every column so far -inf: exp 0
#pragma unroll
      for (int j = 0; j < G; ++j) sum += fast_exp2(fmaf(x[j], kLog2e, -m_log2e));
      return;
    }
    float group_max = x[0];  // count >= 1
#pragma unroll
    for (int j = 1; j < G; ++j)
      if (j < count) group_max = fmaxf(group_max, x[j]);
    if (group_max > m) {
      sum *= exp2f(fmaf(-group_max, kLog2e, m_log2e));
      m = group_max;
      m_log2e = m * kLog2e;
    }
#pragma unroll
    for (int j = 0; j < G; ++j)
      if (j < count) sum += exp_shifted(x[j], m_log2e);
  });
  const float block_m = block_max(m, scratch);
  // exp(m - M) of a thread without valid columns (m = -inf) is 0, as is its sum.
  sum = block_sum(m == -INFINITY ? 0.f : sum * exp_shifted(m, block_m * kLog2e), scratch);
  if (threadIdx.x == 0) {
    const kindex t = kindex(targets[n]) - vocab_begin;
    row_max[n] = block_m;
    sum_exp[n] = sum;
    target_logit[n] = (t >= 0 && t < valid) ? load_f(l, t) - block_m : 0.f;
  }
}

__global__ void loss_kernel(const float* __restrict__ sum_exp,
                            const float* __restrict__ target_logit, kindex N,
                            float* __restrict__ loss) {
  start_after_prior_grid();
  GRID_STRIDE(n, N) loss[n] = float(log(double(sum_exp[n])) - double(target_logit[n]));
}

template <class T, class O, int C>
__global__ void backward_kernel(const T* __restrict__ logits,
                                const std::int32_t* __restrict__ targets,
                                const float* __restrict__ row_max,
                                const float* __restrict__ sum_exp,
                                const float* __restrict__ dloss, int V, kindex vocab_begin,
                                int valid, O* __restrict__ dlogits) {
  start_after_prior_grid();
  const kindex n = blockIdx.x;
  const T* l = logits + n * V;
  O* d = dlogits + n * V;
  const float m_log2e = row_max[n] * kLog2e, dl = dloss[n];
  const float scale = float(double(dl) / double(sum_exp[n]));  // dloss / Z
  const kindex t = kindex(targets[n]) - vocab_begin;
  for (int c = threadIdx.x; c < V / C; c += blockDim.x) {
    float x[C], g[C];
    load_chunk<C>(l + c * C, x);
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const int v = c * C + j;
      g[j] = v < valid ? scale * exp_shifted(x[j], m_log2e) - (v == t ? dl : 0.f) : 0.f;
    }
    store_chunk<C>(d + c * C, g);
  }
}

/// Calls f(std::integral_constant<int, C>{}) with C = 8 columns per access
/// where every row of each [N, V] tensor in `ptrs` is whole 16-byte words
/// (V % 8 == 0, aligned), else C = 1.
template <class F>
void with_columns_per_access(index_t V, std::initializer_list<const void*> ptrs, F&& f) {
  MESH_VERIFY(V < (index_t(1) << 30), "cross-entropy: " << V << " local vocabulary columns");
  bool packed = V % kPacked == 0;
  for (const void* p : ptrs) packed = packed && aligned16(p);
  if (packed)
    f(std::integral_constant<int, kPacked>{});
  else
    f(std::integral_constant<int, 1>{});
}

}  // namespace

void cross_entropy_row_max(DType t, const void* logits, index_t N, index_t V_local,
                           index_t valid_local, float* row_max) {
  if (N == 0) return;
  with_storage_type(t, "cross_entropy_row_max", [&](auto zero) {
    using T = decltype(zero);
    with_columns_per_access(V_local, {logits}, [&](auto c) {
      launch_dependent(row_max_kernel<T, decltype(c)::value>, unsigned(N), kThreads, 0,
                       compute_stream(), static_cast<const T*>(logits), int(V_local),
                       int(valid_local), row_max);
    });
  });
}

void cross_entropy_partials(DType t, const void* logits, const std::int32_t* targets,
                            const float* row_max, index_t N, index_t V_local, index_t vocab_begin,
                            index_t valid_local, float* sum_exp, float* target_logit) {
  if (N == 0) return;
  with_storage_type(t, "cross_entropy_partials", [&](auto zero) {
    using T = decltype(zero);
    with_columns_per_access(V_local, {logits}, [&](auto c) {
      launch_dependent(partials_kernel<T, decltype(c)::value>, unsigned(N), kThreads, 0,
                       compute_stream(), static_cast<const T*>(logits), targets, row_max,
                       int(V_local), vocab_begin, int(valid_local), sum_exp, target_logit);
    });
  });
}

void cross_entropy_row_stats(DType t, const void* logits, const std::int32_t* targets,
                             index_t N, index_t V_local, index_t vocab_begin, index_t valid_local,
                             float* row_max, float* sum_exp, float* target_logit) {
  if (N == 0) return;
  with_storage_type(t, "cross_entropy_row_stats", [&](auto zero) {
    using T = decltype(zero);
    with_columns_per_access(V_local, {logits}, [&](auto c) {
      launch_dependent(row_stats_kernel<T, decltype(c)::value>, unsigned(N), kThreads, 0,
                       compute_stream(), static_cast<const T*>(logits), targets, int(V_local),
                       vocab_begin, int(valid_local), row_max, sum_exp, target_logit);
    });
  });
}

void cross_entropy_loss(const float* sum_exp, const float* target_logit, index_t N, float* loss) {
  if (N == 0) return;
  launch_dependent(loss_kernel, grid_for(N, kThreads), kThreads, 0, compute_stream(), sum_exp,
                   target_logit, N, loss);
}

void cross_entropy_backward(DType t, DType out, const void* logits, const std::int32_t* targets,
                            const float* row_max, const float* sum_exp, const float* dloss,
                            index_t N, index_t V_local, index_t vocab_begin, index_t valid_local,
                            void* dlogits) {
  if (N == 0) return;
  // dlogits in the logits' dtype, or 16-bit from fp32 logits (rounded once).
  with_storage_type(t, "cross_entropy_backward", [&](auto zero) {
    using T = decltype(zero);
    with_storage_type(out, "cross_entropy_backward", [&](auto out_zero) {
      using O = decltype(out_zero);
      with_columns_per_access(V_local, {logits, dlogits}, [&](auto c) {
        // One 16-byte word of logits per thread and access (4 fp32 columns,
        // not kPacked = 8 as two adjacent words: a warp's load then covered
        // every other 16 bytes, and fp32 read at 0.77 of an H200's copy).
        constexpr int kColumns = decltype(c)::value == 1 ? 1 : 16 / int(sizeof(T));
        launch_dependent(backward_kernel<T, O, kColumns>, unsigned(N), kThreads, 0,
                         compute_stream(), static_cast<const T*>(logits), targets, row_max,
                         sum_exp, dloss, int(V_local), vocab_begin, int(valid_local),
                         static_cast<O*>(dlogits));
      });
    });
  });
}

}  // namespace meshtron::cuda
