// Helpers shared by the host op tests: random tensors, the norm-wise
// comparison with a reference, central finite differences. Tolerances are
// norm-wise: |got - ref| <= tol * (|ref| + max |ref|), so entries near zero
// are judged on the scale of the tensor.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace meshtron::ops::test_support {

using Values = std::vector<double>;
using LD = long double;

inline Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng, double lo = -1.0,
                            double hi = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t i = 0; i < t.numel(); ++i) set_element_from_double(t, i, dist(rng));
  return t;
}

inline Tensor random_ids(index_t n, std::int32_t lo, std::int32_t hi, std::mt19937_64& rng) {
  Tensor t = Tensor::empty({n}, DType::I32);
  std::uniform_int_distribution<std::int32_t> dist(lo, hi - 1);
  for (index_t i = 0; i < n; ++i) t.data<std::int32_t>()[i] = dist(rng);
  return t;
}

inline Tensor tensor_from(const Values& v, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  for (index_t i = 0; i < t.numel(); ++i) set_element_from_double(t, i, v[std::size_t(i)]);
  return t;
}

inline std::string where(const char* what, const Shape& shape) {
  return std::string(what) + " at " + shape_string(shape);
}

/// Norm-wise comparison (see the file comment); reports the worst element.
inline void expect_close(const Values& got, const Values& ref, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double scale = 0;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double allowed = tol * (std::abs(ref[i]) + scale);
    const double err = std::abs(got[i] - ref[i]);
    if (!(err <= allowed)) ++bad;  // NaN counts as a failure
    const double ratio = allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0);
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << ref.size()
                     << " elements outside tolerance " << tol << "; worst [" << worst << "] got "
                     << got[worst] << " want " << ref[worst];
}

/// Central differences of loss() with respect to every element of the fp64
/// tensor x (perturbed in place and restored).
inline Values numeric_gradient(Tensor& x, const std::function<double()>& loss, double h = 1e-5) {
  double* p = x.data<double>();
  Values g(std::size_t(x.numel()));
  for (index_t i = 0; i < x.numel(); ++i) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = loss();
    p[i] = saved - h;
    const double down = loss();
    p[i] = saved;
    g[std::size_t(i)] = (up - down) / (2 * h);
  }
  return g;
}

/// sum_i w[i] * y[i]: the scalar whose gradient a backward with dy = w gives.
inline double weighted_sum(const Tensor& w, const Tensor& y) {
  LD s = 0;
  for (index_t i = 0; i < y.numel(); ++i)
    s += LD(element_as_double(w, i)) * element_as_double(y, i);
  return double(s);
}

}  // namespace meshtron::ops::test_support
