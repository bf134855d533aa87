// ==================================================================== cast ==
//
// dst[i] = src[i] converted (fp32 <-> bf16 or fp16, round to nearest even), one
// grid-stride pass; the launcher of ops::cast (src/ops/cast.hpp).
#include "kernels/cuda/common.cuh"
#include "ops/cast.hpp"

namespace meshtron::cuda {
namespace {

template <class S, class D>
__global__ void cast_kernel(const S* src, D* dst, kindex n) {
  start_after_prior_grid();
  for (kindex i = kindex(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += kindex(gridDim.x) * blockDim.x)
    store_f(dst, i, load_f(src, i));
}

}  // namespace

void cast(DType from, const void* src, DType to, void* dst, index_t n) {
  if (n == 0) return;
  constexpr int threads = 256;
  const unsigned grid = grid_for(n, threads);
  const DType half = from == DType::F32 ? to : from;
  MESH_VERIFY((from == DType::F32) != (to == DType::F32) &&
                  (half == DType::BF16 || half == DType::F16),
              "cuda::cast: only fp32 <-> bf16 or fp16, got " << dtype_name(from) << " -> "
                                                             << dtype_name(to));
  with_storage_type(half, "cast", [&](auto zero) {
    using H = decltype(zero);
    if (from == DType::F32)
      launch_dependent(cast_kernel<float, H>, grid, threads, 0, compute_stream(),
                       static_cast<const float*>(src), static_cast<H*>(dst), n);
    else
      launch_dependent(cast_kernel<H, float>, grid, threads, 0, compute_stream(),
                       static_cast<const H*>(src), static_cast<float*>(dst), n);
  });
}

}  // namespace meshtron::cuda
