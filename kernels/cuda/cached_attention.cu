// ======================================================= Cached attention ==
//
// Device twin of src/ops/ops_cached_attention.cpp (generation's attention
// over a key/value cache), in two launches on the compute stream:
//
//   1. store: every row's k and v heads into the cache at (slot, position);
//   2. attend: one block of kWarps warps per (row, query head, split of the
//      cache). The warps take the split's positions round robin; a lane
//      owns features lane + 32 i of q, of the running output and of each
//      k / v row it reads (coalesced 128-byte rows), a shuffle sum gives the
//      score, and the softmax runs online (running max m, sum l; FlashAttention
//      's rescaling), so shared memory holds only the warps' partial
//      results: kWarps x (head_dim + 2) floats, whatever the context length.
//      With one split the block writes the context; with several (few rows,
//      a long cache: batch-1 decode) each split writes (m, l, acc) to a fp32
//      workspace and a third launch merges them.
//
// Storage fp32, bf16 or fp16; every product and sum in fp32. A row whose
// slot or position lies outside the cache stores nothing and writes no
// context (the op checked them on the host first).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
/// Fewest cache positions worth a split of their own.
constexpr kindex kMinSplitLength = 64;
constexpr int kMaxSplits = 64;

struct CacheShape {
  int heads, groups, d;
  kindex num_slots, capacity;
  __host__ __device__ kindex width() const { return kindex(heads + 2 * groups) * d; }
};

__device__ __forceinline__ bool in_cache(const CacheShape& c, kindex slot, kindex position) {
  return slot >= 0 && slot < c.num_slots && position >= 0 && position < c.capacity;
}

template <class T>
__global__ void store_kv_kernel(const T* __restrict__ qkv, kindex rows, CacheShape c,
                                const std::int32_t* __restrict__ slots,
                                const std::int32_t* __restrict__ positions, T* __restrict__ k_cache,
                                T* __restrict__ v_cache) {
  GRID_STRIDE(i, rows * c.groups * c.d) {
    const kindex e = i % c.d, g = (i / c.d) % c.groups, r = i / (kindex(c.d) * c.groups);
    const kindex slot = slots[r], position = positions[r];
    if (!in_cache(c, slot, position)) continue;
    const kindex at = ((slot * c.groups + g) * c.capacity + position) * c.d + e;
    const T* row = qkv + r * c.width();
    k_cache[at] = row[(c.heads + g) * kindex(c.d) + e];
    v_cache[at] = row[(c.heads + c.groups + g) * kindex(c.d) + e];
  }
}

/// exp(m - max) as the weight of a partial result; 0 for an empty one.
__device__ __forceinline__ float rescale(float m, float max) {
  return m == -INFINITY ? 0.f : expf(m - max);
}

/// kPerLane = ceil(head_dim / 32) features per lane.
template <class T, int kPerLane>
__global__ void __launch_bounds__(kThreads)
    attend_kernel(const T* __restrict__ qkv, CacheShape c, const std::int32_t* __restrict__ slots,
                  const std::int32_t* __restrict__ positions, float scale,
                  const T* __restrict__ k_cache, const T* __restrict__ v_cache, int splits,
                  kindex split_length, T* __restrict__ context, float* __restrict__ partial) {
  __shared__ float warp_m[kWarps], warp_l[kWarps], warp_acc[kWarps][32 * kPerLane];
  const kindex bh = blockIdx.x, row = bh / c.heads;
  const int h = int(bh % c.heads), split = int(blockIdx.y);
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const kindex slot = slots[row], last = positions[row];
  const bool valid = in_cache(c, slot, last);
  const kindex begin = split * split_length;
  const kindex stop = begin + split_length < last + 1 ? begin + split_length : last + 1;
  const kindex end = valid ? stop : begin;
  const int g = h / (c.heads / c.groups);
  const T* q = qkv + row * c.width() + kindex(h) * c.d;
  const kindex head_base = valid ? (slot * c.groups + g) * c.capacity * c.d : 0;
  const T* k = k_cache + head_base;
  const T* v = v_cache + head_base;

  float qs[kPerLane], acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    qs[i] = e < c.d ? load_f(q, e) * scale : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (kindex j = begin + warp; j < end; j += kWarps) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < c.d) s += qs[i] * load_f(k, j * c.d + e);
    }
    s = warp_sum(s);
    const float m_new = fmaxf(m, s);
    const float correction = rescale(m, m_new), p = expf(s - m_new);
    l = l * correction + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      acc[i] = acc[i] * correction + (e < c.d ? p * load_f(v, j * c.d + e) : 0.f);
    }
    m = m_new;
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) warp_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();

  float max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) max = fmaxf(max, warp_m[w]);
  float sum = 0.f;
  for (int w = 0; w < kWarps; ++w) sum += rescale(warp_m[w], max) * warp_l[w];
  const kindex base = (bh * splits + split) * (c.d + 2);
  for (int e = int(threadIdx.x); e < c.d; e += kThreads) {
    float a = 0.f;
    for (int w = 0; w < kWarps; ++w) a += rescale(warp_m[w], max) * warp_acc[w][e];
    if (splits > 1)
      partial[base + 2 + e] = a;
    else if (valid)
      store_f(context, bh * c.d + e, a / sum);
  }
  if (splits > 1 && threadIdx.x == 0) {
    partial[base] = max;
    partial[base + 1] = sum;
  }
}

/// One block per (row, head): the splits' (m, l, acc) into the context.
template <class T>
__global__ void merge_splits_kernel(const float* __restrict__ partial, int d, int splits,
                                    T* __restrict__ context) {
  const kindex bh = blockIdx.x, base = bh * splits * (d + 2);
  float max = -INFINITY;
  for (int s = 0; s < splits; ++s) max = fmaxf(max, partial[base + s * (d + 2)]);
  if (max == -INFINITY) return;  // a row outside the cache: nothing attended
  float sum = 0.f;
  for (int s = 0; s < splits; ++s)
    sum += rescale(partial[base + s * (d + 2)], max) * partial[base + s * (d + 2) + 1];
  for (int e = int(threadIdx.x); e < d; e += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < splits; ++s)
      a += rescale(partial[base + s * (d + 2)], max) * partial[base + s * (d + 2) + 2 + e];
    store_f(context, bh * d + e, a / sum);
  }
}

template <class T, int kPerLane>
void attend(const CachedAttentionArgs& a, const CacheShape& c, int splits) {
  const kindex split_length = (c.capacity + splits - 1) / splits;
  const dim3 grid(unsigned(a.rows * c.heads), unsigned(splits));
  attend_kernel<T, kPerLane><<<grid, kThreads, 0, compute_stream()>>>(
      static_cast<const T*>(a.qkv), c, a.slots, a.positions, float(a.scale),
      static_cast<const T*>(a.k_cache), static_cast<const T*>(a.v_cache), splits, split_length,
      static_cast<T*>(a.context), a.workspace);
  MESH_CUDA_LAUNCHED();
  if (splits > 1) {
    merge_splits_kernel<T><<<unsigned(a.rows * c.heads), kThreads, 0, compute_stream()>>>(
        a.workspace, c.d, splits, static_cast<T*>(a.context));
    MESH_CUDA_LAUNCHED();
  }
}

}  // namespace

int cached_attention_splits(index_t rows, index_t heads, index_t capacity) {
  // Enough blocks for two per SM when the rows alone give fewer, each split
  // still kMinSplitLength positions long.
  static const kindex sms = multiprocessor_count();  // one GPU per process
  const kindex blocks = rows * heads, wanted = 2 * sms;
  if (blocks == 0 || blocks >= wanted) return 1;
  const kindex by_length = std::max<kindex>(1, capacity / kMinSplitLength);
  const kindex by_blocks = (wanted + blocks - 1) / blocks;
  return int(std::min<kindex>({by_length, by_blocks, kindex(kMaxSplits)}));
}

void cached_attention(const CachedAttentionArgs& a) {
  MESH_VERIFY(a.d >= 1 && a.d <= 256 && a.groups >= 1 && a.heads % a.groups == 0 &&
                  a.splits >= 1 && a.splits <= kMaxSplits && (a.splits == 1 || a.workspace),
              "cached_attention: head_dim " << a.d << " (the kernel takes 1 to 256), " << a.heads
                                            << " heads over " << a.groups << " groups, "
                                            << a.splits << " splits");
  if (a.rows == 0) return;
  const CacheShape c{int(a.heads), int(a.groups), int(a.d), a.num_slots, a.capacity};
  with_storage_type(a.dtype, "cached_attention", [&](auto t) {
    using T = decltype(t);
    const kindex n = a.rows * c.groups * c.d;
    store_kv_kernel<T><<<grid_for(n, 256), 256, 0, compute_stream()>>>(
        static_cast<const T*>(a.qkv), a.rows, c, a.slots, a.positions, static_cast<T*>(a.k_cache),
        static_cast<T*>(a.v_cache));
    MESH_CUDA_LAUNCHED();
    if (c.d <= 32)
      attend<T, 1>(a, c, a.splits);
    else if (c.d <= 64)
      attend<T, 2>(a, c, a.splits);
    else if (c.d <= 128)
      attend<T, 4>(a, c, a.splits);
    else
      attend<T, 8>(a, c, a.splits);
  });
}

}  // namespace meshtron::cuda
