// ============================================================= Head layout ==
//
// Device twin of src/ops/head_layout.cpp: moves one part p of a token-major
// x [s*b, parts*heads*d] (rows in [s, b] order) to or from the head-major
// out [b*heads, s, d] that the attention core's batched GEMMs read. One
// thread per element of the head-major tensor, indexed so that consecutive
// threads touch consecutive features d of one head vector on both sides
// (coalesced reads and writes). Elements are moved as raw words of 1, 2, 4
// or 8 bytes: the layout change is the same for every dtype.
#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

/// Offset in x of element (bh, si, di) of head-major part p.
__device__ __forceinline__ kindex token_offset(kindex bh, kindex si, kindex di, kindex b,
                                               kindex heads, kindex d, kindex row, int p) {
  const kindex bi = bh / heads, h = bh % heads;
  return (si * b + bi) * row + (kindex(p) * heads + h) * d + di;
}

template <class W, bool kSplit>
__global__ void head_layout_kernel(const W* __restrict__ src, kindex s, kindex b, kindex heads,
                                   kindex d, int parts, int p, W* __restrict__ dst) {
  const kindex row = kindex(parts) * heads * d;
  GRID_STRIDE(i, b * heads * s * d) {  // i indexes the head-major tensor
    const kindex di = i % d, si = (i / d) % s, bh = i / (d * s);
    const kindex tok = token_offset(bh, si, di, b, heads, d, row, p);
    if (kSplit)
      dst[i] = src[tok];
    else
      dst[tok] = src[i];
  }
}

template <bool kSplit>
void launch(const void* src, std::size_t element_size, index_t s, index_t b, index_t heads,
            index_t d, int parts, int p, void* dst) {
  const kindex n = b * heads * s * d;
  if (n == 0) return;
  const unsigned blocks = grid_for(n, 256);
  auto go = [&](auto word) {
    using W = decltype(word);
    head_layout_kernel<W, kSplit><<<blocks, 256, 0, kStream>>>(
        static_cast<const W*>(src), s, b, heads, d, parts, p, static_cast<W*>(dst));
  };
  switch (element_size) {
    case 1: go(std::uint8_t{}); break;
    case 2: go(std::uint16_t{}); break;
    case 4: go(std::uint32_t{}); break;
    case 8: go(std::uint64_t{}); break;
    default: MESH_VERIFY(false, "head layout: element size " << element_size);
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

}  // namespace meshtron::cuda
