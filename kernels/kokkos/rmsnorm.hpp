// ================================================================= RMSNorm ==
//
// Forward over x [N, H], one row per work item:
//   rstd   = 1 / sqrt((1/H) sum_h x[h]^2 + eps)
//   xhat   = round_T(x[h] * rstd)
//   y[h]   = round_T(xhat * gamma[h])
// The two roundings are transformers' LlamaRMSNorm order: the normalised row
// is computed in fp32 and cast back to the input dtype (`hidden_states.to(
// input_dtype)`), then multiplied by the weight (`self.weight * ...`). In
// fp32 and fp64 both products are the IEEE products of the storage type.
//
// Backward, with xhat = x * rstd and g = dy * gamma:
//   dx[h]      = rstd * (g[h] - xhat[h] * mean_h(g * xhat))
//   dgamma[h] += sum_n dy[n, h] * round_T(xhat[n, h])
// (d rstd / d x[k] = -rstd^3 x[k] / H; dgamma uses the rounded xhat the
// forward multiplied by gamma, as autograd through LlamaRMSNorm does.)
// dx is parallel over rows; dgamma is a column sum, parallel over columns
// (no atomics, bitwise reproducible).
//
// Storage T: float, double, bf16 or fp16; S (rstd): float or double; G
// (dgamma): T or float. Everything is computed in accum_t and rounded once
// (plus xhat's rounding above).
#pragma once

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

template <class ExecSpace, class T, class S>
struct RmsNormForward {
  Matrix<const T, ExecSpace> x;
  Vector<const T, ExecSpace> gamma;
  accum_t eps;
  Matrix<T, ExecSpace> y;
  Vector<S, ExecSpace> rstd;

  KOKKOS_INLINE_FUNCTION void operator()(kindex n) const {
    const kindex H = x.extent(1);
    accum_t sq = 0;
    for (kindex h = 0; h < H; ++h) {
      const accum_t v = widen(x(n, h));
      sq += v * v;
    }
    const accum_t rs = 1.0 / kmath::sqrt(sq / H + eps);
    for (kindex h = 0; h < H; ++h) {
      const T xhat = narrow<T>(widen(x(n, h)) * rs);
      y(n, h) = narrow<T>(widen(xhat) * widen(gamma(h)));
    }
    rstd(n) = S(rs);
  }
};

template <class ExecSpace, class T, class S>
struct RmsNormBackwardInput {
  Matrix<const T, ExecSpace> dy, x;
  Vector<const T, ExecSpace> gamma;
  Vector<const S, ExecSpace> rstd;
  Matrix<T, ExecSpace> dx;

  KOKKOS_INLINE_FUNCTION void operator()(kindex n) const {
    const kindex H = x.extent(1);
    const accum_t rs = rstd(n);
    accum_t sum_g_xhat = 0;
    for (kindex h = 0; h < H; ++h)
      sum_g_xhat += widen(dy(n, h)) * widen(gamma(h)) * widen(x(n, h)) * rs;
    const accum_t mean_g_xhat = sum_g_xhat / H;
    for (kindex h = 0; h < H; ++h) {
      const accum_t g = widen(dy(n, h)) * widen(gamma(h));
      const accum_t xhat = widen(x(n, h)) * rs;
      dx(n, h) = narrow<T>(rs * (g - xhat * mean_g_xhat));
    }
  }
};

template <class ExecSpace, class T, class S, class G>
struct RmsNormBackwardGamma {
  Matrix<const T, ExecSpace> dy, x;
  Vector<const S, ExecSpace> rstd;
  Vector<G, ExecSpace> dgamma;

  KOKKOS_INLINE_FUNCTION void operator()(kindex h) const {
    const kindex N = x.extent(0);
    accum_t sum = 0;
    for (kindex n = 0; n < N; ++n) {
      const T xhat = narrow<T>(widen(x(n, h)) * accum_t(rstd(n)));
      sum += widen(dy(n, h)) * widen(xhat);
    }
    dgamma(h) = narrow<G>(widen(dgamma(h)) + sum);
  }
};

// ---------------------------------------------------------------- launchers

template <class ExecSpace, class T, class S>
void rmsnorm_forward(const T* x, const T* gamma, kindex N, kindex H, double eps, T* y, S* rstd) {
  RmsNormForward<ExecSpace, T, S> f{as_matrix<ExecSpace>(x, N, H), as_vector<ExecSpace>(gamma, H),
                                    eps, as_matrix<ExecSpace>(y, N, H),
                                    as_vector<ExecSpace>(rstd, N)};
  Kokkos::parallel_for("meshtron::rmsnorm_forward", Range<ExecSpace>(0, N), f);
}

/// dx overwritten, dgamma accumulated.
template <class ExecSpace, class T, class S, class G>
void rmsnorm_backward(const T* dy, const T* x, const T* gamma, const S* rstd, kindex N, kindex H,
                      T* dx, G* dgamma) {
  RmsNormBackwardInput<ExecSpace, T, S> fx{
      as_matrix<ExecSpace>(dy, N, H), as_matrix<ExecSpace>(x, N, H), as_vector<ExecSpace>(gamma, H),
      as_vector<ExecSpace>(rstd, N), as_matrix<ExecSpace>(dx, N, H)};
  Kokkos::parallel_for("meshtron::rmsnorm_backward_dx", Range<ExecSpace>(0, N), fx);
  RmsNormBackwardGamma<ExecSpace, T, S, G> fg{
      as_matrix<ExecSpace>(dy, N, H), as_matrix<ExecSpace>(x, N, H), as_vector<ExecSpace>(rstd, N),
      as_vector<ExecSpace>(dgamma, H)};
  Kokkos::parallel_for("meshtron::rmsnorm_backward_dgamma", Range<ExecSpace>(0, H), fg);
}

}  // namespace meshtron::kernels
