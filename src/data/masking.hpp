// Masked-language-model predictions shared by the BERT and T5 sample
// builders: Megatron-LM's MaskedWordPieceDataset._create_masked_lm_predictions
// (megatron/core/datasets/masked_dataset.py), followed draw for draw with
// numpy's legacy generator (numpy_random.hpp).
//
// 1. Candidates. Every token but [CLS]/[SEP] is a candidate word; with
//    whole-word masking a word-continuation token (WordPiece's "##" pieces,
//    told by SpecialTokens::word_continuation) joins the word before it.
// 2. Budget. n = min(p * target_length, max(1, round(p * len(tokens))))
//    tokens (p = masking probability, round half to even).
// 3. N-grams. The candidate words are shuffled; for each in turn an N is
//    drawn, either P(N) proportional to 1/N for N in [1, max_ngram]
//    (Megatron's BERT: max_ngram 3) or geometric(p_geo) clipped to
//    max_ngram (SpanBERT; Megatron's T5: max_ngram 10). The N-gram is the
//    N words from that candidate on; N shrinks until the N-gram fits the
//    remaining budget; it is skipped if it overlaps an earlier one. Stops
//    once the budget is spent.
// 4. Replacement of each chosen token: BERT's 80 % [MASK], 10 % a uniform
//    id in [0, vocab_size), 10 % kept; T5's always [MASK] (the encoder
//    replaces the whole span by a sentinel anyway).
// Megatron's optional permutation of further N-grams (off for both models)
// is not implemented.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "data/numpy_random.hpp"

namespace meshtron::data {

/// Value of a label where nothing is predicted: the ignore_index of
/// PyTorch's cross-entropy and of transformers' models.
inline constexpr std::int32_t kIgnoreLabel = -100;

/// Token ids the sample builders insert, given by the tokenizer so that the
/// builders depend on none. An id of -1 is "absent": T5 leaves [CLS] and
/// [SEP] at -1, so that no token of its text is excluded from the spans.
struct SpecialTokens {
  std::int32_t cls = -1;
  std::int32_t sep = -1;
  std::int32_t mask = -1;
  std::int32_t pad = 0;
  std::int32_t bos = -1;  ///< first decoder input (T5); Hugging Face T5 uses pad
  std::int32_t eos = -1;  ///< last decoder label (T5)
  std::int64_t vocab_size = 0;  ///< random replacements are drawn in [0, vocab_size)
  /// T5's sentinels in the order spans use them (<extra_id_0>, <extra_id_1>, ...).
  std::vector<std::int32_t> sentinels;
  /// word_continuation[id] != 0: token `id` continues the word before it
  /// (a "##" WordPiece). Empty: every token starts a word.
  std::vector<std::uint8_t> word_continuation;
};

enum class MaskReplacement { Bert, MaskOnly };

struct MaskingConfig {
  double probability = 0.15;
  std::int32_t max_ngram = 3;
  bool whole_word = true;
  /// Draw N from geometric(geometric_p) clipped to max_ngram instead of
  /// P(N) ~ 1/N.
  bool geometric = false;
  double geometric_p = 0.2;
  MaskReplacement replacement = MaskReplacement::Bert;
};

/// A masked N-gram: its positions (ascending) and original tokens.
struct MaskedSpan {
  std::vector<std::int64_t> positions;
  std::vector<std::int32_t> labels;
};

struct MaskedPredictions {
  std::vector<std::int32_t> tokens;     ///< input with replacements applied
  std::vector<std::int64_t> positions;  ///< masked positions, ascending
  std::vector<std::int32_t> labels;     ///< original token at each position
  std::vector<MaskedSpan> spans;        ///< by first position
};

/// Throws UserError on a probability outside (0, 1), max_ngram < 1, a
/// geometric p outside (0, 1], or a word_continuation table shorter than
/// the vocabulary.
void validate_masking(const MaskingConfig& config, const SpecialTokens& special);

/// Steps 1-4 of the file comment for `tokens` of a sample whose target
/// length is `target_length`, drawing from `rng`.
MaskedPredictions create_masked_predictions(std::span<const std::int32_t> tokens,
                                            std::int64_t target_length,
                                            const SpecialTokens& special,
                                            const MaskingConfig& config,
                                            NumpyLegacyRandom& rng);

/// numpy.random.RandomState((seed + index) % 2^32): each sample's own
/// generator, so a sample depends on its index only (Megatron's seeding).
inline NumpyLegacyRandom sample_random(std::uint32_t seed, std::int64_t index) {
  return NumpyLegacyRandom(std::uint32_t(std::uint64_t(seed) + std::uint64_t(index)));
}

}  // namespace meshtron::data
