// ==================================================================== cast ==
//
// dst[i] = src[i] converted (fp32 <-> bf16, round to nearest even), one
// grid-stride pass; the launcher of ops::cast (src/ops/cast.hpp).
#include "kernels/cuda/common.cuh"
#include "ops/cast.hpp"

namespace meshtron::cuda {
namespace {

template <class S, class D>
__global__ void cast_kernel(const S* src, D* dst, kindex n) {
  for (kindex i = kindex(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += kindex(gridDim.x) * blockDim.x)
    store_f(dst, i, load_f(src, i));
}

}  // namespace

void cast(DType from, const void* src, DType to, void* dst, index_t n) {
  if (n == 0) return;
  constexpr int threads = 256;
  const unsigned grid = grid_for(n, threads);
  if (from == DType::F32 && to == DType::BF16)
    cast_kernel<<<grid, threads, 0, kStream>>>(static_cast<const float*>(src),
                                               static_cast<bf16_t*>(dst), n);
  else if (from == DType::BF16 && to == DType::F32)
    cast_kernel<<<grid, threads, 0, kStream>>>(static_cast<const bf16_t*>(src),
                                               static_cast<float*>(dst), n);
  else
    MESH_VERIFY(false, "cuda::cast: only fp32 <-> bf16, got " << dtype_name(from) << " -> "
                                                             << dtype_name(to));
  MESH_CUDA_LAUNCHED();
}

}  // namespace meshtron::cuda
