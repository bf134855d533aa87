// The vectorised row loops of the cross-entropy (kernels/kokkos/vector_math)
// against std::exp in double: accuracy, special values, and the blocked sum.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/kokkos/vector_math.hpp"

namespace mk = meshtron::kernels;

namespace {

/// Distance in units of the last place of the float nearest to `exact`.
double ulps(float got, double exact) {
  const float nearest = float(exact);
  const double ulp = std::nextafter(nearest, HUGE_VALF) - nearest;
  return std::abs(double(got) - exact) / ulp;
}

}  // namespace

TEST(VectorMath, ExpWithinTwoUlpsOverTheNormalRange) {
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f)
    worst = std::max(worst, ulps(mk::vector_exp(x), std::exp(double(x))));
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(mk::vector_exp(0.0f), 1.0f);
}

TEST(VectorMath, ExpSpecialValues) {
  EXPECT_EQ(mk::vector_exp(-HUGE_VALF), 0.0f);
  EXPECT_EQ(mk::vector_exp(-100.0f), 0.0f);
  EXPECT_EQ(mk::vector_exp(HUGE_VALF), HUGE_VALF);
  EXPECT_EQ(mk::vector_exp(89.0f), HUGE_VALF);
  EXPECT_TRUE(std::isnan(mk::vector_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VectorMath, RowLoopsMatchDoubleReference) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (std::int64_t n : {1, 63, 64, 65, 1000, 50257}) {
    std::vector<float> row(n);
    for (auto& x : row) x = normal(gen);
    double max_ref = -HUGE_VAL;
    for (float x : row) max_ref = std::max(max_ref, double(x));
    const float m = mk::row_maximum(row.data(), n);
    EXPECT_EQ(double(m), max_ref) << n;

    double sum_ref = 0;
    for (float x : row) sum_ref += std::exp(double(x - m));  // the kernel subtracts in float
    EXPECT_NEAR(mk::row_sum_exp(row.data(), n, m), sum_ref, 2e-6 * sum_ref) << n;

    std::vector<float> out(n);
    mk::scaled_exp_row(row.data(), n, m, 0.5f, out.data());
    for (std::int64_t v = 0; v < n; ++v)
      ASSERT_LE(ulps(out[v], 0.5 * std::exp(double(row[v] - m))), 2.0) << n << " " << v;
  }
}

TEST(VectorMath, NanLogitSurfacesInTheSum) {
  std::vector<float> row(100, 1.0f);
  row[70] = std::numeric_limits<float>::quiet_NaN();
  const float m = mk::row_maximum(row.data(), 100);
  EXPECT_EQ(m, 1.0f);
  EXPECT_TRUE(std::isnan(mk::row_sum_exp(row.data(), 100, m)));
}
