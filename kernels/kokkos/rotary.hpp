// =============================================== Rotary position embedding ==
//
// x [tokens, heads, head_dim]; for token t at position p = positions[t] and
// each of the first `rotated_heads` heads, the pairs (i, j) of dims with
// i < R/2 (R = rotary_dim) rotate by the angle p * inv_freq[i]:
//   y_i = x_i cos - x_j sin,   y_j = x_j cos + x_i sin
//   half-split  (GPT-NeoX, Llama):  j = i + R/2   (transformers' rotate_half)
//   interleaved (GPT-J):            (i, j) -> (2i, 2i + 1)  (rotate_every_two)
// Dims at or past R and the other heads are copied. The backward is the
// rotation by -angle (sign = -1), the transpose of the forward's.
//
// inv_freq[i] = 1 / base^(2i / R) and the angle are fp32, as transformers'
// rotary embeddings compute them (`1.0 / (base ** (arange(0, R, 2).float()
// / R))`, then `inv_freq @ position_ids.float()`); cos, sin and the rotation
// are computed in accum_t from that fp32 angle and rounded once to T.
//
// One work item per (token, head): it reads each pair before writing it, so
// y may alias x.
#pragma once

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

struct RotaryGeometry {
  kindex tokens, heads, head_dim;
  kindex rotated_heads;  ///< heads [0, rotated_heads) rotate
  kindex rotary_dim;     ///< even, <= head_dim
  bool interleaved;      ///< pairs (2i, 2i + 1) instead of (i, i + R/2)
};

template <class ExecSpace>
struct RotaryInverseFrequencies {
  float base;
  kindex rotary_dim;
  Vector<float, ExecSpace> inv_freq;

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const float exponent = float(2 * i) / float(rotary_dim);
    inv_freq(i) = 1.0f / kmath::pow(base, exponent);
  }
};

template <class ExecSpace, class T>
struct RotaryRotate {
  Vector<const T, ExecSpace> x;
  Vector<const std::int32_t, ExecSpace> positions;
  Vector<const float, ExecSpace> inv_freq;
  RotaryGeometry g;
  accum_t sign;  ///< +1 forward, -1 backward
  Vector<T, ExecSpace> y;

  KOKKOS_INLINE_FUNCTION void operator()(kindex item) const {
    const kindex t = item / g.heads, h = item % g.heads;
    const kindex begin = item * g.head_dim;
    const kindex rotated = h < g.rotated_heads ? g.rotary_dim : 0;
    const kindex half = g.rotary_dim / 2;
    for (kindex i = 0; i < half && rotated > 0; ++i) {
      const float angle = float(positions(t)) * inv_freq(i);
      const accum_t c = kmath::cos(accum_t(angle)), s = sign * kmath::sin(accum_t(angle));
      const kindex a = begin + (g.interleaved ? 2 * i : i);
      const kindex b = begin + (g.interleaved ? 2 * i + 1 : i + half);
      const accum_t xa = widen(x(a)), xb = widen(x(b));
      y(a) = narrow<T>(xa * c - xb * s);
      y(b) = narrow<T>(xb * c + xa * s);
    }
    if (x.data() == y.data()) return;
    for (kindex d = rotated; d < g.head_dim; ++d) y(begin + d) = x(begin + d);
  }
};

// ---------------------------------------------------------------- launchers

/// sign +1: the forward rotation; -1: its transpose (the backward).
template <class ExecSpace, class T>
void rotary(const T* x, const std::int32_t* positions, const RotaryGeometry& g, double base,
            double sign, T* y) {
  const kindex half = g.rotary_dim / 2;
  Kokkos::View<float*, typename ExecSpace::memory_space> inv_freq(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, "meshtron::rotary_inv_freq"),
      std::size_t(half));
  Kokkos::parallel_for("meshtron::rotary_inv_freq", Range<ExecSpace>(0, half),
                       RotaryInverseFrequencies<ExecSpace>{float(base), g.rotary_dim, inv_freq});
  const kindex n = g.tokens * g.heads * g.head_dim;
  RotaryRotate<ExecSpace, T> f{
      as_vector<ExecSpace>(x, n), as_vector<ExecSpace>(positions, g.tokens), inv_freq, g, sign,
      as_vector<ExecSpace>(y, n)};
  Kokkos::parallel_for("meshtron::rotary", Range<ExecSpace>(0, g.tokens * g.heads), f);
}

}  // namespace meshtron::kernels
