#include "data/ordered_gpt_samples.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "data/gpt_dataset.hpp"

namespace meshtron::data {

OrderedGptSamples::OrderedGptSamples(std::shared_ptr<const IndexedDataset> data,
                                     std::int64_t first_sequence, std::int64_t end_sequence,
                                     std::int64_t seq_length)
    : data_(std::move(data)), first_sequence_(first_sequence), seq_length_(seq_length) {
  MESH_REQUIRE(seq_length >= 1, "GPT samples need seq_length >= 1, got " << seq_length);
  MESH_REQUIRE(0 <= first_sequence && first_sequence <= end_sequence &&
                   end_sequence <= data_->num_sequences(),
               "sequences [" << first_sequence << ", " << end_sequence << ") outside "
                             << data_->prefix() << " (" << data_->num_sequences() << ")");
  std::int64_t tokens = 0;
  for (std::int64_t k = first_sequence; k < end_sequence; ++k) {
    starts_.push_back(tokens);
    tokens += data_->sequence_length(k);
  }
  starts_.push_back(tokens);
  size_ = tokens > 0 ? (tokens - 1) / seq_length : 0;
}

void OrderedGptSamples::sample(std::int64_t i, std::int32_t* out) const {
  MESH_VERIFY(i >= 0 && i < size_, "ordered GPT sample " << i << " outside [0, " << size_ << ")");
  const std::int64_t begin = i * seq_length_, want = seq_length_ + 1;
  // The last sequence starting at or before `begin`: it holds token `begin`
  // (empty sequences share their start with the next one).
  const auto sequences = std::int64_t(starts_.size()) - 1;
  std::int64_t k = std::int64_t(std::upper_bound(starts_.begin(), starts_.begin() + sequences,
                                                 begin) - starts_.begin()) - 1;
  std::int64_t offset = begin - starts_[std::size_t(k)], n = 0;
  for (; n < want; ++k, offset = 0) {
    const std::int64_t available = starts_[std::size_t(k) + 1] - starts_[std::size_t(k)] - offset;
    n += data_->read(first_sequence_ + k, offset, std::min(available, want - n), out + n);
  }
}

std::pair<std::int64_t, std::int64_t> split_sequence_range(const std::string& split,
                                                           const std::string& split_weights,
                                                           std::int64_t num_sequences) {
  if (split == "all") return {0, num_sequences};
  for (int k = 0; k < 3; ++k)
    if (split == split_name(Split(k))) {
      const auto bounds = split_boundaries(split_weights, num_sequences);
      return {bounds[std::size_t(k)], bounds[std::size_t(k) + 1]};
    }
  throw UserError(MESH_MSG("split '" << split << "' is not one of train | valid | test | all"));
}

}  // namespace meshtron::data
