// Shared by the gpu_ops test files (test_gpu_ops_*.cpp, one per op family
// of src/ops/): the GPU op table against the host op table (ops.hpp).
//
// Every op runs twice on the same inputs: on host fp32 tensors (the Kokkos
// and CBLAS path, itself tested against long-double loops in tests/ops) and
// on device tensors in fp32, bf16 and fp16. bf16/fp16 inputs are drawn in
// fp32 and rounded once; the host reference sees the rounded values, so the
// comparison measures the device kernels and their 16-bit outputs only.
// Shapes are not multiples of any block or warp size (N = 1, 3, 17, 33, 257;
// H = 5, 64, 130, 768). Every device output is POISONED with NaN before the
// call, so an element the kernel fails to write shows up as NaN, and NaN
// never passes. Tolerance: max |dev - host| <= tol * max |host| with tol =
// 1e-5 for fp32 (TF32 must be off in the GEMMs), 1e-2 for bf16 and fp16. The dropout
// mask must equal the host's element for element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/ops.hpp"
#include "tensor/device_allocator.hpp"
#include "tensor/tensor.hpp"

namespace meshtron::ops::gpu_ops_test {

inline const std::vector<index_t> kRows = {1, 3, 17, 33, 257};
inline const std::vector<index_t> kCols = {5, 64, 130, 768};
inline const std::vector<DType> kDtypes = {DType::F32, DType::BF16, DType::F16};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline double tolerance(DType t) { return t == DType::F32 ? 1e-5 : 1e-2; }
inline std::string name(DType t) { return std::string(dtype_name(t)); }

/// One operand in both worlds: `host` fp32 holding exactly the values that
/// `dev` (device, dtype dt) holds.
struct Pair {
  Tensor host, dev;
};

inline std::mt19937_64& rng() {
  static std::mt19937_64 engine(20251117);
  return engine;
}

inline Tensor random_host(const Shape& shape, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(dist(rng()));
  return t;
}

/// Whether two tensors (either memory space) hold the same values, bit for bit.
inline bool same_bits(const Tensor& a, const Tensor& b) { return a.to_doubles() == b.to_doubles(); }

/// A random input (also used for accumulated outputs' initial values).
inline Pair input(const Shape& shape, DType dt, double lo = -1.0, double hi = 1.0) {
  const Tensor rounded = random_host(shape, lo, hi).to(dt);
  return {rounded.to(DType::F32), rounded.to_device()};
}

/// An overwritten output: NaN on both sides, so unwritten elements show.
inline Pair output(const Shape& shape, DType dt) {
  Pair p{Tensor::empty(shape, DType::F32), Tensor::empty(shape, dt, MemorySpace::Cuda)};
  p.host.fill(kNaN);
  p.dev.fill(kNaN);
  return p;
}

inline Tensor random_ids(index_t n, int lo, int hi) {
  Tensor t = Tensor::empty({n}, DType::I32);
  std::uniform_int_distribution<int> dist(lo, hi - 1);
  for (index_t i = 0; i < n; ++i) t.data<std::int32_t>()[i] = dist(rng());
  return t;
}

/// max |dev - host| <= tol * max |host|, and no NaN in the device output.
inline void expect_close(const Tensor& dev, const Tensor& host, double tol, const std::string& what) {
  ASSERT_EQ(dev.numel(), host.numel()) << what;
  const std::vector<double> d = dev.to_doubles(), h = host.to_doubles();
  double scale = 0, worst = 0;
  index_t worst_at = -1, nans = 0;
  for (std::size_t i = 0; i < h.size(); ++i) scale = std::max(scale, std::abs(h[i]));
  if (scale == 0) scale = 1;
  for (std::size_t i = 0; i < h.size(); ++i) {
    if (std::isnan(d[i])) {
      ++nans;
      continue;
    }
    const double err = std::abs(d[i] - h[i]) / scale;
    if (err > worst) worst = err, worst_at = index_t(i);
  }
  EXPECT_EQ(nans, 0) << what << ": " << nans << " NaN of " << h.size() << " (unwritten?)";
  EXPECT_LE(worst, tol) << what << ": element " << worst_at << " device "
                        << (worst_at >= 0 ? d[std::size_t(worst_at)] : 0) << " host "
                        << (worst_at >= 0 ? h[std::size_t(worst_at)] : 0) << " (scale " << scale
                        << ")";
}

inline void expect_close(const Pair& p, DType dt, const std::string& what) {
  expect_close(p.dev, p.host, tolerance(dt), what);
}

class GpuOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

/// A GEMM's C [M, N] = A [M, K] B [K, N].
struct GemmCase {
  index_t M, N, K;
};

/// A layernorm forward on fresh random inputs, run on both sides and
/// checked (y, mean, rstd); the inputs and statistics for the backward.
struct LayerNormCase {
  Pair x, gamma, beta, y, mean, rstd;
};
inline LayerNormCase layernorm_forward_case(index_t N, index_t H, DType dt, const std::string& what) {
  LayerNormCase c{input({N, H}, dt, -2.0, 3.0), input({H}, dt), input({H}, dt),
                  output({N, H}, dt), output({N}, DType::F32), output({N}, DType::F32)};
  layernorm_forward(c.x.host, c.gamma.host, c.beta.host, 1e-5, c.y.host, c.mean.host,
                    c.rstd.host);
  layernorm_forward(c.x.dev, c.gamma.dev, c.beta.dev, 1e-5, c.y.dev, c.mean.dev, c.rstd.dev);
  expect_close(c.y, dt, what + " y");
  expect_close(c.mean, DType::F32, what + " mean");
  expect_close(c.rstd, DType::F32, what + " rstd");
  return c;
}

#ifdef MESHTRON_HAVE_CUDA
/// A device tensor one element past an aligned block (2-byte aligned for
/// bf16 and fp16, 4 for fp32), NaN; `block` owns the memory.
struct OffsetView {
  Tensor block, view;
};
inline OffsetView offset_by_one(const Shape& shape, DType dt) {
  index_t n = 1;
  for (index_t d : shape) n *= d;
  OffsetView o;
  o.block = Tensor::empty({n + 1}, dt, MemorySpace::Cuda);
  o.block.fill(kNaN);
  o.view = Tensor::view(static_cast<char*>(o.block.raw()) + dtype_size(dt), shape, dt,
                        MemorySpace::Cuda);
  return o;
}

// kernels/cuda/{layernorm,embedding,elementwise}.cu loop rows/packs over a
// grid sized to what the GPU holds at once and keep the next row's loads
// in flight (layernorm: registers forward, a cp.async ring backward, which
// also carries the residual gradient where shared memory allows). Their
// tests (the "row loops" of the norm, embedding and reductions files) run
// them past one pass of the grid (N = 8197 rows: more than the ~3200
// resident warps of the forward and 2112 of the backward on an H100, and
// not a multiple of anything), at GPT-2 124M's H = 768, 774M's 1280, 1024
// and 2048 (16-bit backward: the scalar kernels), compare with the host,
// demand the same bits from a second call, and run the scalar fallbacks on
// views one element off a 16-byte boundary:
/// A misaligned device copy of `src` (one element past a 16-byte boundary).
inline OffsetView misaligned_copy(const Tensor& src) {
  OffsetView o = offset_by_one(src.shape(), src.dtype());
  o.view.copy_from(src);
  return o;
}
#endif

}  // namespace meshtron::ops::gpu_ops_test
