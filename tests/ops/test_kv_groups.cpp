// ops::expand_kv_groups and reduce_kv_groups (grouped-query attention through
// the multi-head fused kernels): the expansion repeats kv group h / (heads /
// groups) for query head h, as transformers' repeat_kv; the reduction is its
// adjoint (<expand(x), y> = <x, reduce(y)>), so it sums each group's heads.
#include <gtest/gtest.h>

#include <random>

#include "ops/head_layout.hpp"

namespace meshtron::ops {
namespace {

constexpr index_t kTokens = 3, kHeads = 6, kGroups = 2, kDim = 4;

Tensor random_tensor(Shape shape, unsigned seed) {
  Tensor t = Tensor::empty(shape, DType::F64);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal;
  for (index_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = normal(gen);
  return t;
}

TEST(KvGroups, ExpandRepeatsEachGroupForItsQueryHeads) {
  const Tensor qkv = random_tensor({kTokens, (kHeads + 2 * kGroups) * kDim}, 1);
  Tensor out;
  expand_kv_groups(qkv, kHeads, kGroups, out);
  ASSERT_EQ(out.shape(), (Shape{kTokens, 3 * kHeads * kDim}));
  const double* in = qkv.data<double>();
  const double* x = out.data<double>();
  const index_t grouped = (kHeads + 2 * kGroups) * kDim, full = 3 * kHeads * kDim;
  for (index_t t = 0; t < kTokens; ++t)
    for (index_t h = 0; h < kHeads; ++h)
      for (index_t d = 0; d < kDim; ++d) {
        const index_t g = h / (kHeads / kGroups);
        EXPECT_EQ(x[t * full + h * kDim + d], in[t * grouped + h * kDim + d]);
        EXPECT_EQ(x[t * full + (kHeads + h) * kDim + d],
                  in[t * grouped + (kHeads + g) * kDim + d]);
        EXPECT_EQ(x[t * full + (2 * kHeads + h) * kDim + d],
                  in[t * grouped + (kHeads + kGroups + g) * kDim + d]);
      }
}

TEST(KvGroups, ReduceIsTheAdjointOfExpand) {
  const Tensor x = random_tensor({kTokens, (kHeads + 2 * kGroups) * kDim}, 2);
  const Tensor y = random_tensor({kTokens, 3 * kHeads * kDim}, 3);
  Tensor ex, ry;
  expand_kv_groups(x, kHeads, kGroups, ex);
  reduce_kv_groups(y, kHeads, kGroups, ry);
  double lhs = 0, rhs = 0;
  for (index_t i = 0; i < y.numel(); ++i) lhs += ex.data<double>()[i] * y.data<double>()[i];
  for (index_t i = 0; i < x.numel(); ++i) rhs += x.data<double>()[i] * ry.data<double>()[i];
  EXPECT_NEAR(lhs, rhs, 1e-12 * std::abs(lhs));
  // dq passes through unchanged.
  EXPECT_EQ(ry.data<double>()[1], y.data<double>()[1]);
}

}  // namespace
}  // namespace meshtron::ops
