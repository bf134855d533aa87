// ================================================ Elementwise and biases ==
//
//   bias_add:       y[n, c] += bias[c]               (y viewed as [N, C])
//   bias_backward:  dbias[c] += sum_n dy[n, c]       (column sums, in double,
//                                                     parallel over columns)
//   add:            out = a + b                      (out may alias a or b:
//                                                     each item reads then
//                                                     writes its own element)
//   axpy:           y += alpha x
//   scale:          x *= alpha
//   sum_of_squares: sum_i x[i]^2 in double (parallel_reduce)
#pragma once

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

template <class ExecSpace, class T>
struct BiasAdd {
  Matrix<T, ExecSpace> y;
  Vector<const T, ExecSpace> bias;
  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const kindex C = y.extent(1);
    y(i / C, i % C) += bias(i % C);
  }
};

template <class ExecSpace, class T>
struct BiasBackward {
  Matrix<const T, ExecSpace> dy;
  Vector<T, ExecSpace> dbias;
  KOKKOS_INLINE_FUNCTION void operator()(kindex c) const {
    accum_t sum = 0;
    for (kindex n = 0; n < kindex(dy.extent(0)); ++n) sum += dy(n, c);
    dbias(c) += T(sum);
  }
};

template <class ExecSpace, class T>
struct Add {
  Vector<const T, ExecSpace> a, b;
  Vector<T, ExecSpace> out;
  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const { out(i) = a(i) + b(i); }
};

template <class ExecSpace, class T>
struct Axpy {
  T alpha;
  Vector<const T, ExecSpace> x;
  Vector<T, ExecSpace> y;
  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const { y(i) += alpha * x(i); }
};

template <class ExecSpace, class T>
struct Scale {
  T alpha;
  Vector<T, ExecSpace> x;
  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const { x(i) *= alpha; }
};

template <class ExecSpace, class T>
struct SumOfSquares {
  Vector<const T, ExecSpace> x;
  KOKKOS_INLINE_FUNCTION void operator()(kindex i, accum_t& acc) const {
    const accum_t v = x(i);
    acc += v * v;
  }
};

// ---------------------------------------------------------------- launchers

template <class ExecSpace, class T>
void bias_add(T* y, const T* bias, kindex N, kindex C) {
  Kokkos::parallel_for(
      "meshtron::bias_add", Range<ExecSpace>(0, N * C),
      BiasAdd<ExecSpace, T>{as_matrix<ExecSpace>(y, N, C), as_vector<ExecSpace>(bias, C)});
}

template <class ExecSpace, class T>
void bias_backward(const T* dy, kindex N, kindex C, T* dbias) {
  Kokkos::parallel_for(
      "meshtron::bias_backward", Range<ExecSpace>(0, C),
      BiasBackward<ExecSpace, T>{as_matrix<ExecSpace>(dy, N, C), as_vector<ExecSpace>(dbias, C)});
}

template <class ExecSpace, class T>
void add(const T* a, const T* b, kindex n, T* out) {
  Kokkos::parallel_for("meshtron::add", Range<ExecSpace>(0, n),
                       Add<ExecSpace, T>{as_vector<ExecSpace>(a, n), as_vector<ExecSpace>(b, n),
                                         as_vector<ExecSpace>(out, n)});
}

template <class ExecSpace, class T>
void axpy(double alpha, const T* x, kindex n, T* y) {
  Kokkos::parallel_for(
      "meshtron::axpy", Range<ExecSpace>(0, n),
      Axpy<ExecSpace, T>{T(alpha), as_vector<ExecSpace>(x, n), as_vector<ExecSpace>(y, n)});
}

template <class ExecSpace, class T>
void scale(T* x, kindex n, double alpha) {
  Kokkos::parallel_for("meshtron::scale", Range<ExecSpace>(0, n),
                       Scale<ExecSpace, T>{T(alpha), as_vector<ExecSpace>(x, n)});
}

template <class ExecSpace, class T>
double sum_of_squares(const T* x, kindex n) {
  accum_t total = 0;
  Kokkos::parallel_reduce("meshtron::sum_of_squares", Range<ExecSpace>(0, n),
                          SumOfSquares<ExecSpace, T>{as_vector<ExecSpace>(x, n)}, total);
  return total;
}

}  // namespace meshtron::kernels
