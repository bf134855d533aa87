// GPU op table against the host op table (src/ops/ops.hpp).
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
//
// Run: ctest -L gpu --output-on-failure   (skips, exit 0, without a GPU)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ops/cast.hpp"
#include "ops/head_layout.hpp"
#include "ops/ops.hpp"
#include "tensor/device_allocator.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "ops/ops_cuda.hpp"
#include "tensor/device_stream.hpp"
#endif

namespace meshtron::ops {
namespace {

const std::vector<index_t> kRows = {1, 3, 17, 33, 257};
const std::vector<index_t> kCols = {5, 64, 130, 768};
const std::vector<DType> kDtypes = {DType::F32, DType::BF16, DType::F16};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double tolerance(DType t) { return t == DType::F32 ? 1e-5 : 1e-2; }
std::string name(DType t) { return std::string(dtype_name(t)); }

/// One operand in both worlds: `host` fp32 holding exactly the values that
/// `dev` (device, dtype dt) holds.
struct Pair {
  Tensor host, dev;
};

std::mt19937_64& rng() {
  static std::mt19937_64 engine(20251117);
  return engine;
}

Tensor random_host(const Shape& shape, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(dist(rng()));
  return t;
}

/// Whether two tensors (either memory space) hold the same values, bit for bit.
bool same_bits(const Tensor& a, const Tensor& b) { return a.to_doubles() == b.to_doubles(); }

/// A random input (also used for accumulated outputs' initial values).
Pair input(const Shape& shape, DType dt, double lo = -1.0, double hi = 1.0) {
  const Tensor rounded = random_host(shape, lo, hi).to(dt);
  return {rounded.to(DType::F32), rounded.to_device()};
}

/// An overwritten output: NaN on both sides, so unwritten elements show.
Pair output(const Shape& shape, DType dt) {
  Pair p{Tensor::empty(shape, DType::F32), Tensor::empty(shape, dt, MemorySpace::Cuda)};
  p.host.fill(kNaN);
  p.dev.fill(kNaN);
  return p;
}

Tensor random_ids(index_t n, int lo, int hi) {
  Tensor t = Tensor::empty({n}, DType::I32);
  std::uniform_int_distribution<int> dist(lo, hi - 1);
  for (index_t i = 0; i < n; ++i) t.data<std::int32_t>()[i] = dist(rng());
  return t;
}

/// max |dev - host| <= tol * max |host|, and no NaN in the device output.
void expect_close(const Tensor& dev, const Tensor& host, double tol, const std::string& what) {
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

void expect_close(const Pair& p, DType dt, const std::string& what) {
  expect_close(p.dev, p.host, tolerance(dt), what);
}

class GpuOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

// ================================================= tensors and allocator ==

TEST_F(GpuOps, TensorCopiesFillAndConversionsAcrossSpaces) {
  const Tensor h = random_host({33, 17});
  const Tensor d = h.to_device();
  EXPECT_FALSE(d.is_host());
  expect_close(d, h, 0.0, "to_device/to_doubles round trip");
  expect_close(d.to_host(), h, 0.0, "to_host");
  expect_close(d.clone(), h, 0.0, "device clone");
  const Tensor d_bf16 = d.to(DType::BF16);  // device -> device with conversion
  EXPECT_EQ(d_bf16.space(), MemorySpace::Cuda);
  expect_close(d_bf16, h.to(DType::BF16), 0.0, "device fp32 -> bf16");
  Tensor z = Tensor::zeros({1000}, DType::F32, MemorySpace::Cuda);
  for (double v : z.to_doubles()) ASSERT_EQ(v, 0.0);
  z.fill(2.5);
  for (double v : z.to_doubles()) ASSERT_EQ(v, 2.5);
  Tensor dst = Tensor::empty({33, 17}, DType::F32, MemorySpace::Cuda);
  dst.copy_from(d_bf16);
  expect_close(dst, h.to(DType::BF16), 0.0, "copy_from bf16 device into fp32 device");
  expect_close(d.slice_rows(3, 10), h.slice_rows(3, 10), 0.0, "slice_rows of a device tensor");
}

TEST_F(GpuOps, CastKernelRoundsLikeTheHostConversion) {
  // ops::cast on the device (kernels/cuda/cast.cu) against the host's
  // software bf16/fp16 rounding (tensor/types.hpp), both ways, bit for bit;
  // the range covers fp16 subnormals and overflow to inf.
  Tensor h = random_host({4099}, -2.0, 2.0);
  for (index_t i = 0; i < h.numel(); i += 7) h.data<float>()[i] *= float(i % 3 == 0 ? 1e-6 : 1e5);
  for (DType half : {DType::BF16, DType::F16}) {
    const Tensor d = h.to_device();
    Tensor narrow = Tensor::empty(h.shape(), half, MemorySpace::Cuda);
    ops::cast(d, narrow);
    const Tensor expected = h.to(half);
    const auto got = narrow.to_doubles(), want = expected.to_doubles();
    int differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      differ += !(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])));
    EXPECT_EQ(differ, 0) << "fp32 -> " << name(half);
    Tensor wide = Tensor::empty(h.shape(), DType::F32, MemorySpace::Cuda);
    ops::cast(narrow, wide);
    EXPECT_EQ(wide.to_doubles(), want) << name(half) << " -> fp32";
  }
}

TEST_F(GpuOps, AllocatorReusesFreedBlocksWithoutCudaMalloc) {
  device::release_cached();
  const device::AllocatorStats before = device::allocator_stats();
  EXPECT_EQ(before.cached_bytes, 0u);
  for (int round = 0; round < 2; ++round) {  // round 1 must be served from the cache
    std::vector<Tensor> live;
    for (index_t n : {1, 100, 5000, 1 << 20, 3 << 20}) live.push_back(Tensor::empty({n}, DType::F32, MemorySpace::Cuda));
    const device::AllocatorStats during = device::allocator_stats();
    EXPECT_GE(during.current_bytes, before.current_bytes + sizeof(float) * ((1 << 20) + (3 << 20)));
    EXPECT_GE(during.peak_bytes, during.current_bytes);
    if (round == 1) EXPECT_EQ(during.cuda_mallocs, before.cuda_mallocs + 5) << "cache missed";
  }
  const device::AllocatorStats after = device::allocator_stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_GT(after.cached_bytes, 0u);
  device::release_cached();
  EXPECT_EQ(device::allocator_stats().cached_bytes, 0u);
}

// ================================================================= GEMM ==

struct GemmCase {
  index_t M, N, K;
};
const std::vector<GemmCase> kGemmCases = {{1, 5, 64},     {3, 64, 5},     {17, 130, 33},
                                          {33, 768, 130}, {257, 130, 768}, {257, 768, 257}};

Shape stored(index_t rows, index_t cols, bool trans) {
  return trans ? Shape{cols, rows} : Shape{rows, cols};
}

TEST_F(GpuOps, GemmMatchesHostForAllTransposesAndDtypes) {
  for (DType dt : kDtypes)
    for (const GemmCase& g : kGemmCases)
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        const std::string what = "gemm " + name(dt) + " M=" + std::to_string(g.M) +
                                 " N=" + std::to_string(g.N) + " K=" + std::to_string(g.K) +
                                 " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
        const Pair A = input(stored(g.M, g.K, ta), dt), B = input(stored(g.K, g.N, tb), dt);
        Pair C = output({g.M, g.N}, dt);  // beta = 0: C is not read
        gemm(A.host, ta, B.host, tb, C.host, 0.5, 0.0);
        gemm(A.dev, ta, B.dev, tb, C.dev, 0.5, 0.0);
        expect_close(C, dt, what);
        // Accumulate (beta = 1) into C of the storage dtype and, under bf16,
        // into an fp32 C (Megatron's main_grad).
        for (DType cdt : {dt, DType::F32}) {
          Pair acc = input({g.M, g.N}, cdt);
          gemm(A.host, ta, B.host, tb, acc.host, 1.5, 1.0);
          gemm(A.dev, ta, B.dev, tb, acc.dev, 1.5, 1.0);
          expect_close(acc, dt, what + " accumulate into " + name(cdt));
        }
      }
}

TEST_F(GpuOps, BatchedGemmMatchesHost) {
  for (DType dt : kDtypes)
    for (const GemmCase& g : {GemmCase{17, 17, 64}, GemmCase{257, 257, 64}, GemmCase{33, 64, 257}})
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        const index_t batch = 3;
        Shape sa = stored(g.M, g.K, ta), sb = stored(g.K, g.N, tb);
        sa.insert(sa.begin(), batch);
        sb.insert(sb.begin(), batch);
        const Pair A = input(sa, dt), B = input(sb, dt);
        Pair C = output({batch, g.M, g.N}, dt);
        gemm_batched(A.host, ta, B.host, tb, C.host, 1.0, 0.0);
        gemm_batched(A.dev, ta, B.dev, tb, C.dev, 1.0, 0.0);
        expect_close(C, dt, "gemm_batched " + name(dt) + " M=" + std::to_string(g.M) +
                                " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      }
}

#ifdef MESHTRON_HAVE_CUDA  // for the fallback counter
TEST_F(GpuOps, GemmBiasEpilogueMatchesHostGemmThenBiasAdd) {
  // gemm_bias runs CUBLASLT_EPILOGUE_BIAS: our per-column bias [N] must be
  // cuBLASLt's per-row bias of the column-major C^T [N, M]. Odd N and M != N
  // catch a bias read along the wrong axis; C fp32 under bf16/fp16 A, B (an
  // fp32 bias) is the other dtype combination the op admits. A plain gemm
  // of the same shape runs before and after, so that the cached heuristic
  // choice of one cannot serve the other.
  const std::uint64_t fallbacks_before = cuda::gemm_bias_fallbacks();
  const std::vector<GemmCase> cases = {{1, 5, 64},      {3, 33, 5},      {17, 130, 33},
                                       {33, 769, 130},  {257, 768, 257}, {257, 2304, 768},
                                       {130, 17, 3072}};
  for (DType dt : kDtypes)
    for (const GemmCase& g : cases)
      for (int t = 0; t < 4; ++t)
        for (DType cdt : dt == DType::F32 ? std::vector<DType>{dt} : std::vector<DType>{dt, DType::F32}) {
          const bool ta = t & 1, tb = t & 2;
          const std::string what = "gemm_bias " + name(dt) + " C " + name(cdt) +
                                   " M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) +
                                   " K=" + std::to_string(g.K) + " ta=" + std::to_string(ta) +
                                   " tb=" + std::to_string(tb);
          const Pair A = input(stored(g.M, g.K, ta), dt), B = input(stored(g.K, g.N, tb), dt);
          const Pair bias = input({g.N}, cdt, -2.0, 2.0);
          Pair plain = output({g.M, g.N}, cdt);
          gemm(A.host, ta, B.host, tb, plain.host);
          gemm(A.dev, ta, B.dev, tb, plain.dev);
          expect_close(plain, dt, what + " (plain gemm before)");
          Pair C = output({g.M, g.N}, cdt);
          gemm_bias(A.host, ta, B.host, tb, bias.host, C.host);
          gemm_bias(A.dev, ta, B.dev, tb, bias.dev, C.dev);
          expect_close(C, dt, what);
          Pair again = output({g.M, g.N}, cdt);
          gemm(A.dev, ta, B.dev, tb, again.dev);
          expect_close(again.dev, plain.host, tolerance(dt), what + " (plain gemm after)");
        }
  std::cout << "gemm_bias: " << cuda::gemm_bias_fallbacks() - fallbacks_before
            << " of the calls above fell back to gemm + bias_add\n";
  // The model's shapes (GPT-2 124M: qkv, proj, fc, fc-proj, aligned
  // allocations, no transposes) must take the fused epilogue.
  for (DType dt : kDtypes)
    for (const GemmCase& g : {GemmCase{1024, 2304, 768}, GemmCase{1024, 768, 768},
                              GemmCase{1024, 3072, 768}, GemmCase{1024, 768, 3072}}) {
      const Pair A = input({g.M, g.K}, dt), B = input({g.K, g.N}, dt), bias = input({g.N}, dt);
      Pair C = output({g.M, g.N}, dt);
      const std::uint64_t before = cuda::gemm_bias_fallbacks();
      gemm_bias(A.dev, false, B.dev, false, bias.dev, C.dev);
      EXPECT_EQ(cuda::gemm_bias_fallbacks(), before)
          << name(dt) << " M=" << g.M << " N=" << g.N << " K=" << g.K
          << ": cuBLASLt offered no bias-epilogue algorithm";
      gemm_bias(A.host, false, B.host, false, bias.host, C.host);
      expect_close(C, dt, "gemm_bias model shape " + name(dt) + " N=" + std::to_string(g.N));
    }
}
#endif

TEST_F(GpuOps, LinearWeightGradsMatchHostGemmThenBiasBackward) {
  // The weight-gradient GEMM and the bias gradient's column sums: dweight +=
  // x^T dy and dbias += the column sums of dy, both accumulated onto nonzero
  // values (fp32 gradients under bf16/fp16, as in training). Odd N catches
  // sums along the wrong axis; the last shapes are GPT-2 774M's (8192
  // tokens: qkv, proj, fc, fc-proj).
  const std::vector<GemmCase> cases = {{5, 3, 17},          {33, 130, 64},
                                       {768, 2304, 1024},   {1280, 3840, 8192},
                                       {1280, 1280, 8192},  {1280, 5120, 8192},
                                       {5120, 1280, 8192}};
  for (DType dt : kDtypes)
    for (const GemmCase& g : cases) {  // dweight [M = in, N = out], K = tokens
      if (g.K == 8192 && dt != DType::BF16) continue;  // the host GEMMs of these are slow
      const DType gdt = DType::F32;
      const std::string what = "linear_weight_grads " + name(dt) + " in=" + std::to_string(g.M) +
                               " out=" + std::to_string(g.N) + " tokens=" + std::to_string(g.K);
      const Pair x = input({g.K, g.M}, dt), dy = input({g.K, g.N}, dt);
      Pair dw = input({g.M, g.N}, gdt), db = input({g.N}, gdt);
      linear_weight_grads(x.host, dy.host, dw.host, db.host);
      linear_weight_grads(x.dev, dy.dev, dw.dev, db.dev);
      expect_close(dw, dt, what + " dweight");
      expect_close(db, dt, what + " dbias");
    }
}

TEST_F(GpuOps, GemmBiasWithMisalignedBiasOrEmptyInnerDimension) {
  // A bias view only 2-byte (bf16, fp16) or 4-byte (fp32) aligned, row 1 of [2, 33]:
  // the heuristic must see the real alignment (or the op must fall back to
  // gemm + bias_add); either way the numbers are the host's.
  for (DType dt : kDtypes) {
    const index_t M = 17, N = 33, K = 64;
    const Pair A = input({M, K}, dt), B = input({K, N}, dt), rows = input({2, N}, dt);
    const Pair bias{rows.host.slice_rows(1, 2), rows.dev.slice_rows(1, 2)};
    Pair C = output({M, N}, dt);
    gemm_bias(A.host, false, B.host, false, bias.host, C.host);
    gemm_bias(A.dev, false, B.dev, false, bias.dev, C.dev);
    expect_close(C, dt, "gemm_bias misaligned bias " + name(dt));
    const Pair A0 = input({M, 0}, dt), B0 = input({0, N}, dt);
    Pair C0 = output({M, N}, dt);
    gemm_bias(A0.host, false, B0.host, false, bias.host, C0.host);
    gemm_bias(A0.dev, false, B0.dev, false, bias.dev, C0.dev);
    expect_close(C0, dt, "gemm_bias K=0 is the bias alone " + name(dt));
  }
}

TEST_F(GpuOps, GemmWithEmptyInnerDimensionScalesC) {
  const Pair A = input({5, 0}, DType::F32), B = input({0, 7}, DType::F32);
  Pair C = input({5, 7}, DType::F32);
  gemm(A.host, false, B.host, false, C.host, 1.0, 0.5);
  gemm(A.dev, false, B.dev, false, C.dev, 1.0, 0.5);
  expect_close(C, DType::F32, "gemm K=0 beta=0.5");
  Pair Z = output({5, 7}, DType::F32);
  gemm(A.host, false, B.host, false, Z.host, 1.0, 0.0);
  gemm(A.dev, false, B.dev, false, Z.dev, 1.0, 0.0);
  expect_close(Z, DType::F32, "gemm K=0 beta=0 overwrites NaN");
}

// ============================================================ LayerNorm ==

/// A layernorm forward on fresh random inputs, run on both sides and
/// checked (y, mean, rstd); the inputs and statistics for the backward.
struct LayerNormCase {
  Pair x, gamma, beta, y, mean, rstd;
};
LayerNormCase layernorm_forward_case(index_t N, index_t H, DType dt, const std::string& what) {
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

TEST_F(GpuOps, LayerNormForwardAndBackwardMatchHost) {
  for (DType dt : kDtypes)
    for (index_t N : kRows)
      for (index_t H : kCols)
        for (DType gdt : {DType::F32, dt}) {
          const std::string what = "layernorm " + name(dt) + " N=" + std::to_string(N) +
                                   " H=" + std::to_string(H) + " grads " + name(gdt);
          const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
          const Pair &x = c.x, &gamma = c.gamma, &mean = c.mean, &rstd = c.rstd;

          const Pair dy = input({N, H}, dt);
          Pair dx = output({N, H}, dt), dgamma = input({H}, gdt), dbeta = input({H}, gdt);
          // Both sides use the host's statistics, so that dx measures the backward only.
          const Tensor mean_dev = mean.host.to_device(), rstd_dev = rstd.host.to_device();
          layernorm_backward(dy.host, x.host, gamma.host, mean.host, rstd.host, dx.host,
                             dgamma.host, dbeta.host);
          layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx.dev, dgamma.dev,
                             dbeta.dev);
          expect_close(dx, dt, what + " dx");
          expect_close(dgamma, gdt == DType::F32 ? dt : gdt, what + " dgamma");
          expect_close(dbeta, gdt == DType::F32 ? dt : gdt, what + " dbeta");
        }
}

// The packed layernorm kernels (kernels/cuda/layernorm.cu) take H a
// multiple of 16 bytes up to 1280 fp32 / 2048 bf16 (backward: 1280 fp32,
// 1536 16-bit), K = 1..8 packs per lane (fp32 also 10); wider rows
// (fp32 H = 1600, 2048; 16-bit backward H = 1600, 2048) the column-owner
// kernels, whose 2-row tiles N = 2501 leaves one
// short. The packed backward takes 8-row tiles: 313 of them over 132
// blocks, so blocks take two or three, and the last tile has 5 rows (16-bit
// H = 1280: 7-row tiles, the last of 2 rows; fp32 H = 1280: 4-row tiles,
// the last of 1 row). Forward and backward
// give the same bits on a second call (the dgamma/dbeta partials are added
// in a fixed order), and the backward's residual form is its plain form +
// add().
TEST_F(GpuOps, LayerNormPackedAndColumnOwnerPathsOnManyRowsMatchHostAndRepeatBitwise) {
  const index_t N = 2501;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(256), index_t(768), index_t(1024), index_t(1280), index_t(1536),
                      index_t(1600), index_t(2048)}) {
      const std::string what = "layernorm " + name(dt) + " N=" + std::to_string(N) +
                               " H=" + std::to_string(H);
      const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
      const Pair &x = c.x, &gamma = c.gamma, &mean = c.mean, &rstd = c.rstd;

      const Pair dy = input({N, H}, dt);
      Pair dx = output({N, H}, dt), dgamma = input({H}, DType::F32), dbeta = input({H}, DType::F32);
      const Tensor mean_dev = mean.host.to_device(), rstd_dev = rstd.host.to_device();
      const Tensor dgamma0 = dgamma.dev.clone(), dbeta0 = dbeta.dev.clone();
      layernorm_backward(dy.host, x.host, gamma.host, mean.host, rstd.host, dx.host, dgamma.host,
                         dbeta.host);
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx.dev, dgamma.dev,
                         dbeta.dev);
      expect_close(dx, dt, what + " dx");
      expect_close(dgamma, dt, what + " dgamma");
      expect_close(dbeta, dt, what + " dbeta");

      Tensor dx2 = Tensor::empty({N, H}, dt, MemorySpace::Cuda), dgamma2 = dgamma0.clone(),
             dbeta2 = dbeta0.clone();
      dx2.fill(kNaN);
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx2, dgamma2, dbeta2);
      EXPECT_TRUE(dx2.to_doubles() == dx.dev.to_doubles()) << what << ": dx differs between calls";
      EXPECT_TRUE(dgamma2.to_doubles() == dgamma.dev.to_doubles())
          << what << ": dgamma differs between calls";
      EXPECT_TRUE(dbeta2.to_doubles() == dbeta.dev.to_doubles())
          << what << ": dbeta differs between calls";

      Tensor y2 = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      Tensor mean2 = Tensor::empty({N}, DType::F32, MemorySpace::Cuda), rstd2 = mean2.clone();
      layernorm_forward(x.dev, gamma.dev, c.beta.dev, 1e-5, y2, mean2, rstd2);
      EXPECT_TRUE(y2.to_doubles() == c.y.dev.to_doubles()) << what << ": y differs between calls";
      EXPECT_TRUE(rstd2.to_doubles() == rstd.dev.to_doubles()) << what << ": rstd differs";

      const Tensor residual = input({N, H}, dt).dev;
      Tensor fused = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      Tensor dgamma3 = dgamma0.clone(), dbeta3 = dbeta0.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, fused, dgamma3, dbeta3,
                         &residual);
      Tensor two_pass = dx.dev.clone();
      add(two_pass, residual, two_pass);
      EXPECT_TRUE(fused.to_doubles() == two_pass.to_doubles()) << what << ": + residual";
      EXPECT_TRUE(dgamma3.to_doubles() == dgamma.dev.to_doubles()) << what << ": dgamma, residual";
    }
}

// The ones column (y [N, H + kOnesColumnWidth], ColumnParallelLinear): each
// row the bits of the plain call's on the device, then 1 and zeros, on the
// packed kernel (16-bit and fp32 H = 768, 1280), the scalar one (H = 33) and
// the column-owner one (fp32 H = 1600); and close to the host's.
TEST_F(GpuOps, LayerNormOnesColumnRowsAreThePlainRowsThenOneAndZeros) {
  const index_t N = 301;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(33), index_t(768), index_t(1280), index_t(1600)}) {
      const std::string what = "layernorm ones column " + name(dt) + " H=" + std::to_string(H);
      const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
      const index_t ld = H + kOnesColumnWidth;
      Pair wide = output({N, ld}, dt);
      Tensor mean = Tensor::empty({N}, DType::F32, MemorySpace::Cuda), rstd = mean.clone();
      layernorm_forward(c.x.dev, c.gamma.dev, c.beta.dev, 1e-5, wide.dev, mean, rstd);
      Tensor host_mean = c.mean.host.clone(), host_rstd = c.rstd.host.clone();
      layernorm_forward(c.x.host, c.gamma.host, c.beta.host, 1e-5, wide.host, host_mean, host_rstd);
      expect_close(wide, dt, what + " vs host");
      const std::vector<double> got = wide.dev.to_doubles(), plain = c.y.dev.to_doubles();
      for (index_t r = 0; r < N; ++r) {
        for (index_t h = 0; h < H; ++h)
          ASSERT_EQ(got[r * ld + h], plain[r * H + h]) << what << " row " << r << " col " << h;
        for (index_t h = H; h < ld; ++h)
          ASSERT_EQ(got[r * ld + h], h == H ? 1.0 : 0.0) << what << " row " << r << " col " << h;
      }
      EXPECT_TRUE(rstd.to_doubles() == c.rstd.dev.to_doubles()) << what << ": rstd";
    }
}

// A model backward's layernorm backwards share an ops::LayerNormGradChain:
// each call leaves its dgamma / dbeta adds to the next call's kernel (or to
// flush()), which adds them in the order of the kernel that would have
// added them alone. After the flush every output must be the bits of the
// same calls without a chain: over a sequence that mixes widths and dtypes,
// the residual form, one layernorm twice in a row (accumulating, then
// overwriting), a call on few rows (its 5-block grid has no room for the
// earlier call's columns: they are added alone), a width off the split
// kernel (bf16 H = 2048, the column-owner kernel) and fp16 gradients (never
// held). Until the flush, holds() names the last held call's gradients only.
TEST_F(GpuOps, LayerNormGradChainGivesTheBitsOfUnchainedCalls) {
  struct Norm {
    LayerNormCase c;
    Tensor dy, residual, dgamma0, dbeta0;
    DType grad_dtype;
  };
  std::vector<Norm> norms;
  const auto add_norm = [&](index_t N, index_t H, DType dt, DType gdt) {
    const std::string what = "chain norm " + std::to_string(norms.size());
    norms.push_back({layernorm_forward_case(N, H, dt, what), input({N, H}, dt).dev,
                     input({N, H}, dt).dev, input({H}, gdt).dev, input({H}, gdt).dev, gdt});
  };
  add_norm(2501, 768, DType::BF16, DType::F32);   // 0
  add_norm(2501, 1280, DType::BF16, DType::F32);  // 1
  add_norm(2501, 768, DType::F32, DType::F32);    // 2
  add_norm(40, 768, DType::BF16, DType::F32);     // 3: 5 tiles, 5 blocks
  add_norm(2501, 2048, DType::BF16, DType::F32);  // 4: column-owner kernel
  add_norm(2501, 1024, DType::F16, DType::F16);   // 5: 16-bit gradients
  struct Call {
    int norm;
    bool residual;
    GradStore store;
  };
  const std::vector<Call> calls = {
      {0, false, GradStore::Accumulate}, {1, true, GradStore::Accumulate},
      {1, false, GradStore::Accumulate}, {1, true, GradStore::Overwrite},
      {0, true, GradStore::Accumulate},  {3, false, GradStore::Accumulate},
      {0, false, GradStore::Overwrite},  {4, true, GradStore::Accumulate},
      {2, true, GradStore::Accumulate},  {5, false, GradStore::Accumulate},
      {2, false, GradStore::Accumulate}, {3, true, GradStore::Accumulate},
      {0, true, GradStore::Accumulate}};
  struct Outputs {
    std::vector<Tensor> dx, dgamma, dbeta;
  };
  const auto run = [&](LayerNormGradChain* chain) {
    Outputs out;
    for (const Norm& n : norms) {
      out.dgamma.push_back(n.dgamma0.clone());
      out.dbeta.push_back(n.dbeta0.clone());
    }
    for (const Call& k : calls) {
      const Norm& n = norms[std::size_t(k.norm)];
      Tensor dx = Tensor::empty(n.dy.shape(), n.dy.dtype(), MemorySpace::Cuda);
      dx.fill(kNaN);
      layernorm_backward(n.dy, n.c.x.dev, n.c.gamma.dev, n.c.mean.dev, n.c.rstd.dev, dx,
                         out.dgamma[std::size_t(k.norm)], out.dbeta[std::size_t(k.norm)],
                         k.residual ? &n.residual : nullptr, k.store, chain);
      out.dx.push_back(dx);
    }
    return out;
  };
  const Outputs alone = run(nullptr);
  LayerNormGradChain chain;
  const Outputs chained = run(&chain);
  // The last call (norm 0, bf16 on the split kernel, fp32 gradients) is held.
  EXPECT_TRUE(chain.holds(chained.dgamma[0]));
  EXPECT_TRUE(chain.holds(chained.dbeta[0]));
  for (std::size_t i = 1; i < norms.size(); ++i) {
    EXPECT_FALSE(chain.holds(chained.dgamma[i])) << "norm " << i;
    EXPECT_FALSE(chain.holds(chained.dbeta[i])) << "norm " << i;
  }
  EXPECT_FALSE(same_bits(chained.dgamma[0], alone.dgamma[0])) << "the held adds were not pending";
  chain.flush();
  EXPECT_FALSE(chain.holds(chained.dgamma[0]));
  for (std::size_t k = 0; k < calls.size(); ++k)
    EXPECT_TRUE(same_bits(chained.dx[k], alone.dx[k])) << "call " << k << " dx";
  for (std::size_t i = 0; i < norms.size(); ++i) {
    EXPECT_TRUE(same_bits(chained.dgamma[i], alone.dgamma[i])) << "norm " << i << " dgamma";
    EXPECT_TRUE(same_bits(chained.dbeta[i], alone.dbeta[i])) << "norm " << i << " dbeta";
    EXPECT_FALSE(same_bits(alone.dgamma[i], norms[i].dgamma0)) << "norm " << i << " unchanged";
  }
  // And the unchained results are the host's.
  for (std::size_t i = 0; i < norms.size(); ++i) {
    const Norm& n = norms[i];
    const DType dt = n.dy.dtype();
    Tensor dgamma = n.dgamma0.to_host().to(DType::F32), dbeta = n.dbeta0.to_host().to(DType::F32);
    const Tensor x = n.c.x.host, dy = n.dy.to_host().to(DType::F32);
    const Tensor residual = n.residual.to_host().to(DType::F32);
    Tensor dx = Tensor::empty(x.shape(), DType::F32);
    for (const Call& k : calls)
      if (std::size_t(k.norm) == i)
        layernorm_backward(dy, x, n.c.gamma.host, n.c.mean.dev.to_host(), n.c.rstd.dev.to_host(),
                           dx, dgamma, dbeta, k.residual ? &residual : nullptr, k.store);
    const double tol = 20 * tolerance(dt);  // a few calls' worth of 16-bit gradients
    expect_close(alone.dgamma[i], dgamma, tol, "chain norm " + std::to_string(i) + " dgamma");
    expect_close(alone.dbeta[i], dbeta, tol, "chain norm " + std::to_string(i) + " dbeta");
  }
}

// ============================================================== Softmax ==

// The transformer layer's residual gradient rides in the layernorm
// backward: dx = round(layernorm dx) + residual must be the bits of the
// backward followed by add(), on the packed (H = 1280) and scalar (H = 130)
// paths, and match the host.
TEST_F(GpuOps, LayerNormBackwardWithResidualEqualsBackwardThenAdd) {
  const index_t N = 300;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(130), index_t(1280)}) {
      const std::string what = name(dt) + " H=" + std::to_string(H);
      const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
      const Pair &x = c.x, &gamma = c.gamma, &mean = c.mean, &rstd = c.rstd;
      const Pair dy = input({N, H}, dt), residual = input({N, H}, dt);
      Tensor two_pass = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      Tensor dg1 = Tensor::zeros({H}, DType::F32, MemorySpace::Cuda), db1 = dg1.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean.dev, rstd.dev, two_pass, dg1, db1);
      add(two_pass, residual.dev, two_pass);

      Pair fused = output({N, H}, dt);
      Tensor dg2 = Tensor::zeros({H}, DType::F32, MemorySpace::Cuda), db2 = dg2.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean.dev, rstd.dev, fused.dev, dg2, db2,
                         &residual.dev);
      EXPECT_TRUE(fused.dev.to_doubles() == two_pass.to_doubles()) << what;
      EXPECT_TRUE(dg2.to_doubles() == dg1.to_doubles()) << what;

      Tensor dgh = Tensor::zeros({H}, DType::F32), dbh = dgh.clone();
      layernorm_backward(dy.host, x.host, gamma.host, mean.host, rstd.host, fused.host, dgh, dbh,
                         &residual.host);
      expect_close(fused, dt, "layernorm_backward + residual " + what);
    }
}

TEST_F(GpuOps, ScaledCausalSoftmaxForwardAndBackwardMatchHost) {
  // kRows' odd lengths take the column-by-column forward, 64 and 136 (whole
  // 16-byte packs) the packed one in bf16 and fp16.
  std::vector<index_t> lengths = kRows;
  lengths.insert(lengths.end(), {64, 136});
  for (DType dt : kDtypes)
    for (index_t S : lengths) {
      const std::string what = "softmax " + name(dt) + " S=" + std::to_string(S);
      const index_t B = 5;
      const double scale = 0.125;
      const Pair scores = input({B, S, S}, dt, -8.0, 8.0);
      Pair probs = output({B, S, S}, dt);
      scaled_causal_softmax_forward(scores.host, scale, probs.host);
      scaled_causal_softmax_forward(scores.dev, scale, probs.dev);
      expect_close(probs, dt, what + " probs");
      const Pair dprobs = input({B, S, S}, dt);
      const Pair p_in{probs.host, probs.host.to(dt).to_device()};
      Pair dscores = output({B, S, S}, dt);
      scaled_causal_softmax_backward(dprobs.host, probs.host.to(dt).to(DType::F32), scale,
                                     dscores.host);
      scaled_causal_softmax_backward(dprobs.dev, p_in.dev, scale, dscores.dev);
      expect_close(dscores, dt, what + " dscores");
    }
}

// ======================================================= GeLU, biases ... ==

TEST_F(GpuOps, GeluAndElementwiseOpsMatchHost) {
  for (DType dt : kDtypes)
    for (index_t N : kRows)
      for (index_t C : kCols) {
        const std::string what = name(dt) + " [" + std::to_string(N) + ", " + std::to_string(C) + "]";
        const Pair x = input({N, C}, dt, -5.0, 5.0), dy = input({N, C}, dt);
        Pair y = output({N, C}, dt), dx = output({N, C}, dt);
        gelu_forward(x.host, y.host);
        gelu_forward(x.dev, y.dev);
        expect_close(y, dt, "gelu_forward " + what);
        gelu_backward(dy.host, x.host, dx.host);
        gelu_backward(dy.dev, x.dev, dx.dev);
        expect_close(dx, dt, "gelu_backward " + what);

        Pair acc = input({N, C}, dt);
        const Pair bias = input({C}, dt);
        bias_add(acc.host, bias.host);
        bias_add(acc.dev, bias.dev);
        expect_close(acc, dt, "bias_add " + what);
        for (DType gdt : {DType::F32, dt}) {
          Pair dbias = input({C}, gdt);
          bias_backward(dy.host, dbias.host);
          bias_backward(dy.dev, dbias.dev);
          expect_close(dbias, dt, "bias_backward " + what + " into " + name(gdt));
        }

        Pair sum = output({N, C}, dt);
        add(x.host, dy.host, sum.host);
        add(x.dev, dy.dev, sum.dev);
        expect_close(sum, dt, "add " + what);
        Pair alias = input({N, C}, dt);  // out aliases a
        add(alias.host, dy.host, alias.host);
        add(alias.dev, dy.dev, alias.dev);
        expect_close(alias, dt, "add in place " + what);

        Pair ax = input({N, C}, dt);
        axpy(-0.75, x.host, ax.host);
        axpy(-0.75, x.dev, ax.dev);
        expect_close(ax, dt, "axpy " + what);
        Pair sc = input({N, C}, dt);
        scale(sc.host, 1.0 / 3.0);
        scale(sc.dev, 1.0 / 3.0);
        expect_close(sc, dt, "scale " + what);

        const double ss_host = sum_of_squares(x.host), ss_dev = sum_of_squares(x.dev);
        EXPECT_NEAR(ss_dev, ss_host, 1e-6 * ss_host) << "sum_of_squares " << what;
      }
}

// The packed bias_add takes rounds of rows grid-strided over a grid that fits
// the GPU at once: more rows than the grid's first round (a last round of
// fewer than 4 rows included) must come out as the host's sums rounded to
// the storage type, bit for bit.
TEST_F(GpuOps, BiasAddOverMoreRowsThanTheGridHoldsMatchesHostExactly) {
  for (DType dt : kDtypes)
    for (index_t C : {index_t(768), index_t(3072)}) {
      const index_t N = 9003;
      const std::string what = "bias_add " + name(dt) + " [" + std::to_string(N) + ", " +
                               std::to_string(C) + "]";
      Pair acc = input({N, C}, dt);
      const Pair bias = input({C}, dt);
      bias_add(acc.host, bias.host);
      bias_add(acc.dev, bias.dev);
      // The host adds in fp32 (its copy is fp32); the kernel too, then rounds to dt.
      EXPECT_TRUE(same_bits(acc.dev, acc.host.to(dt))) << what << ": elements unlike the host's";
    }
}

TEST_F(GpuOps, SumOfSquaresOfALargeTensorMatchesHost) {
  const Pair x = input({(1 << 22) + 17}, DType::F32);
  const double host = sum_of_squares(x.host), dev = sum_of_squares(x.dev);
  EXPECT_NEAR(dev, host, 1e-9 * host);
  EXPECT_EQ(dev, sum_of_squares(x.dev)) << "not deterministic";
}

TEST_F(GpuOps, SumOfSquaresOfManyTensorsMatchesHost) {
  // Mixed dtypes and sizes, an empty tensor, one sum with a single copy back.
  std::vector<Tensor> host, dev;
  for (auto [n, dt] : {std::pair{index_t(1 << 20), DType::F32}, {index_t(0), DType::F32},
                       {index_t(1000), DType::BF16}, {index_t(3), DType::F16},
                       {index_t(777777), DType::BF16}}) {
    const Pair x = input({n}, dt);
    host.push_back(x.host);
    dev.push_back(x.dev);
  }
  double expected = 0;
  for (const Tensor& h : host) expected += sum_of_squares(h);
  const double got = sum_of_squares(dev);
  EXPECT_NEAR(got, expected, 1e-6 * expected);
  EXPECT_EQ(got, sum_of_squares(dev)) << "not deterministic";
  EXPECT_EQ(sum_of_squares(host), expected);
}

#ifdef MESHTRON_HAVE_CUDA
TEST_F(GpuOps, FusedBiasGeluEqualsBiasAddThenGelu) {
  for (DType dt : kDtypes)
    for (index_t N : {1, 17, 257})
      for (index_t C : kCols) {
        const Pair x = input({N, C}, dt, -4.0, 4.0), bias = input({C}, dt);
        Pair pre = output({N, C}, dt), y = output({N, C}, dt);
        pre.host.copy_from(x.host);
        bias_add(pre.host, bias.host);
        const Tensor pre_rounded = pre.host.to(dt).to(DType::F32);  // the device stores pre in dt
        gelu_forward(pre_rounded, y.host);
        cuda::bias_gelu_forward(dt, x.dev.raw(), bias.dev.raw(), N, C, pre.dev.raw(), y.dev.raw());
        expect_close(pre, dt, "bias_gelu pre " + name(dt));
        expect_close(y, dt, "bias_gelu y " + name(dt));
      }
}
#endif

// ============================================================== Dropout ==

/// A dropout output (inputs never 0) has the host's mask, zero exactly
/// where the host's is, and its values; with `drops`, something is dropped.
void expect_host_dropout(const Pair& y, DType dt, const std::string& what, bool drops = true) {
  const std::vector<double> d = y.dev.to_doubles(), h = y.host.to_doubles();
  index_t mismatches = 0, dropped = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    mismatches += (d[i] == 0.0) != (h[i] == 0.0);
    dropped += h[i] == 0.0;
  }
  EXPECT_EQ(mismatches, 0) << what << ": masks differ";
  if (drops) EXPECT_GT(dropped, 0) << what;
  expect_close(y, dt, what);
}

TEST_F(GpuOps, DropoutMaskIsIdenticalToTheHost) {
  for (DType dt : kDtypes)
    for (double p : {0.0, 0.1, 0.5})
      for (index_t N : {3, 257}) {
        DropoutSite site;
        site.seed = 0x1234567890abcdefULL;
        site.step = 7;
        site.stream = 3 * 16 + 2;
        site.a = 2, site.b = N, site.c = 130;
        site.a_offset = 1, site.b_offset = 5, site.c_offset = 390;
        site.b_global = N + 9, site.c_global = 768;
        const std::string what = "dropout " + name(dt) + " p=" + std::to_string(p) +
                                 " N=" + std::to_string(N);
        // |x| in [0.5, 1.5]: never 0, so a zero output means a dropped element.
        Tensor xh = random_host({2, N, 130}, 0.5, 1.5);
        std::bernoulli_distribution sign(0.5);
        for (index_t i = 0; i < xh.numel(); ++i)
          if (sign(rng())) xh.data<float>()[i] = -xh.data<float>()[i];
        const Tensor rounded = xh.to(dt);
        const Pair x{rounded.to(DType::F32), rounded.to_device()};
        Pair y = output(x.host.shape(), dt), dx = output(x.host.shape(), dt);
        dropout_forward(x.host, p, site, y.host);
        dropout_forward(x.dev, p, site, y.dev);
        dropout_backward(x.host, p, site, dx.host);
        dropout_backward(x.dev, p, site, dx.dev);
        for (const Pair* out : {&y, &dx}) expect_host_dropout(*out, dt, what, /*drops=*/p > 0);
      }
}

// kernels/cuda/dropout.cu has a packed kernel (16-byte aligned in and out;
// index carries within a pack) and the scalar one (anything else). Both
// must give the host's mask: rows of 768 (packs never cross a row), and a
// view from slice_rows(1, ...) of 130-wide rows (start 260 or 520 bytes in:
// not 16-byte aligned, so the scalar kernel), placed at b_offset = 1.
TEST_F(GpuOps, DropoutPackedAndUnalignedPathsGiveTheHostMask) {
  for (DType dt : kDtypes)
    for (index_t C : {index_t(768), index_t(130)}) {
      const index_t rows = 41;
      const bool sliced = C == 130;
      DropoutSite site;
      site.seed = 0xfeedbeef12345ULL;
      site.step = 11;
      site.stream = 5;
      site.a = 1, site.b = sliced ? rows - 1 : rows, site.c = C;
      site.b_offset = sliced ? 1 : 0;
      site.b_global = rows, site.c_global = C;
      const std::string what = "dropout " + name(dt) + " C=" + std::to_string(C) +
                               (sliced ? " unaligned view" : " packed");
      Tensor xh = random_host({rows, C}, 0.5, 1.5);
      const Tensor rounded = xh.to(dt);
      const Tensor x_host_full = rounded.to(DType::F32), x_dev_full = rounded.to_device();
      const Tensor x_host = sliced ? x_host_full.slice_rows(1, rows) : x_host_full;
      const Tensor x_dev = sliced ? x_dev_full.slice_rows(1, rows) : x_dev_full;
      if (sliced)
        ASSERT_NE(reinterpret_cast<std::uintptr_t>(x_dev.raw()) % 16, 0u) << what;
      Pair y = output(x_host.shape(), dt);
      dropout_forward(x_host, 0.3, site, y.host);
      dropout_forward(x_dev, 0.3, site, y.dev);
      expect_host_dropout(y, dt, what);
    }
}

// kernels/cuda/dropout.cu makes one Philox call per aligned group of 8
// global indices (grouped kernel) when C, c_offset and C_global are
// multiples of 8; otherwise the per-element kernels take their half-word of
// the group's call. Placements on both sides of that line, including rows
// of 8 (a bf16 thread's chunk spans two rows: carries between groups), odd
// lengths that leave a tail for block 0, and offsets in every axis.
TEST_F(GpuOps, DropoutGroupedAndPerElementPlacementsGiveTheHostMask) {
  struct Placement {
    index_t A, B, C, a_off, b_off, c_off, B_global, C_global;
  };
  const Placement placements[] = {
      {3, 5, 8, 1, 2, 8, 9, 16},        // grouped, 8-wide rows
      {1, 37, 136, 0, 3, 8, 41, 1000},  // grouped, chunk tail (37 * 136 % 16 != 0)
      {2, 7, 24, 5, 0, 0, 7, 24},       // grouped, whole rows
      {3, 5, 4, 1, 2, 8, 9, 16},        // C % 8 == 4: per element (grouped before session 28)
      {2, 7, 136, 0, 0, 4, 7, 144},     // c_offset % 8 != 0: per element
      {2, 7, 132, 0, 0, 8, 7, 144},     // C % 8 != 0: per element
      {2, 7, 136, 0, 0, 8, 7, 148}};    // C_global % 8 != 0: per element
  for (DType dt : kDtypes)
    for (const Placement& pl : placements) {
      DropoutSite site;
      site.seed = 0x0badc0ffee123ULL;
      site.step = 4;
      site.stream = 17;
      site.a = pl.A, site.b = pl.B, site.c = pl.C;
      site.a_offset = pl.a_off, site.b_offset = pl.b_off, site.c_offset = pl.c_off;
      site.b_global = pl.B_global, site.c_global = pl.C_global;
      const std::string what = "dropout " + name(dt) + " [" + std::to_string(pl.A) + ", " +
                               std::to_string(pl.B) + ", " + std::to_string(pl.C) + "] c_off " +
                               std::to_string(pl.c_off) + " C_global " +
                               std::to_string(pl.C_global);
      const Tensor rounded = random_host({pl.A * pl.B, pl.C}, 0.5, 1.5).to(dt);
      const Pair x{rounded.to(DType::F32), rounded.to_device()};
      Pair y = output(x.host.shape(), dt);
      dropout_forward(x.host, 0.4, site, y.host);
      dropout_forward(x.dev, 0.4, site, y.dev);
      expect_host_dropout(y, dt, what);
    }
}

// dropout_add (out = residual + dropout(x), one pass) gives the bits of
// dropout_forward then add on the device, in each of dropout.cu's three
// kernels (grouped: rows of 768; packed: rows of 130, aligned; scalar: a
// view from slice_rows, not 16-byte aligned), out separate or aliasing the
// residual; p = 0 is the add.
TEST_F(GpuOps, DropoutAddEqualsDropoutThenAddInEveryKernel) {
  for (DType dt : kDtypes)
    for (index_t C : {index_t(768), index_t(130)})
      for (bool sliced : {false, true}) {
        if (C == 768 && sliced) continue;
        const index_t rows = 41, first = sliced ? 1 : 0;
        DropoutSite site;
        site.seed = 0x5eed0123ULL;
        site.step = 9;
        site.stream = 6;
        site.a = 1, site.b = rows - first, site.c = C;
        site.b_offset = first, site.b_global = rows, site.c_global = C;
        const std::string what = "dropout_add " + name(dt) + " C=" + std::to_string(C) +
                                 (sliced ? " unaligned view" : "");
        const Tensor x_full = random_host({rows, C}, -1.5, 1.5).to(dt).to_device();
        const Tensor r_full = random_host({rows, C}, -1.5, 1.5).to(dt).to_device();
        const Tensor x = x_full.slice_rows(first, rows), residual = r_full.slice_rows(first, rows);
        if (sliced) ASSERT_NE(reinterpret_cast<std::uintptr_t>(x.raw()) % 16, 0u) << what;
        for (double p : {0.0, 0.3}) {
          Tensor dropped = Tensor::empty(x.shape(), dt, MemorySpace::Cuda);
          Tensor expected = Tensor::empty(x.shape(), dt, MemorySpace::Cuda);
          dropout_forward(x, p, site, dropped);
          add(residual, dropped, expected);
          Tensor out = Tensor::empty(x.shape(), dt, MemorySpace::Cuda);
          dropout_add(x, residual, p, site, out);
          EXPECT_EQ(out.to_doubles(), expected.to_doubles()) << what << " p=" << p;
          Tensor in_place = residual.clone();
          dropout_add(x, in_place, p, site, in_place);
          EXPECT_EQ(in_place.to_doubles(), expected.to_doubles())
              << what << " p=" << p << ", out aliasing residual";
          if (p > 0) EXPECT_NE(out.to_doubles(), dropped.to_doubles()) << what;
        }
      }
}

// ============================================================ Embedding ==

TEST_F(GpuOps, EmbeddingsForwardAndBackwardMatchHost) {
  for (DType dt : kDtypes)
    for (index_t N : kRows)
      for (index_t H : kCols)
        for (DType gdt : {DType::F32, dt}) {
          const std::string what = name(dt) + " N=" + std::to_string(N) + " H=" +
                                   std::to_string(H) + " grads " + name(gdt);
          const index_t V = 37, vocab_begin = 10;
          const Tensor ids_host = random_ids(N, 0, 60);  // some outside the shard
          const Tensor ids_dev = ids_host.to_device();
          const Pair table = input({V, H}, dt);
          Pair out = output({N, H}, dt);
          embedding_forward(ids_host, table.host, vocab_begin, out.host);
          embedding_forward(ids_dev, table.dev, vocab_begin, out.dev);
          expect_close(out, dt, "embedding_forward " + what);
          const Pair dout = input({N, H}, dt);
          Pair dtable = input({V, H}, gdt);
          embedding_backward(ids_host, dout.host, vocab_begin, dtable.host);
          embedding_backward(ids_dev, dout.dev, vocab_begin, dtable.dev);
          expect_close(dtable, gdt == DType::F32 ? dt : gdt, "embedding_backward " + what);

          for (index_t S : {index_t(1), index_t(3), index_t(17)}) {
            const index_t rows = 3 * S;
            const Pair pos = input({S + 2, H}, dt);
            Pair acc = input({rows, H}, dt);
            position_embedding_forward(pos.host, S, acc.host);
            position_embedding_forward(pos.dev, S, acc.dev);
            expect_close(acc, dt, "position_embedding_forward S=" + std::to_string(S) + what);
            const Pair dpos_out = input({rows, H}, dt);
            Pair dpos = input({S + 2, H}, gdt);
            position_embedding_backward(dpos_out.host, S, dpos.host);
            position_embedding_backward(dpos_out.dev, S, dpos.dev);
            expect_close(dpos, gdt == DType::F32 ? dt : gdt,
                         "position_embedding_backward S=" + std::to_string(S) + what);
          }
        }
}

// Calls back to back, as the position and word tables' backward run: the
// second call's sort reads its ids while the first call's accumulation may
// still run (programmatic launch), and its runs and tokens scratch may be
// the memory the first call's accumulation reads; the writes must wait.
// 8192 tokens over 4096 rows take the range sort on several blocks.
TEST_F(GpuOps, EmbeddingBackwardCallsBackToBackMatchHost) {
  const index_t N = 8192, H = 256, V = 4096;
  for (DType dt : {DType::BF16, DType::F32}) {
    const std::string what = "embedding_backward back to back " + name(dt);
    Pair dtable = input({V, H}, DType::F32);
    std::vector<Tensor> ids_host, ids_dev;
    std::vector<Pair> douts;
    for (int call = 0; call < 4; ++call) {  // every input uploaded before the first call
      ids_host.push_back(random_ids(N, 0, call % 2 ? V : 64));  // long runs, then short
      ids_dev.push_back(ids_host.back().to_device());
      douts.push_back(input({N, H}, dt));
    }
    for (int call = 0; call < 4; ++call) {
      embedding_backward(ids_host[call], douts[call].host, 0, dtable.host);
      embedding_backward(ids_dev[call], douts[call].dev, 0, dtable.dev);
    }
    expect_close(dtable, dt, what);
  }
}

// bias_backward reads 16-byte packs of columns where it can (C % V == 0,
// aligned) and single columns otherwise (the same data at a misaligned
// address): both match the host, and the packed path repeats bit for bit,
// with its finalize fused (C = 1280) and, past kMaxFusedColumnBlocks column
// blocks (C = 262400), launched on its own.
TEST_F(GpuOps, BiasBackwardPackedAndScalarPathsMatchHostAndRepeat) {
  for (DType dt : kDtypes)
    for (const auto& [N, C] : {std::pair<index_t, index_t>{8192, 1280}, {16, 262400}}) {
      const std::string what = name(dt) + " C=" + std::to_string(C);
      const Tensor flat = input({N * C + 1}, dt).dev;
      const Tensor aligned = flat.slice_rows(0, N * C).reshape({N, C});
      Tensor shifted = Tensor::empty({N * C + 1}, dt, MemorySpace::Cuda);
      shifted.slice_rows(1, N * C + 1).copy_from(aligned.reshape({N * C}));
      const Tensor misaligned = shifted.slice_rows(1, N * C + 1).reshape({N, C});
      Tensor packed = Tensor::zeros({C}, DType::F32, MemorySpace::Cuda);
      Tensor scalar = Tensor::zeros({C}, DType::F32, MemorySpace::Cuda);
      bias_backward(aligned, packed);
      bias_backward(misaligned, scalar);
      Tensor again = Tensor::zeros({C}, DType::F32, MemorySpace::Cuda);
      bias_backward(aligned, again);
      EXPECT_TRUE(packed.to_doubles() == again.to_doubles()) << what << ": not deterministic";
      const Tensor host = aligned.to_host().to(DType::F32);
      Tensor reference = Tensor::zeros({C}, DType::F32, MemorySpace::Host);
      bias_backward(host, reference);
      expect_close(Pair{reference, packed}, dt, "bias_backward packed " + what);
      expect_close(Pair{reference, scalar}, dt, "bias_backward scalar " + what);
    }
}

// GradStore::Overwrite (the first write of a gradient after a deferred
// zero_grad) over a gradient holding NaN (a skipped step's) gives the bits
// of accumulating onto zeros, on every column-sum path: bias_backward
// packed with the fused finish ([8192, 1280]), packed with the separate
// finish (more column blocks than tickets) and scalar (misaligned); the
// layernorm backward's split (H = 768), column-owner (H = 2048) and scalar
// (H = 130) kernels. The GEMMs' beta = 0 is checked in linear_weight_grads
// (both gradients) against accumulating onto zeros (another algorithm may
// serve beta = 0, so to tolerance).
TEST_F(GpuOps, GradientOverwriteOverNaNEqualsAccumulatingOntoZeros) {
  const auto zeros = [](index_t n) { return Tensor::zeros({n}, DType::F32, MemorySpace::Cuda); };
  const auto nans = [](index_t n) {
    Tensor t = Tensor::empty({n}, DType::F32, MemorySpace::Cuda);
    t.fill(kNaN);
    return t;
  };
  for (DType dt : kDtypes) {
    for (const auto& [N, C] : {std::pair<index_t, index_t>{8192, 1280}, {16, 262400}, {33, 130}}) {
      const std::string what = "bias_backward " + name(dt) + " [" + std::to_string(N) + ", " +
                               std::to_string(C) + "]";
      const Tensor flat = input({N * C + 1}, dt).dev;
      for (index_t shift : {index_t(0), index_t(1)}) {  // aligned (packed) and not (scalar)
        const Tensor dy = flat.slice_rows(shift, shift + N * C).reshape({N, C});
        Tensor accumulated = zeros(C), overwritten = nans(C);
        bias_backward(dy, accumulated);
        bias_backward(dy, overwritten, GradStore::Overwrite);
        EXPECT_TRUE(overwritten.to_doubles() == accumulated.to_doubles())
            << what << " shift " << shift;
      }
    }
    for (index_t H : {index_t(768), index_t(2048), index_t(130)}) {
      const index_t N = 2501;
      const std::string what = "layernorm_backward " + name(dt) + " H=" + std::to_string(H);
      const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
      const Tensor dy = input({N, H}, dt).dev;
      Tensor dx = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      Tensor dgamma = zeros(H), dbeta = zeros(H), dgamma2 = nans(H), dbeta2 = nans(H);
      layernorm_backward(dy, c.x.dev, c.gamma.dev, c.mean.dev, c.rstd.dev, dx, dgamma, dbeta);
      layernorm_backward(dy, c.x.dev, c.gamma.dev, c.mean.dev, c.rstd.dev, dx, dgamma2, dbeta2,
                         nullptr, GradStore::Overwrite);
      EXPECT_TRUE(dgamma2.to_doubles() == dgamma.to_doubles()) << what << " dgamma";
      EXPECT_TRUE(dbeta2.to_doubles() == dbeta.to_doubles()) << what << " dbeta";
    }
    for (const GemmCase& g : {GemmCase{5, 3, 17}, GemmCase{1280, 3840, 8192}}) {
      const std::string what = "linear_weight_grads " + name(dt) + " out=" + std::to_string(g.N);
      const Tensor x = input({g.K, g.M}, dt).dev, dy = input({g.K, g.N}, dt).dev;
      Tensor dw = Tensor::zeros({g.M, g.N}, DType::F32, MemorySpace::Cuda), db = zeros(g.N);
      Tensor dw2 = Tensor::empty({g.M, g.N}, DType::F32, MemorySpace::Cuda), db2 = nans(g.N);
      dw2.fill(kNaN);
      linear_weight_grads(x, dy, dw, db);
      linear_weight_grads(x, dy, dw2, db2, GradStore::Overwrite, GradStore::Overwrite);
      expect_close(dw2, dw.to_host(), tolerance(dt), what + " dweight");
      expect_close(db2, db.to_host(), tolerance(dt), what + " dbias");
    }
  }
}

#ifdef MESHTRON_HAVE_CUDA  // a kernel without an ops:: entry (PeerExchange calls it)
// The copy-engine tp all-reduce's sum kernel with a row-parallel layer's
// epilogue (PeerExchange::Addends): out = a + b + residual + bias[column]
// over elements [first, first + n) of a row-major [rows, C] output, in fp32
// with one rounding, so within a few fp32 roundings of the exact sum in fp32
// and within one rounding in 16 bits; the packed kernel (aligned, C and
// first multiples of the pack) and the element kernel (a misaligned
// operand, C = 5); residual and bias each optional; out aliasing a.
TEST_F(GpuOps, AddResidualBiasPackedAndScalarPathsAreOneRoundingOfTheExactSum) {
  struct Case {
    index_t rows, C, first;
    bool misaligned, residual, bias, alias;
  };
  const Case cases[] = {{64, 1280, 0, false, true, true, false},
                        {64, 1280, 32 * 1280, false, true, true, true},
                        {64, 1280, 640, false, false, true, false},
                        {64, 1280, 0, false, true, false, false},
                        {64, 1280, 1280, true, true, true, false},
                        {33, 5, 3, false, true, true, false}};
  for (DType dt : kDtypes)
    for (const Case& c : cases) {
      const std::string what = name(dt) + " C=" + std::to_string(c.C) + " first=" +
                               std::to_string(c.first) + (c.misaligned ? " misaligned" : "") +
                               (c.residual ? "" : " no residual") + (c.bias ? "" : " no bias") +
                               (c.alias ? " out = a" : "");
      const index_t n = c.rows * c.C;
      const Pair a = input({n + 1}, dt), b = input({n}, dt), r = input({n}, dt, -4, 4),
                 bias = input({c.C}, dt);
      // Misaligned: a read from its second element (2 or 4 bytes off).
      const Tensor a_dev = a.dev.slice_rows(c.misaligned ? 1 : 0, n + (c.misaligned ? 1 : 0));
      const Tensor a_host = a.host.slice_rows(c.misaligned ? 1 : 0, n + (c.misaligned ? 1 : 0));
      Tensor out = c.alias ? a_dev : Tensor::empty({n}, dt, MemorySpace::Cuda);
      cuda::add_residual_bias_on_stream(dt, a_dev.raw(), b.dev.raw(),
                                        c.residual ? r.dev.raw() : nullptr,
                                        c.bias ? bias.dev.raw() : nullptr, c.C, c.first, n,
                                        out.raw(), device::compute_stream());
      const std::vector<double> got = out.to_doubles();
      const double unit = dt == DType::F32 ? 4 * std::ldexp(1.0, -24)
                          : dt == DType::BF16 ? std::ldexp(1.0, -8)
                                              : std::ldexp(1.0, -11);
      index_t bad = 0, first_bad = -1;
      for (index_t i = 0; i < n; ++i) {
        const double terms[] = {a_host.data<float>()[i], b.host.data<float>()[i],
                                c.residual ? r.host.data<float>()[i] : 0.0,
                                c.bias ? bias.host.data<float>()[(c.first + i) % c.C] : 0.0};
        double exact = 0, magnitude = 0;
        for (double t : terms) exact += t, magnitude += std::abs(t);
        if (!(std::abs(got[std::size_t(i)] - exact) <= unit * magnitude + 1e-30))
          if (bad++ == 0) first_bad = i;
      }
      EXPECT_EQ(bad, 0) << what << ": first at " << first_bad;
    }
}
#endif

// The backward sums repeated ids in token order (kernels/cuda/embedding.cu):
// into an fp32 table it is the host's result bit for bit (same order, same
// roundings; bf16/fp16 dout are exact fp32 numbers),
// and every call gives the same bits (atomics would not). 8192 tokens (the
// one-block sort) and 12000 (the device-wide sort) over 64 ids give
// ~128-190 repeats per row; some ids fall outside the shard; the position
// table's ids (token / micro-batch) are the model's other use.
TEST_F(GpuOps, EmbeddingBackwardIsDeterministicAndExactInFp32) {
  const index_t H = 96, V = 50, vocab_begin = 7, micro_batch = 4;
  for (const index_t N : {index_t(8192), index_t(12000)}) {
    Tensor positions = Tensor::empty({N}, DType::I32);
    for (index_t t = 0; t < N; ++t)
      positions.data<std::int32_t>()[t] = std::int32_t(t / micro_batch);
    const std::pair<std::string, Tensor> cases[] = {{"word ids", random_ids(N, 0, 64)},
                                                    {"position ids", positions}};
    for (const auto& [ids_name, ids_host] : cases) {
      const std::string what = ids_name + " N=" + std::to_string(N);
      const index_t rows = ids_name == "word ids" ? V : N / micro_batch;
      const index_t begin = ids_name == "word ids" ? vocab_begin : 0;
      const Tensor ids_dev = ids_host.to_device();
      for (DType dt : kDtypes) {
        const Pair dout = input({N, H}, dt);
        const Pair start = input({rows, H}, DType::F32);  // fp32 main_grad
        Tensor host = start.host.clone();
        embedding_backward(ids_host, dout.host, begin, host);
        Tensor first = start.dev.clone(), second = start.dev.clone();
        embedding_backward(ids_dev, dout.dev, begin, first);
        embedding_backward(ids_dev, dout.dev, begin, second);
        const auto a = first.to_doubles(), b = second.to_doubles();
        EXPECT_TRUE(a == b) << what << " " << name(dt) << ": two calls differ";
        // bf16/fp16 dout are exact in fp32, so the fp32 sums match too.
        EXPECT_TRUE(a == host.to_doubles()) << what << " " << name(dt) << ": differs from the host";
      }
    }
  }
}

// The range sort of kernels/cuda/embedding.cu (up to 8192 tokens): a hot
// row (real text's "the": here 3/4 of the tokens, so one block lists 6000
// of them), every token the same row, a shard of 300000 rows (more keys
// than 256 per block), and token counts that are not a multiple of 32,
// ids outside the shard among them. Exact against the host in fp32.
TEST_F(GpuOps, EmbeddingBackwardSortHandlesHotRowsAndLargeShards) {
  struct Case {
    std::string name;
    index_t N, V;
    double hot;  // fraction of tokens on row 17
  };
  const Case cases[] = {{"hot row", 8192, 50304, 0.75},
                        {"one row", 8192, 50304, 1.0},
                        {"large shard", 8192, 300000, 0.1},
                        {"odd count", 4001, 50304, 0.3},
                        {"one token", 1, 50304, 0.0}};
  const index_t H = 16, vocab_begin = 3;
  for (const Case& c : cases) {
    Tensor ids = random_ids(c.N, 0, int(c.V + 2 * vocab_begin));  // some outside [begin, begin + V)
    std::bernoulli_distribution is_hot(c.hot);
    for (index_t n = 0; n < c.N; ++n)
      if (is_hot(rng())) ids.data<std::int32_t>()[n] = std::int32_t(vocab_begin + 17);
    const Tensor ids_dev = ids.to_device();
    const Pair dout = input({c.N, H}, DType::F32), start = input({c.V, H}, DType::F32);
    Tensor host = start.host.clone(), dev = start.dev.clone();
    embedding_backward(ids, dout.host, vocab_begin, host);
    embedding_backward(ids_dev, dout.dev, vocab_begin, dev);
    EXPECT_TRUE(dev.to_doubles() == host.to_doubles()) << c.name << ": differs from the host";
  }
}

// ======================================================== Cross-entropy ==

TEST_F(GpuOps, VocabParallelCrossEntropyMatchesHost) {
  struct Shard {
    index_t V_local, vocab_begin, vocab_valid;
  };
  // Whole vocabulary; a middle shard; a last shard with padded columns.
  const std::vector<Shard> shards = {{130, 0, 130}, {768, 768, 50257}, {3000, 1000, 3900}};
  for (DType dt : kDtypes)
    for (index_t N : kRows)
      for (const Shard& s : shards) {
        const std::string what = "cross_entropy " + name(dt) + " N=" + std::to_string(N) +
                                 " V_local=" + std::to_string(s.V_local);
        const Pair logits = input({N, s.V_local}, dt, -6.0, 6.0);
        const Tensor targets = random_ids(N, int(s.vocab_begin), int(std::min(s.vocab_valid, s.vocab_begin + s.V_local)));
        const Tensor targets_dev = targets.to_device();
        Pair row_max = output({N}, DType::F32);
        cross_entropy_row_max(logits.host, s.vocab_begin, s.vocab_valid, row_max.host);
        cross_entropy_row_max(logits.dev, s.vocab_begin, s.vocab_valid, row_max.dev);
        expect_close(row_max, DType::F32, what + " row_max");

        Pair sum_exp = output({N}, DType::F32), target_logit = output({N}, DType::F32);
        cross_entropy_partials(logits.host, targets, row_max.host, s.vocab_begin, s.vocab_valid,
                               sum_exp.host, target_logit.host);
        cross_entropy_partials(logits.dev, targets_dev, row_max.dev, s.vocab_begin,
                               s.vocab_valid, sum_exp.dev, target_logit.dev);
        expect_close(sum_exp, DType::F32, what + " sum_exp");
        expect_close(target_logit, dt, what + " target_logit");

        Pair loss = output({N}, DType::F32);
        cross_entropy_loss(sum_exp.host, target_logit.host, loss.host);
        cross_entropy_loss(sum_exp.dev, target_logit.dev, loss.dev);
        expect_close(loss, DType::F32, what + " loss");

        const Pair dloss = input({N}, DType::F32, 0.1, 1.0);
        Pair dlogits = output({N, s.V_local}, dt);
        cross_entropy_backward(logits.host, targets, row_max.host, sum_exp.host, dloss.host,
                               s.vocab_begin, s.vocab_valid, dlogits.host);
        cross_entropy_backward(logits.dev, targets_dev, row_max.dev, sum_exp.dev, dloss.dev,
                               s.vocab_begin, s.vocab_valid, dlogits.dev);
        expect_close(dlogits, dt, what + " dlogits");
        if (dt == DType::F32) {  // fp32 logits -> bf16 dlogits (the LM head under bf16)
          Pair narrow = output({N, s.V_local}, DType::BF16);
          cross_entropy_backward(logits.dev, targets_dev, row_max.dev, sum_exp.dev, dloss.dev,
                                 s.vocab_begin, s.vocab_valid, narrow.dev);
          expect_close(narrow.dev, dlogits.host, tolerance(DType::BF16), what + " bf16 dlogits");
        }
      }
}

// cross_entropy_row_stats (the LM head's statistics in one pass on one tp
// rank: an online softmax on the device) against the two passes it stands
// for: on the host (the same kernels, so the same bits) and on the device
// (the max and the target logit exactly, the rescaled sum to fp32
// tolerance), deterministic; the shards above, GPT-2's padded vocabulary
// (the packed path) and 50257 columns (V % 8 != 0: column by column), a row
// whose logits rise along the columns (the running max grows at every
// column, so every step rescales), a shard of padding only (no valid
// column: max -inf, sum 0, target 0).
TEST_F(GpuOps, CrossEntropyRowStatsMatchTheTwoPasses) {
  struct Shard {
    index_t V_local, vocab_begin, vocab_valid;
  };
  const std::vector<Shard> shards = {{130, 0, 130},     {768, 768, 50257}, {3000, 1000, 3900},
                                     {50304, 0, 50257}, {50257, 0, 50257}, {64, 4000, 3900}};
  for (DType dt : kDtypes)
    for (index_t N : {index_t(1), index_t(33)})
      for (const Shard& s : shards) {
        const std::string what = "cross_entropy_row_stats " + name(dt) + " N=" +
                                 std::to_string(N) + " V_local=" + std::to_string(s.V_local) +
                                 " begin=" + std::to_string(s.vocab_begin);
        Tensor values = random_host({N, s.V_local}, -6.0, 6.0);
        for (index_t v = 0; v < s.V_local; ++v)  // row 0 rises
          values.data<float>()[v] = float(-6.0 + 12.0 * double(v) / double(s.V_local));
        const Tensor rounded = values.to(dt);
        const Pair logits{rounded.to(DType::F32), rounded.to_device()};
        const index_t local_end = std::min(s.vocab_valid, s.vocab_begin + s.V_local);
        const bool no_valid_column = local_end <= s.vocab_begin;
        const Tensor targets = no_valid_column
                                   ? random_ids(N, 0, int(s.vocab_valid))
                                   : random_ids(N, int(s.vocab_begin), int(local_end));
        const Tensor targets_dev = targets.to_device();
        struct Stats {
          Tensor row_max, sum_exp, target_logit;
        };
        const auto stats = [&](const Tensor& l, const Tensor& t, bool one_pass) {
          const MemorySpace space = l.space();
          Stats r{Tensor::empty({N}, DType::F32, space), Tensor::empty({N}, DType::F32, space),
                  Tensor::empty({N}, DType::F32, space)};
          if (one_pass) {
            cross_entropy_row_stats(l, t, s.vocab_begin, s.vocab_valid, r.row_max, r.sum_exp,
                                    r.target_logit);
          } else {
            cross_entropy_row_max(l, s.vocab_begin, s.vocab_valid, r.row_max);
            cross_entropy_partials(l, t, r.row_max, s.vocab_begin, s.vocab_valid, r.sum_exp,
                                   r.target_logit);
          }
          return r;
        };
        const auto same = [](const Tensor& a, const Tensor& b) {
          return a.to_doubles() == b.to_doubles();
        };
        const Stats host_two = stats(logits.host, targets, false);
        const Stats host_one = stats(logits.host, targets, true);
        EXPECT_TRUE(same(host_one.row_max, host_two.row_max) &&
                    same(host_one.sum_exp, host_two.sum_exp) &&
                    same(host_one.target_logit, host_two.target_logit))
            << what << ": the host's one pass is not its two";
        const Stats dev_two = stats(logits.dev, targets_dev, false);
        const Stats dev_one = stats(logits.dev, targets_dev, true);
        const Stats again = stats(logits.dev, targets_dev, true);
        EXPECT_TRUE(same(dev_one.row_max, again.row_max) && same(dev_one.sum_exp, again.sum_exp) &&
                    same(dev_one.target_logit, again.target_logit))
            << what << ": not deterministic";
        EXPECT_TRUE(same(dev_one.row_max, dev_two.row_max)) << what << ": row_max";
        EXPECT_TRUE(same(dev_one.target_logit, dev_two.target_logit)) << what << ": target_logit";
        if (no_valid_column) {
          for (double m : dev_one.row_max.to_doubles()) EXPECT_EQ(m, -INFINITY) << what;
          for (double z : dev_one.sum_exp.to_doubles()) EXPECT_EQ(z, 0.0) << what;
          for (double t : dev_one.target_logit.to_doubles()) EXPECT_EQ(t, 0.0) << what;
          continue;
        }
        expect_close(dev_one.sum_exp, host_two.sum_exp, tolerance(DType::F32), what + " sum_exp");
        expect_close(dev_one.sum_exp, dev_two.sum_exp.to_host(), tolerance(DType::F32),
                     what + " sum_exp against the device's two passes");
        expect_close(dev_one.target_logit, host_two.target_logit, tolerance(dt),
                     what + " target_logit");
      }
}

// ================================================================ AdamW ==

TEST_F(GpuOps, AdamWStepMatchesHost) {
  for (index_t n : {index_t(1), index_t(3), index_t(257), index_t(100003)})
    for (std::int64_t step : {1, 5}) {
      Pair param = input({n}, DType::F32), m = input({n}, DType::F32, -0.1, 0.1),
           v = input({n}, DType::F32, 0.0, 0.01);
      const Pair grad = input({n}, DType::F32);
      AdamWParams hp;
      hp.lr = 3e-4, hp.weight_decay = 0.1, hp.step = step;
      adamw_step(param.host, grad.host, m.host, v.host, hp);
      adamw_step(param.dev, grad.dev, m.dev, v.dev, hp);
      const std::string what = "adamw n=" + std::to_string(n) + " step=" + std::to_string(step);
      expect_close(param, DType::F32, what + " param");
      expect_close(m, DType::F32, what + " m");
      expect_close(v, DType::F32, what + " v");
    }
}

// ========================================================== Head layout ==

TEST_F(GpuOps, SplitAndMergeHeadsMatchHostExactly) {
  for (DType dt : kDtypes)
    for (int parts : {1, 3}) {
      const index_t s = 17, b = 3, heads = 5, d = 7;
      const Pair x = input({s * b, parts * heads * d}, dt);
      const Tensor x_host = x.host.to(dt);
      Tensor host_parts[3], dev_parts[3];
      split_heads(x_host, s, b, heads, parts, host_parts);
      split_heads(x.dev, s, b, heads, parts, dev_parts);
      for (int p = 0; p < parts; ++p) {
        EXPECT_EQ(dev_parts[p].space(), MemorySpace::Cuda);
        expect_close(dev_parts[p], host_parts[p], 0.0, "split_heads part " + std::to_string(p));
      }
      Tensor merged;
      merge_heads(dev_parts, parts, s, b, heads, merged);
      EXPECT_EQ(merged.space(), MemorySpace::Cuda);
      expect_close(merged, x_host, 0.0, "merge_heads(split_heads(x)) " + name(dt));
    }
}

// ================================================ Fused GEMM epilogues ==
//
// gemm_bias_gelu (cuBLASLt GELU_AUX_BIAS) and gemm_dgelu (DGELU) for bf16
// and fp16, and their unfused fp32 path, against the host ops (gemm_bias then
// gelu_forward; gemm then gelu_backward) on the same rounded inputs. B is
// scaled by 2/sqrt(K) so that the GeLU sees |x| of order 1, its curved part,
// and not a ReLU. Both outputs of the forward start as NaN. N = 130 and 33
// break cuBLASLt's aux rule (ld a multiple of 8) and so exercise the
// fallback, as do views one element past an aligned block. The same for
// gemm_bias_residual (the residual add in the row-parallel GEMM) below.

#ifdef MESHTRON_HAVE_CUDA  // for the fallback counters and the launcher
double weight_range(index_t K) { return 2.0 / std::sqrt(double(std::max<index_t>(K, 1))); }

std::string gemm_what(const char* op, DType dt, index_t M, index_t N, index_t K, bool ta,
                      bool tb) {
  return std::string(op) + " " + name(dt) + " M=" + std::to_string(M) + " N=" +
         std::to_string(N) + " K=" + std::to_string(K) + " ta=" + std::to_string(ta) +
         " tb=" + std::to_string(tb);
}

void check_gemm_bias_gelu(DType dt, const GemmCase& g, bool ta, bool tb) {
  const std::string what = gemm_what("gemm_bias_gelu", dt, g.M, g.N, g.K, ta, tb);
  const double w = weight_range(g.K);
  const Pair A = input(stored(g.M, g.K, ta), dt), B = input(stored(g.K, g.N, tb), dt, -w, w);
  const Pair bias = input({g.N}, dt);
  Pair pre = output({g.M, g.N}, dt), act = output({g.M, g.N}, dt);
  gemm_bias_gelu(A.host, ta, B.host, tb, bias.host, pre.host, act.host);
  gemm_bias_gelu(A.dev, ta, B.dev, tb, bias.dev, pre.dev, act.dev);
  expect_close(pre, dt, what + " pre_gelu");
  expect_close(act, dt, what + " activated");
}

/// With `bias_grad`, also the fc bias gradient gemm_dgelu takes after the
/// GEMM: an fp32 gradient that already holds values accumulates the column
/// sums of dpre.
void check_gemm_dgelu(DType dt, const GemmCase& g, bool ta, bool tb, bool bias_grad = false) {
  const std::string what =
      gemm_what(bias_grad ? "gemm_dgelu + dbias" : "gemm_dgelu", dt, g.M, g.N, g.K, ta, tb);
  const double w = weight_range(g.K);
  const Pair A = input(stored(g.M, g.K, ta), dt), B = input(stored(g.K, g.N, tb), dt, -w, w);
  const Pair pre = input({g.M, g.N}, dt, -3.0, 3.0);
  Pair dpre = output({g.M, g.N}, dt);
  Pair dbias = input({g.N}, DType::F32);
  gemm_dgelu(A.host, ta, B.host, tb, pre.host, dpre.host, bias_grad ? &dbias.host : nullptr);
  gemm_dgelu(A.dev, ta, B.dev, tb, pre.dev, dpre.dev, bias_grad ? &dbias.dev : nullptr);
  expect_close(dpre, dt, what);
  if (bias_grad) expect_close(dbias, dt, what + " dbias");
}

const std::vector<GemmCase> kEpilogueCases = {{1, 8, 64},      {3, 64, 5},      {17, 130, 33},
                                              {33, 768, 130},  {64, 40, 3072},  {257, 3072, 768},
                                              {130, 1024, 1024}};

TEST_F(GpuOps, GemmBiasGeluMatchesHostGemmBiasThenGelu) {
  for (DType dt : kDtypes)
    for (const GemmCase& g : kEpilogueCases)
      for (int t = 0; t < 4; ++t) check_gemm_bias_gelu(dt, g, t & 1, t & 2);
}

/// gemm_gelu (GELU_AUX, no bias: the fc forward with the ones column).
void check_gemm_gelu(DType dt, const GemmCase& g, bool ta, bool tb) {
  const std::string what = gemm_what("gemm_gelu", dt, g.M, g.N, g.K, ta, tb);
  const double w = weight_range(g.K);
  const Pair A = input(stored(g.M, g.K, ta), dt), B = input(stored(g.K, g.N, tb), dt, -w, w);
  Pair pre = output({g.M, g.N}, dt), act = output({g.M, g.N}, dt);
  gemm_gelu(A.host, ta, B.host, tb, pre.host, act.host);
  gemm_gelu(A.dev, ta, B.dev, tb, pre.dev, act.dev);
  expect_close(pre, dt, what + " pre_gelu");
  expect_close(act, dt, what + " activated");
}

TEST_F(GpuOps, GemmGeluMatchesHostGemmThenGeluAndIsFusedAtGpt2Shapes) {
  for (DType dt : kDtypes)
    for (const GemmCase& g : kEpilogueCases)
      for (int t = 0; t < 4; ++t) check_gemm_gelu(dt, g, t & 1, t & 2);
  // GPT-2 124M's fc forward with the ones column: K = 768 + 8.
  for (DType dt : {DType::BF16, DType::F16}) {
    const std::uint64_t before = cuda::gemm_gelu_fallbacks();
    check_gemm_gelu(dt, {8192, 3072, 768 + kOnesColumnWidth}, false, false);
    EXPECT_EQ(cuda::gemm_gelu_fallbacks(), before)
        << name(dt) << ": cuBLASLt offered no GELU_AUX algorithm";
  }
}

TEST_F(GpuOps, GemmDgeluMatchesHostGemmThenGeluBackward) {
  for (DType dt : kDtypes)
    for (const GemmCase& g : kEpilogueCases)
      for (int t = 0; t < 4; ++t) check_gemm_dgelu(dt, g, t & 1, t & 2);
}

TEST_F(GpuOps, GemmDgeluWithBiasGradMatchesHostGemmGeluBackwardThenColumnSums) {
  for (DType dt : kDtypes)
    for (const GemmCase& g : kEpilogueCases)
      for (int t = 0; t < 4; ++t) check_gemm_dgelu(dt, g, t & 1, t & 2, /*bias_grad=*/true);
}

TEST_F(GpuOps, GeluEpiloguesMatchHostAtGpt2_774MShapes) {
  // GPT-2 774M, 8 x 1024 tokens: fc forward [8192, 1280] x [1280, 5120] and
  // proj's dgrad dy [8192, 1280] x W^T (W stored [5120, 1280]), as the MLP
  // calls them (no transpose forward, trans_b backward).
  const index_t M = 8192, H = 1280, F = 5120;
  for (DType dt : kDtypes) {
    const std::uint64_t before = cuda::gemm_gelu_fallbacks();
    check_gemm_bias_gelu(dt, {M, F, H}, false, false);
    check_gemm_dgelu(dt, {M, F, H}, false, true);
    check_gemm_dgelu(dt, {M, F, H}, false, true, /*bias_grad=*/true);
    if (dt != DType::F32)
      EXPECT_EQ(cuda::gemm_gelu_fallbacks(), before)
          << name(dt) << ": cuBLASLt offered no GeLU-epilogue algorithm at 774M shapes";
  }
}

TEST_F(GpuOps, GeluEpiloguesTakeTheFusedPathAtGpt2Shapes) {
  // Every GPT-2 size (124M, 350M, 774M, 1.5B), 1 x 1024 and 8 x 1024
  // tokens, the MLP's local ffn width at tp = 1, 2, 4, 8: the fallback
  // counter must stay where it was, in bf16 and fp16 (the training dtypes).
  // Outputs are poisoned and must come back free of NaN; their values are
  // checked against the host above. The random inputs are drawn once per
  // dtype and size, at the largest M and ffn, and each case takes views of
  // their leading elements (any values do; drawing them per case took most
  // of this test's minute on an H100).
  struct Size {
    index_t hidden, ffn;
  };
  constexpr index_t kMaxM = 8192;
  const auto leading = [](const Tensor& t, Shape shape) {
    return Tensor::view(t.raw(), std::move(shape), t.dtype(), t.space());
  };
  for (DType dt : {DType::BF16, DType::F16})
    for (const Size& sz : {Size{768, 3072}, Size{1024, 4096}, Size{1280, 5120}, Size{1600, 6400}}) {
      const index_t H = sz.hidden;
      const double w = weight_range(H);
      const Tensor x_all = input({kMaxM, H}, dt).dev, dy_all = input({kMaxM, H}, dt).dev;
      const Tensor fc_all = input({H, sz.ffn}, dt, -w, w).dev, b_all = input({sz.ffn}, dt).dev;
      const Tensor proj_all = input({sz.ffn, H}, dt, -w, w).dev;
      for (index_t M : {1024, 8192})
        for (int tp : {1, 2, 4, 8}) {
          const index_t F = sz.ffn / tp;
          const std::string what = name(dt) + " M=" + std::to_string(M) + " h=" +
                                   std::to_string(H) + " ffn/tp=" + std::to_string(F);
          const Tensor x = leading(x_all, {M, H}), dy = leading(dy_all, {M, H});
          const Tensor fc = leading(fc_all, {H, F}), b = leading(b_all, {F});
          const Tensor proj = leading(proj_all, {F, H});
          const bool scan = M == 1024;  // the NaN scan of 8192-row outputs adds nothing
          const auto out = [&] {
            Tensor t = Tensor::empty({M, F}, dt, MemorySpace::Cuda);
            if (scan) t.fill(kNaN);
            return t;
          };
          Tensor pre = out(), act = out(), dpre = out();
          const std::uint64_t before = cuda::gemm_gelu_fallbacks();
          gemm_bias_gelu(x, false, fc, false, b, pre, act);
          EXPECT_EQ(cuda::gemm_gelu_fallbacks(), before) << what << ": forward fell back";
          gemm_dgelu(dy, false, proj, true, pre, dpre);
          EXPECT_EQ(cuda::gemm_gelu_fallbacks(), before) << what << ": dgelu fell back";
          Tensor dbias = Tensor::zeros({F}, DType::F32, MemorySpace::Cuda);
          gemm_dgelu(dy, false, proj, true, pre, dpre, &dbias);
          EXPECT_EQ(cuda::gemm_gelu_fallbacks(), before) << what << ": dgelu + dbias fell back";
          if (scan)
            for (const Tensor* t : {&pre, &act, &dpre}) {
              index_t nans = 0;
              for (double v : t->to_doubles()) nans += std::isnan(v);
              EXPECT_EQ(nans, 0) << what << ": unwritten elements";
            }
        }
    }
}

/// A device tensor one element past an aligned block (2-byte aligned for
/// bf16 and fp16, 4 for fp32), NaN; `block` owns the memory.
struct OffsetView {
  Tensor block, view;
};
OffsetView offset_by_one(const Shape& shape, DType dt) {
  index_t n = 1;
  for (index_t d : shape) n *= d;
  OffsetView o;
  o.block = Tensor::empty({n + 1}, dt, MemorySpace::Cuda);
  o.block.fill(kNaN);
  o.view = Tensor::view(static_cast<char*>(o.block.raw()) + dtype_size(dt), shape, dt,
                        MemorySpace::Cuda);
  return o;
}

TEST_F(GpuOps, GeluEpiloguesWithMisalignedAuxMatchHost) {
  // pre_gelu one element off its block: cuBLASLt must be told the real
  // alignment (it reads the aux pointer when it chooses) or the op must fall
  // back; either way the numbers are the host's.
  for (DType dt : kDtypes) {
    const index_t M = 33, N = 64, K = 96;
    const double w = weight_range(K);
    const Pair A = input({M, K}, dt), B = input({K, N}, dt, -w, w), bias = input({N}, dt);
    Pair pre = output({M, N}, dt), act = output({M, N}, dt);
    OffsetView pre_off = offset_by_one({M, N}, dt);
    gemm_bias_gelu(A.host, false, B.host, false, bias.host, pre.host, act.host);
    gemm_bias_gelu(A.dev, false, B.dev, false, bias.dev, pre_off.view, act.dev);
    expect_close(pre_off.view, pre.host, tolerance(dt), "misaligned pre_gelu " + name(dt));
    expect_close(act, dt, "activated beside a misaligned pre_gelu " + name(dt));
    // The backward reading that misaligned pre_gelu.
    const Pair dy = input({M, N}, dt), W = input({K, N}, dt, -w, w);
    Pair dpre = output({M, K}, dt);
    const Pair pre_in = input({M, K}, dt, -3.0, 3.0);
    OffsetView pre_in_off = offset_by_one({M, K}, dt);
    pre_in_off.view.copy_from(pre_in.dev);
    gemm_dgelu(dy.host, false, W.host, true, pre_in.host, dpre.host);
    gemm_dgelu(dy.dev, false, W.dev, true, pre_in_off.view, dpre.dev);
    expect_close(dpre, dt, "gemm_dgelu with a misaligned pre_gelu " + name(dt));
  }
}

TEST_F(GpuOps, FusedGeluEpilogueInFp32IsTheTanhGeluDiagnostic) {
  // The op table keeps fp32 unfused (ops_host.cpp: gelu_in_epilogue); this
  // calls the launcher directly to measure cuBLASLt's fp32 GeLU epilogues
  // against the host's tanh GeLU, and prints the error so that the policy can
  // be revisited. Held only to 1e-3 of the tensor's scale here.
  const index_t M = 257, N = 768, K = 512;
  const DType dt = DType::F32;
  const double w = weight_range(K);
  const Pair A = input({M, K}, dt), B = input({K, N}, dt, -w, w), bias = input({N}, dt);
  Pair pre = output({M, N}, dt), act = output({M, N}, dt);
  gemm_bias_gelu(A.host, false, B.host, false, bias.host, pre.host, act.host);
  cuda::GemmArgs g{dt, dt, A.dev.raw(), B.dev.raw(), act.dev.raw(), false, false, M, N, K, K, N, N};
  g.bias = bias.dev.raw();
  g.gelu_pre_out = pre.dev.raw();
  const std::uint64_t before = cuda::gemm_gelu_fallbacks();
  cuda::gemm(g);
  const bool fused = cuda::gemm_gelu_fallbacks() == before;
  // Error of the device's activated against tanh-GeLU and erf-GeLU of the
  // host's pre-activation, relative to the largest |activated|.
  const std::vector<double> d = act.dev.to_doubles(), h = act.host.to_doubles(),
                            p = pre.host.to_doubles();
  double scale = 0, err_tanh = 0, err_erf = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    scale = std::max(scale, std::abs(h[i]));
    const double erf_gelu = 0.5 * p[i] * (1.0 + std::erf(p[i] / std::sqrt(2.0)));
    err_tanh = std::max(err_tanh, std::abs(d[i] - h[i]));
    err_erf = std::max(err_erf, std::abs(d[i] - erf_gelu));
  }
  std::cout << "fp32 GELU_AUX_BIAS epilogue (" << (fused ? "fused" : "fell back")
            << "): max |dev - tanh gelu| = " << err_tanh / scale
            << ", max |dev - erf gelu| = " << err_erf / scale << " (relative to max |gelu|)\n";
  EXPECT_LE(err_tanh / scale, 1e-3);
  expect_close(pre.dev, pre.host, 1e-5, "fp32 epilogue's pre_gelu");
  // The backward epilogue in fp32, the same way.
  const Pair dy = input({M, N}, dt), W = input({K, N}, dt, -w, w), pre_in = input({M, K}, dt, -3, 3);
  Pair dpre = output({M, K}, dt);
  gemm_dgelu(dy.host, false, W.host, true, pre_in.host, dpre.host);
  cuda::GemmArgs b{dt, dt, dy.dev.raw(), W.dev.raw(), dpre.dev.raw(), false, true, M, K, N, N, N, K};
  b.gelu_pre_in = pre_in.dev.raw();
  cuda::gemm(b);
  const std::vector<double> dd = dpre.dev.to_doubles(), dh = dpre.host.to_doubles();
  double dscale = 0, derr = 0;
  for (std::size_t i = 0; i < dh.size(); ++i) {
    dscale = std::max(dscale, std::abs(dh[i]));
    derr = std::max(derr, std::abs(dd[i] - dh[i]));
  }
  std::cout << "fp32 DGELU epilogue: max |dev - host| = " << derr / dscale
            << " (relative to max |dpre|)\n";
  EXPECT_LE(derr / dscale, 1e-3);
}

// gemm_bias_residual: out = op(A) op(B) + bias + residual in one cuBLASLt
// call with C = residual, D = out (out of place), against the host's
// gemm_bias then add. The residual must come back unchanged, and at GPT-2's
// row-parallel shapes (attention proj h -> h, MLP proj 4h -> h) the fused
// path must run in bf16 and fp16.

void check_gemm_bias_residual(DType dt, const GemmCase& g, bool ta, bool tb) {
  const std::string what = gemm_what("gemm_bias_residual", dt, g.M, g.N, g.K, ta, tb);
  const double w = weight_range(g.K);
  const Pair A = input(stored(g.M, g.K, ta), dt), B = input(stored(g.K, g.N, tb), dt, -w, w);
  const Pair bias = input({g.N}, dt), residual = input({g.M, g.N}, dt, -4.0, 4.0);
  const std::vector<double> residual_before = residual.dev.to_doubles();
  Pair out = output({g.M, g.N}, dt);
  gemm_bias_residual(A.host, ta, B.host, tb, bias.host, residual.host, out.host);
  gemm_bias_residual(A.dev, ta, B.dev, tb, bias.dev, residual.dev, out.dev);
  expect_close(out, dt, what);
  EXPECT_EQ(residual.dev.to_doubles(), residual_before) << what << ": residual was written";
}

// Autotuning (gemm.cu) times the heuristic's candidates on scratch outputs.
// With it on, a GEMM accumulating into C (beta = 1), a weight gradient with
// its bias gradient and the GeLU forward (aux output) must give
// what the heuristic's first algorithm gives, to fp32 rounding of another
// algorithm, and C must hold one accumulation, not also the timing runs'
// (those would add A B six more times).
TEST_F(GpuOps, AutotunedGemmsMatchTheHeuristicChoiceAndWriteOnlyTheirOutputs) {
  const std::uint64_t tuned_before = cuda::gemm_autotuned_problems();
  const DType dt = DType::BF16;
  const index_t M = 512, N = 768, K = 256;
  const Pair A = input({M, K}, dt), B = input({K, N}, dt, -0.1, 0.1), bias = input({N}, dt);
  const Pair C0 = input({M, N}, DType::F32), db0 = input({N}, DType::F32);
  struct Outputs {
    Tensor c, dw, db, pre, act;
  };
  const auto run = [&](bool tune) {
    cuda::set_gemm_autotune(tune);
    Outputs o{C0.dev.clone(), C0.dev.clone(), db0.dev.clone(),
              Tensor::empty({M, N}, dt, MemorySpace::Cuda),
              Tensor::empty({M, N}, dt, MemorySpace::Cuda)};
    gemm(A.dev, false, B.dev, false, o.c, 1.0, 1.0);  // c += A B
    // dW [K, N] += A^T dY with dY = the first M rows of C0 as bf16.
    const Tensor dy = C0.dev.to(dt);
    Tensor dw = Tensor::view(o.dw.raw(), {K, N}, DType::F32, MemorySpace::Cuda);
    linear_weight_grads(A.dev, dy, dw, o.db);
    gemm_bias_gelu(A.dev, false, B.dev, false, bias.dev, o.pre, o.act);
    return o;
  };
  const Outputs heuristic = run(false), tuned = run(true);
  cuda::set_gemm_autotune(false);
  EXPECT_GT(cuda::gemm_autotuned_problems(), tuned_before) << "nothing was autotuned";
  const double tol = tolerance(DType::F32) * 10;
  expect_close(tuned.c, heuristic.c.to_host(), tol, "autotuned c += A B");
  expect_close(tuned.dw, heuristic.dw.to_host(), tol, "autotuned dW");
  expect_close(tuned.db, heuristic.db.to_host(), tol, "autotuned db");
  expect_close(tuned.pre, heuristic.pre.to_host(), tolerance(dt), "autotuned pre_gelu");
  expect_close(tuned.act, heuristic.act.to_host(), tolerance(dt), "autotuned gelu");
}

TEST_F(GpuOps, GemmBiasResidualMatchesHostGemmBiasThenAdd) {
  for (DType dt : kDtypes)
    for (const GemmCase& g : kEpilogueCases)
      for (int t = 0; t < 4; ++t) check_gemm_bias_residual(dt, g, t & 1, t & 2);
  // GPT-2 774M's MLP projection, 8 x 1024 tokens: [8192, 5120] x [5120, 1280].
  for (DType dt : kDtypes) check_gemm_bias_residual(dt, {8192, 1280, 5120}, false, false);
}

TEST_F(GpuOps, ResidualEpilogueTakesTheFusedPathAtGpt2Shapes) {
  struct Size {
    index_t hidden, ffn;
  };
  for (DType dt : kDtypes)
    for (const Size& sz : {Size{768, 3072}, Size{1024, 4096}, Size{1280, 5120}, Size{1600, 6400}})
      for (index_t K : {sz.hidden, sz.ffn}) {
        const index_t M = 8192, N = sz.hidden;
        const Pair A = input({M, K}, dt), B = input({K, N}, dt, -0.05, 0.05), bias = input({N}, dt);
        const Pair residual = input({M, N}, dt);
        Pair out = output({M, N}, dt);
        const std::uint64_t before = cuda::gemm_residual_fallbacks();
        gemm_bias_residual(A.dev, false, B.dev, false, bias.dev, residual.dev, out.dev);
        const bool fused = cuda::gemm_residual_fallbacks() == before;
        if (dt == DType::F32)
          std::cout << "fp32 residual epilogue M=" << M << " N=" << N << " K=" << K << ": "
                    << (fused ? "fused" : "fell back") << "\n";
        else
          EXPECT_TRUE(fused) << name(dt) << " M=" << M << " N=" << N << " K=" << K
                             << ": cuBLASLt offered no out-of-place bias GEMM";
      }
}

TEST_F(GpuOps, GemmBiasResidualWithMisalignedResidualMatchesHost) {
  for (DType dt : kDtypes) {
    const index_t M = 33, N = 64, K = 96;
    const Pair A = input({M, K}, dt), B = input({K, N}, dt), bias = input({N}, dt);
    const Pair residual = input({M, N}, dt);
    OffsetView residual_off = offset_by_one({M, N}, dt);
    residual_off.view.copy_from(residual.dev);
    Pair out = output({M, N}, dt);
    gemm_bias_residual(A.host, false, B.host, false, bias.host, residual.host, out.host);
    gemm_bias_residual(A.dev, false, B.dev, false, bias.dev, residual_off.view, out.dev);
    expect_close(out, dt, "gemm_bias_residual with a misaligned residual " + name(dt));
  }
}
#endif

// ==================================== memory-bound kernels, round two ==
//
// kernels/cuda/{layernorm,embedding,elementwise}.cu loop rows/packs over a
// grid sized to what the GPU holds at once and keep the next row's loads
// in flight (layernorm: registers forward, a cp.async ring backward, which
// also carries the residual gradient where shared memory allows). These
// tests run them past one pass of the grid (N = 8197 rows: more than the
// ~3200 resident warps of the forward and 2112 of the backward on an H100,
// and not a multiple of anything), at GPT-2 124M's H = 768, 774M's 1280,
// 1024 and 2048 (16-bit backward: the scalar kernels), compare with the
// host, demand the same bits from a second call, and run the scalar
// fallbacks on views one element off a 16-byte boundary.
#ifdef MESHTRON_HAVE_CUDA

/// A misaligned device copy of `src` (one element past a 16-byte boundary).
OffsetView misaligned_copy(const Tensor& src) {
  OffsetView o = offset_by_one(src.shape(), src.dtype());
  o.view.copy_from(src);
  return o;
}

TEST_F(GpuOps, LayerNormRowLoopsMatchHostRepeatAndFallBackWhenMisaligned) {
  const index_t N = 8197;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(768), index_t(1024), index_t(1280), index_t(2048)}) {
      const std::string what = "layernorm " + name(dt) + " N=" + std::to_string(N) +
                               " H=" + std::to_string(H);
      const Pair x = input({N, H}, dt, -2.0, 3.0), gamma = input({H}, dt), beta = input({H}, dt);
      Pair y = output({N, H}, dt), mean = output({N}, DType::F32), rstd = output({N}, DType::F32);
      layernorm_forward(x.host, gamma.host, beta.host, 1e-5, y.host, mean.host, rstd.host);
      layernorm_forward(x.dev, gamma.dev, beta.dev, 1e-5, y.dev, mean.dev, rstd.dev);
      expect_close(y, dt, what + " y");
      expect_close(mean, DType::F32, what + " mean");
      expect_close(rstd, DType::F32, what + " rstd");
      Pair y2 = output({N, H}, dt), mean2 = output({N}, DType::F32),
           rstd2 = output({N}, DType::F32);
      layernorm_forward(x.dev, gamma.dev, beta.dev, 1e-5, y2.dev, mean2.dev, rstd2.dev);
      EXPECT_TRUE(same_bits(y2.dev, y.dev)) << what << ": y differs between calls";
      EXPECT_TRUE(same_bits(mean2.dev, mean.dev) && same_bits(rstd2.dev, rstd.dev)) << what;

      // Scalar forward: x one element off a 16-byte boundary.
      OffsetView x_off = misaligned_copy(x.dev);
      Pair y_off = output({N, H}, dt), mean_off = output({N}, DType::F32),
           rstd_off = output({N}, DType::F32);
      layernorm_forward(x_off.view, gamma.dev, beta.dev, 1e-5, y_off.dev, mean_off.dev,
                        rstd_off.dev);
      expect_close(y_off.dev, y.host, tolerance(dt), what + " misaligned x: y");
      expect_close(mean_off.dev, mean.host, tolerance(DType::F32), what + " misaligned x: mean");

      // Backward with the residual gradient (the model's call), host statistics.
      const Pair dy = input({N, H}, dt), residual = input({N, H}, dt);
      const Tensor mean_dev = mean.host.to_device(), rstd_dev = rstd.host.to_device();
      Pair dx = output({N, H}, dt), dgamma = input({H}, DType::F32), dbeta = input({H}, DType::F32);
      const Tensor dgamma0 = dgamma.dev.clone(), dbeta0 = dbeta.dev.clone();
      layernorm_backward(dy.host, x.host, gamma.host, mean.host, rstd.host, dx.host, dgamma.host,
                         dbeta.host, &residual.host);
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx.dev, dgamma.dev,
                         dbeta.dev, &residual.dev);
      expect_close(dx, dt, what + " dx + residual");
      expect_close(dgamma, dt, what + " dgamma");
      expect_close(dbeta, dt, what + " dbeta");
      Pair dx2 = output({N, H}, dt);
      Tensor dgamma2 = dgamma0.clone(), dbeta2 = dbeta0.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx2.dev, dgamma2, dbeta2,
                         &residual.dev);
      EXPECT_TRUE(same_bits(dx2.dev, dx.dev)) << what << ": dx differs between calls";
      EXPECT_TRUE(same_bits(dgamma2, dgamma.dev)) << what << ": dgamma differs between calls";
      EXPECT_TRUE(same_bits(dbeta2, dbeta.dev)) << what << ": dbeta differs between calls";

      // Without the residual: round(layernorm dx) + residual must be the
      // bits of the fused call (the ring carries the residual, or not).
      Tensor plain = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      plain.fill(kNaN);
      Tensor dgamma3 = dgamma0.clone(), dbeta3 = dbeta0.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, plain, dgamma3, dbeta3);
      EXPECT_TRUE(same_bits(dgamma3, dgamma.dev)) << what << ": dgamma depends on the residual";
      add(plain, residual.dev, plain);
      EXPECT_TRUE(same_bits(plain, dx.dev)) << what << ": fused residual != backward + add";

      // Scalar backward: a misaligned residual sends the call to the scalar
      // kernels; same host reference.
      OffsetView res_off = misaligned_copy(residual.dev);
      Pair dx_off = output({N, H}, dt);
      Tensor dgamma4 = dgamma0.clone(), dbeta4 = dbeta0.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx_off.dev, dgamma4,
                         dbeta4, &res_off.view);
      expect_close(dx_off.dev, dx.host, tolerance(dt), what + " misaligned residual: dx");
      expect_close(dgamma4, dgamma.host, tolerance(dt), what + " misaligned residual: dgamma");
    }
}

TEST_F(GpuOps, EmbeddingForwardPacksMatchHostExactlyAndFallBack) {
  const index_t V = 1000, vocab_begin = 100;
  for (DType dt : kDtypes)
    for (index_t N : {index_t(1), index_t(37), index_t(8197)})
      for (index_t H : {index_t(768), index_t(1280), index_t(130)}) {
        const std::string what = "embedding_forward " + name(dt) + " N=" + std::to_string(N) +
                                 " H=" + std::to_string(H);
        const Tensor ids_host = random_ids(N, 0, 1200);  // some outside [100, 1100)
        const Tensor ids_dev = ids_host.to_device();
        const Pair table = input({V, H}, dt);
        Pair out = output({N, H}, dt);
        embedding_forward(ids_host, table.host, vocab_begin, out.host);
        embedding_forward(ids_dev, table.dev, vocab_begin, out.dev);
        expect_close(out, DType::F32, what);  // a copy: exact, any dtype
        EXPECT_TRUE(out.dev.to_doubles() == out.host.to_doubles()) << what << ": not exact";
        OffsetView out_off = offset_by_one({N, H}, dt);
        embedding_forward(ids_dev, table.dev, vocab_begin, out_off.view);
        EXPECT_TRUE(out_off.view.to_doubles() == out.host.to_doubles())
            << what << ": misaligned output (scalar kernel) differs";
      }
}

// Packed runs (H % V == 0, aligned) and the scalar kernel (odd H, or dout
// one element off a 16-byte boundary): in an fp32 table the host's bits,
// every call. 8192 tokens over 40 rows give runs of ~200, over 8192 rows
// runs of one to a few; 66000 tokens of
// 520-wide fp32 rows use more sorted positions than grid rows (65535);
// 2600-wide fp32 rows (650 packs) are split over two x blocks of 352
// threads, the last with idle threads.
TEST_F(GpuOps, EmbeddingBackwardPacksAreExactAndDeterministicAtModelShapes) {
  struct Case {
    DType dt;
    index_t N, H, V;
    int id_hi;
  };
  std::vector<Case> cases;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(768), index_t(1280), index_t(130)})
      for (int id_hi : {50, 9000}) cases.push_back({dt, 8192, H, id_hi == 50 ? 40 : 8192, id_hi});
  cases.push_back({DType::F32, 66000, 520, 64, 70});
  cases.push_back({DType::F32, 4096, 2600, 40, 50});
  for (const Case& c : cases) {
    const std::string what = "embedding_backward " + name(c.dt) + " N=" + std::to_string(c.N) +
                             " H=" + std::to_string(c.H) + " V=" + std::to_string(c.V);
    const index_t vocab_begin = 5;
    const Tensor ids_host = random_ids(c.N, 0, c.id_hi), ids_dev = ids_host.to_device();
    const Pair dout = input({c.N, c.H}, c.dt), start = input({c.V, c.H}, DType::F32);
    Tensor host = start.host.clone();
    embedding_backward(ids_host, dout.host, vocab_begin, host);
    Tensor first = start.dev.clone(), second = start.dev.clone();
    embedding_backward(ids_dev, dout.dev, vocab_begin, first);
    embedding_backward(ids_dev, dout.dev, vocab_begin, second);
    const auto a = first.to_doubles();
    EXPECT_TRUE(a == second.to_doubles()) << what << ": two calls differ";
    EXPECT_TRUE(a == host.to_doubles()) << what << ": differs from the host";
    if (c.N == 8192 && c.H != 130) {
      OffsetView dout_off = misaligned_copy(dout.dev);
      Tensor scalar = start.dev.clone();
      embedding_backward(ids_dev, dout_off.view, vocab_begin, scalar);
      EXPECT_TRUE(scalar.to_doubles() == a) << what << ": scalar kernel differs";
      // Gradients in the storage dtype (rounded once per run, at the store).
      const Pair start_dt = input({c.V, c.H}, c.dt);
      Pair table_dt{start_dt.host.clone(), start_dt.dev.clone()};
      embedding_backward(ids_host, dout.host, vocab_begin, table_dt.host);
      embedding_backward(ids_dev, dout.dev, vocab_begin, table_dt.dev);
      expect_close(table_dt, c.dt, what + " into " + name(c.dt));
    }
  }
}

// The last block of a sum_of_squares call adds the block partials and
// resets the ticket counter: back-to-back calls of different sizes and
// dtypes (16-bit packs are squared in fp32 first), aligned and one element
// off, each match the host and repeat bit for bit.
TEST_F(GpuOps, SumOfSquaresBackToBackCallsMatchHostAndRepeat) {
  for (int round = 0; round < 2; ++round)
    for (DType dt : kDtypes)
      for (index_t n : {index_t(1), index_t(7), index_t(4099), index_t(8192 * 3072 + 5)}) {
        const std::string what = "sum_of_squares " + name(dt) + " n=" + std::to_string(n);
        const Pair x = input({n}, dt, -3.0, 3.0);
        const double host = sum_of_squares(x.host), dev = sum_of_squares(x.dev);
        EXPECT_NEAR(dev, host, 1e-6 * host) << what;
        EXPECT_EQ(dev, sum_of_squares(x.dev)) << what << ": not deterministic";
        const OffsetView off = misaligned_copy(x.dev);
        EXPECT_NEAR(sum_of_squares(off.view), host, 1e-6 * host) << what << " misaligned";
      }
  // Many tensors: 48 of 1M elements are 48 x 1024 block partials.
  std::vector<Tensor> host, dev;
  for (int k = 0; k < 48; ++k) {
    const Pair x = input({index_t(1 << 20) + k}, k % 3 == 0 ? DType::F32 : DType::BF16);
    host.push_back(x.host);
    dev.push_back(x.dev);
  }
  const double expected = sum_of_squares(host), got = sum_of_squares(dev);
  EXPECT_NEAR(got, expected, 1e-6 * expected);
  EXPECT_EQ(got, sum_of_squares(dev)) << "many tensors: not deterministic";
}
#endif

}  // namespace
}  // namespace meshtron::ops
