// T5 span-corruption samples, built as Megatron-LM's T5 dataset builds them
// (megatron/core/datasets/t5_dataset.py over masked_dataset.py, with
// examples/t5/pretrain_t5.py's settings), tokenizer-free: the special and
// sentinel ids come in SpecialTokens.
//
// Sample i, from the sentence runs of sentence_samples.hpp (max_tokens =
// encoder_seq_length - 2, one sentence or more) and its own generator
// RandomState((seed + i) % 2^32):
//  1. The run's sentences are concatenated and cut to the run's target
//     length.
//  2. Noise spans (masking.hpp): a budget of 15 % of the tokens, whole
//     words, span length N ~ geometric(p) clipped to 10 words, as Megatron's
//     T5 (SpanBERT's sampling). Megatron fixes p = 0.2 (mean 5, 4.5 after
//     clipping); here p = 1 / mean_span_length with a default mean of 3,
//     the mean noise-span length of the T5 paper. Set mean_span_length = 5
//     to draw exactly as Megatron.
//  3. The encoder input is the text with each span replaced by the next
//     sentinel (<extra_id_0>, <extra_id_1>, ...); the decoder input is
//     [bos] then, per span, its sentinel and its tokens; the labels are the
//     decoder input shifted left by one, ending with [eos].
//  4. Padding to encoder_seq_length / decoder_seq_length with the pad id.
//
// Output conventions (where meshtron differs from Megatron's dict):
//  - labels: -100 on padding (Megatron: -1, under its loss mask).
//  - enc_mask, dec_mask: 1 on the real tokens, 0 on padding, by position;
//    padded tokens keep the pad id (Megatron compares ids with the pad id
//    and rewrites them to 0).
//  - loss_mask: 1 on the decoder's real positions.
// A sample whose decoder does not fit decoder_seq_length, or that needs
// more spans than there are sentinels, throws UserError naming both
// numbers (Megatron asserts).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/indexed_dataset.hpp"
#include "data/masking.hpp"
#include "data/sentence_samples.hpp"

namespace meshtron::data {

struct T5SamplesConfig {
  std::int64_t encoder_seq_length = 512;  ///< Megatron's --encoder-seq-length
  std::int64_t decoder_seq_length = 128;  ///< Megatron's --decoder-seq-length
  double short_seq_prob = 0.1;
  std::uint32_t seed = 1234;
  double mean_span_length = 3.0;          ///< geometric p = 1 / mean
  double noise_density = 0.15;
  std::int32_t max_span_words = 10;       ///< Megatron's masking_max_ngram for T5

  /// The masking these settings give: geometric spans, whole words, [MASK]
  /// only (the encoder replaces each span by its sentinel).
  MaskingConfig masking() const;
};

struct T5Sample {
  std::vector<std::int32_t> enc_tokens;  ///< [encoder_seq_length]
  std::vector<std::int32_t> dec_in;      ///< [decoder_seq_length]
  std::vector<std::int32_t> labels;      ///< [decoder_seq_length] next decoder token or -100
  std::vector<std::int32_t> loss_mask;   ///< [decoder_seq_length]
  std::vector<std::int32_t> enc_mask;    ///< [encoder_seq_length] 1 real, 0 padding
  std::vector<std::int32_t> dec_mask;    ///< [decoder_seq_length] 1 real, 0 padding
  bool truncated = false;
};

/// Steps 1-4 for sample `index` whose run's sentences concatenate to
/// `text`, with the run's target length: the builder without its mapping.
T5Sample make_t5_sample(std::vector<std::int32_t> text, std::int32_t target_length,
                        std::int64_t index, const T5SamplesConfig& config,
                        const SpecialTokens& special);

class T5Samples {
 public:
  /// Samples over documents [first_document, end_document) of `data` (at
  /// least num_samples; <= 0: one epoch). Throws UserError on a bad
  /// parameter, missing bos/eos/pad/mask ids, no sentinels, or when no
  /// document has a sentence.
  T5Samples(std::shared_ptr<const IndexedDataset> data, std::int64_t first_document,
            std::int64_t end_document, std::int64_t num_samples, const T5SamplesConfig& config,
            SpecialTokens special);

  std::int64_t size() const { return std::int64_t(runs_.size()); }
  const T5SamplesConfig& config() const { return config_; }
  const std::vector<SentenceRun>& runs() const { return runs_; }

  /// Sample i, 0 <= i < size().
  T5Sample sample(std::int64_t i) const;

 private:
  std::shared_ptr<const IndexedDataset> data_;
  T5SamplesConfig config_;
  SpecialTokens special_;
  std::vector<SentenceRun> runs_;
};

}  // namespace meshtron::data
