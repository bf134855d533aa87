// BERT pre-training samples, built as Megatron-LM's BERT dataset builds them
// (megatron/core/datasets/bert_dataset.py over masked_dataset.py, with
// examples/bert/pretrain_bert.py's settings), tokenizer-free: the special
// ids come in SpecialTokens.
//
// Sample i, from the sentence runs of sentence_samples.hpp (max_tokens =
// seq_length - 3: one [CLS], two [SEP]) and its own generator
// RandomState((seed + i) % 2^32):
//  1. Segments. With the binary head the run (>= 2 sentences) is cut at a
//     pivot, randint(1, n) for n >= 3 sentences, else 1: A = sentences before
//     it, B = from it on. Then with probability 1/2 A and B are swapped and
//     is_random = 1. This is sentence-order prediction (SOP, as ALBERT), not
//     next-sentence prediction with a segment from another document:
//     Megatron's `is_random` names a swap. Without the binary head A is the
//     whole run and there is no B.
//  2. Truncation. While |A| + |B| exceeds the run's target length, the
//     longer segment (B on a tie) loses its first or last token, each with
//     probability 1/2.
//  3. [CLS] A [SEP] B [SEP] (no B: [CLS] A [SEP]), token types 0 up to the
//     first [SEP], 1 after.
//  4. Masking (masking.hpp) with Megatron's BERT settings: probability 0.15,
//     whole-word, N-grams up to 3 words with P(N) ~ 1/N, no permutation;
//     80 % [MASK], 10 % random id, 10 % kept.
//  5. Padding to seq_length with the pad id.
//
// Output conventions (where meshtron differs from Megatron's dict):
//  - labels: the original token at masked positions, -100 elsewhere and on
//    padding. Megatron writes -1 and relies on its loss mask; -100 is the
//    ignore_index of PyTorch's cross-entropy and of transformers'
//    MegatronBertForPreTraining, so the same labels score either way.
//  - padding_mask: 1 on the real tokens, 0 on padding, by position (Megatron
//    compares token ids with the pad id, which misreads a real token equal
//    to it); padded tokens keep the pad id (Megatron rewrites them to 0).
//  - loss_mask: 1 at masked positions.
// A sample depends on (data, range, config, i) only, never on the rank that
// builds it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/indexed_dataset.hpp"
#include "data/masking.hpp"
#include "data/sentence_samples.hpp"

namespace meshtron::data {

struct BertSamplesConfig {
  std::int64_t seq_length = 512;
  double short_seq_prob = 0.1;  ///< Megatron's --short-seq-prob
  std::uint32_t seed = 1234;
  bool binary_head = true;      ///< sentence pairs and is_random (SOP)
  MaskingConfig masking{};      ///< 0.15, whole words, N <= 3, P(N) ~ 1/N, 80/10/10
};

struct BertSample {
  std::vector<std::int32_t> tokens;        ///< [seq_length]
  std::vector<std::int32_t> token_types;   ///< [seq_length] 0 for A, 1 for B, 0 on padding
  std::vector<std::int32_t> labels;        ///< [seq_length] original id or -100
  std::vector<std::int32_t> loss_mask;     ///< [seq_length] 1 where masked
  std::vector<std::int32_t> padding_mask;  ///< [seq_length] 1 real, 0 padding
  std::int32_t is_random = 0;              ///< 1: segments swapped
  bool truncated = false;
};

/// Steps 1-5 for sample `index` made of `sentences` (the run's sentences)
/// with the run's target length: the builder without its mapping.
BertSample make_bert_sample(const std::vector<std::vector<std::int32_t>>& sentences,
                            std::int32_t target_length, std::int64_t index,
                            const BertSamplesConfig& config, const SpecialTokens& special);

class BertSamples {
 public:
  /// Samples over documents [first_document, end_document) of `data` (at
  /// least num_samples; <= 0: one epoch). Throws UserError on a bad
  /// parameter or special id, or when no document has enough sentences.
  BertSamples(std::shared_ptr<const IndexedDataset> data, std::int64_t first_document,
              std::int64_t end_document, std::int64_t num_samples,
              const BertSamplesConfig& config, SpecialTokens special);

  std::int64_t size() const { return std::int64_t(runs_.size()); }
  const BertSamplesConfig& config() const { return config_; }
  const std::vector<SentenceRun>& runs() const { return runs_; }

  /// Sample i, 0 <= i < size().
  BertSample sample(std::int64_t i) const;

 private:
  std::shared_ptr<const IndexedDataset> data_;
  BertSamplesConfig config_;
  SpecialTokens special_;
  std::vector<SentenceRun> runs_;
};

}  // namespace meshtron::data
