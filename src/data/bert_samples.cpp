#include "data/bert_samples.hpp"

#include <algorithm>
#include <utility>

#include "common/error.hpp"

namespace meshtron::data {

namespace {

using Tokens = std::vector<std::int32_t>;

/// Step 1: segments A and B of a run of sentences, and whether they swapped.
bool split_segments(const std::vector<Tokens>& sentences, bool binary_head,
                    NumpyLegacyRandom& rng, Tokens& a, Tokens& b) {
  std::size_t pivot = sentences.size();
  bool swapped = false;
  if (binary_head) {
    pivot = 1;
    if (sentences.size() >= 3) pivot = std::size_t(rng.randint(1, std::int64_t(sentences.size())));
    swapped = rng.uniform() < 0.5;
  }
  for (std::size_t s = 0; s < sentences.size(); ++s) {
    Tokens& into = s < pivot ? a : b;
    into.insert(into.end(), sentences[s].begin(), sentences[s].end());
  }
  if (swapped) std::swap(a, b);
  return swapped;
}

/// Step 2: trims the longer segment from a random end until both fit.
bool truncate_pair(Tokens& a, Tokens& b, std::int64_t target, NumpyLegacyRandom& rng) {
  bool truncated = false;
  while (std::int64_t(a.size() + b.size()) > target) {
    Tokens& longer = a.size() > b.size() ? a : b;
    if (rng.uniform() < 0.5)
      longer.erase(longer.begin());
    else
      longer.pop_back();
    truncated = true;
  }
  return truncated;
}

}  // namespace

BertSamples::BertSamples(std::shared_ptr<const IndexedDataset> data,
                         std::int64_t first_document, std::int64_t end_document,
                         std::int64_t num_samples, const BertSamplesConfig& config,
                         SpecialTokens special)
    : data_(std::move(data)), config_(config), special_(std::move(special)) {
  MESH_REQUIRE(config_.seq_length > 4, "BERT samples: seq_length=" << config_.seq_length
               << " leaves no room for text after [CLS] and two [SEP]");
  validate_masking(config_.masking, special_);
  MESH_REQUIRE(special_.cls >= 0 && special_.sep >= 0 && special_.pad >= 0,
               "BERT samples: [CLS]=" << special_.cls << ", [SEP]=" << special_.sep
               << " and [PAD]=" << special_.pad << " ids must be given");
  SentenceRunOptions options;
  options.first_document = first_document;
  options.end_document = end_document;
  options.num_samples = num_samples;
  options.max_tokens = std::int32_t(config_.seq_length - 3);
  options.short_seq_prob = config_.short_seq_prob;
  options.min_sentences = config_.binary_head ? 2 : 1;
  options.seed = config_.seed;
  runs_ = build_sentence_runs(*data_, options);
}

BertSample make_bert_sample(const std::vector<std::vector<std::int32_t>>& sentences,
                            std::int32_t target_length, std::int64_t index,
                            const BertSamplesConfig& config, const SpecialTokens& special) {
  MESH_REQUIRE(!config.binary_head || sentences.size() >= 2,
               "BERT samples: sample " << index << " has " << sentences.size()
               << " sentence(s); sentence pairs need 2 or more");
  NumpyLegacyRandom rng = sample_random(config.seed, index);
  BertSample out;
  Tokens a, b;
  out.is_random = split_segments(sentences, config.binary_head, rng, a, b) ? 1 : 0;
  out.truncated = truncate_pair(a, b, target_length, rng);

  Tokens tokens{special.cls};
  tokens.insert(tokens.end(), a.begin(), a.end());
  tokens.push_back(special.sep);
  std::vector<std::int32_t> types(tokens.size(), 0);
  if (!b.empty()) {
    tokens.insert(tokens.end(), b.begin(), b.end());
    tokens.push_back(special.sep);
    types.resize(tokens.size(), 1);
  }

  const MaskedPredictions masked =
      create_masked_predictions(tokens, target_length, special, config.masking, rng);
  const std::size_t length = std::size_t(config.seq_length);
  out.tokens = masked.tokens;
  out.tokens.resize(length, special.pad);
  out.token_types = std::move(types);
  out.token_types.resize(length, 0);
  out.padding_mask.assign(length, 0);
  std::fill(out.padding_mask.begin(), out.padding_mask.begin() + std::ptrdiff_t(tokens.size()), 1);
  out.labels.assign(length, kIgnoreLabel);
  out.loss_mask.assign(length, 0);
  for (std::size_t k = 0; k < masked.positions.size(); ++k) {
    out.labels[std::size_t(masked.positions[k])] = masked.labels[k];
    out.loss_mask[std::size_t(masked.positions[k])] = 1;
  }
  return out;
}

BertSample BertSamples::sample(std::int64_t i) const {
  MESH_REQUIRE(i >= 0 && i < size(), "BERT samples: index " << i << " outside [0, "
               << size() << ")");
  const SentenceRun& run = runs_[std::size_t(i)];
  std::vector<Tokens> sentences;
  for (std::int64_t s = run.first; s < run.end; ++s) sentences.push_back(data_->get_int32(s));
  return make_bert_sample(sentences, run.target_length, i, config_, special_);
}

}  // namespace meshtron::data
