// BERT's fill-mask probabilities (generate::top_k_tokens over the masked-LM
// head's vocab-parallel logits, as app/fill_mask.cpp takes them): on one
// rank and on tp 2 (each rank's best k merged), the k tokens of every row
// and their probabilities equal the k largest of a softmax computed here
// over the full logits of the one-rank model's own forward, to 1e-6 (fp64).
//
// Run: ctest -R generate_fill_mask_np2 --output-on-failure   (from the build folder)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/mpi_test_util.hpp"
#include "common/tp_pair.hpp"
#include "generate/sampler.hpp"
#include "model/embedding.hpp"
#include "tests/model/bert_fixture.hpp"

namespace meshtron::bert_test {
namespace {

constexpr int kTop = 5;

/// The k most probable ids of each row of the full logits [rows, V_pad]
/// (the first kVocab columns), with softmax probabilities computed here.
std::vector<std::vector<std::pair<std::int32_t, double>>> explicit_top_k(const Tensor& logits) {
  const index_t rows = logits.dim(0), cols = logits.dim(1);
  std::vector<std::vector<std::pair<std::int32_t, double>>> out;
  for (index_t r = 0; r < rows; ++r) {
    const double* x = logits.data<double>() + r * cols;
    const double max = *std::max_element(x, x + kVocab);
    double sum = 0;
    for (int v = 0; v < kVocab; ++v) sum += std::exp(x[v] - max);
    std::vector<std::int32_t> ids(kVocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return x[a] > x[b]; });
    std::vector<std::pair<std::int32_t, double>> row;
    for (int k = 0; k < kTop; ++k) row.push_back({ids[std::size_t(k)], std::exp(x[ids[std::size_t(k)]] - max) / sum});
    out.push_back(row);
  }
  return out;
}

void expect_matches(const std::vector<std::vector<generate::TokenChoice>>& got,
                    const std::vector<std::vector<std::pair<std::int32_t, double>>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), std::size_t(kTop)) << "row " << r;
    for (int k = 0; k < kTop; ++k) {
      EXPECT_EQ(got[r][std::size_t(k)].id, want[r][std::size_t(k)].first) << "row " << r << " rank " << k;
      EXPECT_NEAR(std::exp(got[r][std::size_t(k)].logprob), want[r][std::size_t(k)].second, 1e-6)
          << "row " << r << " rank " << k;
    }
  }
}

TEST(FillMask, TopKProbabilitiesAreTheSoftmaxOfTheFullLogits) {
  if (testing_util::world_size() % 2) GTEST_SKIP() << "needs an even world";
  testing_util::TpPair pair;
  LayerContext ref_ctx = context(pair.one), ctx = context(pair.two);
  const ModelSpec ref_spec = tiny_spec(1), spec = tiny_spec(2);
  BertModel ref(ref_spec, ref_ctx, DType::F64, 3), model(spec, ctx, DType::F64, 3);
  BertModel::Cache ref_cache, cache;
  ref.forward(tiny_batch(), ref_ctx, ref_cache);
  model.forward(tiny_batch(), ctx, cache);
  const Tensor& full = BertModel::prediction_logits(ref_cache);
  ASSERT_EQ(full.dim(1), ref_spec.padded_vocab_size);  // every column on the one rank
  const auto want = explicit_top_k(full);
  // A token past the vocabulary (padding rows of the word table) is never listed.
  expect_matches(generate::top_k_tokens(full, 0, kVocab, kTop, pair.one.comm), want);
  const Tensor& shard = BertModel::prediction_logits(cache);
  ASSERT_EQ(shard.dim(1), spec.padded_vocab_size / 2);
  expect_matches(generate::top_k_tokens(shard, vocab_begin(spec, pair.two), kVocab, kTop,
                                        pair.two.comm),
                 want);
}

}  // namespace
}  // namespace meshtron::bert_test
