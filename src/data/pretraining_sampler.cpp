#include "data/pretraining_sampler.hpp"

#include "common/error.hpp"

namespace meshtron::data {

PretrainingSampler::PretrainingSampler(std::int64_t total_samples,
                                       std::int64_t consumed_samples,
                                       std::int64_t global_batch_size,
                                       std::int64_t micro_batch_size, int dp_rank,
                                       int dp_size)
    : total_(total_samples),
      consumed_(consumed_samples),
      global_batch_(global_batch_size),
      micro_batch_(micro_batch_size),
      dp_rank_(dp_rank),
      dp_size_(dp_size) {
  MESH_REQUIRE(micro_batch_ > 0 && dp_size_ > 0 && global_batch_ > 0,
               "sampler: global_batch_size=" << global_batch_ << ", micro_batch_size="
               << micro_batch_ << " and dp=" << dp_size_ << " must be positive");
  MESH_REQUIRE(global_batch_ % (micro_batch_ * dp_size_) == 0,
               "sampler: global_batch_size=" << global_batch_
               << " is not a multiple of micro_batch_size=" << micro_batch_ << " x dp="
               << dp_size_ << " (= " << micro_batch_ * dp_size_ << ")");
  MESH_REQUIRE(dp_rank_ >= 0 && dp_rank_ < dp_size_, "sampler: dp_rank=" << dp_rank_
               << " outside [0, dp=" << dp_size_ << ")");
  MESH_REQUIRE(consumed_ >= 0 && consumed_ <= total_, "sampler: consumed_samples="
               << consumed_ << " outside [0, " << total_ << " samples in the dataset]");
  num_micro_batches_ = global_batch_ / (micro_batch_ * dp_size_);
}

std::vector<std::int64_t> PretrainingSampler::micro_batch(std::int64_t step_start,
                                                          std::int64_t m) const {
  const std::int64_t first = step_start + m * micro_batch_ * dp_size_ + dp_rank_ * micro_batch_;
  std::vector<std::int64_t> indices(static_cast<std::size_t>(micro_batch_));
  for (std::int64_t k = 0; k < micro_batch_; ++k) indices[std::size_t(k)] = first + k;
  return indices;
}

std::vector<std::vector<std::int64_t>> PretrainingSampler::next_step() {
  MESH_REQUIRE(has_next_step(), "sampler: no whole global batch of " << global_batch_
               << " left after " << consumed_ << " of " << total_ << " samples");
  std::vector<std::vector<std::int64_t>> step;
  step.reserve(std::size_t(num_micro_batches_));
  for (std::int64_t m = 0; m < num_micro_batches_; ++m) step.push_back(micro_batch(consumed_, m));
  consumed_ += global_batch_;
  return step;
}

}  // namespace meshtron::data
