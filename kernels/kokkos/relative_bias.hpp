// ================================================ T5 relative position bias ==
//
// T5's bias of head h on (query i, key j) is a learned scalar per (bucket,
// head): table [num_buckets, H], buckets int32 [sq, sk] (ops::
// relative_position_buckets), bias [H, sq, sk].
//   forward:  bias[h, i, j] = table[buckets[i, j], h]   (one item per element)
//   backward: dtable[buckets[i, j], h] += dbias[h, i, j]. Every (i, j) of
//             a head lands in one of its num_buckets entries, so the
//             backward runs in parallel over heads h, each work item walking
//             its sq * sk elements in order (no atomics, bitwise
//             reproducible, as the embedding's backward).
#pragma once

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

template <class ExecSpace, class Table, class Bias>
struct RelativeBiasForward {
  Matrix<const Table, ExecSpace> table;           // [num_buckets, H]
  Vector<const std::int32_t, ExecSpace> buckets;  // [sq * sk]
  Matrix<Bias, ExecSpace> bias;                   // [H, sq * sk]

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const kindex n = bias.extent(1), h = i / n, e = i % n;
    bias(h, e) = narrow<Bias>(widen(table(buckets(e), h)));
  }
};

template <class ExecSpace, class T>
struct RelativeBiasBackward {
  Matrix<const T, ExecSpace> dbias;               // [H, sq * sk]
  Vector<const std::int32_t, ExecSpace> buckets;  // [sq * sk]
  Matrix<T, ExecSpace> dtable;                    // [num_buckets, H]

  KOKKOS_INLINE_FUNCTION void operator()(kindex h) const {
    for (kindex e = 0; e < kindex(buckets.extent(0)); ++e) dtable(buckets(e), h) += dbias(h, e);
  }
};

// ---------------------------------------------------------------- launchers

/// table [num_buckets, H], buckets [n = sq * sk], bias [H, n].
template <class ExecSpace, class Table, class Bias>
void relative_bias_forward(const Table* table, kindex num_buckets, kindex H,
                           const std::int32_t* buckets, kindex n, Bias* bias) {
  RelativeBiasForward<ExecSpace, Table, Bias> f{as_matrix<ExecSpace>(table, num_buckets, H),
                                                as_vector<ExecSpace>(buckets, n),
                                                as_matrix<ExecSpace>(bias, H, n)};
  Kokkos::parallel_for("meshtron::relative_bias_forward", Range<ExecSpace>(0, H * n), f);
}

template <class ExecSpace, class T>
void relative_bias_backward(const T* dbias, const std::int32_t* buckets, kindex n,
                            kindex num_buckets, kindex H, T* dtable) {
  RelativeBiasBackward<ExecSpace, T> f{as_matrix<ExecSpace>(dbias, H, n),
                                       as_vector<ExecSpace>(buckets, n),
                                       as_matrix<ExecSpace>(dtable, num_buckets, H)};
  Kokkos::parallel_for("meshtron::relative_bias_backward", Range<ExecSpace>(0, H), f);
}

}  // namespace meshtron::kernels
