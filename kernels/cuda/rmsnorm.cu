// ================================================================= RMSNorm ==
//
// Llama's RMSNorm, with the roundings of transformers' LlamaRMSNorm (x and
// gamma of one dtype T):
//   forward  rstd = 1 / sqrt(mean(x^2) + eps)       (fp32, as .to(float32))
//            n = x rstd rounded to T                 (hidden_states.to(input_dtype))
//            y = gamma n rounded to T                (a T x T product: fp32, one rounding)
//   backward the gradient of that graph with the rounding of n passed
//            through (as autograd does), n' = x rstd unrounded:
//            g = dy gamma, dx = rstd (g - n' mean(g n'))
//            dgamma += sum_rows dy n, n rounded to T as the forward used it
//            (column_sums.cuh: deterministic, no atomics)
// fp32 arithmetic throughout; for T = fp32 every rounding above is the
// identity. rstd [N] is fp32, as the layernorm's statistics.
//
// One warp per row (as layernorm.cu's scalar kernels): the warp reduces with
// shuffles alone, and the second pass over the row re-reads it from L1/L2.
#include "kernels/cuda/column_sums.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <class T>
__global__ void rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                       kindex N, kindex H, float eps, T* __restrict__ y,
                                       float* __restrict__ rstd) {
  start_after_prior_grid();
  const kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* xr = x + row * H;
  float sq = 0.f;
  for (kindex h = lane; h < H; h += 32) {
    const float v = load_f(xr, h);
    sq += v * v;
  }
  const float rs = rsqrtf(warp_sum(sq) / float(H) + eps);
  T* yr = y + row * H;
  for (kindex h = lane; h < H; h += 32)
    store_f(yr, h, load_f(gamma, h) * round_to<T>(load_f(xr, h) * rs));
  if (rstd && lane == 0) rstd[row] = rs;
}

template <class T>
__global__ void rmsnorm_backward_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                           const T* __restrict__ gamma,
                                           const float* __restrict__ rstd, kindex N, kindex H,
                                           T* __restrict__ dx, const T* __restrict__ residual) {
  start_after_prior_grid();
  const kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* dyr = dy + row * H;
  const T* xr = x + row * H;
  const float rs = rstd[row];
  float sum_g_n = 0.f;
  for (kindex h = lane; h < H; h += 32)
    sum_g_n += load_f(dyr, h) * load_f(gamma, h) * load_f(xr, h) * rs;
  const float mean_g_n = warp_sum(sum_g_n) / float(H);
  T* dxr = dx + row * H;
  for (kindex h = lane; h < H; h += 32) {
    const float g = load_f(dyr, h) * load_f(gamma, h);
    const float n = load_f(xr, h) * rs;
    store_f(dxr, h, with_residual<T>(rs * (g - n * mean_g_n), residual, row * H + h));
  }
}

/// Column terms of dgamma: dy times n as the forward rounded it.
template <class T>
struct RmsNormGammaTerms {
  const T* dy;
  const T* x;
  const float* rstd;
  kindex H;
  __device__ void operator()(kindex r, kindex c, float* acc) const {
    acc[0] += load_f(dy, r * H + c) * round_to<T>(load_f(x, r * H + c) * rstd[r]);
  }
};

unsigned row_blocks(kindex N) { return grid_for(N, kWarpsPerBlock, 1LL << 31); }

}  // namespace

void rmsnorm_forward(DType t, const void* x, const void* gamma, index_t N, index_t H, double eps,
                     void* y, float* rstd) {
  if (N == 0 || H == 0) return;
  with_storage_type(t, "rmsnorm_forward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(rmsnorm_forward_kernel<T>, row_blocks(N), kWarpsPerBlock * 32, 0,
                     compute_stream(), static_cast<const T*>(x), static_cast<const T*>(gamma), N,
                     H, float(eps), static_cast<T*>(y), rstd);
  });
}

void rmsnorm_backward(DType t, DType g, const void* dy, const void* x, const void* gamma,
                      const float* rstd, index_t N, index_t H, void* dx, void* dgamma,
                      const void* residual_grad, bool accumulate) {
  if (H == 0) return;
  with_storage_and_grad_type(t, g, "rmsnorm_backward", [&](auto tz, auto gz) {
    using T = decltype(tz);
    using G = decltype(gz);
    if (N > 0)
      launch_dependent(rmsnorm_backward_dx_kernel<T>, row_blocks(N), kWarpsPerBlock * 32, 0,
                       compute_stream(), static_cast<const T*>(dy), static_cast<const T*>(x),
                       static_cast<const T*>(gamma), rstd, N, H, static_cast<T*>(dx),
                       static_cast<const T*>(residual_grad));
    column_sums<1>(RmsNormGammaTerms<T>{static_cast<const T*>(dy), static_cast<const T*>(x),
                                        rstd, H},
                   N, H, accumulate, static_cast<G*>(dgamma));
  });
}

}  // namespace meshtron::cuda
