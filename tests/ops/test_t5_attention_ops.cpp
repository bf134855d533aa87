// T5's attention ops (ops.hpp: T5 relative position bias, Attention
// softmax) on the host: the buckets against values derived by hand from
// transformers' _relative_position_bucket, the bias gather/scatter, the
// general softmax (bias, key mask, causal with Sk != Sq) and its gradients
// against naive long double references (fp32 1e-5, fp64 1e-12), and the
// whole chain table -> bias -> softmax against central finite differences
// in fp64.
//
// Run: ctest -R ops_t5_attention --output-on-failure   (from the build folder)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "ops/ops.hpp"
#include "tests/ops/attention_softmax_case.hpp"
#include "tests/ops/float_types.hpp"
#include "tests/ops/op_test_support.hpp"

namespace meshtron::ops {
namespace {

using namespace test_support;

// ------------------------------------------------------------- buckets ---

/// The bucket of each relative position rel = key - query in `want`, read
/// from one query row at position `offset` over keys 0 .. sk-1.
void expect_buckets(bool bidirectional, int num_buckets, int max_distance,
                    const std::map<int, int>& want) {
  const index_t offset = 1000, sk = 1200;  // rel = j - 1000 in [-1000, 199]
  const Tensor b =
      relative_position_buckets(1, sk, bidirectional, num_buckets, max_distance, offset);
  ASSERT_EQ(b.shape(), Shape({1, sk}));
  for (const auto& [rel, bucket] : want)
    EXPECT_EQ(b.data<std::int32_t>()[offset + rel], bucket)
        << "rel " << rel << (bidirectional ? " bidirectional " : " causal ") << num_buckets
        << " buckets, max distance " << max_distance;
}

TEST(RelativePositionBuckets, BidirectionalT5Default) {
  // 32 buckets, max 128, bidirectional: n = 16 per direction, keys after the
  // query (rel > 0) offset by 16; |rel| < 8 exact; else
  // 8 + trunc(log(|rel| / 8) / log(16) * 8) = 8 + trunc(2 log2(|rel| / 8)),
  // at most 15. In fp32 log(2)/log(16)*8 etc. are exactly 2, 4, 6 (the
  // logs of powers of two are exact multiples of fp32 log 2), so 16, 32, 64
  // start a bucket.
  expect_buckets(true, 32, 128,
                 {{0, 0},     {-1, 1},    {1, 17},    {-7, 7},    {7, 23},    {-8, 8},
                  {-11, 8},   {-12, 9},   {-15, 9},   {-16, 10},  {16, 26},   {-22, 10},
                  {-23, 11},  {-32, 12},  {-45, 12},  {-46, 13},  {-64, 14},  {64, 30},
                  {-90, 14},  {-91, 15},  {-127, 15}, {-128, 15}, {128, 31},  {-129, 15},
                  {-1000, 15}, {199, 31}});
}

TEST(RelativePositionBuckets, CausalT5Default) {
  // 32 buckets, max 128, causal: rel = max(query - key, 0) (later keys: 0),
  // < 16 exact; else 16 + trunc(log(rel / 16) / log(8) * 16)
  // = 16 + trunc(16/3 log2(rel / 16)), at most 31.
  expect_buckets(false, 32, 128,
                 {{5, 0},     {199, 0},   {0, 0},     {-1, 1},    {-15, 15},  {-16, 16},
                  {-20, 17},  {-21, 18},  {-23, 18},  {-24, 19},  {-32, 21},  {-64, 26},
                  {-100, 30}, {-127, 31}, {-128, 31}, {-129, 31}, {-1000, 31}});
}

TEST(RelativePositionBuckets, TruncatesTheFloat32Value) {
  // 18 buckets, max 128, bidirectional: n = 9, max_exact = 4, the log bucket
  // 4 + trunc(log(|rel| / 4) / log(32) * 5) = 4 + trunc(log2(|rel| / 4)).
  // At |rel| = 16 fp32 gives exactly 2 (bucket 6, 15 for a later key), where
  // the same formula in double gives 1.9999999999999998 (bucket 5).
  expect_buckets(true, 18, 128, {{-16, 6}, {16, 15}, {-15, 5}, {-8, 5}, {-7, 4}, {-3, 3}});
}

TEST(RelativePositionBuckets, RowsAreQueriesAtTheirOffset) {
  // [sq, sk] = [3, 5]: entry (i, j) is the bucket of j - (i + offset).
  const Tensor ref = relative_position_buckets(1, 1200, true, 32, 128, 1000);
  for (index_t offset : {0, 7}) {
    const Tensor b = relative_position_buckets(3, 5, true, 32, 128, offset);
    ASSERT_EQ(b.shape(), Shape({3, 5}));
    for (index_t i = 0; i < 3; ++i)
      for (index_t j = 0; j < 5; ++j)
        EXPECT_EQ(b.data<std::int32_t>()[i * 5 + j],
                  ref.data<std::int32_t>()[1000 + j - (i + offset)])
            << "(" << i << ", " << j << ") at offset " << offset;
  }
}

// --------------------------------------------------- relative bias table ---

template <class T>
class RelativeBias : public ::testing::Test {
 protected:
  DType dtype = std::is_same_v<T, float> ? DType::F32 : DType::F64;
  std::mt19937_64 rng{3};
};
TYPED_TEST_SUITE(RelativeBias, test_types::FloatTypes, test_types::FloatTypeNames);

TYPED_TEST(RelativeBias, ForwardGathersAndBackwardScatters) {
  const index_t sq = 5, sk = 9, H = 3, nb = 32;
  const Tensor buckets = relative_position_buckets(sq, sk, true, int(nb), 128, 2);
  const Tensor table = random_tensor({nb, H}, this->dtype, this->rng);
  Tensor bias = Tensor::empty({H, sq, sk}, this->dtype);
  relative_bias_forward(table, buckets, bias);
  const std::int32_t* bk = buckets.data<std::int32_t>();
  const Values t = table.to_doubles(), b = bias.to_doubles();
  for (index_t h = 0; h < H; ++h)
    for (index_t e = 0; e < sq * sk; ++e)
      ASSERT_EQ(b[h * sq * sk + e], t[bk[e] * H + h]) << "head " << h << " element " << e;
  // An fp32 bias from this table: the same values rounded once.
  Tensor bias32 = Tensor::empty({H, sq, sk}, DType::F32);
  relative_bias_forward(table, buckets, bias32);
  for (index_t e = 0; e < H * sq * sk; ++e) EXPECT_EQ(bias32.to_doubles()[e], double(float(b[e])));

  const Tensor dbias = random_tensor({H, sq, sk}, this->dtype, this->rng);
  Tensor dtable = random_tensor({nb, H}, this->dtype, this->rng);
  Values want = dtable.to_doubles();  // accumulates onto what is there
  const Values d = dbias.to_doubles();
  for (index_t h = 0; h < H; ++h)
    for (index_t e = 0; e < sq * sk; ++e) want[bk[e] * H + h] += d[h * sq * sk + e];
  relative_bias_backward(dbias, buckets, dtable);
  expect_close(dtable.to_doubles(), want, std::is_same_v<TypeParam, float> ? 1e-6 : 1e-14,
               "relative_bias_backward");
}

TEST(T5OpsDeathTest, ArgumentErrorsNameTheOpAndTheTensor) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // MPI's helper threads: re-exec, not fork
  const Tensor buckets = relative_position_buckets(2, 3, false, 8, 16);
  const Tensor table = Tensor::zeros({8, 4});
  Tensor bias = Tensor::empty({4, 3, 2});
  EXPECT_DEATH(relative_bias_forward(table, buckets, bias),
               "relative_bias_forward: bias \\[4, 3, 2\\] fp32 must be \\[4, 2, 3\\]");
  // Query 7 of key 0 is 7 back: bucket 4 or more, past a table of 4 rows.
  const Tensor far = relative_position_buckets(8, 1, false, 8, 16);
  const Tensor table4 = Tensor::zeros({4, 4});
  Tensor bias81 = Tensor::empty({4, 8, 1});
  EXPECT_DEATH(relative_bias_forward(table4, far, bias81),
               "relative_bias_forward: bucket [0-9]+ at element [0-9]+ is outside the table's 4 rows");
  SoftmaxMasks masks;
  masks.heads = 2;
  masks.key_mask = Tensor::zeros({3, 5}, DType::I32);  // B = 4 holds 2 samples, not 3
  const Tensor scores = Tensor::zeros({4, 2, 5});
  Tensor probs = Tensor::empty({4, 2, 5});
  EXPECT_DEATH(attention_softmax_forward(scores, 1.0, masks, probs),
               "attention_softmax_forward: masks.key_mask \\[3, 5\\] int32 must be \\[2, 5\\]");
}

// --------------------------------------------------- attention softmax ---

using Case = SoftmaxCase;

bool visible(const Case& c, const SoftmaxMasks& masks, index_t m, index_t i, index_t j) {
  if (c.causal && j > i + (c.Sk - c.Sq)) return false;
  return !c.key_mask || masks.key_mask.data<std::int32_t>()[(m / c.heads) * c.Sk + j] != 0;
}

Values naive_attention_softmax(const Case& c, const Values& s, double scale,
                               const SoftmaxMasks& masks) {
  const Values bias = c.bias ? masks.bias.to_doubles() : Values();
  Values p(s.size(), 0.0);
  for (index_t m = 0; m < c.batch * c.heads; ++m)
    for (index_t i = 0; i < c.Sq; ++i) {
      const index_t row = (m * c.Sq + i) * c.Sk;
      const auto logit = [&](index_t j) {
        return LD(scale) * s[row + j] + (c.bias ? LD(bias[((m % c.heads) * c.Sq + i) * c.Sk + j]) : 0);
      };
      LD mx = -INFINITY, z = 0;
      for (index_t j = 0; j < c.Sk; ++j)
        if (visible(c, masks, m, i, j)) mx = std::max(mx, logit(j));
      for (index_t j = 0; j < c.Sk; ++j)
        if (visible(c, masks, m, i, j)) z += std::exp(logit(j) - mx);
      for (index_t j = 0; j < c.Sk; ++j)
        if (visible(c, masks, m, i, j)) p[row + j] = double(std::exp(logit(j) - mx) / z);
    }
  return p;
}

SoftmaxMasks masks_for(const Case& c, DType bias_dtype, std::mt19937_64& rng) {
  SoftmaxMasks masks;
  masks.heads = c.heads;
  masks.causal = c.causal;
  if (c.bias) masks.bias = random_tensor({c.heads, c.Sq, c.Sk}, bias_dtype, rng, -3.0, 3.0);
  if (c.key_mask) masks.key_mask = key_mask_for(c.batch, c.Sk);
  return masks;
}

const std::vector<Case> kCases = {
    {2, 3, 4, 7, false, false, false},  // Sq < Sk, no mask
    {2, 2, 7, 4, false, false, false},  // Sq > Sk
    {1, 2, 3, 8, false, false, true},   // causal after a prefix: shift Sk - Sq = 5
    {1, 2, 6, 6, false, false, true},   // square causal
    {1, 1, 5, 3, false, false, true},   // causal Sq > Sk: rows 0, 1 see no key
    {3, 2, 4, 6, false, true, false},   // key mask; sample 1 masked whole
    {3, 2, 4, 9, true, true, true},     // bias + key mask + causal
    {2, 4, 5, 5, true, false, false},   // bias alone
};

template <class T>
class AttentionSoftmax : public ::testing::Test {
 protected:
  DType dtype = std::is_same_v<T, float> ? DType::F32 : DType::F64;
  double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  std::mt19937_64 rng{5};
};
TYPED_TEST_SUITE(AttentionSoftmax, test_types::FloatTypes, test_types::FloatTypeNames);

TYPED_TEST(AttentionSoftmax, ForwardMatchesReference) {
  for (const Case& c : kCases) {
    const index_t B = c.batch * c.heads;
    const Shape shape{B, c.Sq, c.Sk};
    const SoftmaxMasks masks = masks_for(c, DType::F32, this->rng);
    const Tensor scores = random_tensor(shape, this->dtype, this->rng, -4.0, 4.0);
    Tensor probs = Tensor::empty(shape, this->dtype);
    attention_softmax_forward(scores, 0.5, masks, probs);
    const Values p = probs.to_doubles();
    const Values ref = naive_attention_softmax(c, scores.to_doubles(), 0.5, masks);
    expect_close(p, ref, this->tol, where("attention softmax", shape));
    for (index_t r = 0; r < B * c.Sq; ++r) {
      double row_sum = 0;
      bool any = false;
      for (index_t j = 0; j < c.Sk; ++j) {
        row_sum += p[r * c.Sk + j];
        const bool seen = visible(c, masks, r / c.Sq, r % c.Sq, j);
        any = any || seen;
        if (!seen) EXPECT_EQ(p[r * c.Sk + j], 0.0) << "masked key " << j << " of row " << r;
      }
      EXPECT_NEAR(row_sum, any ? 1.0 : 0.0, 10 * this->tol) << "row " << r;
    }
  }
}

TYPED_TEST(AttentionSoftmax, AllMaskedRowIsZero) {
  // Sample 1 of key_mask_for has no key: every probability of its rows is 0.
  const Case c{2, 2, 3, 4, true, true, false};
  const SoftmaxMasks masks = masks_for(c, DType::F32, this->rng);
  const Tensor scores = random_tensor({4, 3, 4}, this->dtype, this->rng);
  Tensor probs = Tensor::empty({4, 3, 4}, this->dtype);
  attention_softmax_forward(scores, 1.0, masks, probs);
  const Values p = probs.to_doubles();
  for (index_t e = 2 * 12; e < 4 * 12; ++e) EXPECT_EQ(p[e], 0.0) << "element " << e;
  EXPECT_GT(p[0], 0.0);
}

TYPED_TEST(AttentionSoftmax, BackwardAndBiasGradientMatchReference) {
  for (const Case& c : kCases) {
    const index_t B = c.batch * c.heads, n = c.Sq * c.Sk;
    const Shape shape{B, c.Sq, c.Sk};
    const SoftmaxMasks masks = masks_for(c, DType::F32, this->rng);
    const Tensor scores = random_tensor(shape, this->dtype, this->rng, -4.0, 4.0);
    Tensor probs = Tensor::empty(shape, this->dtype);
    attention_softmax_forward(scores, 0.5, masks, probs);
    const Tensor dprobs = random_tensor(shape, this->dtype, this->rng);
    Tensor dlogits = Tensor::empty(shape, this->dtype);
    attention_softmax_backward(dprobs, probs, dlogits);
    const Values p = probs.to_doubles(), dp = dprobs.to_doubles();
    Values want(p.size());
    for (index_t r = 0; r < B * c.Sq; ++r) {
      LD dot = 0;
      for (index_t j = 0; j < c.Sk; ++j) dot += LD(dp[r * c.Sk + j]) * p[r * c.Sk + j];
      for (index_t j = 0; j < c.Sk; ++j)
        want[r * c.Sk + j] = double(p[r * c.Sk + j] * (dp[r * c.Sk + j] - dot));
    }
    expect_close(dlogits.to_doubles(), want, this->tol, where("attention softmax backward", shape));

    Tensor dbias = random_tensor({c.heads, c.Sq, c.Sk}, DType::F32, this->rng);
    Values want_bias = dbias.to_doubles();  // accumulates
    const Values dl = dlogits.to_doubles();
    for (index_t m = 0; m < B; ++m)
      for (index_t e = 0; e < n; ++e) want_bias[(m % c.heads) * n + e] += dl[m * n + e];
    attention_bias_backward(dlogits, c.heads, dbias);
    expect_close(dbias.to_doubles(), want_bias, 1e-6, where("attention bias backward", shape));
  }
}

TEST(AttentionSoftmaxGrad, TableBiasScoresMatchFiniteDifferences) {
  // loss = sum w * softmax(scale * s + bias(table)), bias from buckets, with
  // a key mask and the causal mask after a prefix: dscores = scale * dlogits,
  // dbias = attention_bias_backward(dlogits), dtable = relative_bias_backward(dbias).
  std::mt19937_64 rng(13);
  const Case c{2, 3, 4, 7, true, true, true};
  const index_t B = c.batch * c.heads, nb = 8;
  const double scale = 0.8;
  const Shape shape{B, c.Sq, c.Sk};
  const Tensor buckets = relative_position_buckets(c.Sq, c.Sk, false, int(nb), 16, c.Sk - c.Sq);
  Tensor table = random_tensor({nb, c.heads}, DType::F64, rng, -1.0, 1.0);
  Tensor scores = random_tensor(shape, DType::F64, rng, -2.0, 2.0);
  const Tensor w = random_tensor(shape, DType::F64, rng);
  SoftmaxMasks masks;
  masks.heads = c.heads;
  masks.causal = true;
  masks.key_mask = key_mask_for(c.batch, c.Sk);
  masks.key_mask.data<std::int32_t>()[6] = 0;  // sample 0 loses key 6 too: 0 and 1 both masked
  masks.bias = Tensor::empty({c.heads, c.Sq, c.Sk}, DType::F64);
  Tensor probs = Tensor::empty(shape, DType::F64);
  auto loss = [&] {
    relative_bias_forward(table, buckets, masks.bias);
    attention_softmax_forward(scores, scale, masks, probs);
    return weighted_sum(w, probs);
  };
  loss();
  Tensor dlogits = Tensor::empty(shape, DType::F64);
  attention_softmax_backward(w, probs, dlogits);
  Tensor dbias = Tensor::zeros({c.heads, c.Sq, c.Sk}, DType::F64);
  attention_bias_backward(dlogits, c.heads, dbias);
  Tensor dtable = Tensor::zeros({nb, c.heads}, DType::F64);
  relative_bias_backward(dbias, buckets, dtable);
  Values dscores = dlogits.to_doubles();
  for (double& d : dscores) d *= scale;

  expect_close(dscores, numeric_gradient(scores, loss), 1e-6, "d scores");
  expect_close(dtable.to_doubles(), numeric_gradient(table, loss), 1e-6, "d table");
  Values abs_dtable = dtable.to_doubles();
  double total = 0;
  for (double d : abs_dtable) total += std::abs(d);
  EXPECT_GT(total, 1e-3) << "the table must receive a gradient";
}

}  // namespace
}  // namespace meshtron::ops
