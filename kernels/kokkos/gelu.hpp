// ==================================================================== GeLU ==
//
// GPT-2's tanh approximation of the Gaussian error linear unit:
//   gelu(x)  = 0.5 x (1 + tanh(u)),   u = c (x + k x^3),
//   c = sqrt(2/pi), k = 0.044715.
// Its derivative, by the product and chain rules with tanh' = 1 - tanh^2:
//   gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 k x^2).
// Both are evaluated through the identity 0.5 (1 + tanh u) = sigmoid(2u) =: s
// (so 0.5 (1 - tanh^2 u) = 2 s (1 - s)):
//   gelu(x)  = x s,    gelu'(x) = s + 2 x s (1 - s) c (1 + 3 k x^2).
// The same function, but without the cancellation in 1 + tanh(u) for
// negative x, which in fp32 loses ~4 digits at x = -4.
// Elementwise; the arithmetic happens in the storage type T.
#pragma once

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

namespace gelu_constants {
inline constexpr double sqrt_2_over_pi = 0.79788456080286535588;
inline constexpr double cubic = 0.044715;
}  // namespace gelu_constants

template <class ExecSpace, class T>
struct GeluForward {
  Vector<const T, ExecSpace> x;
  Vector<T, ExecSpace> y;

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const T c = T(gelu_constants::sqrt_2_over_pi), k = T(gelu_constants::cubic);
    const T v = x(i);
    const T u = c * (v + k * v * v * v);
    y(i) = v / (T(1) + kmath::exp(T(-2) * u));  // x * sigmoid(2u)
  }
};

template <class ExecSpace, class T>
struct GeluBackward {
  Vector<const T, ExecSpace> dy, x;
  Vector<T, ExecSpace> dx;

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const T c = T(gelu_constants::sqrt_2_over_pi), k = T(gelu_constants::cubic);
    const T v = x(i);
    const T s = T(1) / (T(1) + kmath::exp(T(-2) * c * (v + k * v * v * v)));
    const T du_dx = c * (T(1) + T(3) * k * v * v);
    const T grad = s + T(2) * v * s * (T(1) - s) * du_dx;
    dx(i) = dy(i) * grad;
  }
};

// ---------------------------------------------------------------- launchers

template <class ExecSpace, class T>
void gelu_forward(const T* x, kindex n, T* y) {
  Kokkos::parallel_for(
      "meshtron::gelu_forward", Range<ExecSpace>(0, n),
      GeluForward<ExecSpace, T>{as_vector<ExecSpace>(x, n), as_vector<ExecSpace>(y, n)});
}

template <class ExecSpace, class T>
void gelu_backward(const T* dy, const T* x, kindex n, T* dx) {
  Kokkos::parallel_for(
      "meshtron::gelu_backward", Range<ExecSpace>(0, n),
      GeluBackward<ExecSpace, T>{as_vector<ExecSpace>(dy, n), as_vector<ExecSpace>(x, n),
                                 as_vector<ExecSpace>(dx, n)});
}

}  // namespace meshtron::kernels
