// =================================================================== AdamW ==
//
// torch.optim.AdamW, elementwise, at 1-based step t:
//   p <- p * (1 - lr * wd)                         (decoupled weight decay)
//   m <- b1 m + (1 - b1) g
//   v <- b2 v + (1 - b2) g^2
//   p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// The bias corrections are computed once on the host; the update is done in
// double and rounded to T once per stored quantity.
#pragma once

#include <cmath>

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

struct AdamWCoefficients {
  double lr, beta1, beta2, eps, weight_decay;
  double step_size;       // lr / (1 - b1^t)
  double inv_sqrt_bias2;  // 1 / sqrt(1 - b2^t)
};

inline AdamWCoefficients adamw_coefficients(double lr, double beta1, double beta2, double eps,
                                            double weight_decay, std::int64_t step) {
  const double bias1 = 1.0 - std::pow(beta1, double(step));
  const double bias2 = 1.0 - std::pow(beta2, double(step));
  return {lr, beta1, beta2, eps, weight_decay, lr / bias1, 1.0 / std::sqrt(bias2)};
}

template <class ExecSpace, class T>
struct AdamWStep {
  Vector<T, ExecSpace> param;
  Vector<const T, ExecSpace> grad;
  Vector<T, ExecSpace> m, v;
  AdamWCoefficients k;
  T grad_scale;  ///< g = grad * grad_scale in T first, as scale() would store it

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const double g = grad_scale == T(1) ? grad(i) : T(grad(i) * grad_scale);
    const double p = double(param(i)) * (1.0 - k.lr * k.weight_decay);
    const double m_new = k.beta1 * m(i) + (1.0 - k.beta1) * g;
    const double v_new = k.beta2 * v(i) + (1.0 - k.beta2) * g * g;
    const double denom = kmath::sqrt(v_new) * k.inv_sqrt_bias2 + k.eps;
    param(i) = T(p - k.step_size * m_new / denom);
    m(i) = T(m_new);
    v(i) = T(v_new);
  }
};

// ---------------------------------------------------------------- launchers

template <class ExecSpace, class T>
void adamw_step(T* param, const T* grad, T* m, T* v, kindex n, const AdamWCoefficients& k,
                double grad_scale = 1.0) {
  Kokkos::parallel_for(
      "meshtron::adamw_step", Range<ExecSpace>(0, n),
      AdamWStep<ExecSpace, T>{as_vector<ExecSpace>(param, n), as_vector<ExecSpace>(grad, n),
                              as_vector<ExecSpace>(m, n), as_vector<ExecSpace>(v, n), k,
                              T(grad_scale)});
}

}  // namespace meshtron::kernels
