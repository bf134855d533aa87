#include "ops/head_layout.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

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

namespace {

/// heads, groups and the head dim of an expansion's two sides.
index_t check_kv_groups(const char* op, const Tensor& grouped, const Tensor& full, index_t heads,
                        index_t groups) {
  MESH_VERIFY(groups > 0 && heads % groups == 0 && grouped.rank() == 2 && full.rank() == 2 &&
                  grouped.dim(0) == full.dim(0) && grouped.dtype() == full.dtype() &&
                  grouped.space() == full.space() && grouped.dim(1) % (heads + 2 * groups) == 0 &&
                  full.dim(1) * (heads + 2 * groups) == grouped.dim(1) * 3 * heads,
              op << ": " << shape_string(grouped.shape()) << " with " << heads << " heads in "
                 << groups << " groups vs " << shape_string(full.shape()));
  return grouped.dim(1) / (heads + 2 * groups);
}

/// Column of the grouped row that feeds column c of the full row.
inline index_t grouped_column(index_t c, index_t heads, index_t groups, index_t d) {
  const index_t part = c / (heads * d), h = (c / d) % heads, di = c % d;
  if (part == 0) return c;
  const index_t group = h / (heads / groups);
  return heads * d + (part - 1) * groups * d + group * d + di;
}

template <class T>
void reduce_kv_groups_host(const T* dout, index_t tokens, index_t heads, index_t groups,
                           index_t d, T* dqkv) {
  const index_t full = 3 * heads * d, grouped = (heads + 2 * groups) * d;
  std::vector<T> row(grouped);
  for (index_t t = 0; t < tokens; ++t) {
    std::fill(row.begin(), row.end(), T(0));
    for (index_t c = 0; c < full; ++c) {
      const index_t g = grouped_column(c, heads, groups, d);
      row[g] = c < heads * d ? dout[t * full + c] : row[g] + dout[t * full + c];
    }
    std::copy(row.begin(), row.end(), dqkv + t * grouped);
  }
}

}  // namespace

void expand_kv_groups(const Tensor& qkv, index_t heads, index_t groups, Tensor& out) {
  const index_t tokens = qkv.dim(0), d = qkv.dim(1) / (heads + 2 * groups);
  out = Tensor::empty({tokens, 3 * heads * d}, qkv.dtype(), qkv.space());
  check_kv_groups("expand_kv_groups", qkv, out, heads, groups);
  const std::size_t es = dtype_size(qkv.dtype());
  if (!qkv.is_host()) {
#ifdef MESHTRON_HAVE_CUDA
    cuda::expand_kv_groups(qkv.raw(), es, tokens, heads, groups, d, out.raw());
    return;
#else
    MESH_VERIFY(false, "expand_kv_groups: a device tensor, but the CUDA path is not built");
#endif
  }
  const char* src = static_cast<const char*>(qkv.raw());
  char* dst = static_cast<char*>(out.raw());
  const index_t full = 3 * heads * d, grouped = (heads + 2 * groups) * d;
  for (index_t t = 0; t < tokens; ++t)
    for (index_t c = 0; c < full; c += d)  // one head vector at a time
      std::memcpy(dst + (t * full + c) * es, src + (t * grouped + grouped_column(c, heads, groups, d)) * es,
                  std::size_t(d) * es);
}

void reduce_kv_groups(const Tensor& dout, index_t heads, index_t groups, Tensor& dqkv) {
  const index_t tokens = dout.dim(0), d = dout.dim(1) / (3 * heads);
  dqkv = Tensor::empty({tokens, (heads + 2 * groups) * d}, dout.dtype(), dout.space());
  check_kv_groups("reduce_kv_groups", dqkv, dout, heads, groups);
  if (!dout.is_host()) {
#ifdef MESHTRON_HAVE_CUDA
    cuda::reduce_kv_groups(dout.dtype(), dout.raw(), tokens, heads, groups, d, dqkv.raw());
    return;
#else
    MESH_VERIFY(false, "reduce_kv_groups: a device tensor, but the CUDA path is not built");
#endif
  }
  if (dout.dtype() == DType::F64)
    reduce_kv_groups_host(dout.data<double>(), tokens, heads, groups, d, dqkv.data<double>());
  else if (dout.dtype() == DType::F32)
    reduce_kv_groups_host(dout.data<float>(), tokens, heads, groups, d, dqkv.data<float>());
  else
    MESH_VERIFY(false, "reduce_kv_groups: the host path takes fp32 or fp64, got "
                           << dtype_name(dout.dtype()));
}

}  // namespace meshtron::ops
