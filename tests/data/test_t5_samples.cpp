// T5 span-corruption samples on a synthetic sentence dataset: sentinels in
// order, the text rebuilt from encoder and decoder, shifted labels, noise
// density and span lengths, padding, determinism, errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/expect_user_error.hpp"
#include "data/t5_samples.hpp"
#include "masked_samples_test_util.hpp"

namespace meshtron::data {
namespace {

using testing::ScratchDir;

bool is_sentinel(std::int32_t t) { return t >= testing::kFirstSentinel; }

std::int64_t count_ones(const std::vector<std::int32_t>& mask) {
  return std::count(mask.begin(), mask.end(), 1);
}

class T5SamplesTest : public ::testing::Test {
 protected:
  void SetUp() override { data_ = testing::write_sentence_dataset(dir_ / "sentences"); }
  T5Samples build(std::uint32_t seed = 1234, bool whole_words = true) const {
    T5SamplesConfig config;
    config.encoder_seq_length = 96;
    config.decoder_seq_length = 40;
    config.seed = seed;
    auto special = testing::test_special_tokens();
    if (!whole_words) special.word_continuation.clear();
    return T5Samples(data_, 0, data_->num_documents(), 2000, config, special);
  }
  /// The run's text cut to its target, as the encoder saw it before noise.
  std::vector<std::int32_t> source(const T5Samples& samples, std::int64_t i) const {
    const SentenceRun& run = samples.runs()[std::size_t(i)];
    auto text = testing::run_text(*data_, run.first, run.end);
    text.resize(std::min(text.size(), std::size_t(run.target_length)));
    return text;
  }
  ScratchDir dir_{"t5_samples"};
  std::shared_ptr<const IndexedDataset> data_;
};

TEST_F(T5SamplesTest, SpansAndSentinelsRebuildTheText) {
  const T5Samples samples = build();
  const auto special = testing::test_special_tokens();
  ASSERT_GE(samples.size(), 2000);
  for (std::int64_t i = 0; i < samples.size(); ++i) {
    SCOPED_TRACE(i);
    const T5Sample s = samples.sample(i);
    ASSERT_EQ(s.enc_tokens.size(), 96u);
    ASSERT_EQ(s.enc_mask.size(), 96u);
    ASSERT_EQ(s.dec_in.size(), 40u);
    ASSERT_EQ(s.labels.size(), 40u);
    ASSERT_EQ(s.loss_mask.size(), 40u);
    ASSERT_EQ(s.dec_mask.size(), 40u);
    const std::int64_t enc_length = count_ones(s.enc_mask), dec_length = count_ones(s.dec_mask);
    ASSERT_TRUE(std::all_of(s.enc_mask.begin(), s.enc_mask.begin() + enc_length,
                            [](int v) { return v == 1; }));
    ASSERT_TRUE(std::all_of(s.dec_mask.begin(), s.dec_mask.begin() + dec_length,
                            [](int v) { return v == 1; }));
    EXPECT_EQ(s.loss_mask, s.dec_mask);
    ASSERT_EQ(s.dec_in[0], special.bos);
    // Labels: the decoder input shifted left, then [eos], then -100.
    for (std::int64_t k = 0; k + 1 < dec_length; ++k)
      EXPECT_EQ(s.labels[std::size_t(k)], s.dec_in[std::size_t(k + 1)]);
    EXPECT_EQ(s.labels[std::size_t(dec_length - 1)], special.eos);
    for (std::int64_t k = dec_length; k < 40; ++k) {
      EXPECT_EQ(s.labels[std::size_t(k)], kIgnoreLabel);
      EXPECT_EQ(s.dec_in[std::size_t(k)], special.pad);
    }
    for (std::int64_t k = enc_length; k < 96; ++k)
      EXPECT_EQ(s.enc_tokens[std::size_t(k)], special.pad);
    // Decoder: sentinel k followed by span k; sentinels 0, 1, 2, ... in order.
    std::vector<std::vector<std::int32_t>> spans;
    for (std::int64_t k = 1; k < dec_length; ++k) {
      const std::int32_t t = s.dec_in[std::size_t(k)];
      if (is_sentinel(t)) {
        ASSERT_EQ(t, special.sentinels[spans.size()]);
        spans.emplace_back();
      } else {
        ASSERT_FALSE(spans.empty()) << "a decoder token before the first sentinel";
        spans.back().push_back(t);
      }
    }
    // Encoder: the same sentinels in the same order; each replaced by its span
    // gives back the text.
    std::vector<std::int32_t> rebuilt;
    std::size_t next_sentinel = 0;
    for (std::int64_t k = 0; k < enc_length; ++k) {
      const std::int32_t t = s.enc_tokens[std::size_t(k)];
      if (!is_sentinel(t)) {
        rebuilt.push_back(t);
        continue;
      }
      ASSERT_LT(next_sentinel, spans.size());
      ASSERT_EQ(t, special.sentinels[next_sentinel]);
      ASSERT_FALSE(spans[next_sentinel].empty());
      rebuilt.insert(rebuilt.end(), spans[next_sentinel].begin(), spans[next_sentinel].end());
      ++next_sentinel;
    }
    EXPECT_EQ(next_sentinel, spans.size());
    EXPECT_EQ(rebuilt, source(samples, i));
    EXPECT_LE(std::int64_t(rebuilt.size()), 94);
  }
}

/// Noise tokens / text tokens and mean span length over all samples.
std::pair<double, double> noise_statistics(const T5Samples& samples) {
  std::int64_t text = 0, noise = 0, spans = 0;
  for (std::int64_t i = 0; i < samples.size(); ++i) {
    const T5Sample s = samples.sample(i);
    const std::int64_t enc = count_ones(s.enc_mask), dec = count_ones(s.dec_mask);
    const std::int64_t n_spans =
        std::count_if(s.dec_in.begin(), s.dec_in.begin() + dec, is_sentinel);
    const std::int64_t n_noise = dec - 1 - n_spans;  // less [bos] and sentinels
    spans += n_spans;
    noise += n_noise;
    text += enc - n_spans + n_noise;
  }
  return {double(noise) / double(text), double(noise) / double(spans)};
}

TEST_F(T5SamplesTest, NoiseDensityAndSpanLength) {
  // Single-token words: spans are geometric(1/3) words clipped to 10 (mean
  // 2.95), and a span that would overrun the sample's budget of about 14
  // tokens is shortened until it fits, which pulls the mean down (2.4 here).
  const auto [density, mean_span] = noise_statistics(build(1234, false));
  EXPECT_NEAR(density, 0.15, 0.01);
  EXPECT_GT(mean_span, 2.2);
  EXPECT_LT(mean_span, 2.8);
  // Whole words of several tokens make longer spans in tokens.
  const auto [word_density, word_span] = noise_statistics(build(1234, true));
  EXPECT_NEAR(word_density, 0.15, 0.015);
  EXPECT_GT(word_span, mean_span);
}

TEST_F(T5SamplesTest, SameSeedSameSamplesOtherSeedOthers) {
  const T5Samples a = build(5), b = build(5), c = build(6);
  int differing = 0;
  for (std::int64_t i = 0; i < 100; ++i) {
    const T5Sample x = a.sample(i), y = b.sample(i), z = c.sample(i);
    EXPECT_EQ(x.enc_tokens, y.enc_tokens);
    EXPECT_EQ(x.dec_in, y.dec_in);
    EXPECT_EQ(x.labels, y.labels);
    differing += x.enc_tokens != z.enc_tokens;
  }
  EXPECT_GT(differing, 90);
}

TEST_F(T5SamplesTest, ShortDecoderOrFewSentinelsAreOneLineErrors) {
  T5SamplesConfig config;
  config.encoder_seq_length = 96;
  config.decoder_seq_length = 8;
  const T5Samples tight(data_, 0, data_->num_documents(), 100, config,
                        testing::test_special_tokens());
  testing_util::expect_user_error(
      [&] {
        for (std::int64_t i = 0; i < tight.size(); ++i) tight.sample(i);
      },
      {"decoder_seq_length is 8"});
  config.decoder_seq_length = 40;
  auto special = testing::test_special_tokens();
  special.sentinels.resize(1);
  const T5Samples few(data_, 0, data_->num_documents(), 100, config, special);
  testing_util::expect_user_error(
      [&] {
        for (std::int64_t i = 0; i < few.size(); ++i) few.sample(i);
      },
      {"only 1 sentinel"});
  special.sentinels.clear();
  testing_util::expect_user_error(
      [&] { T5Samples(data_, 0, data_->num_documents(), 100, config, special); },
      {"no sentinel"});
}

}  // namespace
}  // namespace meshtron::data
