// Host definitions of the fused-epilogue GEMMs (ops.hpp, "GeLU and biases"):
//   gemm_bias_gelu      = gemm_bias, then gelu_forward
//   gemm_dgelu          = gemm, then gelu_backward
//   gemm_bias_residual  = gemm_bias, then add
// bit for bit, in fp32 and fp64, for every transpose and shapes that are not
// multiples of any block size. The MLP and the transformer layer switched to
// these ops, so the host numbers of every model test must not move by one
// ulp; the two-step compositions are themselves tested against naive loops
// in test_ops.cpp. Every output starts as NaN, so an unwritten element fails.
// The argument checks (shapes, dtypes, aliasing) are death tests.
//
// Run: ctest -R ops_fused_epilogues --output-on-failure
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "ops/ops.hpp"
#include "tests/ops/float_types.hpp"

namespace meshtron::ops {
namespace {

struct GemmCase {
  index_t M, N, K;
};
const std::vector<GemmCase> kCases = {{1, 1, 1}, {3, 5, 17}, {17, 33, 1}, {33, 17, 64},
                                      {5, 130, 33}, {64, 40, 96}};

template <class T>
class FusedEpilogues : public ::testing::Test {
 protected:
  DType dtype = std::is_same_v<T, float> ? DType::F32 : DType::F64;
  std::mt19937_64 rng{20260117};

  Tensor random(const Shape& shape, double lo = -1.0, double hi = 1.0) {
    Tensor t = Tensor::empty(shape, dtype);
    std::uniform_real_distribution<double> dist(lo, hi);
    for (index_t i = 0; i < t.numel(); ++i) set_element_from_double(t, i, dist(rng));
    return t;
  }
  Tensor poisoned(const Shape& shape) {
    Tensor t = Tensor::empty(shape, dtype);
    t.fill(std::numeric_limits<double>::quiet_NaN());
    return t;
  }
  /// Random op(A) [M, K] and op(B) [K, N] as stored; values scaled so that
  /// the products sit in the GeLU's curved range (|x| of order 1).
  std::pair<Tensor, Tensor> operands(const GemmCase& g, bool ta, bool tb) {
    const double b = 2.0 / std::sqrt(double(g.K));
    return {random(ta ? Shape{g.K, g.M} : Shape{g.M, g.K}),
            random(tb ? Shape{g.N, g.K} : Shape{g.K, g.N}, -b, b)};
  }
};

TYPED_TEST_SUITE(FusedEpilogues, test_types::FloatTypes, test_types::FloatTypeNames);

std::string describe(const char* op, const GemmCase& g, bool ta, bool tb) {
  return MESH_MSG(op << " M=" << g.M << " N=" << g.N << " K=" << g.K << " ta=" << ta
                     << " tb=" << tb);
}

bool any_nan(const std::vector<double>& v) {
  for (double x : v)
    if (std::isnan(x)) return true;
  return false;
}

TYPED_TEST(FusedEpilogues, GemmBiasGeluEqualsGemmBiasThenGeluBitwise) {
  for (const GemmCase& g : kCases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const auto [A, B] = this->operands(g, ta, tb);
        const Tensor bias = this->random({g.N});
        Tensor pre = this->poisoned({g.M, g.N}), act = this->poisoned({g.M, g.N});
        gemm_bias_gelu(A, ta, B, tb, bias, pre, act);
        Tensor pre_ref = this->poisoned({g.M, g.N}), act_ref = this->poisoned({g.M, g.N});
        gemm_bias(A, ta, B, tb, bias, pre_ref);
        gelu_forward(pre_ref, act_ref);
        const std::string what = describe("gemm_bias_gelu", g, ta, tb);
        EXPECT_FALSE(any_nan(act.to_doubles())) << what;
        EXPECT_EQ(pre.to_doubles(), pre_ref.to_doubles()) << what << " (pre_gelu)";
        EXPECT_EQ(act.to_doubles(), act_ref.to_doubles()) << what << " (activated)";
      }
}

TYPED_TEST(FusedEpilogues, GemmGeluEqualsGemmThenGeluBitwise) {
  for (const GemmCase& g : kCases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const auto [A, B] = this->operands(g, ta, tb);
        Tensor pre = this->poisoned({g.M, g.N}), act = this->poisoned({g.M, g.N});
        gemm_gelu(A, ta, B, tb, pre, act);
        Tensor pre_ref = this->poisoned({g.M, g.N}), act_ref = this->poisoned({g.M, g.N});
        gemm(A, ta, B, tb, pre_ref);
        gelu_forward(pre_ref, act_ref);
        const std::string what = describe("gemm_gelu", g, ta, tb);
        EXPECT_FALSE(any_nan(act.to_doubles())) << what;
        EXPECT_EQ(pre.to_doubles(), pre_ref.to_doubles()) << what << " (pre_gelu)";
        EXPECT_EQ(act.to_doubles(), act_ref.to_doubles()) << what << " (activated)";
      }
}

TYPED_TEST(FusedEpilogues, GemmDgeluEqualsGemmThenGeluBackwardBitwise) {
  for (const GemmCase& g : kCases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const auto [A, B] = this->operands(g, ta, tb);
        const Tensor pre = this->random({g.M, g.N}, -3.0, 3.0);
        Tensor dpre = this->poisoned({g.M, g.N});
        gemm_dgelu(A, ta, B, tb, pre, dpre);
        Tensor dact = this->poisoned({g.M, g.N}), dpre_ref = this->poisoned({g.M, g.N});
        gemm(A, ta, B, tb, dact);
        gelu_backward(dact, pre, dpre_ref);
        const std::string what = describe("gemm_dgelu", g, ta, tb);
        EXPECT_FALSE(any_nan(dpre.to_doubles())) << what;
        EXPECT_EQ(dpre.to_doubles(), dpre_ref.to_doubles()) << what;
      }
}

TYPED_TEST(FusedEpilogues, GemmBiasResidualEqualsGemmBiasThenAddBitwise) {
  for (const GemmCase& g : kCases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const auto [A, B] = this->operands(g, ta, tb);
        const Tensor bias = this->random({g.N}), residual = this->random({g.M, g.N}, -4.0, 4.0);
        const std::vector<double> residual_before = residual.to_doubles();
        Tensor out = this->poisoned({g.M, g.N});
        gemm_bias_residual(A, ta, B, tb, bias, residual, out);
        // The transformer layer's old order: y = linear(x); h = x + y.
        Tensor y = this->poisoned({g.M, g.N}), h = this->poisoned({g.M, g.N});
        gemm_bias(A, ta, B, tb, bias, y);
        add(residual, y, h);
        const std::string what = describe("gemm_bias_residual", g, ta, tb);
        EXPECT_FALSE(any_nan(out.to_doubles())) << what;
        EXPECT_EQ(out.to_doubles(), h.to_doubles()) << what;
        EXPECT_EQ(residual.to_doubles(), residual_before) << what << ": residual was written";
      }
}

TYPED_TEST(FusedEpilogues, EmptyInnerDimensionGivesTheBiasTerms) {
  // K = 0: op(A) op(B) = 0, so pre = bias, act = gelu(bias), dpre = 0,
  // out = bias + residual.
  const GemmCase g{3, 5, 0};
  const Tensor A0 = Tensor::empty({g.M, 0}, this->dtype), B0 = Tensor::empty({0, g.N}, this->dtype);
  const Tensor bias = this->random({g.N}), residual = this->random({g.M, g.N});
  Tensor pre = this->poisoned({g.M, g.N}), act = this->poisoned({g.M, g.N});
  gemm_bias_gelu(A0, false, B0, false, bias, pre, act);
  Tensor bias_rows = Tensor::zeros({g.M, g.N}, this->dtype), gelu_rows = this->poisoned({g.M, g.N});
  bias_add(bias_rows, bias);
  gelu_forward(bias_rows, gelu_rows);
  EXPECT_EQ(pre.to_doubles(), bias_rows.to_doubles());
  EXPECT_EQ(act.to_doubles(), gelu_rows.to_doubles());
  Tensor dpre = this->poisoned({g.M, g.N});
  gemm_dgelu(A0, false, B0, false, residual, dpre);
  EXPECT_EQ(dpre.to_doubles(), std::vector<double>(std::size_t(g.M * g.N), 0.0));
  Tensor out = this->poisoned({g.M, g.N}), want = this->poisoned({g.M, g.N});
  gemm_bias_residual(A0, false, B0, false, bias, residual, out);
  add(residual, bias_rows, want);
  EXPECT_EQ(out.to_doubles(), want.to_doubles());
}

TEST(FusedEpiloguesDeathTest, ArgumentErrorsNameTheOpAndTheTensor) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // MPI's helper threads: re-exec, not fork
  Tensor x = Tensor::zeros({3, 4}), w = Tensor::zeros({4, 5}), bias = Tensor::zeros({5});
  Tensor pre = Tensor::zeros({3, 5}), act = Tensor::zeros({3, 5}), wrong = Tensor::zeros({5, 3});
  EXPECT_DEATH(gemm_bias_gelu(x, false, w, false, bias, wrong, act),
               "gemm_bias_gelu: pre_gelu \\[5, 3\\] fp32 must have the shape and dtype");
  EXPECT_DEATH(gemm_bias_gelu(x, false, w, false, bias, act, act),
               "gemm_bias_gelu: pre_gelu must not share memory");
  EXPECT_DEATH(gemm_bias_gelu(x, false, w, false, Tensor::zeros({4}), pre, act),
               "gemm_bias_gelu: bias \\[4\\] fp32 must hold 5 elements");
  Tensor pre64 = Tensor::zeros({3, 5}, DType::F64);
  EXPECT_DEATH(gemm_dgelu(x, false, w, false, pre64, act),
               "gemm_dgelu: pre_gelu \\[3, 5\\] fp64 must have the shape and dtype");
  EXPECT_DEATH(gemm_bias_residual(x, false, w, false, bias, act, act),
               "gemm_bias_residual: residual must not share memory");
  Tensor act64 = Tensor::zeros({3, 5}, DType::F64);
  EXPECT_DEATH(gemm_bias_residual(x, false, w, false, bias, pre, act64), "gemm_bias_residual: ");
}

}  // namespace
}  // namespace meshtron::ops
