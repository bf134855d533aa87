// The T5 relative position bias ops (ops.hpp: T5 relative position bias):
// the bucket of each (query, key) pair, the bias gathered from the learned
// [num_buckets, heads] table, and its gradient scattered back.
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "kernels/kokkos/relative_bias.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

namespace {
/// transformers' T5Attention._relative_position_bucket for one relative
/// position (key - query). Half the buckets (all of them when not
/// bidirectional) are exact distances 0 .. max_exact - 1, the rest
/// logarithmic up to max_distance, beyond which everything shares the last
/// bucket. The logarithmic bucket is computed as torch does it on float32
/// tensors: log(float(rel) / max_exact) in fp32, divided by the fp32 of the
/// Python float log(max_distance / max_exact), times (n - max_exact),
/// truncated toward zero (`.to(torch.long)`).
std::int32_t relative_bucket(index_t rel, bool bidirectional, int num_buckets, int max_distance) {
  int n = num_buckets;
  std::int32_t ret = 0;
  if (bidirectional) {
    n /= 2;
    if (rel > 0) ret += n;
    rel = std::abs(rel);
  } else {
    rel = rel < 0 ? -rel : 0;
  }
  const int max_exact = n / 2;
  if (rel < max_exact) return ret + std::int32_t(rel);
  const float log_ratio = std::log(float(rel) / float(max_exact));
  const float log_range = float(std::log(double(max_distance) / double(max_exact)));
  const float large = log_ratio / log_range * float(n - max_exact);
  const index_t bucket = max_exact + index_t(large);
  return ret + std::int32_t(bucket < n - 1 ? bucket : n - 1);
}

/// buckets int32 [sq, sk] beside the bias/table; returns sq * sk.
index_t check_buckets(const char* op, const Arg& buckets, const Arg& beside) {
  require_index_arg(op, buckets);
  MESH_VERIFY(buckets.t.rank() == 2 && buckets.t.space() == beside.t.space(),
              op << ": " << describe(buckets) << " must be [sq, sk] beside " << describe(beside));
  return buckets.t.numel();
}

/// Host buckets must index the table's rows (device ones are not read back).
void check_bucket_range(const char* op, const Tensor& buckets, index_t num_buckets) {
  if (!buckets.is_host()) return;
  const std::int32_t* b = buckets.data<std::int32_t>();
  for (index_t e = 0; e < buckets.numel(); ++e)
    MESH_VERIFY(b[e] >= 0 && b[e] < num_buckets,
                op << ": bucket " << b[e] << " at element " << e << " is outside the table's "
                   << num_buckets << " rows");
}

/// bias [H, sq, sk] for buckets [sq, sk] and a table [num_buckets, H].
void check_bias_shape(const char* op, const Arg& bias, const Arg& buckets, const Arg& table) {
  MESH_VERIFY(table.t.rank() == 2 && table.t.dim(0) > 0 && table.t.dim(1) > 0,
              op << ": " << describe(table) << " must be [num_buckets, H]");
  const Shape want{table.t.dim(1), buckets.t.dim(0), buckets.t.dim(1)};
  MESH_VERIFY(bias.t.shape() == want, op << ": " << describe(bias) << " must be "
                                         << shape_string(want) << " for " << describe(buckets)
                                         << " and " << describe(table));
}

/// Host bias tensors: fp32, or fp64 (the gradient checks).
template <class F>
void with_bias_type(DType dtype, F&& f) {
  if (dtype == DType::F64)
    f(double{});
  else
    f(float{});
}
}  // namespace

// ------------------------------------------------ T5 relative position bias ---

Tensor relative_position_buckets(index_t sq, index_t sk, bool bidirectional, int num_buckets,
                                 int max_distance, index_t query_offset) {
  const int n = bidirectional ? num_buckets / 2 : num_buckets;
  MESH_VERIFY(sq >= 0 && sk >= 0 && n >= 2 && max_distance > n / 2,
              "relative_position_buckets: need sq, sk >= 0, at least "
                  << (bidirectional ? 4 : 2) << " buckets (got " << num_buckets
                  << ") and max_distance (" << max_distance << ") above the exact range");
  Tensor buckets = Tensor::empty({sq, sk}, DType::I32);
  std::int32_t* b = buckets.data<std::int32_t>();
  for (index_t i = 0; i < sq; ++i)
    for (index_t j = 0; j < sk; ++j)
      b[i * sk + j] = relative_bucket(j - (i + query_offset), bidirectional, num_buckets,
                                      max_distance);
  return buckets;
}

void relative_bias_forward(const Tensor& table, const Tensor& buckets, Tensor& bias) {
  const char* op = "relative_bias_forward";
  const Arg at{"table", table}, ab{"buckets", buckets}, ao{"bias", bias};
  const bool device = on_device(op, {at, ab, ao});
  require_storage_args(op, {at});
  MESH_VERIFY(bias.dtype() == DType::F32 || (!device && bias.dtype() == DType::F64),
              op << ": " << describe(ao) << " must be fp32" << (device ? "" : " or fp64"));
  const index_t n = check_buckets(op, ab, at);
  check_bias_shape(op, ao, ab, at);
  const index_t num_buckets = table.dim(0), H = table.dim(1);
  check_bucket_range(op, buckets, num_buckets);
  if (device) {
    ON_CUDA(cuda::relative_bias_forward(table.dtype(), table.raw(), num_buckets, H,
                                        buckets.data<std::int32_t>(), n, bias.data<float>()));
    return;
  }
  with_storage_type(table.dtype(), [&](auto tz) {
    using T = decltype(tz);
    with_bias_type(bias.dtype(), [&](auto bz) {
      using B = decltype(bz);
      kernels::relative_bias_forward<Host>(table.data<T>(), num_buckets, H,
                                           buckets.data<std::int32_t>(), n, bias.data<B>());
    });
  });
}

void relative_bias_backward(const Tensor& dbias, const Tensor& buckets, Tensor& dtable) {
  const char* op = "relative_bias_backward";
  const Arg ad{"dbias", dbias}, ab{"buckets", buckets}, at{"dtable", dtable};
  const bool device = on_device(op, {ad, ab, at});
  MESH_VERIFY(dbias.dtype() == DType::F32 || (!device && dbias.dtype() == DType::F64),
              op << ": " << describe(ad) << " must be fp32" << (device ? "" : " or fp64"));
  MESH_VERIFY(dtable.dtype() == dbias.dtype(),
              op << ": " << describe(at) << " must be " << dtype_name(dbias.dtype()) << " like "
                 << describe(ad));
  const index_t n = check_buckets(op, ab, ad);
  check_bias_shape(op, ad, ab, at);
  const index_t num_buckets = dtable.dim(0), H = dtable.dim(1);
  check_bucket_range(op, buckets, num_buckets);
  if (device) {
    ON_CUDA(cuda::relative_bias_backward(dbias.data<float>(), buckets.data<std::int32_t>(), n,
                                         num_buckets, H, dtable.data<float>()));
    return;
  }
  with_float_type(dbias.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::relative_bias_backward<Host>(dbias.data<T>(), buckets.data<std::int32_t>(), n,
                                          num_buckets, H, dtable.data<T>());
  });
}

}  // namespace meshtron::ops
