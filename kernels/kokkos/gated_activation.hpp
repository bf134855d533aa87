// ========================================================= MLP activations ==
//
// The plain MLP's activation, elementwise on fc's output x [n]:
//   y = act(x),   dx = dy act'(x)
// and the gated MLP's:
//
// x [N, 2F] holds (gate a | up b) per row, Megatron's fused first linear
// layer of a gated MLP (--swiglu: torch.chunk(x, 2, dim=-1)):
//   y[n, c]      = act(a) * b                 a = x[n, c], b = x[n, F + c]
//   dx[n, c]     = dy[n, c] * act'(a) * b
//   dx[n, F + c] = dy[n, c] * act(a)
// with, s standing for a sigmoid:
//   SiLU:      act = a s(a),        act' = s (1 + a (1 - s))
//   GeLU tanh: act = a s(2u),       act' = s + 2 a s (1 - s) c (1 + 3 k a^2)
//              u = c (a + k a^3)    (gelu.hpp: the same formula and its
//                                    derivation; transformers' gelu_pytorch_tanh)
//   GeLU erf:  act = a Phi(a),      act' = Phi(a) + a exp(-a^2 / 2) / sqrt(2 pi)
//              Phi(a) = erfc(-a / sqrt 2) / 2 (no cancellation for a < 0;
//              transformers' gelu, torch's exact GeLU)
//   ReLU:      act = max(a, 0),     act' = 1 for a > 0, else 0 (torch's
//                                    relu backward: threshold_backward)
//   Tanh:      act = tanh(a),       act' = 1 - tanh(a)^2 (BERT's pooler)
// Computed in accum_t, rounded once to T; one work item per output element.
#pragma once

#include "kernels/kokkos/common.hpp"
#include "kernels/kokkos/gelu.hpp"

namespace meshtron::kernels {

enum class GateKind { SiLU, GeLUTanh, GeLUErf, ReLU, Tanh };

/// act(a) and act'(a) of the gate.
struct GateValue {
  accum_t act, slope;
};

KOKKOS_INLINE_FUNCTION GateValue gate(GateKind kind, accum_t a) {
  if (kind == GateKind::SiLU) {
    const accum_t s = 1.0 / (1.0 + kmath::exp(-a));
    return {a * s, s * (1.0 + a * (1.0 - s))};
  }
  if (kind == GateKind::GeLUTanh) {
    const accum_t c = gelu_constants::sqrt_2_over_pi, k = gelu_constants::cubic;
    const accum_t s = 1.0 / (1.0 + kmath::exp(-2.0 * c * (a + k * a * a * a)));
    return {a * s, s + 2.0 * a * s * (1.0 - s) * c * (1.0 + 3.0 * k * a * a)};
  }
  if (kind == GateKind::ReLU) return a > 0 ? GateValue{a, 1.0} : GateValue{0.0, 0.0};
  if (kind == GateKind::Tanh) {
    const accum_t t = kmath::tanh(a);
    return {t, 1.0 - t * t};
  }
  constexpr accum_t inv_sqrt_2 = 0.70710678118654752440, inv_sqrt_2pi = 0.39894228040143267794;
  const accum_t phi = 0.5 * kmath::erfc(-a * inv_sqrt_2);
  return {a * phi, phi + a * kmath::exp(-0.5 * a * a) * inv_sqrt_2pi};
}

template <class ExecSpace, class T>
struct GatedActivationForward {
  Matrix<const T, ExecSpace> x;
  GateKind kind;
  Matrix<T, ExecSpace> y;

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const kindex F = y.extent(1), n = i / F, c = i % F;
    const accum_t act = gate(kind, widen(x(n, c))).act;
    y(n, c) = narrow<T>(act * widen(x(n, F + c)));
  }
};

template <class ExecSpace, class T>
struct GatedActivationBackward {
  Matrix<const T, ExecSpace> dy, x;
  GateKind kind;
  Matrix<T, ExecSpace> dx;

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const kindex F = dy.extent(1), n = i / F, c = i % F;
    const GateValue v = gate(kind, widen(x(n, c)));
    const accum_t d = widen(dy(n, c));
    dx(n, c) = narrow<T>(d * v.slope * widen(x(n, F + c)));
    dx(n, F + c) = narrow<T>(d * v.act);
  }
};

template <class ExecSpace, class T>
struct ActivationForward {
  Vector<const T, ExecSpace> x;
  GateKind kind;
  Vector<T, ExecSpace> y;

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    y(i) = narrow<T>(gate(kind, widen(x(i))).act);
  }
};

template <class ExecSpace, class T>
struct ActivationBackward {
  Vector<const T, ExecSpace> dy, x;
  GateKind kind;
  Vector<T, ExecSpace> dx;

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    dx(i) = narrow<T>(widen(dy(i)) * gate(kind, widen(x(i))).slope);
  }
};

// ---------------------------------------------------------------- launchers

template <class ExecSpace, class T>
void activation_forward(const T* x, kindex n, GateKind kind, T* y) {
  Kokkos::parallel_for("meshtron::activation_forward", Range<ExecSpace>(0, n),
                       ActivationForward<ExecSpace, T>{as_vector<ExecSpace>(x, n), kind,
                                                       as_vector<ExecSpace>(y, n)});
}

template <class ExecSpace, class T>
void activation_backward(const T* dy, const T* x, kindex n, GateKind kind, T* dx) {
  Kokkos::parallel_for("meshtron::activation_backward", Range<ExecSpace>(0, n),
                       ActivationBackward<ExecSpace, T>{as_vector<ExecSpace>(dy, n),
                                                        as_vector<ExecSpace>(x, n), kind,
                                                        as_vector<ExecSpace>(dx, n)});
}

template <class ExecSpace, class T>
void gated_activation_forward(const T* x, kindex N, kindex F, GateKind kind, T* y) {
  Kokkos::parallel_for("meshtron::gated_activation_forward", Range<ExecSpace>(0, N * F),
                       GatedActivationForward<ExecSpace, T>{as_matrix<ExecSpace>(x, N, 2 * F), kind,
                                                            as_matrix<ExecSpace>(y, N, F)});
}

template <class ExecSpace, class T>
void gated_activation_backward(const T* dy, const T* x, kindex N, kindex F, GateKind kind, T* dx) {
  Kokkos::parallel_for("meshtron::gated_activation_backward", Range<ExecSpace>(0, N * F),
                       GatedActivationBackward<ExecSpace, T>{
                           as_matrix<ExecSpace>(dy, N, F), as_matrix<ExecSpace>(x, N, 2 * F), kind,
                           as_matrix<ExecSpace>(dx, N, 2 * F)});
}

}  // namespace meshtron::kernels
