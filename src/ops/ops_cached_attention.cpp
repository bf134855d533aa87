// Attention over a key/value cache (ops.hpp: Cached attention). Host loops:
// a decode step is one query row per sequence, a GEMV per head; device
// tensors go to kernels/cuda/cached_attention.cu.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.hpp"
#include "ops/ops.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "ops/ops_cuda.hpp"
#endif

namespace meshtron::ops {

namespace {

template <class T>
void store_kv(const T* row, index_t heads, index_t groups, index_t d, index_t capacity,
              index_t slot, index_t position, T* k_cache, T* v_cache) {
  for (index_t g = 0; g < groups; ++g) {
    const index_t at = ((slot * groups + g) * capacity + position) * d;
    std::copy_n(row + (heads + g) * d, d, k_cache + at);
    std::copy_n(row + (heads + groups + g) * d, d, v_cache + at);
  }
}

/// One query head of one row against positions 0..last of its group's cache.
template <class T>
void attend(const T* q, const T* k, const T* v, index_t last, index_t d, double scale,
            std::vector<double>& scores, T* out) {
  scores.resize(std::size_t(last + 1));
  double max_score = -INFINITY;
  for (index_t j = 0; j <= last; ++j) {
    double dot = 0;
    for (index_t e = 0; e < d; ++e) dot += double(q[e]) * double(k[j * d + e]);
    scores[std::size_t(j)] = scale * dot;
    max_score = std::max(max_score, scores[std::size_t(j)]);
  }
  double sum = 0;
  for (double& s : scores) sum += (s = std::exp(s - max_score));
  for (index_t e = 0; e < d; ++e) {
    double acc = 0;
    for (index_t j = 0; j <= last; ++j) acc += scores[std::size_t(j)] * double(v[j * d + e]);
    out[e] = T(acc / sum);
  }
}

template <class T>
void cached_attention_host(const Tensor& qkv, index_t heads, index_t groups,
                           const std::int32_t* slot, const std::int32_t* position, double scale,
                           Tensor& k_cache, Tensor& v_cache, Tensor& context) {
  const index_t rows = qkv.dim(0), capacity = k_cache.dim(2), d = k_cache.dim(3);
  const index_t width = (heads + 2 * groups) * d, per_group = heads / groups;
  const T* in = qkv.data<T>();
  T *kc = k_cache.data<T>(), *vc = v_cache.data<T>(), *out = context.data<T>();
  for (index_t r = 0; r < rows; ++r)
    store_kv(in + r * width, heads, groups, d, capacity, slot[r], position[r], kc, vc);
  std::vector<double> scores;
  for (index_t r = 0; r < rows; ++r) {
    const index_t s = slot[r], last = position[r];
    for (index_t h = 0; h < heads; ++h) {
      const index_t at = (s * groups + h / per_group) * capacity * d;
      attend(in + r * width + h * d, kc + at, vc + at, last, d, scale, scores,
             out + (r * heads + h) * d);
    }
  }
}

void cached_attention_device(const Tensor& qkv, index_t heads, index_t groups, const Tensor& slot,
                             const Tensor& position, double scale, Tensor& k_cache,
                             Tensor& v_cache, Tensor& context) {
#ifdef MESHTRON_HAVE_CUDA
  const index_t rows = qkv.dim(0), d = k_cache.dim(3), capacity = k_cache.dim(2);
  const int splits = cuda::cached_attention_splits(rows, heads, capacity);
  Tensor workspace;
  if (splits > 1)
    workspace = Tensor::empty({rows * heads * splits * (d + 2)}, DType::F32, MemorySpace::Cuda);
  cuda::CachedAttentionArgs args{qkv.dtype(),     qkv.raw(),   rows,  heads,
                                 groups,          d,           k_cache.dim(0), capacity,
                                 slot.data<std::int32_t>(), position.data<std::int32_t>(),
                                 scale,           k_cache.raw(), v_cache.raw(), context.raw()};
  args.splits = splits;
  args.workspace = splits > 1 ? workspace.data<float>() : nullptr;
  cuda::cached_attention(args);
#else
  MESH_VERIFY(false, "cached_attention: a device tensor, but the CUDA path is not built");
#endif
}

}  // namespace

void cached_attention(const Tensor& qkv, index_t heads, index_t groups, const Tensor& slot,
                      const Tensor& position, double scale, Tensor& k_cache, Tensor& v_cache,
                      Tensor& context) {
  const index_t rows = qkv.dim(0), d = k_cache.dim(3);
  MESH_VERIFY(k_cache.rank() == 4 && v_cache.shape() == k_cache.shape() &&
                  k_cache.dim(1) == groups && groups > 0 && heads % groups == 0 &&
                  qkv.rank() == 2 && qkv.dim(1) == (heads + 2 * groups) * d &&
                  context.numel() == rows * heads * d && slot.numel() == rows &&
                  position.numel() == rows && slot.dtype() == DType::I32 &&
                  position.dtype() == DType::I32 && qkv.dtype() == k_cache.dtype() &&
                  context.dtype() == qkv.dtype(),
              "cached_attention: inconsistent shapes");
  for (const Tensor& t : {slot, position, k_cache, v_cache, context})
    MESH_VERIFY(t.space() == qkv.space(), "cached_attention: tensors in different memory spaces");
  if (!qkv.is_host())
    return cached_attention_device(qkv, heads, groups, slot, position, scale, k_cache, v_cache,
                                   context);
  const std::int32_t *s = slot.data<std::int32_t>(), *p = position.data<std::int32_t>();
  for (index_t r = 0; r < rows; ++r)
    MESH_VERIFY(s[r] >= 0 && s[r] < k_cache.dim(0) && p[r] >= 0 && p[r] < k_cache.dim(2),
                "cached_attention: row " << r << " outside the cache");
  switch (qkv.dtype()) {
    case DType::F32:
      return cached_attention_host<float>(qkv, heads, groups, s, p, scale, k_cache, v_cache,
                                          context);
    case DType::F64:
      return cached_attention_host<double>(qkv, heads, groups, s, p, scale, k_cache, v_cache,
                                           context);
    default:
      MESH_REQUIRE(false, "generation on the host runs in fp32 or fp64, not "
                              << dtype_name(qkv.dtype()));
  }
}

}  // namespace meshtron::ops
