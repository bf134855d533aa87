#include "ops/head_layout.hpp"

#include <cstring>

#include "common/error.hpp"

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
  MESH_VERIFY(x.is_host(), "split_heads: host tensors only");
  const index_t d = x.dim(1) / (parts * heads);
  MESH_VERIFY(x.dim(0) == s * b && x.dim(1) == parts * heads * d,
              "split_heads: " << shape_string(x.shape()) << " vs s=" << s << " b=" << b
                              << " heads=" << heads << " parts=" << parts);
  for (int p = 0; p < parts; ++p) out[p] = Tensor::empty({b * heads, s, d}, x.dtype());
  const std::size_t es = dtype_size(x.dtype()), bytes = std::size_t(d) * es;
  const char* src = static_cast<const char*>(x.raw());
  for_each_head_vector(s, b, heads, d, parts, [&](int p, index_t tok, index_t mat) {
    std::memcpy(static_cast<char*>(out[p].raw()) + mat * es, src + tok * es, bytes);
  });
}

void merge_heads(const Tensor* in, int parts, index_t s, index_t b, index_t heads,
                 Tensor& x) {
  const index_t d = in[0].dim(2);
  x = Tensor::empty({s * b, parts * heads * d}, in[0].dtype());
  const std::size_t es = dtype_size(x.dtype()), bytes = std::size_t(d) * es;
  char* dst = static_cast<char*>(x.raw());
  for_each_head_vector(s, b, heads, d, parts, [&](int p, index_t tok, index_t mat) {
    std::memcpy(dst + tok * es, static_cast<const char*>(in[p].raw()) + mat * es, bytes);
  });
}

}  // namespace meshtron::ops
