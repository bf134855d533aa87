// =============================================================== LayerNorm ==
//
// Forward over x [N, H], one row per work item:
//   mean = (1/H) sum_h x[h]
//   var  = (1/H) sum_h (x[h] - mean)^2        (two-pass: no cancellation)
//   rstd = 1 / sqrt(var + eps)
//   y[h] = (x[h] - mean) * rstd * gamma[h] + beta[h]
// mean and rstd are saved for the backward.
//
// Backward, with xhat = (x - mean) * rstd and g = dy * gamma:
//   dx[h]      = rstd * (g[h] - mean_h(g) - xhat[h] * mean_h(g * xhat))
//   dgamma[h] += sum_n dy[n, h] * xhat[n, h]
//   dbeta[h]  += sum_n dy[n, h]
// dx is parallel over rows; dgamma/dbeta are column sums, parallel over
// columns so that no two work items write the same element (no atomics,
// bitwise reproducible).
//
// All row and column sums accumulate in double (accum_t).
#pragma once

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

template <class ExecSpace, class T>
struct LayerNormForward {
  Matrix<const T, ExecSpace> x;
  Vector<const T, ExecSpace> gamma, beta;
  accum_t eps;
  Matrix<T, ExecSpace> y;
  Vector<T, ExecSpace> mean, rstd;

  KOKKOS_INLINE_FUNCTION void operator()(kindex n) const {
    const kindex H = x.extent(1);
    accum_t sum = 0;
    for (kindex h = 0; h < H; ++h) sum += x(n, h);
    const accum_t mu = sum / H;
    accum_t sq = 0;
    for (kindex h = 0; h < H; ++h) {
      const accum_t d = x(n, h) - mu;
      sq += d * d;
    }
    const accum_t rs = 1.0 / kmath::sqrt(sq / H + eps);
    for (kindex h = 0; h < H; ++h) y(n, h) = T((x(n, h) - mu) * rs * gamma(h) + beta(h));
    mean(n) = T(mu);
    rstd(n) = T(rs);
  }
};

template <class ExecSpace, class T>
struct LayerNormBackwardInput {
  Matrix<const T, ExecSpace> dy, x;
  Vector<const T, ExecSpace> gamma, mean, rstd;
  Matrix<T, ExecSpace> dx;

  KOKKOS_INLINE_FUNCTION void operator()(kindex n) const {
    const kindex H = x.extent(1);
    const accum_t mu = mean(n), rs = rstd(n);
    accum_t sum_g = 0, sum_g_xhat = 0;
    for (kindex h = 0; h < H; ++h) {
      const accum_t g = accum_t(dy(n, h)) * gamma(h);
      sum_g += g;
      sum_g_xhat += g * (x(n, h) - mu) * rs;
    }
    const accum_t mean_g = sum_g / H, mean_g_xhat = sum_g_xhat / H;
    for (kindex h = 0; h < H; ++h) {
      const accum_t g = accum_t(dy(n, h)) * gamma(h);
      const accum_t xhat = (x(n, h) - mu) * rs;
      dx(n, h) = T(rs * (g - mean_g - xhat * mean_g_xhat));
    }
  }
};

template <class ExecSpace, class T>
struct LayerNormBackwardParams {
  Matrix<const T, ExecSpace> dy, x;
  Vector<const T, ExecSpace> mean, rstd;
  Vector<T, ExecSpace> dgamma, dbeta;

  KOKKOS_INLINE_FUNCTION void operator()(kindex h) const {
    const kindex N = x.extent(0);
    accum_t sum_dy_xhat = 0, sum_dy = 0;
    for (kindex n = 0; n < N; ++n) {
      const accum_t d = dy(n, h);
      sum_dy_xhat += d * (x(n, h) - accum_t(mean(n))) * rstd(n);
      sum_dy += d;
    }
    dgamma(h) += T(sum_dy_xhat);
    dbeta(h) += T(sum_dy);
  }
};

// ---------------------------------------------------------------- launchers

template <class ExecSpace, class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, kindex N, kindex H, double eps,
                       T* y, T* mean, T* rstd) {
  LayerNormForward<ExecSpace, T> f{as_matrix<ExecSpace>(x, N, H), as_vector<ExecSpace>(gamma, H),
                                   as_vector<ExecSpace>(beta, H), eps,
                                   as_matrix<ExecSpace>(y, N, H), as_vector<ExecSpace>(mean, N),
                                   as_vector<ExecSpace>(rstd, N)};
  Kokkos::parallel_for("meshtron::layernorm_forward", Range<ExecSpace>(0, N), f);
}

template <class ExecSpace, class T>
void layernorm_backward(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd,
                        kindex N, kindex H, T* dx, T* dgamma, T* dbeta) {
  LayerNormBackwardInput<ExecSpace, T> fx{
      as_matrix<ExecSpace>(dy, N, H), as_matrix<ExecSpace>(x, N, H),
      as_vector<ExecSpace>(gamma, H), as_vector<ExecSpace>(mean, N),
      as_vector<ExecSpace>(rstd, N),  as_matrix<ExecSpace>(dx, N, H)};
  Kokkos::parallel_for("meshtron::layernorm_backward_dx", Range<ExecSpace>(0, N), fx);
  LayerNormBackwardParams<ExecSpace, T> fp{
      as_matrix<ExecSpace>(dy, N, H),  as_matrix<ExecSpace>(x, N, H),
      as_vector<ExecSpace>(mean, N),   as_vector<ExecSpace>(rstd, N),
      as_vector<ExecSpace>(dgamma, H), as_vector<ExecSpace>(dbeta, H)};
  Kokkos::parallel_for("meshtron::layernorm_backward_dparams", Range<ExecSpace>(0, H), fp);
}

}  // namespace meshtron::kernels
