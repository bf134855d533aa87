// BERT samples on a synthetic sentence dataset: structure of every sample,
// masking statistics, whole-word masking, the samples mapping, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/expect_user_error.hpp"
#include "data/bert_samples.hpp"
#include "masked_samples_test_util.hpp"

namespace meshtron::data {
namespace {

using testing::ScratchDir;

class BertSamplesTest : public ::testing::Test {
 protected:
  void SetUp() override { data_ = testing::write_sentence_dataset(dir_ / "sentences"); }
  BertSamples build(std::uint32_t seed = 1234, std::int64_t num_samples = 2000) const {
    BertSamplesConfig config;
    config.seq_length = 64;
    config.seed = seed;
    return BertSamples(data_, 0, data_->num_documents(), num_samples, config,
                       testing::test_special_tokens());
  }
  ScratchDir dir_{"bert_samples"};
  std::shared_ptr<const IndexedDataset> data_;
};

/// The sample's text before masking: labels where masked, tokens elsewhere.
std::vector<std::int32_t> unmasked(const BertSample& s) {
  std::vector<std::int32_t> out(s.tokens);
  for (std::size_t k = 0; k < out.size(); ++k)
    if (s.loss_mask[k]) out[k] = s.labels[k];
  return out;
}

std::int64_t real_length(const BertSample& s) {
  return std::count(s.padding_mask.begin(), s.padding_mask.end(), 1);
}

bool contains(const std::vector<std::int32_t>& text, const std::vector<std::int32_t>& piece) {
  return std::search(text.begin(), text.end(), piece.begin(), piece.end()) != text.end();
}

TEST_F(BertSamplesTest, EverySampleIsClsASepBSepWithTypesAndPadding) {
  const BertSamples samples = build();
  const auto special = testing::test_special_tokens();
  ASSERT_GE(samples.size(), 2000);
  for (std::int64_t i = 0; i < samples.size(); ++i) {
    SCOPED_TRACE(i);
    const BertSample s = samples.sample(i);
    const SentenceRun& run = samples.runs()[std::size_t(i)];
    ASSERT_EQ(s.tokens.size(), 64u);
    ASSERT_EQ(s.token_types.size(), 64u);
    ASSERT_EQ(s.labels.size(), 64u);
    ASSERT_EQ(s.loss_mask.size(), 64u);
    const std::int64_t length = real_length(s);
    // Padding mask: leading ones; padding holds pad ids, type 0, no label.
    ASSERT_TRUE(std::all_of(s.padding_mask.begin(), s.padding_mask.begin() + length,
                            [](int v) { return v == 1; }));
    for (std::int64_t k = length; k < 64; ++k) {
      EXPECT_EQ(s.tokens[std::size_t(k)], special.pad);
      EXPECT_EQ(s.token_types[std::size_t(k)], 0);
      EXPECT_EQ(s.labels[std::size_t(k)], kIgnoreLabel);
    }
    const auto text = unmasked(s);
    ASSERT_EQ(text[0], special.cls);
    ASSERT_EQ(text[std::size_t(length - 1)], special.sep);
    const auto first_sep =
        std::size_t(std::find(text.begin(), text.end(), special.sep) - text.begin());
    ASSERT_LT(first_sep, std::size_t(length - 1)) << "no segment B";
    EXPECT_EQ(std::count(text.begin(), text.begin() + length, special.sep), 2);
    EXPECT_LE(length - 3, run.target_length);
    for (std::size_t k = 0; k < std::size_t(length); ++k)
      EXPECT_EQ(s.token_types[k], k <= first_sep ? 0 : 1) << k;
    // Labels: -100 exactly where nothing is predicted.
    for (std::size_t k = 0; k < 64; ++k)
      EXPECT_EQ(s.labels[k] != kIgnoreLabel, s.loss_mask[k] == 1);
    // A and B are pieces of the run's text in order (B before A when swapped),
    // the whole text when nothing was truncated.
    const std::vector<std::int32_t> a(text.begin() + 1, text.begin() + std::ptrdiff_t(first_sep));
    const std::vector<std::int32_t> b(text.begin() + std::ptrdiff_t(first_sep) + 1,
                                      text.begin() + length - 1);
    const auto source = testing::run_text(*data_, run.first, run.end);
    std::vector<std::int32_t> in_order = s.is_random ? b : a;
    const auto& second = s.is_random ? a : b;
    if (!s.truncated) {
      in_order.insert(in_order.end(), second.begin(), second.end());
      EXPECT_EQ(in_order, source);
    } else {
      EXPECT_TRUE(contains(source, a) && contains(source, b));
    }
  }
}

TEST_F(BertSamplesTest, MaskingRatesFollowBert) {
  const BertSamples samples = build();
  const auto special = testing::test_special_tokens();
  std::int64_t text_tokens = 0, masked = 0, as_mask = 0, kept = 0, swapped = 0;
  for (std::int64_t i = 0; i < samples.size(); ++i) {
    const BertSample s = samples.sample(i);
    const std::int64_t length = real_length(s);
    const std::int64_t here = std::count(s.loss_mask.begin(), s.loss_mask.end(), 1);
    // Megatron's budget: min(0.15 target, max(1, round(0.15 length))).
    const double budget = std::min(0.15 * samples.runs()[std::size_t(i)].target_length,
                                   std::max(1.0, std::nearbyint(0.15 * double(length))));
    EXPECT_LE(double(here), budget) << i;
    text_tokens += length - 3;
    masked += here;
    swapped += s.is_random;
    for (std::size_t k = 0; k < 64; ++k) {
      if (!s.loss_mask[k]) continue;
      EXPECT_NE(s.labels[k], special.cls);
      EXPECT_NE(s.labels[k], special.sep);
      as_mask += s.tokens[k] == special.mask;
      kept += s.tokens[k] == s.labels[k];
    }
  }
  // About 16k masked tokens: the split bounds below are 9-10 standard
  // deviations wide. The overall rate sits near 15 %: the budget counts
  // [CLS]/[SEP] (above 15 % of the text) but whole words that would
  // overshoot it are skipped (below).
  const double rate = double(masked) / double(text_tokens);
  EXPECT_NEAR(rate, 0.15, 0.015) << masked << " of " << text_tokens;
  EXPECT_NEAR(double(as_mask) / double(masked), 0.80, 0.03);
  EXPECT_NEAR(double(kept) / double(masked), 0.10, 0.025);
  EXPECT_NEAR(double(masked - as_mask - kept) / double(masked), 0.10, 0.025);
  EXPECT_NEAR(double(swapped) / double(samples.size()), 0.5, 0.05);
}

TEST_F(BertSamplesTest, WholeWordsAreMaskedTogether) {
  const BertSamples samples = build();
  const auto special = testing::test_special_tokens();
  std::int64_t continuations_masked = 0;
  for (std::int64_t i = 0; i < 500; ++i) {
    const BertSample s = samples.sample(i);
    const auto text = unmasked(s);
    std::int64_t previous = -1;  // last position that is neither [CLS] nor [SEP]
    for (std::int64_t k = 0; k < real_length(s); ++k) {
      const std::int32_t t = text[std::size_t(k)];
      if (t == special.cls || t == special.sep) continue;
      if (t >= testing::kFirstContinuation && previous >= 0) {
        EXPECT_EQ(s.loss_mask[std::size_t(k)], s.loss_mask[std::size_t(previous)]) << i << " " << k;
        continuations_masked += s.loss_mask[std::size_t(k)];
      }
      previous = k;
    }
  }
  EXPECT_GT(continuations_masked, 100);
}

TEST_F(BertSamplesTest, SameSeedSameSamplesOtherSeedOthers) {
  const BertSamples a = build(77), b = build(77), c = build(78);
  ASSERT_EQ(a.runs(), b.runs());
  EXPECT_NE(a.runs(), c.runs());
  int differing = 0;
  for (std::int64_t i = 0; i < 100; ++i) {
    const BertSample x = a.sample(i), y = b.sample(i), z = c.sample(i);
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.labels, y.labels);
    EXPECT_EQ(x.token_types, y.token_types);
    EXPECT_EQ(x.is_random, y.is_random);
    differing += x.tokens != z.tokens;
  }
  EXPECT_GT(differing, 90);
  // A sample does not depend on what was built before it.
  EXPECT_EQ(a.sample(5).labels, build(77).sample(5).labels);
}

TEST_F(BertSamplesTest, RunsCoverWholeDocumentsAndRespectTargets) {
  const BertSamples one_epoch = build(1234, 0);
  std::vector<SentenceRun> runs = one_epoch.runs();
  std::sort(runs.begin(), runs.end(),
            [](const SentenceRun& x, const SentenceRun& y) { return x.first < y.first; });
  std::int64_t short_targets = 0;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    EXPECT_GE(runs[r].end - runs[r].first, 2);
    EXPECT_LE(runs[r].target_length, 61);
    EXPECT_GE(runs[r].target_length, 2);
    short_targets += runs[r].target_length < 61;
    if (r + 1 < runs.size() && runs[r + 1].first != runs[r].end) {
      // A gap only between documents: the run ends its document.
      bool ends_document = false;
      for (std::int64_t d = 0; d < data_->num_documents(); ++d)
        ends_document |= data_->document_sequences(d).second == runs[r].end;
      EXPECT_TRUE(ends_document) << runs[r].end;
    }
  }
  // short_seq_prob 0.1
  EXPECT_NEAR(double(short_targets) / double(runs.size()), 0.1, 0.06);
  EXPECT_GE(build(1234, 3 * std::int64_t(runs.size())).size(), 3 * std::int64_t(runs.size()));
}

TEST_F(BertSamplesTest, BadParametersAreOneLineErrors) {
  const auto special_tokens = testing::test_special_tokens();
  BertSamplesConfig config;
  config.seq_length = 4;
  testing_util::expect_user_error(
      [&] { BertSamples(data_, 0, data_->num_documents(), 10, config, special_tokens); },
      {"seq_length=4"});
  config.seq_length = 64;
  auto special = testing::test_special_tokens();
  special.mask = -1;
  testing_util::expect_user_error(
      [&] { BertSamples(data_, 0, data_->num_documents(), 10, config, special); }, {"[MASK]"});
  testing_util::expect_user_error(
      [&] { BertSamples(data_, 0, data_->num_documents() + 1, 10, config, special_tokens); },
      {"outside"});
  testing_util::expect_user_error(
      [&] { make_bert_sample({{10, 11, 12}}, 61, 0, config, special_tokens); },
      {"1 sentence(s)"});
}

}  // namespace
}  // namespace meshtron::data
