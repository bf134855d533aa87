#include "data/t5_samples.hpp"

#include <algorithm>
#include <utility>

#include "common/error.hpp"

namespace meshtron::data {

namespace {

using Tokens = std::vector<std::int32_t>;

/// Step 3: encoder input, decoder input and labels (unpadded) from the
/// masked spans of `text`.
void corrupt_spans(const Tokens& text, const std::vector<MaskedSpan>& spans,
                   const SpecialTokens& special, std::int64_t index, T5Sample& out) {
  MESH_REQUIRE(spans.size() <= special.sentinels.size(),
               "T5 samples: sample " << index << " has " << spans.size()
               << " noise spans but only " << special.sentinels.size() << " sentinel ids");
  out.dec_in.push_back(special.bos);
  std::size_t next = 0;
  for (std::size_t s = 0; s < spans.size(); ++s) {
    const std::int32_t sentinel = special.sentinels[s];
    const auto& span = spans[s];
    out.enc_tokens.insert(out.enc_tokens.end(), text.begin() + std::ptrdiff_t(next),
                          text.begin() + std::ptrdiff_t(span.positions.front()));
    out.enc_tokens.push_back(sentinel);
    out.dec_in.push_back(sentinel);
    out.dec_in.insert(out.dec_in.end(), span.labels.begin(), span.labels.end());
    next = std::size_t(span.positions.back()) + 1;
  }
  out.enc_tokens.insert(out.enc_tokens.end(), text.begin() + std::ptrdiff_t(next), text.end());
  out.labels.assign(out.dec_in.begin() + 1, out.dec_in.end());
  out.labels.push_back(special.eos);
}

/// 1 on the first `real` of `length` positions, 0 after.
std::vector<std::int32_t> leading_ones(std::size_t real, std::size_t length) {
  std::vector<std::int32_t> mask(length, 0);
  std::fill(mask.begin(), mask.begin() + std::ptrdiff_t(real), 1);
  return mask;
}

/// Step 4.
void pad_sample(const T5SamplesConfig& config, const SpecialTokens& special, T5Sample& out) {
  const std::size_t enc_length = std::size_t(config.encoder_seq_length);
  const std::size_t dec_length = std::size_t(config.decoder_seq_length);
  out.enc_mask = leading_ones(out.enc_tokens.size(), enc_length);
  out.dec_mask = leading_ones(out.dec_in.size(), dec_length);
  out.loss_mask = out.dec_mask;
  out.enc_tokens.resize(enc_length, special.pad);
  out.dec_in.resize(dec_length, special.pad);
  out.labels.resize(dec_length, kIgnoreLabel);
}

}  // namespace

MaskingConfig T5SamplesConfig::masking() const {
  MaskingConfig m;
  m.probability = noise_density;
  m.max_ngram = max_span_words;
  m.whole_word = true;
  m.geometric = true;
  m.geometric_p = mean_span_length > 0 ? 1.0 / mean_span_length : 0.0;
  m.replacement = MaskReplacement::MaskOnly;
  return m;
}

T5Samples::T5Samples(std::shared_ptr<const IndexedDataset> data, std::int64_t first_document,
                     std::int64_t end_document, std::int64_t num_samples,
                     const T5SamplesConfig& config, SpecialTokens special)
    : data_(std::move(data)), config_(config), special_(std::move(special)) {
  MESH_REQUIRE(config_.encoder_seq_length > 3 && config_.decoder_seq_length > 1,
               "T5 samples: encoder_seq_length=" << config_.encoder_seq_length
               << " and decoder_seq_length=" << config_.decoder_seq_length << " are too short");
  MESH_REQUIRE(config_.mean_span_length >= 1.0,
               "T5 samples: mean_span_length=" << config_.mean_span_length << " is below 1");
  validate_masking(config_.masking(), special_);
  MESH_REQUIRE(special_.bos >= 0 && special_.eos >= 0 && special_.pad >= 0,
               "T5 samples: bos=" << special_.bos << ", eos=" << special_.eos << " and pad="
               << special_.pad << " ids must be given");
  MESH_REQUIRE(!special_.sentinels.empty(), "T5 samples: no sentinel ids given");
  SentenceRunOptions options;
  options.first_document = first_document;
  options.end_document = end_document;
  options.num_samples = num_samples;
  options.max_tokens = std::int32_t(config_.encoder_seq_length - 2);
  options.short_seq_prob = config_.short_seq_prob;
  options.min_sentences = 1;
  options.seed = config_.seed;
  runs_ = build_sentence_runs(*data_, options);
}

T5Sample make_t5_sample(std::vector<std::int32_t> text, std::int32_t target_length,
                        std::int64_t index, const T5SamplesConfig& config,
                        const SpecialTokens& special) {
  T5Sample out;
  out.truncated = std::int64_t(text.size()) > target_length;
  text.resize(std::min(text.size(), std::size_t(target_length)));
  NumpyLegacyRandom rng = sample_random(config.seed, index);
  const MaskedPredictions masked =
      create_masked_predictions(text, target_length, special, config.masking(), rng);
  corrupt_spans(text, masked.spans, special, index, out);
  MESH_REQUIRE(std::int64_t(out.dec_in.size()) <= config.decoder_seq_length,
               "T5 samples: sample " << index << " needs a decoder of " << out.dec_in.size()
               << " tokens but decoder_seq_length is " << config.decoder_seq_length);
  pad_sample(config, special, out);
  return out;
}

T5Sample T5Samples::sample(std::int64_t i) const {
  MESH_REQUIRE(i >= 0 && i < size(), "T5 samples: index " << i << " outside [0, " << size()
               << ")");
  const SentenceRun& run = runs_[std::size_t(i)];
  Tokens text;
  for (std::int64_t s = run.first; s < run.end; ++s) {
    const Tokens sentence = data_->get_int32(s);
    text.insert(text.end(), sentence.begin(), sentence.end());
  }
  return make_t5_sample(std::move(text), run.target_length, i, config_, special_);
}

}  // namespace meshtron::data
