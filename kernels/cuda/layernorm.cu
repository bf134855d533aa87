// =============================================================== LayerNorm ==
//
// Same math as kernels/kokkos/layernorm.hpp, with fp32 statistics:
//   forward  mean, var by two passes over the row (no E[x^2] - E[x]^2
//            cancellation), rstd = 1/sqrt(var + eps), y = xhat gamma + beta
//   backward dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma
//            dgamma += sum_n dy xhat, dbeta += sum_n dy (column_sums.cuh:
//            deterministic, no atomics)
// One warp per row: rows of a transformer are 768..12288 wide, enough work
// for 32 lanes, and a warp reduces with shuffles alone (no shared memory, no
// block barrier). The second and third passes re-read the row from L1/L2.
#include "kernels/cuda/column_sums.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <class T>
__global__ void layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                         const T* __restrict__ beta, kindex N, kindex H,
                                         float eps, T* __restrict__ y, float* __restrict__ mean,
                                         float* __restrict__ rstd) {
  const kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* xr = x + row * H;
  float sum = 0.f;
  for (kindex h = lane; h < H; h += 32) sum += load_f(xr, h);
  const float mu = warp_sum(sum) / float(H);
  float sq = 0.f;
  for (kindex h = lane; h < H; h += 32) {
    const float d = load_f(xr, h) - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(warp_sum(sq) / float(H) + eps);
  T* yr = y + row * H;
  for (kindex h = lane; h < H; h += 32)
    store_f(yr, h, (load_f(xr, h) - mu) * rs * load_f(gamma, h) + load_f(beta, h));
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

template <class T>
__global__ void layernorm_backward_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                             const T* __restrict__ gamma,
                                             const float* __restrict__ mean,
                                             const float* __restrict__ rstd, kindex N, kindex H,
                                             T* __restrict__ dx) {
  const kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* dyr = dy + row * H;
  const T* xr = x + row * H;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.f, sum_g_xhat = 0.f;
  for (kindex h = lane; h < H; h += 32) {
    const float g = load_f(dyr, h) * load_f(gamma, h);
    sum_g += g;
    sum_g_xhat += g * (load_f(xr, h) - mu) * rs;
  }
  const float mean_g = warp_sum(sum_g) / float(H);
  const float mean_g_xhat = warp_sum(sum_g_xhat) / float(H);
  T* dxr = dx + row * H;
  for (kindex h = lane; h < H; h += 32) {
    const float g = load_f(dyr, h) * load_f(gamma, h);
    const float xhat = (load_f(xr, h) - mu) * rs;
    store_f(dxr, h, rs * (g - mean_g - xhat * mean_g_xhat));
  }
}

/// Column terms of dgamma (acc[0]) and dbeta (acc[1]).
template <class T>
struct LayerNormParamTerms {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  kindex H;
  __device__ void operator()(kindex r, kindex c, float* acc) const {
    const float d = load_f(dy, r * H + c);
    acc[0] += d * (load_f(x, r * H + c) - mean[r]) * rstd[r];
    acc[1] += d;
  }
};

}  // namespace

void layernorm_forward(DType t, const void* x, const void* gamma, const void* beta, index_t N,
                       index_t H, double eps, void* y, float* mean, float* rstd) {
  if (N == 0) return;
  with_storage_type(t, "layernorm_forward", [&](auto zero) {
    using T = decltype(zero);
    layernorm_forward_kernel<T><<<grid_for(N, kWarpsPerBlock, 1LL << 31), kWarpsPerBlock * 32, 0,
                                  kStream>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta), N, H,
        float(eps), static_cast<T*>(y), mean, rstd);
    MESH_CUDA_LAUNCHED();
  });
}

void layernorm_backward(DType t, DType g, const void* dy, const void* x, const void* gamma,
                        const float* mean, const float* rstd, index_t N, index_t H, void* dx,
                        void* dgamma, void* dbeta) {
  with_storage_and_grad_type(t, g, "layernorm_backward", [&](auto tz, auto gz) {
    using T = decltype(tz);
    using G = decltype(gz);
    if (N > 0) {
      layernorm_backward_dx_kernel<T><<<grid_for(N, kWarpsPerBlock, 1LL << 31),
                                        kWarpsPerBlock * 32, 0, kStream>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(gamma), mean,
          rstd, N, H, static_cast<T*>(dx));
      MESH_CUDA_LAUNCHED();
    }
    column_sums<2>(LayerNormParamTerms<T>{static_cast<const T*>(dy), static_cast<const T*>(x),
                                          mean, rstd, H},
                   N, H, static_cast<G*>(dgamma), static_cast<G*>(dbeta));
  });
}

}  // namespace meshtron::cuda
