// The sampler's summary of a vocabulary shard (ops.hpp: Logit candidates).
// Host: each row in fp64, a partial sort; device tensors go to
// kernels/cuda/logit_candidates.cu and come back as [rows, 2 + 2n].
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/error.hpp"
#include "ops/ops.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "ops/ops_cuda.hpp"
#endif

namespace meshtron::ops {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

template <class T>
void summarise_row(const T* x, index_t real, int n, double* out) {
  double max = kNegInf, sum = 0;
  for (index_t c = 0; c < real; ++c) max = std::max(max, double(x[c]));
  for (index_t c = 0; c < real; ++c) sum += std::exp(double(x[c]) - max);
  out[0] = max;
  out[1] = sum;
  std::vector<index_t> order(static_cast<std::size_t>(real));
  std::iota(order.begin(), order.end(), index_t(0));
  const std::size_t keep = std::min(order.size(), std::size_t(n));
  std::partial_sort(order.begin(), order.begin() + long(keep), order.end(),
                    [&](index_t a, index_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  for (std::size_t k = 0; k < std::size_t(n); ++k) {
    out[2 + 2 * k] = k < keep ? double(x[order[k]]) : kNegInf;
    out[3 + 2 * k] = k < keep ? double(order[k]) : -1.0;
  }
}

Tensor candidates_on_device(const Tensor& logits, index_t real, int n) {
#ifdef MESHTRON_HAVE_CUDA
  Tensor out = Tensor::empty({logits.dim(0), 2 + 2 * index_t(n)}, DType::F32, MemorySpace::Cuda);
  cuda::logit_candidates(logits.dtype(), logits.raw(), logits.dim(0), logits.dim(1), real, n,
                         out.data<float>());
  return out.to_host().to(DType::F64);
#else
  MESH_VERIFY(false, "logit_candidates: a device tensor, but the CUDA path is not built");
  return {};
#endif
}

}  // namespace

Tensor logit_candidates(const Tensor& logits, index_t real, int n) {
  MESH_VERIFY(logits.rank() == 2 && n >= 1 && real >= 0 && real <= logits.dim(1),
              "logit_candidates: " << n << " candidates of " << real << " real columns of "
                                   << shape_string(logits.shape()));
  if (!logits.is_host()) return candidates_on_device(logits, real, n);
  const index_t rows = logits.dim(0), cols = logits.dim(1), width = 2 + 2 * index_t(n);
  Tensor out = Tensor::empty({rows, width}, DType::F64);
  for (index_t r = 0; r < rows; ++r) {
    double* o = out.data<double>() + r * width;
    switch (logits.dtype()) {
      case DType::F32: summarise_row(logits.data<float>() + r * cols, real, n, o); break;
      case DType::F64: summarise_row(logits.data<double>() + r * cols, real, n, o); break;
      default:
        MESH_VERIFY(false, "logit_candidates: host logits in fp32 or fp64, got "
                               << dtype_name(logits.dtype()));
    }
  }
  return out;
}

}  // namespace meshtron::ops
