// Helpers shared by the GPU tests: the skip where no GPU is present, inputs
// rounded to a storage type once (so device and fp64 host reference start
// from the same values) and NaN-poisoned outputs (unwritten elements show).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "tensor/device_allocator.hpp"
#include "tensor/tensor.hpp"

#define REQUIRE_GPU() \
  if (::meshtron::device::cuda_device_count() == 0) GTEST_SKIP() << "no GPU"

namespace meshtron::gpu_test {

/// Random values in [lo, hi) rounded to `dt`, as an fp64 host tensor.
inline Tensor random_rounded(const Shape& shape, DType dt, std::uint64_t seed, double lo,
                             double hi) {
  Tensor t = Tensor::empty(shape, DType::F64);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(rng);
  return t.to(dt).to(DType::F64);
}

/// A device tensor of `dt` filled with NaN.
inline Tensor poisoned(const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt, MemorySpace::Cuda);
  t.fill(std::nan(""));
  return t;
}

}  // namespace meshtron::gpu_test
