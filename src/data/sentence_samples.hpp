// Which sentences make each BERT / T5 sample: Megatron-LM's samples mapping
// (build_mapping in megatron/core/datasets/helpers.cpp), followed step for
// step so that the same dataset and seed give Megatron's mapping.
//
// The data is an indexed dataset preprocessed with sentence splitting: a
// document is a run of sequences, one per sentence (indexed_dataset.hpp).
// For each epoch, each document [first, end) of the range in turn:
//   - skipped if it has fewer than `min_sentences` sentences, or more than
//     one sentence and one of them longer than 512 tokens;
//   - otherwise cut into consecutive sentence runs: a run closes once it
//     holds >= target tokens and >= min_sentences sentences and more than
//     one sentence of the document remains after it, or at the document's
//     end. The target is max_tokens, or with probability short_seq_prob
//     (drawn as r % round(1/prob) == 0 on a 32-bit draw r) a length in
//     [2, max_tokens]: 2 + r % (max_tokens - 1).
// Epochs repeat (the draws go on, so the cuts differ) until num_samples runs
// exist (num_samples <= 0: one epoch); then the runs are shuffled by
// Fisher-Yates with j = r64 % (i + 1). Draws: std::mt19937(seed) for the
// targets, std::mt19937_64(seed + 1) for the shuffle, as Megatron.
//
// The mapping depends on the data, the range and the parameters only, never
// on the number of ranks; every rank builds the same one (it takes one pass
// over the sentence lengths per epoch, so it is not cached on disk).
#pragma once

#include <cstdint>
#include <vector>

#include "data/indexed_dataset.hpp"

namespace meshtron::data {

/// Sentences [first, end) of the indexed dataset and the sample's target
/// length in tokens (Megatron's (start, end, target_sequence_length)).
struct SentenceRun {
  std::int64_t first = 0;
  std::int64_t end = 0;
  std::int32_t target_length = 0;
  bool operator==(const SentenceRun&) const = default;
};

struct SentenceRunOptions {
  std::int64_t first_document = 0;  ///< documents [first_document, end_document)
  std::int64_t end_document = 0;
  std::int64_t num_samples = 0;     ///< at least this many (<= 0: one epoch)
  std::int32_t max_tokens = 509;    ///< seq_length minus the special tokens
  double short_seq_prob = 0.1;
  std::int32_t min_sentences = 2;   ///< 2 for sentence pairs, 1 otherwise
  std::uint32_t seed = 1234;
};

/// Megatron's samples mapping (file comment). Throws UserError on a bad
/// range or parameter and when no document yields a sample.
std::vector<SentenceRun> build_sentence_runs(const IndexedDataset& data,
                                             const SentenceRunOptions& options);

}  // namespace meshtron::data
