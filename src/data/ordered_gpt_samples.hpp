// The samples of a GPT split in order, for evaluation: each sample exactly
// once, no epochs, no shuffling.
//
// The split's documents (sequences, as GptDataset counts them) are
// concatenated in their stored order into one token stream, and sample j is
// the window stream[j s, j s + s + 1) for j < (tokens - 1) / s (s =
// seq_length): the windows of Megatron's build_sample_idx over one epoch
// whose doc_idx is the documents in order and whose shuffle_idx is the
// identity. Consecutive windows share one token, windows cross document
// boundaries, and the tokens after the last full window are not scored (as
// in Megatron's GPT samples).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/indexed_dataset.hpp"

namespace meshtron::data {

class OrderedGptSamples {
 public:
  /// Windows over sequences [first_sequence, end_sequence) of `data`.
  OrderedGptSamples(std::shared_ptr<const IndexedDataset> data, std::int64_t first_sequence,
                    std::int64_t end_sequence, std::int64_t seq_length);

  std::int64_t size() const { return size_; }
  std::int64_t seq_length() const { return seq_length_; }
  /// Sample i: seq_length + 1 tokens into `out`.
  void sample(std::int64_t i, std::int32_t* out) const;

 private:
  std::shared_ptr<const IndexedDataset> data_;
  std::int64_t first_sequence_, seq_length_, size_ = 0;
  /// Stream position of each sequence's first token, then the stream's length.
  std::vector<std::int64_t> starts_;
};

/// Sequences [first, end) of `split` ("train" | "valid" | "test" by the
/// weights `split_weights`, as build_gpt_datasets cuts them; "all" = every
/// sequence) of a dataset of `num_sequences`. Throws UserError on another name.
std::pair<std::int64_t, std::int64_t> split_sequence_range(const std::string& split,
                                                           const std::string& split_weights,
                                                           std::int64_t num_sequences);

}  // namespace meshtron::data
