// Shared vocabulary of the portable Kokkos kernels.
//
// Every kernel family in this folder is a set of functors templated on the
// execution space and the scalar type (float or double), plus a host-side
// launcher that wraps raw pointers in unmanaged Views and calls
// Kokkos::parallel_for / parallel_reduce over a RangePolicy. The launchers
// take raw pointers and extents, never a Tensor, so that the kernels do not
// depend on the tensor library (src/ops/ does that translation).
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

namespace meshtron::kernels {

using kindex = std::int64_t;

/// Accumulator for reductions that must not lose digits (row sums of
/// LayerNorm, softmax, cross-entropy, column sums of gradients): double for
/// float and double inputs alike.
using accum_t = double;

/// Unmanaged, row-major views over memory the caller owns.
template <class T, class ExecSpace>
using Vector = Kokkos::View<T*, Kokkos::LayoutRight, typename ExecSpace::memory_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class T, class ExecSpace>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Wrap caller-owned memory (T may be const): as_vector<ExecSpace>(p, n).
template <class ExecSpace, class T>
Vector<T, ExecSpace> as_vector(T* data, kindex n) {
  return Vector<T, ExecSpace>(data, std::size_t(n));
}
template <class ExecSpace, class T>
Matrix<T, ExecSpace> as_matrix(T* data, kindex rows, kindex cols) {
  return Matrix<T, ExecSpace>(data, std::size_t(rows), std::size_t(cols));
}

/// Storage in the kernels that compute in accum_t and round once (RMSNorm,
/// rotary, gated activations): float and double, or a 16-bit storage type
/// (meshtron's bf16, fp16) that converts explicitly to and from float.
template <class T>
KOKKOS_INLINE_FUNCTION accum_t widen(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return accum_t(v);
  else
    return accum_t(float(v));
}
template <class T>
KOKKOS_INLINE_FUNCTION T narrow(accum_t v) {
  if constexpr (std::is_floating_point_v<T>)
    return T(v);
  else
    return T(float(v));
}

template <class ExecSpace>
using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<kindex>>;

/// Math functions callable from device code: Kokkos 3.x keeps them in
/// Kokkos::Experimental, Kokkos 4 in Kokkos.
#if KOKKOS_VERSION >= 40000
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif

}  // namespace meshtron::kernels
