#include "ops/head_layout.hpp"

#include <cstring>

#include "common/error.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "ops/ops_cuda.hpp"
#endif

namespace meshtron::ops {

namespace {

/// Calls copy(token_row_offset, head_matrix_offset, d) for every (p, s, b, h):
/// the element offsets of one head vector in both layouts.
template <class F>
void for_each_head_vector(index_t s, index_t b, index_t heads, index_t d, int parts, F&& f) {
  const index_t row = index_t(parts) * heads * d;
  for (int p = 0; p < parts; ++p)
    for (index_t si = 0; si < s; ++si)
      for (index_t bi = 0; bi < b; ++bi)
        for (index_t h = 0; h < heads; ++h)
          f(p, (si * b + bi) * row + (p * heads + h) * d, ((bi * heads + h) * s + si) * d);
}

}  // namespace

void split_heads(const Tensor& x, index_t s, index_t b, index_t heads, int parts,
                 Tensor* out) {
  const index_t d = x.dim(1) / (parts * heads);
  MESH_VERIFY(x.dim(0) == s * b && x.dim(1) == parts * heads * d,
              "split_heads: " << shape_string(x.shape()) << " vs s=" << s << " b=" << b
                              << " heads=" << heads << " parts=" << parts);
  for (int p = 0; p < parts; ++p) out[p] = Tensor::empty({b * heads, s, d}, x.dtype(), x.space());
  const std::size_t es = dtype_size(x.dtype()), bytes = std::size_t(d) * es;
  if (!x.is_host()) {
#ifdef MESHTRON_HAVE_CUDA
    for (int p = 0; p < parts; ++p)
      cuda::split_heads_part(x.raw(), es, s, b, heads, d, parts, p, out[p].raw());
    return;
#else
    MESH_VERIFY(false, "split_heads: a device tensor, but the CUDA path is not built");
#endif
  }
  const char* src = static_cast<const char*>(x.raw());
  for_each_head_vector(s, b, heads, d, parts, [&](int p, index_t tok, index_t mat) {
    std::memcpy(static_cast<char*>(out[p].raw()) + mat * es, src + tok * es, bytes);
  });
}

void merge_heads(const Tensor* in, int parts, index_t s, index_t b, index_t heads,
                 Tensor& x) {
  const index_t d = in[0].dim(2);
  for (int p = 0; p < parts; ++p)
    MESH_VERIFY(in[p].shape() == in[0].shape() && in[p].space() == in[0].space() &&
                    in[p].dtype() == in[0].dtype() && in[p].numel() == b * heads * s * d,
                "merge_heads: part " << p << " is " << shape_string(in[p].shape())
                                     << ", expected [" << b * heads << ", " << s << ", " << d
                                     << "] like part 0");
  x = Tensor::empty({s * b, parts * heads * d}, in[0].dtype(), in[0].space());
  const std::size_t es = dtype_size(x.dtype()), bytes = std::size_t(d) * es;
  if (!x.is_host()) {
#ifdef MESHTRON_HAVE_CUDA
    for (int p = 0; p < parts; ++p)
      cuda::merge_heads_part(in[p].raw(), es, s, b, heads, d, parts, p, x.raw());
    return;
#else
    MESH_VERIFY(false, "merge_heads: a device tensor, but the CUDA path is not built");
#endif
  }
  char* dst = static_cast<char*>(x.raw());
  for_each_head_vector(s, b, heads, d, parts, [&](int p, index_t tok, index_t mat) {
    std::memcpy(dst + tok * es, static_cast<const char*>(in[p].raw()) + mat * es, bytes);
  });
}

}  // namespace meshtron::ops
