// ============================================================= Head layout ==
//
// Device twin of src/ops/head_layout.cpp: moves one part p of a token-major
// x [s*b, parts*heads*d] (rows in [s, b] order) to or from the head-major
// out [b*heads, s, d] that the attention core's batched GEMMs read. One
// thread per element of the head-major tensor, indexed so that consecutive
// threads touch consecutive features d of one head vector on both sides
// (coalesced reads and writes). Elements are moved as raw words, as wide as
// the head vector and alignment allow (16 bytes for bf16 heads of 64: a
// 2-byte-per-thread copy with 64-bit index math ran at a third of the copy
// bandwidth): the layout change is the same for every dtype.
#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

/// Moves head vectors as words of W bytes; I is the index type (32-bit
/// whenever the tensor allows: 64-bit division costs more than the copy).
template <class W, bool kSplit, class I>
__global__ void head_layout_kernel(const W* __restrict__ src, I s, I b, I heads, I d, I parts,
                                   I p, W* __restrict__ dst) {
  const I row = parts * heads * d;  // words per token row of x
  const I n = b * heads * s * d;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    // i indexes the head-major tensor [b*heads, s, d]; tok the token-major x.
    const I di = i % d, si = (i / d) % s, bh = i / (d * s);
    const I bi = bh / heads, h = bh % heads;
    const I tok = (si * b + bi) * row + (p * heads + h) * d + di;
    if (kSplit)
      dst[i] = src[tok];
    else
      dst[tok] = src[i];
  }
}

/// Widest word (16, 8, 4, 2 or 1 bytes) that divides a head vector and
/// both base addresses, so every word is aligned on both sides.
std::size_t word_bytes(std::size_t vector_bytes, const void* a, const void* b) {
  const auto addr = reinterpret_cast<std::uintptr_t>(a) | reinterpret_cast<std::uintptr_t>(b);
  std::size_t w = 16;
  while (w > 1 && (vector_bytes % w != 0 || addr % w != 0)) w /= 2;
  return w;
}

template <bool kSplit>
void launch(const void* src, std::size_t element_size, index_t s, index_t b, index_t heads,
            index_t d, int parts, int p, void* dst) {
  if (b * heads * s * d == 0) return;
  const std::size_t w = word_bytes(std::size_t(d) * element_size, src, dst);
  const index_t dw = index_t(std::size_t(d) * element_size / w);  // words per head vector
  const kindex n = b * heads * s * dw, x_words = s * b * parts * heads * dw;
  const unsigned blocks = grid_for(n, 256);
  auto go = [&](auto word, auto index) {
    using W = decltype(word);
    using I = decltype(index);
    head_layout_kernel<W, kSplit, I><<<blocks, 256, 0, compute_stream()>>>(
        static_cast<const W*>(src), I(s), I(b), I(heads), I(dw), I(parts), I(p),
        static_cast<W*>(dst));
  };
  auto with_index = [&](auto word) {
    if (x_words < (kindex(1) << 31))
      go(word, std::uint32_t{});
    else
      go(word, kindex{});
  };
  switch (w) {
    case 1: with_index(std::uint8_t{}); break;
    case 2: with_index(std::uint16_t{}); break;
    case 4: with_index(std::uint32_t{}); break;
    case 8: with_index(std::uint64_t{}); break;
    default: with_index(uint4{}); break;
  }
  MESH_CUDA_LAUNCHED();
}

}  // namespace

void split_heads_part(const void* x, std::size_t element_size, index_t s, index_t b,
                      index_t heads, index_t d, int parts, int p, void* out) {
  launch<true>(x, element_size, s, b, heads, d, parts, p, out);
}

void merge_heads_part(const void* in, std::size_t element_size, index_t s, index_t b,
                      index_t heads, index_t d, int parts, int p, void* x) {
  launch<false>(in, element_size, s, b, heads, d, parts, p, x);
}

namespace {

/// Column of the grouped row [q | k groups | v groups] that feeds column c of
/// the expanded row [q | k | v] (as ops::grouped_column on the host).
__device__ __forceinline__ kindex grouped_column(kindex c, kindex heads, kindex groups,
                                                 kindex d) {
  const kindex part = c / (heads * d), h = (c / d) % heads, di = c % d;
  if (part == 0) return c;
  return heads * d + (part - 1) * groups * d + (h / (heads / groups)) * d + di;
}

template <class W>
__global__ void expand_kv_groups_kernel(const W* __restrict__ qkv, kindex tokens, kindex heads,
                                        kindex groups, kindex d, W* __restrict__ out) {
  const kindex full = 3 * heads * d, grouped = (heads + 2 * groups) * d;
  GRID_STRIDE(i, tokens * full) {
    const kindex t = i / full, c = i % full;
    out[i] = qkv[t * grouped + grouped_column(c, heads, groups, d)];
  }
}

/// One thread per element of dqkv: dq copied, dk/dv summed over the group's heads in fp32.
template <class T>
__global__ void reduce_kv_groups_kernel(const T* __restrict__ dout, kindex tokens, kindex heads,
                                        kindex groups, kindex d, T* __restrict__ dqkv) {
  const kindex full = 3 * heads * d, grouped = (heads + 2 * groups) * d;
  const kindex per_group = heads / groups;
  GRID_STRIDE(i, tokens * grouped) {
    const kindex t = i / grouped, c = i % grouped;
    const T* row = dout + t * full;
    if (c < heads * d) {
      dqkv[i] = row[c];
      continue;
    }
    const kindex part = c < (heads + groups) * d ? 1 : 2;
    const kindex in_part = c - heads * d - (part - 1) * groups * d;
    const kindex group = in_part / d, di = in_part % d;
    float sum = 0.f;
    for (kindex h = group * per_group; h < (group + 1) * per_group; ++h)
      sum += to_f(row[part * heads * d + h * d + di]);
    dqkv[i] = from_f<T>(sum);
  }
}

}  // namespace

void expand_kv_groups(const void* qkv, std::size_t element_size, index_t tokens, index_t heads,
                      index_t groups, index_t d, void* out) {
  const kindex n = kindex(tokens) * 3 * heads * d;
  if (n == 0) return;
  auto go = [&](auto word) {
    using W = decltype(word);
    expand_kv_groups_kernel<W><<<grid_for(n, 256), 256, 0, compute_stream()>>>(
        static_cast<const W*>(qkv), tokens, heads, groups, d, static_cast<W*>(out));
  };
  if (element_size == 2) go(std::uint16_t{});
  else if (element_size == 4) go(std::uint32_t{});
  else go(std::uint64_t{});
  MESH_CUDA_LAUNCHED();
}

void reduce_kv_groups(DType t, const void* dout, index_t tokens, index_t heads, index_t groups,
                      index_t d, void* dqkv) {
  const kindex n = kindex(tokens) * (heads + 2 * groups) * d;
  if (n == 0) return;
  with_storage_type(t, "reduce_kv_groups", [&](auto type) {
    using T = decltype(type);
    reduce_kv_groups_kernel<T><<<grid_for(n, 256), 256, 0, compute_stream()>>>(
        static_cast<const T*>(dout), tokens, heads, groups, d, static_cast<T*>(dqkv));
  });
  MESH_CUDA_LAUNCHED();
}

}  // namespace meshtron::cuda
