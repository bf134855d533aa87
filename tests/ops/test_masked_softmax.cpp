// The bidirectional softmax with a key-padding mask (ops.hpp:
// scaled_masked_softmax_forward / _backward) against a long double
// reference (fp32 1e-5, fp64 1e-12), padding keys exactly zero, and the
// backward against central finite differences of the forward in fp64.
//
// Run: ctest -R ops_masked_softmax --output-on-failure   (from the build folder)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ops/ops.hpp"
#include "tests/ops/float_types.hpp"
#include "tests/ops/op_test_support.hpp"

namespace meshtron::ops {
namespace {

using namespace test_support;

/// A [batch, S] mask with sample b's last b keys padding (sample 0 has none).
Tensor padding_mask(index_t batch, index_t S) {
  Tensor m = Tensor::empty({batch, S}, DType::I32);
  for (index_t b = 0; b < batch; ++b)
    for (index_t j = 0; j < S; ++j) m.data<std::int32_t>()[b * S + j] = j < S - b ? 1 : 0;
  return m;
}

Values naive_masked_softmax(const Values& s, const Tensor& mask, index_t B, index_t S,
                            double scale) {
  const index_t heads = B / mask.dim(0);
  Values p(s.size(), 0.0);
  for (index_t r = 0; r < B * S; ++r) {
    const std::int32_t* real = mask.data<std::int32_t>() + (r / S / heads) * S;
    LD mx = -INFINITY, z = 0;
    for (index_t j = 0; j < S; ++j)
      if (real[j]) mx = std::max(mx, LD(scale) * s[r * S + j]);
    for (index_t j = 0; j < S; ++j)
      if (real[j]) z += std::exp(LD(scale) * s[r * S + j] - mx);
    for (index_t j = 0; j < S; ++j)
      if (real[j]) p[r * S + j] = double(std::exp(LD(scale) * s[r * S + j] - mx) / z);
  }
  return p;
}

template <class T>
class MaskedSoftmax : public ::testing::Test {
 protected:
  DType dtype = std::is_same_v<T, float> ? DType::F32 : DType::F64;
  double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  std::mt19937_64 rng{7};
};
TYPED_TEST_SUITE(MaskedSoftmax, test_types::FloatTypes, test_types::FloatTypeNames);

TYPED_TEST(MaskedSoftmax, ForwardMatchesReferenceWithPaddingKeysZero) {
  for (index_t S : {1, 5, 17, 64}) {
    const index_t batch = std::min<index_t>(3, S), heads = 2, B = batch * heads;
    const Tensor mask = padding_mask(batch, S);
    Tensor scores = random_tensor({B, S, S}, this->dtype, this->rng, -6.0, 6.0);
    Tensor probs = Tensor::empty({B, S, S}, this->dtype);
    scaled_masked_softmax_forward(scores, mask, 0.25, probs);
    const Values p = probs.to_doubles();
    expect_close(p, naive_masked_softmax(scores.to_doubles(), mask, B, S, 0.25), this->tol,
                 where("masked softmax", {B, S, S}));
    for (index_t r = 0; r < B * S; ++r) {
      const std::int32_t* real = mask.data<std::int32_t>() + (r / S / heads) * S;
      double row_sum = 0;
      for (index_t j = 0; j < S; ++j) {
        row_sum += p[r * S + j];
        if (!real[j]) EXPECT_EQ(p[r * S + j], 0.0) << "padding key " << j << " of row " << r;
      }
      EXPECT_NEAR(row_sum, 1.0, 10 * this->tol) << "row " << r;
    }
  }
}

TYPED_TEST(MaskedSoftmax, SeesKeysAfterTheQuery) {
  // Row 0 (query 0) of an unpadded sample: bidirectional, so key S-1 counts.
  const index_t S = 4;
  Tensor scores = Tensor::zeros({1, S, S}, this->dtype);
  Tensor probs = Tensor::empty({1, S, S}, this->dtype);
  scaled_masked_softmax_forward(scores, padding_mask(1, S), 1.0, probs);
  EXPECT_NEAR(probs.to_doubles()[S - 1], 0.25, this->tol);
}

TEST(MaskedSoftmaxGrad, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(11);
  const index_t batch = 2, heads = 3, B = batch * heads, S = 6;
  const double scale = 0.7;
  const Tensor mask = padding_mask(batch, S);
  Tensor scores = random_tensor({B, S, S}, DType::F64, rng, -2.0, 2.0);
  const Tensor w = random_tensor({B, S, S}, DType::F64, rng);  // loss = sum w * probs
  auto loss = [&] {
    Tensor probs = Tensor::empty({B, S, S}, DType::F64);
    scaled_masked_softmax_forward(scores, mask, scale, probs);
    return weighted_sum(w, probs);
  };
  Tensor probs = Tensor::empty({B, S, S}, DType::F64);
  scaled_masked_softmax_forward(scores, mask, scale, probs);
  Tensor dscores = Tensor::empty({B, S, S}, DType::F64);
  scaled_masked_softmax_backward(w, probs, scale, dscores);
  const Values numeric = numeric_gradient(scores, loss);
  expect_close(dscores.to_doubles(), numeric, 1e-6, "masked softmax backward");
  // Padding keys get no gradient (sample 1's last key).
  for (index_t m = heads; m < B; ++m)
    for (index_t i = 0; i < S; ++i) EXPECT_EQ(dscores.to_doubles()[(m * S + i) * S + S - 1], 0.0);
}

}  // namespace
}  // namespace meshtron::ops
