// Helpers shared by the GPU tests: the skip where no GPU is present, inputs
// rounded to a storage type once (so device and fp64 host reference start
// from the same values), NaN-poisoned outputs (unwritten elements show), and
// a model's loss and gradients on the device against the fp32 host.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "model/parameter.hpp"
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

/// One training step's loss and every parameter's gradient (in parameters()
/// order), copied to the host.
struct DeviceRun {
  double loss = 0;
  std::vector<std::vector<double>> grads;
};

/// The run of a model whose step gave `loss`: its gradients, each checked
/// to live in `space`.
inline DeviceRun device_run(double loss, const ParameterList& params, MemorySpace space) {
  DeviceRun out;
  out.loss = loss;
  for (Parameter* p : params) {
    EXPECT_EQ(p->grad.space(), space) << p->name;
    out.grads.push_back(p->grad.to_doubles());
  }
  return out;
}

/// max |got - want| / max |want|: the error relative to the tensor's scale.
inline double norm_wise_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 1e-30;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return diff / scale;
}

/// fp32 on the device as on the host: the loss to 1e-5 relative, each
/// gradient to 1e-4 norm-wise (summation order differs).
inline void expect_fp32_matches_host(const DeviceRun& gpu, const DeviceRun& host) {
  EXPECT_LE(std::fabs(gpu.loss - host.loss) / host.loss, 1e-5) << gpu.loss << " vs " << host.loss;
  ASSERT_EQ(gpu.grads.size(), host.grads.size());
  for (std::size_t k = 0; k < host.grads.size(); ++k)
    EXPECT_LE(norm_wise_error(gpu.grads[k], host.grads[k]), 1e-4) << "parameter " << k;
}

/// bf16 on the device near the fp32 host: the loss to 2e-2 relative, every
/// gradient finite.
inline void expect_bf16_tracks_host(const DeviceRun& gpu, const DeviceRun& host) {
  EXPECT_LE(std::fabs(gpu.loss - host.loss) / host.loss, 2e-2) << gpu.loss << " vs " << host.loss;
  for (std::size_t k = 0; k < gpu.grads.size(); ++k)
    for (double g : gpu.grads[k]) ASSERT_TRUE(std::isfinite(g)) << "parameter " << k;
}

}  // namespace meshtron::gpu_test
