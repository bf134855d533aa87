// Tests of the host op table (src/ops/ops.hpp).
//
// Every op is compared with a naive reference written here as plain loops in
// long double, on random inputs at shapes that are not multiples of any
// block size, for fp32 (tolerance 1e-5) and fp64 (1e-12). Backward ops are
// also compared with central finite differences of their forward in fp64
// (tolerance 1e-6). Tolerances are norm-wise: |got - ref| <= tol * (|ref| +
// max |ref|), so entries near zero are judged on the scale of the tensor.
//
// Run: ctest -R ops_host --output-on-failure   (from the build folder)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/kokkos/dropout.hpp"
#include "ops/ops.hpp"
#include "tests/ops/float_types.hpp"
#include "tests/ops/op_test_support.hpp"

namespace meshtron::ops {
namespace {

using namespace test_support;

// ================================================================ helpers ==

template <class T>
constexpr double kTol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
constexpr double kFiniteDiffTol = 1e-6;

/// Extents that are not multiples of any vector width or block size.
const std::vector<index_t> kRows = {1, 3, 17, 33};
const std::vector<index_t> kCols = {1, 5, 64, 130};

template <class T>
class OpsTyped : public ::testing::Test {
 public:
  static constexpr DType dtype = dtype_v<T>;
  static constexpr double tol = kTol<T>;
  std::mt19937_64 rng{20240601};
};
TYPED_TEST_SUITE(OpsTyped, test_types::FloatTypes, test_types::FloatTypeNames);

// =================================================================== GEMM ==

/// C = alpha op(A) op(B) + beta C with A, B as stored ([rows, cols]).
Values naive_gemm(const Values& A, index_t a_cols, bool ta, const Values& B, index_t b_cols,
                  bool tb, const Values& C, index_t M, index_t N, index_t K, double alpha,
                  double beta) {
  auto a = [&](index_t i, index_t k) { return LD(ta ? A[k * a_cols + i] : A[i * a_cols + k]); };
  auto b = [&](index_t k, index_t j) { return LD(tb ? B[j * b_cols + k] : B[k * b_cols + j]); };
  Values out(std::size_t(M * N));
  for (index_t i = 0; i < M; ++i)
    for (index_t j = 0; j < N; ++j) {
      LD s = 0;
      for (index_t k = 0; k < K; ++k) s += a(i, k) * b(k, j);
      out[i * N + j] = double(LD(alpha) * s + LD(beta) * C[i * N + j]);
    }
  return out;
}

struct GemmCase {
  index_t M, N, K;
};
const std::vector<GemmCase> kGemmCases = {
    {1, 1, 1}, {3, 5, 17}, {17, 33, 1}, {33, 17, 64}, {5, 130, 33}};

TYPED_TEST(OpsTyped, GemmMatchesNaiveLoopsForEveryTransposeAndBeta) {
  for (const GemmCase& g : kGemmCases)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [alpha, beta] : {std::pair{1.0, 0.0}, {0.5, 1.0}, {-2.0, 0.25}}) {
          const Shape a_shape = ta ? Shape{g.K, g.M} : Shape{g.M, g.K};
          const Shape b_shape = tb ? Shape{g.N, g.K} : Shape{g.K, g.N};
          Tensor A = random_tensor(a_shape, this->dtype, this->rng);
          Tensor B = random_tensor(b_shape, this->dtype, this->rng);
          Tensor C = random_tensor({g.M, g.N}, this->dtype, this->rng);
          const Values want = naive_gemm(A.to_doubles(), A.dim(1), ta, B.to_doubles(), B.dim(1), tb,
                                         C.to_doubles(), g.M, g.N, g.K, alpha, beta);
          gemm(A, ta, B, tb, C, alpha, beta);
          expect_close(C.to_doubles(), want, this->tol,
                       MESH_MSG("gemm M=" << g.M << " N=" << g.N << " K=" << g.K << " ta=" << ta
                                          << " tb=" << tb << " beta=" << beta));
        }
}

TYPED_TEST(OpsTyped, GemmBatchedMatchesOneGemmPerBatch) {
  const index_t batch = 3;
  for (const GemmCase& g : kGemmCases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Shape a_shape = ta ? Shape{batch, g.K, g.M} : Shape{batch, g.M, g.K};
        const Shape b_shape = tb ? Shape{batch, g.N, g.K} : Shape{batch, g.K, g.N};
        Tensor A = random_tensor(a_shape, this->dtype, this->rng);
        Tensor B = random_tensor(b_shape, this->dtype, this->rng);
        Tensor C = random_tensor({batch, g.M, g.N}, this->dtype, this->rng);
        Values want;
        for (index_t i = 0; i < batch; ++i) {
          const Values Ci =
              naive_gemm(A.slice_rows(i, i + 1).to_doubles(), A.dim(2), ta,
                         B.slice_rows(i, i + 1).to_doubles(), B.dim(2), tb,
                         C.slice_rows(i, i + 1).to_doubles(), g.M, g.N, g.K, 0.75, 0.5);
          want.insert(want.end(), Ci.begin(), Ci.end());
        }
        gemm_batched(A, ta, B, tb, C, 0.75, 0.5);
        expect_close(C.to_doubles(), want, this->tol,
                     MESH_MSG("gemm_batched M=" << g.M << " N=" << g.N << " K=" << g.K
                                                << " ta=" << ta << " tb=" << tb));
      }
}

TYPED_TEST(OpsTyped, GemmBiasEqualsGemmThenBiasAddBitwise) {
  // The host gemm_bias is defined as gemm then bias_add; the linear layers
  // switched to it, so their host numbers must not move by one ulp. The
  // naive loops check that the pair itself is right.
  for (const GemmCase& g : kGemmCases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Shape a_shape = ta ? Shape{g.K, g.M} : Shape{g.M, g.K};
        const Shape b_shape = tb ? Shape{g.N, g.K} : Shape{g.K, g.N};
        const Tensor A = random_tensor(a_shape, this->dtype, this->rng);
        const Tensor B = random_tensor(b_shape, this->dtype, this->rng);
        const Tensor bias = random_tensor({g.N}, this->dtype, this->rng);
        Tensor fused = Tensor::empty({g.M, g.N}, this->dtype);
        Tensor twostep = Tensor::empty({g.M, g.N}, this->dtype);
        fused.fill(std::numeric_limits<double>::quiet_NaN());
        twostep.fill(std::numeric_limits<double>::quiet_NaN());
        gemm_bias(A, ta, B, tb, bias, fused);
        gemm(A, ta, B, tb, twostep);
        bias_add(twostep, bias);
        const std::string what = MESH_MSG("gemm_bias M=" << g.M << " N=" << g.N << " K=" << g.K
                                                         << " ta=" << ta << " tb=" << tb);
        EXPECT_EQ(fused.to_doubles(), twostep.to_doubles()) << what;
        Values want = naive_gemm(A.to_doubles(), A.dim(1), ta, B.to_doubles(), B.dim(1), tb,
                                 Values(std::size_t(g.M * g.N), 0.0), g.M, g.N, g.K, 1.0, 0.0);
        const Values bv = bias.to_doubles();
        for (index_t i = 0; i < g.M; ++i)
          for (index_t j = 0; j < g.N; ++j) want[i * g.N + j] += bv[j];
        expect_close(fused.to_doubles(), want, this->tol, what + " vs naive");
      }
}

// ============================================================== LayerNorm ==

struct LayerNormRef {
  Values y, mean, rstd;
};

LayerNormRef naive_layernorm(const Values& x, const Values& gamma, const Values& beta, index_t N,
                             index_t H, double eps) {
  LayerNormRef r{Values(x.size()), Values(N), Values(N)};
  for (index_t n = 0; n < N; ++n) {
    LD mean = 0, var = 0;
    for (index_t h = 0; h < H; ++h) mean += x[n * H + h];
    mean /= H;
    for (index_t h = 0; h < H; ++h) var += (x[n * H + h] - mean) * (x[n * H + h] - mean);
    var /= H;
    const LD rstd = 1.0L / std::sqrt(var + eps);
    for (index_t h = 0; h < H; ++h)
      r.y[n * H + h] = double((x[n * H + h] - mean) * rstd * gamma[h] + beta[h]);
    r.mean[n] = double(mean);
    r.rstd[n] = double(rstd);
  }
  return r;
}

struct LayerNormGrads {
  Values dx, dgamma, dbeta;
};

/// dgamma, dbeta start from the given values (the op accumulates).
LayerNormGrads naive_layernorm_backward(const Values& dy, const Values& x, const Values& gamma,
                                        Values dgamma, Values dbeta, index_t N, index_t H,
                                        double eps) {
  const LayerNormRef fwd = naive_layernorm(x, gamma, gamma, N, H, eps);
  LayerNormGrads g{Values(x.size()), std::move(dgamma), std::move(dbeta)};
  for (index_t n = 0; n < N; ++n) {
    const LD mean = fwd.mean[n], rstd = fwd.rstd[n];
    LD sum_g = 0, sum_g_xhat = 0;
    for (index_t h = 0; h < H; ++h) {
      const LD xhat = (x[n * H + h] - mean) * rstd, gh = LD(dy[n * H + h]) * gamma[h];
      sum_g += gh;
      sum_g_xhat += gh * xhat;
    }
    for (index_t h = 0; h < H; ++h) {
      const LD xhat = (x[n * H + h] - mean) * rstd, gh = LD(dy[n * H + h]) * gamma[h];
      g.dx[n * H + h] = double(rstd * (gh - sum_g / H - xhat * sum_g_xhat / H));
    }
  }
  for (index_t h = 0; h < H; ++h) {
    LD sg = g.dgamma[h], sb = g.dbeta[h];
    for (index_t n = 0; n < N; ++n) {
      sg += LD(dy[n * H + h]) * (x[n * H + h] - LD(fwd.mean[n])) * fwd.rstd[n];
      sb += dy[n * H + h];
    }
    g.dgamma[h] = double(sg);
    g.dbeta[h] = double(sb);
  }
  return g;
}

TYPED_TEST(OpsTyped, LayerNormForwardMatchesNaive) {
  const double eps = 1e-5;
  for (index_t N : kRows)
    for (index_t H : kCols) {
      // An offset of 3 checks that the mean is removed before the variance.
      Tensor x = random_tensor({N, H}, this->dtype, this->rng, 2.0, 4.0);
      Tensor gamma = random_tensor({H}, this->dtype, this->rng, 0.5, 1.5);
      Tensor beta = random_tensor({H}, this->dtype, this->rng);
      Tensor y = Tensor::empty({N, H}, this->dtype);
      Tensor mean = Tensor::empty({N}, this->dtype), rstd = Tensor::empty({N}, this->dtype);
      layernorm_forward(x, gamma, beta, eps, y, mean, rstd);
      const LayerNormRef want =
          naive_layernorm(x.to_doubles(), gamma.to_doubles(), beta.to_doubles(), N, H, eps);
      expect_close(y.to_doubles(), want.y, this->tol, where("layernorm y", {N, H}));
      expect_close(mean.to_doubles(), want.mean, this->tol, where("layernorm mean", {N, H}));
      expect_close(rstd.to_doubles(), want.rstd, this->tol, where("layernorm rstd", {N, H}));
    }
}

// y [N, H + kOnesColumnWidth]: each row as the plain call's, bit for bit,
// then 1 and zeros (the ones column a ColumnParallelLinear's bias rides in).
TYPED_TEST(OpsTyped, LayerNormForwardWritesTheOnesColumn) {
  const double eps = 1e-5;
  for (index_t N : kRows)
    for (index_t H : kCols) {
      const Tensor x = random_tensor({N, H}, this->dtype, this->rng, 2.0, 4.0);
      const Tensor gamma = random_tensor({H}, this->dtype, this->rng, 0.5, 1.5);
      const Tensor beta = random_tensor({H}, this->dtype, this->rng);
      Tensor y = Tensor::empty({N, H}, this->dtype), wide = Tensor::empty({N, H + kOnesColumnWidth}, this->dtype);
      wide.fill(std::numeric_limits<double>::quiet_NaN());
      Tensor mean = Tensor::empty({N}, this->dtype), rstd = Tensor::empty({N}, this->dtype);
      Tensor mean2 = mean.clone(), rstd2 = rstd.clone();
      layernorm_forward(x, gamma, beta, eps, y, mean, rstd);
      layernorm_forward(x, gamma, beta, eps, wide, mean2, rstd2);
      const std::vector<double> plain = y.to_doubles(), got = wide.to_doubles();
      const index_t ld = H + kOnesColumnWidth;
      for (index_t r = 0; r < N; ++r) {
        for (index_t c = 0; c < H; ++c) ASSERT_EQ(got[r * ld + c], plain[r * H + c]) << r << ", " << c;
        for (index_t c = H; c < ld; ++c) ASSERT_EQ(got[r * ld + c], c == H ? 1.0 : 0.0) << r << ", " << c;
      }
      EXPECT_EQ(mean2.to_doubles(), mean.to_doubles());
      EXPECT_EQ(rstd2.to_doubles(), rstd.to_doubles());
    }
}

TYPED_TEST(OpsTyped, LayerNormBackwardMatchesNaiveAndAccumulatesParams) {
  const double eps = 1e-5;
  for (index_t N : kRows)
    for (index_t H : kCols) {
      Tensor x = random_tensor({N, H}, this->dtype, this->rng, -2.0, 2.0);
      Tensor gamma = random_tensor({H}, this->dtype, this->rng, 0.5, 1.5);
      Tensor beta = random_tensor({H}, this->dtype, this->rng);
      Tensor dy = random_tensor({N, H}, this->dtype, this->rng);
      Tensor y = Tensor::empty({N, H}, this->dtype);
      Tensor mean = Tensor::empty({N}, this->dtype), rstd = Tensor::empty({N}, this->dtype);
      layernorm_forward(x, gamma, beta, eps, y, mean, rstd);
      Tensor dx = Tensor::empty({N, H}, this->dtype);
      Tensor dgamma = random_tensor({H}, this->dtype, this->rng);
      Tensor dbeta = random_tensor({H}, this->dtype, this->rng);
      const LayerNormGrads want =
          naive_layernorm_backward(dy.to_doubles(), x.to_doubles(), gamma.to_doubles(),
                                   dgamma.to_doubles(), dbeta.to_doubles(), N, H, eps);
      layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
      expect_close(dx.to_doubles(), want.dx, this->tol, where("layernorm dx", {N, H}));
      expect_close(dgamma.to_doubles(), want.dgamma, this->tol, where("layernorm dgamma", {N, H}));
      expect_close(dbeta.to_doubles(), want.dbeta, this->tol, where("layernorm dbeta", {N, H}));
    }
}

// On the host a chain holds nothing: every call's dgamma and dbeta are
// final when it returns, the bits of the same call without a chain.
TYPED_TEST(OpsTyped, LayerNormGradChainOnTheHostHoldsNothing) {
  const index_t N = 17, H = 130;
  Tensor x = random_tensor({N, H}, this->dtype, this->rng, -2.0, 2.0);
  Tensor gamma = random_tensor({H}, this->dtype, this->rng, 0.5, 1.5);
  Tensor dy = random_tensor({N, H}, this->dtype, this->rng);
  Tensor y = Tensor::empty({N, H}, this->dtype);
  Tensor mean = Tensor::empty({N}, this->dtype), rstd = Tensor::empty({N}, this->dtype);
  layernorm_forward(x, gamma, gamma, 1e-5, y, mean, rstd);
  Tensor dx = Tensor::empty({N, H}, this->dtype), dx2 = dx.clone();
  Tensor dgamma = random_tensor({H}, this->dtype, this->rng);
  Tensor dbeta = random_tensor({H}, this->dtype, this->rng);
  Tensor dgamma2 = dgamma.clone(), dbeta2 = dbeta.clone();
  LayerNormGradChain chain;
  for (int call = 0; call < 2; ++call) {
    layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
    layernorm_backward(dy, x, gamma, mean, rstd, dx2, dgamma2, dbeta2, &dy,
                       GradStore::Accumulate, &chain);
    EXPECT_FALSE(chain.holds(dgamma2));
    EXPECT_FALSE(chain.holds(dbeta2));
    EXPECT_EQ(dgamma2.to_doubles(), dgamma.to_doubles()) << "call " << call;
    EXPECT_EQ(dbeta2.to_doubles(), dbeta.to_doubles()) << "call " << call;
  }
  add(dx, dy, dx);
  EXPECT_EQ(dx2.to_doubles(), dx.to_doubles());
}

TEST(OpsFiniteDifferences, LayerNormBackward) {
  std::mt19937_64 rng(7);
  const double eps = 1e-5;
  for (auto [N, H] : {std::pair<index_t, index_t>{1, 1}, {3, 5}, {2, 17}, {1, 64}}) {
    Tensor x = random_tensor({N, H}, DType::F64, rng, -2.0, 2.0);
    Tensor gamma = random_tensor({H}, DType::F64, rng, 0.5, 1.5);
    Tensor beta = random_tensor({H}, DType::F64, rng);
    Tensor w = random_tensor({N, H}, DType::F64, rng);
    Tensor y = Tensor::empty({N, H}, DType::F64);
    Tensor mean = Tensor::empty({N}, DType::F64), rstd = Tensor::empty({N}, DType::F64);
    auto loss = [&] {
      layernorm_forward(x, gamma, beta, eps, y, mean, rstd);
      return weighted_sum(w, y);
    };
    loss();
    Tensor dx = Tensor::empty({N, H}, DType::F64);
    Tensor dgamma = Tensor::zeros({H}, DType::F64), dbeta = Tensor::zeros({H}, DType::F64);
    layernorm_backward(w, x, gamma, mean, rstd, dx, dgamma, dbeta);
    expect_close(dx.to_doubles(), numeric_gradient(x, loss), kFiniteDiffTol,
                 where("layernorm dx vs finite differences", {N, H}));
    expect_close(dgamma.to_doubles(), numeric_gradient(gamma, loss), kFiniteDiffTol,
                 where("layernorm dgamma vs finite differences", {N, H}));
    expect_close(dbeta.to_doubles(), numeric_gradient(beta, loss), kFiniteDiffTol,
                 where("layernorm dbeta vs finite differences", {N, H}));
  }
}

// ================================================================ Softmax ==

Values naive_causal_softmax(const Values& s, index_t B, index_t S, double scale) {
  Values p(s.size(), 0.0);
  for (index_t r = 0; r < B * S; ++r) {
    const index_t i = r % S;
    LD mx = -INFINITY, z = 0;
    for (index_t j = 0; j <= i; ++j) mx = std::max(mx, LD(scale) * s[r * S + j]);
    for (index_t j = 0; j <= i; ++j) z += std::exp(LD(scale) * s[r * S + j] - mx);
    for (index_t j = 0; j <= i; ++j)
      p[r * S + j] = double(std::exp(LD(scale) * s[r * S + j] - mx) / z);
  }
  return p;
}

Values naive_causal_softmax_backward(const Values& dp, const Values& p, index_t B, index_t S,
                                     double scale) {
  Values ds(p.size(), 0.0);
  for (index_t r = 0; r < B * S; ++r) {
    const index_t i = r % S;
    LD dot = 0;
    for (index_t j = 0; j <= i; ++j) dot += LD(dp[r * S + j]) * p[r * S + j];
    for (index_t j = 0; j <= i; ++j)
      ds[r * S + j] = double(LD(scale) * p[r * S + j] * (dp[r * S + j] - dot));
  }
  return ds;
}

/// Every entry above the diagonal (key j > query i) is exactly zero.
void expect_causal_zeros(const Tensor& t, index_t S, const std::string& what) {
  const Values v = t.to_doubles();
  std::size_t nonzero = 0;
  for (index_t r = 0; r < index_t(v.size()) / S; ++r)
    for (index_t j = r % S + 1; j < S; ++j) nonzero += v[r * S + j] != 0.0;
  EXPECT_EQ(nonzero, 0u) << what << ": masked entries must be exactly 0";
}

const std::vector<index_t> kSeqLens = {1, 5, 17, 64};

TYPED_TEST(OpsTyped, CausalSoftmaxForwardMatchesNaiveWithExactZeros) {
  for (index_t B : {1, 3})
    for (index_t S : kSeqLens)
      for (double scale : {1.0, 0.125}) {
        Tensor scores = random_tensor({B, S, S}, this->dtype, this->rng, -6.0, 6.0);
        Tensor probs = Tensor::empty({B, S, S}, this->dtype);
        scaled_causal_softmax_forward(scores, scale, probs);
        expect_close(probs.to_doubles(), naive_causal_softmax(scores.to_doubles(), B, S, scale),
                     this->tol, where("softmax", {B, S, S}));
        expect_causal_zeros(probs, S, where("softmax", {B, S, S}));
        const Values p = probs.to_doubles();
        for (index_t r = 0; r < B * S; ++r) {
          double row_sum = 0;
          for (index_t j = 0; j < S; ++j) row_sum += p[r * S + j];
          EXPECT_NEAR(row_sum, 1.0, 10 * this->tol) << "row " << r << " of " << B << "x" << S;
        }
      }
}

TYPED_TEST(OpsTyped, CausalSoftmaxBackwardMatchesNaiveWithExactZeros) {
  for (index_t B : {1, 3})
    for (index_t S : kSeqLens) {
      const double scale = 0.3;
      Tensor scores = random_tensor({B, S, S}, this->dtype, this->rng, -3.0, 3.0);
      Tensor probs = Tensor::empty({B, S, S}, this->dtype);
      scaled_causal_softmax_forward(scores, scale, probs);
      // Garbage above the diagonal of dprobs must not leak into dscores.
      Tensor dprobs = random_tensor({B, S, S}, this->dtype, this->rng);
      Tensor dscores = Tensor::empty({B, S, S}, this->dtype);
      scaled_causal_softmax_backward(dprobs, probs, scale, dscores);
      expect_close(
          dscores.to_doubles(),
          naive_causal_softmax_backward(dprobs.to_doubles(), probs.to_doubles(), B, S, scale),
          this->tol, where("softmax backward", {B, S, S}));
      expect_causal_zeros(dscores, S, where("softmax backward", {B, S, S}));
    }
}

TEST(Alibi, SlopesAreBuildAlibiTensorsForPowersOfTwoAndBetween) {
  // transformers' build_alibi_tensor: 2^(-8k/n) for n = 4, 8; 6 heads take
  // n = 4's and then 2^(-4k/4), k = 1, 3.
  EXPECT_EQ(alibi_slopes(4), (std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625}));
  EXPECT_EQ(alibi_slopes(8), (std::vector<double>{0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625,
                                                  0.0078125, 0.00390625}));
  EXPECT_EQ(alibi_slopes(6),
            (std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125}));
}

/// transformers' BLOOM in long double: softmax_j(scale s[b,i,j] + slope_h j)
/// over j <= i, h = b mod heads (its bias slope * j, not -slope (i - j)).
Values naive_alibi_softmax(const Values& s, index_t B, index_t S, double scale,
                           const std::vector<double>& slopes) {
  Values p(s.size(), 0.0);
  const index_t heads = index_t(slopes.size());
  for (index_t r = 0; r < B * S; ++r) {
    const index_t i = r % S;
    const LD slope = slopes[std::size_t((r / S) % heads)];
    auto logit = [&](index_t j) { return LD(scale) * s[r * S + j] + slope * LD(j); };
    LD mx = -INFINITY, z = 0;
    for (index_t j = 0; j <= i; ++j) mx = std::max(mx, logit(j));
    for (index_t j = 0; j <= i; ++j) z += std::exp(logit(j) - mx);
    for (index_t j = 0; j <= i; ++j) p[r * S + j] = double(std::exp(logit(j) - mx) / z);
  }
  return p;
}

TYPED_TEST(OpsTyped, AlibiSoftmaxMatchesTransformersBias) {
  for (index_t heads : {4, 6, 8}) {
    const index_t B = 2 * heads, S = 33;
    const std::vector<double> slopes = alibi_slopes(heads);
    Tensor slope_tensor = Tensor::empty({heads}, DType::F32);
    for (index_t h = 0; h < heads; ++h) slope_tensor.data<float>()[h] = float(slopes[std::size_t(h)]);
    Tensor scores = random_tensor({B, S, S}, this->dtype, this->rng, -6.0, 6.0);
    Tensor probs = Tensor::empty({B, S, S}, this->dtype);
    scaled_causal_softmax_forward(scores, 0.25, probs, slope_tensor);
    const Values expected = naive_alibi_softmax(scores.to_doubles(), B, S, 0.25, slopes);
    expect_close(probs.to_doubles(), expected, this->tol, where("alibi softmax", {B, S, S}));
    expect_causal_zeros(probs, S, where("alibi softmax", {B, S, S}));
    // The bias moves the probabilities: without it they differ.
    Tensor plain = Tensor::empty({B, S, S}, this->dtype);
    scaled_causal_softmax_forward(scores, 0.25, plain);
    double moved = 0;
    const Values a = plain.to_doubles(), b = probs.to_doubles();
    for (std::size_t k = 0; k < a.size(); ++k) moved = std::max(moved, std::fabs(a[k] - b[k]));
    EXPECT_GT(moved, 1e-2) << heads << " heads";
  }
}

TEST(OpsFiniteDifferences, CausalSoftmaxBackward) {
  std::mt19937_64 rng(11);
  for (auto [B, S] : {std::pair<index_t, index_t>{1, 1}, {2, 5}, {1, 17}}) {
    const double scale = 0.7;
    Tensor scores = random_tensor({B, S, S}, DType::F64, rng, -2.0, 2.0);
    Tensor w = random_tensor({B, S, S}, DType::F64, rng);
    Tensor probs = Tensor::empty({B, S, S}, DType::F64);
    auto loss = [&] {
      scaled_causal_softmax_forward(scores, scale, probs);
      return weighted_sum(w, probs);
    };
    loss();
    Tensor dscores = Tensor::empty({B, S, S}, DType::F64);
    scaled_causal_softmax_backward(w, probs, scale, dscores);
    expect_close(dscores.to_doubles(), numeric_gradient(scores, loss), kFiniteDiffTol,
                 where("softmax dscores vs finite differences", {B, S, S}));
  }
}

// =================================================================== GeLU ==

// 1 + tanh(u) and 1 - tanh(u)^2 written from tanh's definition,
// (e^u - e^-u) / (e^u + e^-u): no cancellation even in long double at x = -6.
LD one_plus_tanh(LD u) { return 2 * std::exp(u) / (std::exp(u) + std::exp(-u)); }
LD sech_squared(LD u) { return 4 / ((std::exp(u) + std::exp(-u)) * (std::exp(u) + std::exp(-u))); }
const LD kSqrt2OverPi = std::sqrt(2.0L / 3.14159265358979323846264338327950288L);

LD naive_gelu(LD x) { return 0.5L * x * one_plus_tanh(kSqrt2OverPi * (x + 0.044715L * x * x * x)); }

LD naive_gelu_grad(LD x) {
  const LD u = kSqrt2OverPi * (x + 0.044715L * x * x * x);
  return 0.5L * one_plus_tanh(u) +
         0.5L * x * sech_squared(u) * kSqrt2OverPi * (1 + 3 * 0.044715L * x * x);
}

TYPED_TEST(OpsTyped, GeluForwardAndBackwardMatchNaive) {
  for (index_t N : kRows)
    for (index_t H : kCols) {
      Tensor x = random_tensor({N, H}, this->dtype, this->rng, -5.0, 5.0);
      Tensor dy = random_tensor({N, H}, this->dtype, this->rng);
      Tensor y = Tensor::empty({N, H}, this->dtype), dx = Tensor::empty({N, H}, this->dtype);
      gelu_forward(x, y);
      gelu_backward(dy, x, dx);
      const Values xv = x.to_doubles(), dyv = dy.to_doubles();
      Values want_y(xv.size()), want_dx(xv.size());
      for (std::size_t i = 0; i < xv.size(); ++i) {
        want_y[i] = double(naive_gelu(xv[i]));
        want_dx[i] = double(dyv[i] * naive_gelu_grad(xv[i]));
      }
      expect_close(y.to_doubles(), want_y, this->tol, where("gelu", {N, H}));
      expect_close(dx.to_doubles(), want_dx, this->tol, where("gelu backward", {N, H}));
    }
}

TYPED_TEST(OpsTyped, GeluIsAccurateElementwiseForNegativeInputs) {
  // Each value to its own relative tolerance (not the tensor's scale): the
  // textbook 1 + tanh(u) form cancels for x < -3 and fails this in fp32.
  const index_t n = 241;
  Values grid(n);
  for (index_t i = 0; i < n; ++i) grid[i] = -6.0 + 0.05 * double(i);
  Tensor x = tensor_from(grid, {n}, this->dtype), y = Tensor::empty({n}, this->dtype);
  gelu_forward(x, y);
  const Values xv = x.to_doubles(), yv = y.to_doubles();
  for (index_t i = 0; i < n; ++i) {
    const double want = double(naive_gelu(xv[i]));
    EXPECT_NEAR(yv[i], want, 4 * this->tol * std::abs(want)) << "gelu(" << xv[i] << ")";
  }
}

TEST(OpsFiniteDifferences, GeluBackward) {
  std::mt19937_64 rng(13);
  Tensor x = random_tensor({3, 33}, DType::F64, rng, -4.0, 4.0);
  Tensor w = random_tensor({3, 33}, DType::F64, rng);
  Tensor y = Tensor::empty({3, 33}, DType::F64), dx = Tensor::empty({3, 33}, DType::F64);
  auto loss = [&] {
    gelu_forward(x, y);
    return weighted_sum(w, y);
  };
  gelu_backward(w, x, dx);
  expect_close(dx.to_doubles(), numeric_gradient(x, loss), kFiniteDiffTol,
               "gelu dx vs finite differences");
}

// ============================================ Biases and elementwise ops ==

TYPED_TEST(OpsTyped, BiasAddAndBiasBackwardMatchNaive) {
  for (index_t N : kRows)
    for (index_t C : kCols) {
      Tensor y = random_tensor({N, C}, this->dtype, this->rng);
      Tensor bias = random_tensor({C}, this->dtype, this->rng);
      Tensor dbias = random_tensor({C}, this->dtype, this->rng);
      const Values yv = y.to_doubles(), bv = bias.to_doubles();
      Values want_y(yv.size()), want_db = dbias.to_doubles();
      for (index_t n = 0; n < N; ++n)
        for (index_t c = 0; c < C; ++c) want_y[n * C + c] = double(LD(yv[n * C + c]) + bv[c]);
      for (index_t c = 0; c < C; ++c) {
        LD s = want_db[c];
        for (index_t n = 0; n < N; ++n) s += yv[n * C + c];
        want_db[c] = double(s);
      }
      bias_backward(y, dbias);  // uses y as dy before it is modified
      bias_add(y, bias);
      expect_close(y.to_doubles(), want_y, this->tol, where("bias_add", {N, C}));
      expect_close(dbias.to_doubles(), want_db, this->tol, where("bias_backward", {N, C}));
    }
}

TEST(OpsFiniteDifferences, BiasBackward) {
  std::mt19937_64 rng(17);
  Tensor x = random_tensor({5, 17}, DType::F64, rng), bias = random_tensor({17}, DType::F64, rng);
  Tensor w = random_tensor({5, 17}, DType::F64, rng);
  auto loss = [&] {
    Tensor y = x.clone();
    bias_add(y, bias);
    return weighted_sum(w, y);
  };
  Tensor dbias = Tensor::zeros({17}, DType::F64);
  bias_backward(w, dbias);
  expect_close(dbias.to_doubles(), numeric_gradient(bias, loss), kFiniteDiffTol,
               "dbias vs finite differences");
}

TYPED_TEST(OpsTyped, AddAxpyScaleAndSumOfSquaresMatchNaive) {
  for (index_t n : {1, 3, 17, 33 * 130}) {
    Tensor a = random_tensor({n}, this->dtype, this->rng);
    Tensor b = random_tensor({n}, this->dtype, this->rng);
    const Values av = a.to_doubles(), bv = b.to_doubles();
    Values sum(n), axpy_ref(n), scaled(n);
    LD squares = 0;
    for (index_t i = 0; i < n; ++i) {
      sum[i] = double(LD(av[i]) + bv[i]);
      axpy_ref[i] = double(LD(bv[i]) + LD(-0.375) * av[i]);
      scaled[i] = double(LD(av[i]) * 2.5L);
      squares += LD(av[i]) * av[i];
    }
    Tensor out = Tensor::empty({n}, this->dtype);
    add(a, b, out);
    expect_close(out.to_doubles(), sum, this->tol, MESH_MSG("add n=" << n));
    Tensor b_alias = b.clone();
    add(a, b_alias, b_alias);  // out aliases b
    expect_close(b_alias.to_doubles(), sum, this->tol, MESH_MSG("add in place n=" << n));
    Tensor y = b.clone();
    axpy(-0.375, a, y);
    expect_close(y.to_doubles(), axpy_ref, this->tol, MESH_MSG("axpy n=" << n));
    EXPECT_NEAR(sum_of_squares(a), double(squares), 1e-13 * double(squares))
        << "sum_of_squares n=" << n;  // accumulated in double for both dtypes
    scale(a, 2.5);
    expect_close(a.to_doubles(), scaled, this->tol, MESH_MSG("scale n=" << n));
  }
}

// ============================================================== Embedding ==

/// dtable/out starting values are taken from `start` (the ops accumulate).
Values naive_embedding(const Tensor& ids, const Values& table, index_t V, index_t H,
                       index_t vocab_begin) {
  const index_t N = ids.numel();
  Values out(std::size_t(N * H), 0.0);
  for (index_t n = 0; n < N; ++n) {
    const index_t row = ids.data<std::int32_t>()[n] - vocab_begin;
    if (row < 0 || row >= V) continue;
    for (index_t h = 0; h < H; ++h) out[n * H + h] = table[row * H + h];
  }
  return out;
}

Values naive_embedding_backward(const Tensor& ids, const Values& dout, Values dtable, index_t V,
                                index_t H, index_t vocab_begin) {
  std::vector<LD> acc(dtable.begin(), dtable.end());
  for (index_t n = 0; n < ids.numel(); ++n) {
    const index_t row = ids.data<std::int32_t>()[n] - vocab_begin;
    if (row < 0 || row >= V) continue;
    for (index_t h = 0; h < H; ++h) acc[row * H + h] += dout[n * H + h];
  }
  for (std::size_t i = 0; i < acc.size(); ++i) dtable[i] = double(acc[i]);
  return dtable;
}

TYPED_TEST(OpsTyped, VocabShardEmbeddingMatchesNaive) {
  // This shard holds global rows [5, 12); ids span [0, 20), so some ids are
  // below, some above the shard, and (with N = 33) some repeat.
  const index_t V = 7, vocab_begin = 5;
  for (index_t N : kRows)
    for (index_t H : kCols) {
      Tensor ids = random_ids(N, 0, 20, this->rng);
      Tensor table = random_tensor({V, H}, this->dtype, this->rng);
      Tensor out = random_tensor({N, H}, this->dtype, this->rng);  // overwritten
      embedding_forward(ids, table, vocab_begin, out);
      EXPECT_EQ(out.to_doubles(), naive_embedding(ids, table.to_doubles(), V, H, vocab_begin))
          << where("embedding", {N, H});
      Tensor dout = random_tensor({N, H}, this->dtype, this->rng);
      Tensor dtable = random_tensor({V, H}, this->dtype, this->rng);
      const Values want =
          naive_embedding_backward(ids, dout.to_doubles(), dtable.to_doubles(), V, H, vocab_begin);
      embedding_backward(ids, dout, vocab_begin, dtable);
      expect_close(dtable.to_doubles(), want, this->tol, where("embedding backward", {N, H}));
    }
}

TYPED_TEST(OpsTyped, PositionEmbeddingMatchesNaive) {
  const index_t max_positions = 40;
  for (index_t S : {1, 5, 33})
    for (index_t batch : {1, 3})
      for (index_t H : kCols) {
        const index_t N = batch * S;
        Tensor table = random_tensor({max_positions, H}, this->dtype, this->rng);
        Tensor out = random_tensor({N, H}, this->dtype, this->rng);
        const Values tv = table.to_doubles(), ov = out.to_doubles();
        Values want_out(ov.size());
        for (index_t n = 0; n < N; ++n)
          for (index_t h = 0; h < H; ++h)
            want_out[n * H + h] = double(LD(ov[n * H + h]) + tv[(n % S) * H + h]);
        position_embedding_forward(table, S, out);
        expect_close(out.to_doubles(), want_out, this->tol, where("position embedding", {N, H}));

        Tensor dtable = random_tensor({max_positions, H}, this->dtype, this->rng);
        std::vector<LD> acc(dtable.numel());
        const Values dv = dtable.to_doubles();
        std::copy(dv.begin(), dv.end(), acc.begin());
        for (index_t n = 0; n < N; ++n)
          for (index_t h = 0; h < H; ++h) acc[(n % S) * H + h] += ov[n * H + h];
        position_embedding_backward(tensor_from(ov, {N, H}, this->dtype), S, dtable);
        expect_close(dtable.to_doubles(), Values(acc.begin(), acc.end()), this->tol,
                     where("position embedding backward", {N, H}));
      }
}

TEST(OpsFiniteDifferences, EmbeddingBackwards) {
  std::mt19937_64 rng(19);
  const index_t V = 6, H = 5, N = 17, S = 17, vocab_begin = 3;
  Tensor ids = random_ids(N, 0, 12, rng);
  Tensor table = random_tensor({V, H}, DType::F64, rng);
  Tensor positions = random_tensor({S + 2, H}, DType::F64, rng);
  Tensor w = random_tensor({N, H}, DType::F64, rng);
  Tensor out = Tensor::empty({N, H}, DType::F64);
  auto loss = [&] {
    embedding_forward(ids, table, vocab_begin, out);
    position_embedding_forward(positions, S, out);
    return weighted_sum(w, out);
  };
  Tensor dtable = Tensor::zeros({V, H}, DType::F64);
  Tensor dpositions = Tensor::zeros({S + 2, H}, DType::F64);
  embedding_backward(ids, w, vocab_begin, dtable);
  position_embedding_backward(w, S, dpositions);
  expect_close(dtable.to_doubles(), numeric_gradient(table, loss), kFiniteDiffTol,
               "embedding dtable vs finite differences");
  expect_close(dpositions.to_doubles(), numeric_gradient(positions, loss), kFiniteDiffTol,
               "position dtable vs finite differences");
}

// ================================================== Cross-entropy ==

/// Logits [N, V_padded] whose padded columns hold huge values: any pass that
/// failed to skip them would overflow or dominate the max.
struct CrossEntropyProblem {
  index_t N, V_valid, V_padded;
  Tensor logits, targets, dloss;
};

CrossEntropyProblem make_ce_problem(index_t N, index_t V_valid, index_t V_padded, DType dtype,
                                    std::mt19937_64& rng) {
  CrossEntropyProblem p{N,
                        V_valid,
                        V_padded,
                        random_tensor({N, V_padded}, dtype, rng, -4, 4),
                        random_ids(N, 0, std::int32_t(V_valid), rng),
                        random_tensor({N}, dtype, rng, 0.5, 1.5)};
  for (index_t n = 0; n < N; ++n)
    for (index_t v = V_valid; v < V_padded; ++v)
      set_element_from_double(p.logits, n * V_padded + v, 1e4);
  return p;
}

struct CrossEntropyRef {
  Values loss, dlogits;
};

CrossEntropyRef naive_cross_entropy(const CrossEntropyProblem& p) {
  const Values l = p.logits.to_doubles(), dloss = p.dloss.to_doubles();
  CrossEntropyRef r{Values(p.N), Values(std::size_t(p.N * p.V_padded), 0.0)};
  for (index_t n = 0; n < p.N; ++n) {
    const double* row = &l[n * p.V_padded];
    LD mx = -INFINITY, z = 0;
    for (index_t v = 0; v < p.V_valid; ++v) mx = std::max(mx, LD(row[v]));
    for (index_t v = 0; v < p.V_valid; ++v) z += std::exp(LD(row[v]) - mx);
    const index_t t = p.targets.data<std::int32_t>()[n];
    r.loss[n] = double(std::log(z) + mx - row[t]);  // -log softmax[t]
    for (index_t v = 0; v < p.V_valid; ++v)
      r.dlogits[n * p.V_padded + v] =
          double(dloss[n] * (std::exp(LD(row[v]) - mx) / z - (v == t ? 1 : 0)));
  }
  return r;
}

/// Columns [begin, end) of a [N, V] tensor, as a new tensor.
Tensor columns(const Tensor& t, index_t begin, index_t end) {
  const index_t N = t.dim(0), V = t.dim(1);
  const Values v = t.to_doubles();
  Values out;
  for (index_t n = 0; n < N; ++n) out.insert(out.end(), &v[n * V + begin], &v[n * V + end]);
  return tensor_from(out, {N, end - begin}, t.dtype());
}

struct CrossEntropyResult {
  Values loss, dlogits;  // dlogits over the whole padded vocabulary
};

/// Megatron's flow over `shards` equal vocab shards, the all-reduces done by
/// hand: max of the shard maxes, then sums of the partials at that max.
CrossEntropyResult sharded_cross_entropy(const CrossEntropyProblem& p, index_t shards) {
  const DType dt = p.logits.dtype();
  const index_t Vs = p.V_padded / shards;
  std::vector<Tensor> shard_logits;
  Values global_max(p.N, -INFINITY);
  for (index_t s = 0; s < shards; ++s) {
    shard_logits.push_back(columns(p.logits, s * Vs, (s + 1) * Vs));
    Tensor m = Tensor::empty({p.N}, dt);
    cross_entropy_row_max(shard_logits[s], s * Vs, p.V_valid, m);
    for (index_t n = 0; n < p.N; ++n)
      global_max[n] = std::max(global_max[n], element_as_double(m, n));
  }
  const Tensor row_max = tensor_from(global_max, {p.N}, dt);
  Values z(p.N, 0.0), tl(p.N, 0.0);
  for (index_t s = 0; s < shards; ++s) {
    Tensor zs = Tensor::empty({p.N}, dt), tls = Tensor::empty({p.N}, dt);
    cross_entropy_partials(shard_logits[s], p.targets, row_max, s * Vs, p.V_valid, zs, tls);
    for (index_t n = 0; n < p.N; ++n)
      z[n] += element_as_double(zs, n), tl[n] += element_as_double(tls, n);
  }
  const Tensor sum_exp = tensor_from(z, {p.N}, dt);
  Tensor loss = Tensor::empty({p.N}, dt);
  cross_entropy_loss(sum_exp, tensor_from(tl, {p.N}, dt), loss);
  CrossEntropyResult r{loss.to_doubles(), Values(std::size_t(p.N * p.V_padded))};
  for (index_t s = 0; s < shards; ++s) {
    Tensor d = Tensor::empty({p.N, Vs}, dt);
    cross_entropy_backward(shard_logits[s], p.targets, row_max, sum_exp, p.dloss, s * Vs, p.V_valid,
                           d);
    const Values dv = d.to_doubles();
    for (index_t n = 0; n < p.N; ++n)
      std::copy(&dv[n * Vs], &dv[n * Vs] + Vs, &r.dlogits[n * p.V_padded + s * Vs]);
  }
  return r;
}

/// The alternative combine: each shard's partials at its own max, rescaled
/// by hand to the global max: Z = sum_s Z_s exp(m_s - m).
Values rescaled_sharded_loss(const CrossEntropyProblem& p, index_t shards) {
  const DType dt = p.logits.dtype();
  const index_t Vs = p.V_padded / shards;
  std::vector<Values> maxes, sums, target_logits;
  for (index_t s = 0; s < shards; ++s) {
    Tensor l = columns(p.logits, s * Vs, (s + 1) * Vs);
    Tensor m = Tensor::empty({p.N}, dt), z = Tensor::empty({p.N}, dt),
           tl = Tensor::empty({p.N}, dt);
    cross_entropy_row_max(l, s * Vs, p.V_valid, m);
    cross_entropy_partials(l, p.targets, m, s * Vs, p.V_valid, z, tl);
    maxes.push_back(m.to_doubles()), sums.push_back(z.to_doubles()),
        target_logits.push_back(tl.to_doubles());
  }
  Values loss(p.N);
  for (index_t n = 0; n < p.N; ++n) {
    LD m = -INFINITY, z = 0, target = 0;
    for (index_t s = 0; s < shards; ++s) m = std::max(m, LD(maxes[s][n]));
    for (index_t s = 0; s < shards; ++s) {
      if (sums[s][n] > 0) z += sums[s][n] * std::exp(LD(maxes[s][n]) - m);
      const index_t t = p.targets.data<std::int32_t>()[n];
      if (t >= s * Vs && t < (s + 1) * Vs) target = LD(target_logits[s][n]) + maxes[s][n] - m;
    }
    loss[n] = double(std::log(z) - target);
  }
  return loss;
}

struct VocabCase {
  index_t V_valid, V_padded;  // V_padded divisible by 1, 2 and 3
};
// 5 of 12: with 3 shards the last shard is all padding.
const std::vector<VocabCase> kVocabCases = {{5, 12}, {33, 36}, {130, 132}};

TYPED_TEST(OpsTyped, CrossEntropyOneShardMatchesNaiveLogSoftmaxLoss) {
  for (index_t N : kRows)
    for (const VocabCase& vc : kVocabCases) {
      const CrossEntropyProblem p =
          make_ce_problem(N, vc.V_valid, vc.V_padded, this->dtype, this->rng);
      const CrossEntropyRef want = naive_cross_entropy(p);
      const CrossEntropyResult got = sharded_cross_entropy(p, 1);
      const std::string what =
          MESH_MSG("cross-entropy N=" << N << " V=" << vc.V_valid << "/" << vc.V_padded);
      expect_close(got.loss, want.loss, this->tol, what + " loss");
      expect_close(got.dlogits, want.dlogits, this->tol, what + " dlogits");
      for (index_t n = 0; n < N; ++n)
        for (index_t v = vc.V_valid; v < vc.V_padded; ++v)
          EXPECT_EQ(got.dlogits[n * vc.V_padded + v], 0.0) << what << " padded column " << v;
    }
}

// cross_entropy_row_stats, the one-pass statistics of the LM head on one tp
// rank, is cross_entropy_row_max then cross_entropy_partials at that max
// (bit for bit on the host), on every shard, one of padding only included
// (5 of 12 columns valid, 3 shards), and with one shard it gives the loss.
TYPED_TEST(OpsTyped, CrossEntropyRowStatsAreTheRowMaxThenThePartials) {
  const DType dt = this->dtype;
  for (const VocabCase& vc : kVocabCases) {
    const index_t N = 17;
    const CrossEntropyProblem p = make_ce_problem(N, vc.V_valid, vc.V_padded, dt, this->rng);
    for (index_t shards : {1, 2, 3}) {
      const index_t Vs = vc.V_padded / shards;
      for (index_t s = 0; s < shards; ++s) {
        const std::string what = MESH_MSG("row stats V=" << vc.V_valid << "/" << vc.V_padded
                                                         << " shard " << s << " of " << shards);
        const Tensor l = columns(p.logits, s * Vs, (s + 1) * Vs);
        Tensor m = Tensor::empty({N}, dt), z = Tensor::empty({N}, dt), t = Tensor::empty({N}, dt);
        cross_entropy_row_max(l, s * Vs, vc.V_valid, m);
        cross_entropy_partials(l, p.targets, m, s * Vs, vc.V_valid, z, t);
        Tensor m1 = Tensor::empty({N}, dt), z1 = Tensor::empty({N}, dt),
               t1 = Tensor::empty({N}, dt);
        cross_entropy_row_stats(l, p.targets, s * Vs, vc.V_valid, m1, z1, t1);
        EXPECT_EQ(m1.to_doubles(), m.to_doubles()) << what << " row_max";
        EXPECT_EQ(z1.to_doubles(), z.to_doubles()) << what << " sum_exp";
        EXPECT_EQ(t1.to_doubles(), t.to_doubles()) << what << " target_logit";
        if (shards > 1) continue;
        Tensor loss = Tensor::empty({N}, dt);
        cross_entropy_loss(z1, t1, loss);
        expect_close(loss.to_doubles(), naive_cross_entropy(p).loss, this->tol, what + " loss");
      }
    }
  }
}

TYPED_TEST(OpsTyped, CrossEntropyOverVocabShardsEqualsOneShard) {
  for (index_t N : {3, 17})
    for (const VocabCase& vc : kVocabCases) {
      const CrossEntropyProblem p =
          make_ce_problem(N, vc.V_valid, vc.V_padded, this->dtype, this->rng);
      const CrossEntropyRef want = naive_cross_entropy(p);
      for (index_t shards : {2, 3}) {
        const std::string what =
            MESH_MSG("cross-entropy over " << shards << " shards, N=" << N << " V=" << vc.V_valid
                                           << "/" << vc.V_padded);
        const CrossEntropyResult got = sharded_cross_entropy(p, shards);
        expect_close(got.loss, want.loss, this->tol, what + " loss");
        expect_close(got.dlogits, want.dlogits, this->tol, what + " dlogits");
        for (index_t n = 0; n < N; ++n)
          for (index_t v = vc.V_valid; v < vc.V_padded; ++v)
            EXPECT_EQ(got.dlogits[n * vc.V_padded + v], 0.0) << what << " padded column " << v;
        expect_close(rescaled_sharded_loss(p, shards), want.loss, this->tol,
                     what + " loss (rescaled partials)");
      }
    }
}

TEST(OpsFiniteDifferences, CrossEntropyBackward) {
  std::mt19937_64 rng(23);
  CrossEntropyProblem p = make_ce_problem(3, 7, 9, DType::F64, rng);
  Tensor row_max = Tensor::empty({3}, DType::F64), sum_exp = Tensor::empty({3}, DType::F64);
  Tensor target_logit = Tensor::empty({3}, DType::F64), loss = Tensor::empty({3}, DType::F64);
  auto total = [&] {
    cross_entropy_row_max(p.logits, 0, p.V_valid, row_max);
    cross_entropy_partials(p.logits, p.targets, row_max, 0, p.V_valid, sum_exp, target_logit);
    cross_entropy_loss(sum_exp, target_logit, loss);
    return weighted_sum(p.dloss, loss);
  };
  total();
  Tensor dlogits = Tensor::empty({3, 9}, DType::F64);
  cross_entropy_backward(p.logits, p.targets, row_max, sum_exp, p.dloss, 0, p.V_valid, dlogits);
  expect_close(dlogits.to_doubles(), numeric_gradient(p.logits, total), kFiniteDiffTol,
               "dlogits vs finite differences");
}

// ================================================================== AdamW ==

/// torch.optim.AdamW (single tensor, no amsgrad), written from its docs.
struct AdamWReference {
  Values p, m, v;
  void step(const Values& g, const AdamWParams& hp) {
    const double bc1 = 1 - std::pow(hp.beta1, double(hp.step));
    const double bc2 = 1 - std::pow(hp.beta2, double(hp.step));
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - hp.lr * hp.weight_decay;
      m[i] = hp.beta1 * m[i] + (1 - hp.beta1) * g[i];
      v[i] = hp.beta2 * v[i] + (1 - hp.beta2) * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + hp.eps;
      p[i] -= hp.lr / bc1 * m[i] / denom;
    }
  }
};

TYPED_TEST(OpsTyped, AdamWMatchesTorchReferenceOverSeveralSteps) {
  AdamWParams configs[2];
  configs[0].lr = 1e-2, configs[0].weight_decay = 0.1;
  configs[1].lr = 3e-4, configs[1].beta1 = 0.8, configs[1].beta2 = 0.95, configs[1].eps = 1e-6,
  configs[1].weight_decay = 0.01;
  for (AdamWParams hp : configs)
    for (index_t n : {1, 17, 130}) {
      Tensor param = random_tensor({n}, this->dtype, this->rng);
      Tensor m = Tensor::zeros({n}, this->dtype), v = Tensor::zeros({n}, this->dtype);
      AdamWReference ref{param.to_doubles(), Values(n, 0.0), Values(n, 0.0)};
      for (hp.step = 1; hp.step <= 6; ++hp.step) {
        Tensor grad = random_tensor({n}, this->dtype, this->rng, -0.5, 0.5);
        adamw_step(param, grad, m, v, hp);
        ref.step(grad.to_doubles(), hp);
        const std::string what =
            MESH_MSG("adamw lr=" << hp.lr << " n=" << n << " step=" << hp.step);
        expect_close(param.to_doubles(), ref.p, this->tol, what + " param");
        expect_close(m.to_doubles(), ref.m, this->tol, what + " m");
        expect_close(v.to_doubles(), ref.v, this->tol, what + " v");
      }
    }
}

// ================================================================ Dropout ==

using kernels::Philox4x32Block;

void expect_block(const Philox4x32Block& got, const Philox4x32Block& want, const char* what) {
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got.w[i], want.w[i]) << what << " word " << i;
}

TEST(Philox, KnownAnswersFromRandom123) {
  // Random123 kat_vectors, philox4x32 with 10 rounds.
  expect_block(kernels::philox4x32_10({{0, 0, 0, 0}}, 0, 0),
               {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}, "zero counter, zero key");
  expect_block(kernels::philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
                                      0xffffffffu, 0xffffffffu),
               {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}, "all-ones");
  // Digits of pi as counter and key.
  expect_block(kernels::philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                      0xa4093822u, 0x299f31d0u),
               {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}, "pi");
}

TEST(Dropout, KeepDecisionIsPhiloxOfSeedIndexStepStream) {
  // Index i takes half (i & 1) of word ((i >> 1) & 3) of the call for
  // counter {i >> 3 lo, hi, step, stream}, as 16 bits: every half-word
  // position, both halves of the 64-bit group number.
  const std::uint64_t seed = 0x123456789abcdef0ull;
  for (std::uint64_t index : {0ull, 1ull, 2ull, 3ull, 4ull, 5ull, 6ull, 7ull, 8ull, 77ull,
                              (1ull << 32) + 5, (1ull << 35) + 6, 0xfedcba9876543213ull})
    for (double p : {0.1, 0.5, 0.9}) {
      const std::uint64_t q = index >> 3;
      const Philox4x32Block r = kernels::philox4x32_10(
          {{std::uint32_t(q), std::uint32_t(q >> 32), 3u, 21u}}, 0x9abcdef0u, 0x12345678u);
      const std::uint32_t word = r.w[(index >> 1) & 3];
      const std::uint32_t half = index & 1 ? word >> 16 : word & 0xffffu;
      const double u = double(half) / 65536.0;
      EXPECT_EQ(dropout_keep(seed, 3, 21, index, p), u >= p) << "index " << index << " p " << p;
    }
  EXPECT_TRUE(dropout_keep(seed, 3, 21, 42, 0.0)) << "p = 0 keeps everything";
}

TEST(Dropout, TheEightIndicesOfAGroupGetIndependentDecisions) {
  // The 8 half-words of one call are independent: at p = 0.5 the decisions
  // of index 8q + j and 8q + j' (j != j') disagree on about half of the
  // groups; and at p = 0.1 each position keeps about 90 %.
  const std::uint64_t seed = 99;
  for (int j = 1; j < 8; ++j) {
    int differ = 0;
    for (std::uint64_t q = 0; q < 4096; ++q)
      differ += dropout_keep(seed, 1, 2, 8 * q, 0.5) != dropout_keep(seed, 1, 2, 8 * q + j, 0.5);
    EXPECT_NEAR(differ / 4096.0, 0.5, 0.05) << "half-word 0 against half-word " << j;
  }
  for (int j = 0; j < 8; ++j) {
    int kept = 0;
    for (std::uint64_t q = 0; q < 8192; ++q) kept += dropout_keep(seed, 1, 2, 8 * q + j, 0.1);
    EXPECT_NEAR(kept / 8192.0, 0.9, 0.01) << "half-word " << j;
  }
}

DropoutSite whole_site(index_t a, index_t b, index_t c) {
  DropoutSite s;
  s.seed = 1234, s.step = 7, s.stream = 3 * 16 + 1;
  s.a = a, s.b = b, s.c = c, s.b_global = b, s.c_global = c;
  return s;
}

/// Mask of a site as 0/1, from the op applied to ones.
Values mask_of(const DropoutSite& s, double p) {
  Tensor ones = Tensor::empty({s.a * s.b * s.c}, DType::F64);
  ones.fill(1.0);
  Tensor y = Tensor::empty({s.a * s.b * s.c}, DType::F64);
  dropout_forward(ones, p, s, y);
  Values m = y.to_doubles();
  for (double& v : m) v = v != 0.0;
  return m;
}

TYPED_TEST(OpsTyped, DropoutForwardScalesKeptAndZeroesDropped) {
  const double p = 0.3;
  for (index_t c : kCols) {
    DropoutSite s = whole_site(3, 5, c);
    s.a_offset = 2, s.b_offset = 1, s.c_offset = 4, s.b_global = 9, s.c_global = c + 7;
    Tensor x = random_tensor({3, 5, c}, this->dtype, this->rng, 0.5, 1.5);  // never 0
    Tensor y = Tensor::empty({3, 5, c}, this->dtype);
    dropout_forward(x, p, s, y);
    const Values xv = x.to_doubles(), yv = y.to_doubles();
    Values want(xv.size());
    for (index_t a = 0; a < 3; ++a)
      for (index_t b = 0; b < 5; ++b)
        for (index_t cc = 0; cc < c; ++cc) {
          const std::uint64_t global = std::uint64_t(((a + 2) * 9 + (b + 1)) * (c + 7) + (cc + 4));
          const index_t i = (a * 5 + b) * c + cc;
          want[i] = dropout_keep(s.seed, s.step, s.stream, global, p) ? xv[i] / (1 - p) : 0.0;
          if (want[i] == 0.0) {
            EXPECT_EQ(yv[i], 0.0) << "dropped element " << i;
          }
        }
    expect_close(yv, want, this->tol, where("dropout", {3, 5, c}));
  }
}

TEST(Dropout, FractionKeptIsOneMinusPWithinStatisticalBounds) {
  const index_t n = 1 << 20;
  for (double p : {0.1, 0.5, 0.9}) {
    const Values mask = mask_of(whole_site(1, 1, n), p);
    double kept = 0;
    for (double m : mask) kept += m;
    const double sigma = std::sqrt(p * (1 - p) / double(n));
    EXPECT_NEAR(kept / double(n), 1 - p, 6 * sigma) << "p = " << p;
  }
}

TYPED_TEST(OpsTyped, DropoutBackwardUsesTheForwardMask) {
  const double p = 0.4;
  const DropoutSite s = whole_site(4, 3, 33);
  const Values mask = mask_of(s, p);
  Tensor dy = random_tensor({4, 3, 33}, this->dtype, this->rng);
  Tensor dx = Tensor::empty({4, 3, 33}, this->dtype);
  dropout_backward(dy, p, s, dx);
  const Values dyv = dy.to_doubles(), dxv = dx.to_doubles();
  Values want(dyv.size());
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = mask[i] * dyv[i] / (1 - p);
  expect_close(dxv, want, this->tol, "dropout backward");
  for (std::size_t i = 0; i < want.size(); ++i)
    if (mask[i] == 0.0) {
      EXPECT_EQ(dxv[i], 0.0) << "dropped element " << i;
    }
}

TEST(OpsFiniteDifferences, DropoutBackward) {
  std::mt19937_64 rng(29);
  const DropoutSite s = whole_site(2, 3, 17);
  Tensor x = random_tensor({2, 3, 17}, DType::F64, rng),
         w = random_tensor({2, 3, 17}, DType::F64, rng);
  Tensor y = Tensor::empty({2, 3, 17}, DType::F64), dx = Tensor::empty({2, 3, 17}, DType::F64);
  auto loss = [&] {
    dropout_forward(x, 0.25, s, y);
    return weighted_sum(w, y);
  };
  dropout_backward(w, 0.25, s, dx);
  expect_close(dx.to_doubles(), numeric_gradient(x, loss), kFiniteDiffTol,
               "dropout dx vs finite differences");
}

/// Elements [a0, a1) x [b0, b1) x [c0, c1) of a [A, B, C] value array.
Values block(const Values& v, index_t B, index_t C, index_t a0, index_t a1, index_t b0, index_t b1,
             index_t c0, index_t c1) {
  Values out;
  for (index_t a = a0; a < a1; ++a)
    for (index_t b = b0; b < b1; ++b)
      for (index_t c = c0; c < c1; ++c) out.push_back(v[(a * B + b) * C + c]);
  return out;
}

TEST(Dropout, MaskDependsOnlyOnTheGlobalIndex) {
  // One global [A, B, C] tensor, and the same tensor as two halves split
  // along each axis in turn (as sequence, data or tensor parallelism split
  // it): every half must reproduce its part of the global result.
  const index_t A = 4, B = 6, C = 10;
  const double p = 0.5;
  std::mt19937_64 rng(31);
  Tensor x = random_tensor({A, B, C}, DType::F64, rng);
  Tensor y = Tensor::empty({A, B, C}, DType::F64);
  const DropoutSite global = whole_site(A, B, C);
  dropout_forward(x, p, global, y);
  const Values xv = x.to_doubles(), yv = y.to_doubles();
  struct Half {
    const char* axis;
    index_t a0, a1, b0, b1, c0, c1;
  };
  const std::vector<Half> halves = {{"a", 0, 2, 0, B, 0, C}, {"a", 2, 4, 0, B, 0, C},
                                    {"b", 0, A, 0, 3, 0, C}, {"b", 0, A, 3, 6, 0, C},
                                    {"c", 0, A, 0, B, 0, 5}, {"c", 0, A, 0, B, 5, 10}};
  for (const Half& h : halves) {
    DropoutSite s = global;
    s.a = h.a1 - h.a0, s.b = h.b1 - h.b0, s.c = h.c1 - h.c0;
    s.a_offset = h.a0, s.b_offset = h.b0, s.c_offset = h.c0;
    Tensor part = tensor_from(block(xv, B, C, h.a0, h.a1, h.b0, h.b1, h.c0, h.c1), {s.a, s.b, s.c},
                              DType::F64);
    Tensor out = Tensor::empty({s.a, s.b, s.c}, DType::F64);
    dropout_forward(part, p, s, out);
    EXPECT_EQ(out.to_doubles(), block(yv, B, C, h.a0, h.a1, h.b0, h.b1, h.c0, h.c1))
        << "half along " << h.axis << " starting at (" << h.a0 << ", " << h.b0 << ", " << h.c0
        << ")";
  }
}

/// Fraction of positions where two masks differ.
double disagreement(const Values& m1, const Values& m2) {
  double differ = 0;
  for (std::size_t i = 0; i < m1.size(); ++i) differ += m1[i] != m2[i];
  return differ / double(m1.size());
}

TEST(Dropout, SeedStepAndStreamEachChangeTheMask) {
  // Independent masks at p = 0.5 disagree on about half of the positions.
  const DropoutSite base = whole_site(1, 1, 4096);
  const Values mask = mask_of(base, 0.5);
  DropoutSite other = base;
  other.seed = base.seed + 1;
  EXPECT_NEAR(disagreement(mask, mask_of(other, 0.5)), 0.5, 0.05) << "seed";
  other = base, other.seed = base.seed + (1ull << 32);
  EXPECT_NEAR(disagreement(mask, mask_of(other, 0.5)), 0.5, 0.05) << "seed high word";
  other = base, other.step = base.step + 1;
  EXPECT_NEAR(disagreement(mask, mask_of(other, 0.5)), 0.5, 0.05) << "step";
  other = base, other.stream = base.stream + 1;
  EXPECT_NEAR(disagreement(mask, mask_of(other, 0.5)), 0.5, 0.05) << "stream";
  // Indices that differ only in their high word get independent decisions.
  int differ = 0;
  for (std::uint64_t i = 0; i < 4096; ++i)
    differ += dropout_keep(base.seed, base.step, base.stream, i, 0.5) !=
              dropout_keep(base.seed, base.step, base.stream, i + (1ull << 32), 0.5);
  EXPECT_NEAR(differ / 4096.0, 0.5, 0.05) << "index high word";
}

TYPED_TEST(OpsTyped, DropoutWithZeroPCopiesAndInPlaceMatchesOutOfPlace) {
  const DropoutSite s = whole_site(3, 17, 5);
  Tensor x = random_tensor({3, 17, 5}, this->dtype, this->rng);
  Tensor y = random_tensor({3, 17, 5}, this->dtype, this->rng);
  dropout_forward(x, 0.0, s, y);
  EXPECT_EQ(y.to_doubles(), x.to_doubles()) << "p = 0 must copy exactly";
  dropout_backward(x, 0.0, s, y);
  EXPECT_EQ(y.to_doubles(), x.to_doubles()) << "p = 0 backward must copy exactly";
  dropout_forward(x, 0.3, s, y);
  Tensor in_place = x.clone();
  dropout_forward(in_place, 0.3, s, in_place);
  EXPECT_EQ(in_place.to_doubles(), y.to_doubles()) << "y aliasing x";
}

// dropout_add (the residual stream's dropout-add fusion) is dropout_forward
// then add, bit for bit, with out separate or aliasing the residual, and
// p = 0 is the plain add.
TYPED_TEST(OpsTyped, DropoutAddEqualsDropoutThenAdd) {
  const DropoutSite s = whole_site(3, 17, 8);
  const Tensor x = random_tensor({3 * 17, 8}, this->dtype, this->rng);
  const Tensor residual = random_tensor({3 * 17, 8}, this->dtype, this->rng);
  for (double p : {0.0, 0.3}) {
    Tensor dropped = Tensor::empty(x.shape(), x.dtype()), expected = dropped.clone();
    dropout_forward(x, p, s, dropped);
    add(residual, dropped, expected);
    Tensor out = Tensor::empty(x.shape(), x.dtype());
    dropout_add(x, residual, p, s, out);
    EXPECT_EQ(out.to_doubles(), expected.to_doubles()) << "p = " << p;
    Tensor in_place = residual.clone();
    dropout_add(x, in_place, p, s, in_place);
    EXPECT_EQ(in_place.to_doubles(), expected.to_doubles()) << "out aliasing residual, p = " << p;
    if (p > 0) EXPECT_NE(out.to_doubles(), dropped.to_doubles());  // the residual was added
  }
}

// ========================================================= argument checks ==

TEST(OpsDeathTest, ShapeAndDtypeErrorsNameTheOpAndShapes) {
  // MPI runs helper threads, so the child must re-execute the binary rather
  // than fork() the threaded parent (which hangs in MPI_Abort).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor x = Tensor::zeros({3, 4}), gamma = Tensor::zeros({5}), beta = Tensor::zeros({4});
  Tensor y = Tensor::zeros({3, 4}), mean = Tensor::zeros({3}), rstd = Tensor::zeros({3});
  EXPECT_DEATH(layernorm_forward(x, gamma, beta, 1e-5, y, mean, rstd),
               "layernorm_forward: gamma \\[5\\] fp32 and beta \\[4\\] fp32 must hold 4");
  Tensor C = Tensor::zeros({3, 3});
  EXPECT_DEATH(gemm(x, false, x, false, C),
               "gemm: op\\(A\\) is \\[3, 4\\] and op\\(B\\) is \\[3, 4\\]");
  Tensor w = Tensor::zeros({4, 5}), out = Tensor::zeros({3, 5});
  EXPECT_DEATH(gemm_bias(x, false, w, false, beta, out),
               "gemm_bias: bias \\[4\\] fp32 must hold 5 elements");
  Tensor x64 = Tensor::zeros({3, 4}, DType::F64);
  EXPECT_DEATH(add(x, x64, y), "add: dtypes differ");
  Tensor x_cuda = Tensor::view(x.raw(), {3, 4}, DType::F32, MemorySpace::Cuda);
  EXPECT_DEATH(gelu_forward(x_cuda, y), "gelu_forward: x \\[3, 4\\] fp32 is in CUDA memory");
  EXPECT_DEATH(dropout_forward(x, 1.0, whole_site(3, 4, 1), y), "p must be in \\[0, 1\\)");
  EXPECT_DEATH(dropout_add(x, mean, 0.1, whole_site(3, 4, 1), y),
               "dropout_add: x \\[3, 4\\] fp32 and residual \\[3\\] fp32 must have the same");
}

}  // namespace
}  // namespace meshtron::ops
