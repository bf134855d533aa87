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
// Rows of whole 16-byte packs with aligned pointers (Llama's H = 4096 ...)
// move in 16-byte loads and stores, others element by element.
#include "kernels/cuda/column_sums.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

/// Row `row` of x as W-wide units (W divides H; 16-byte aligned rows when
/// W > 1).
template <class T, int W>
__device__ __forceinline__ const Values<T, W>* units_of(const T* x, kindex row, kindex H) {
  return reinterpret_cast<const Values<T, W>*>(x + row * H);
}

template <class T, int W>
__global__ void rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                       kindex N, kindex H, float eps, T* __restrict__ y,
                                       float* __restrict__ rstd) {
  using U = Values<T, W>;
  start_after_prior_grid();
  const kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const kindex units = H / W;
  const U* xr = units_of<T, W>(x, row, H);
  float sq = 0.f;
  for (kindex u = lane; u < units; u += 32) {
    const U v = xr[u];
#pragma unroll
    for (int j = 0; j < W; ++j) sq += to_f(v.v[j]) * to_f(v.v[j]);
  }
  const float rs = rsqrtf(warp_sum(sq) / float(H) + eps);
  const U* gu = units_of<T, W>(gamma, 0, H);
  U* yr = reinterpret_cast<U*>(y + row * H);
  for (kindex u = lane; u < units; u += 32) {
    const U v = xr[u], g = gu[u];
    U out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = from_f<T>(to_f(g.v[j]) * round_to<T>(to_f(v.v[j]) * rs));
    yr[u] = out;
  }
  if (rstd && lane == 0) rstd[row] = rs;
}

template <class T, int W>
__global__ void rmsnorm_backward_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                           const T* __restrict__ gamma,
                                           const float* __restrict__ rstd, kindex N, kindex H,
                                           T* __restrict__ dx, const T* __restrict__ residual) {
  using U = Values<T, W>;
  start_after_prior_grid();
  const kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const kindex units = H / W;
  const U *dyr = units_of<T, W>(dy, row, H), *xr = units_of<T, W>(x, row, H),
          *gu = units_of<T, W>(gamma, 0, H);
  const float rs = rstd[row];
  float sum_g_n = 0.f;
  for (kindex u = lane; u < units; u += 32) {
    const U d = dyr[u], v = xr[u], g = gu[u];
#pragma unroll
    for (int j = 0; j < W; ++j) sum_g_n += to_f(d.v[j]) * to_f(g.v[j]) * to_f(v.v[j]) * rs;
  }
  const float mean_g_n = warp_sum(sum_g_n) / float(H);
  U* dxr = reinterpret_cast<U*>(dx + row * H);
  for (kindex u = lane; u < units; u += 32) {
    const U d = dyr[u], v = xr[u], g = gu[u];
    U out;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float n = to_f(v.v[j]) * rs;
      const float value = rs * (to_f(d.v[j]) * to_f(g.v[j]) - n * mean_g_n);
      out.v[j] = from_f<T>(with_residual<T>(value, residual, row * H + u * W + j));
    }
    dxr[u] = out;
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
    with_pack_width<T>(H, {x, gamma, y}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      launch_dependent(rmsnorm_forward_kernel<T, W>, row_blocks(N), kWarpsPerBlock * 32, 0,
                       compute_stream(), static_cast<const T*>(x), static_cast<const T*>(gamma),
                       N, H, float(eps), static_cast<T*>(y), rstd);
    });
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
      with_pack_width<T>(H, {dy, x, gamma, dx}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        launch_dependent(rmsnorm_backward_dx_kernel<T, W>, row_blocks(N), kWarpsPerBlock * 32, 0,
                         compute_stream(), static_cast<const T*>(dy), static_cast<const T*>(x),
                         static_cast<const T*>(gamma), rstd, N, H, static_cast<T*>(dx),
                         static_cast<const T*>(residual_grad));
      });
    column_sums<1>(RmsNormGammaTerms<T>{static_cast<const T*>(dy), static_cast<const T*>(x),
                                        rstd, H},
                   N, H, accumulate, static_cast<G*>(dgamma));
  });
}

}  // namespace meshtron::cuda
