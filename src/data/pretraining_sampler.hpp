// Which samples each data-parallel rank reads at each step, as Megatron-LM's
// MegatronPretrainingSampler decides.
//
// A step consumes the global batch [c, c + global_batch) of sample indices,
// c = consumed samples. Megatron walks it in chunks of micro_batch * dp
// consecutive samples; chunk m is micro-batch m of every rank, and dp rank r
// takes the r-th micro_batch-long piece of each chunk:
//
//   micro-batch m of rank r = c + m*micro_batch*dp + r*micro_batch + [0, micro_batch)
//
// Over all ranks and micro-batches a step reads exactly the global batch, so
// what is trained on does not depend on dp. The sampler holds no state but
// the consumed count, so a restart from a checkpoint's consumed_samples
// continues exactly where the run stopped.
#pragma once

#include <cstdint>
#include <vector>

namespace meshtron::data {

class PretrainingSampler {
 public:
  /// Throws UserError unless micro_batch * dp_size divides global_batch,
  /// 0 <= dp_rank < dp_size and 0 <= consumed_samples <= total_samples.
  PretrainingSampler(std::int64_t total_samples, std::int64_t consumed_samples,
                     std::int64_t global_batch_size, std::int64_t micro_batch_size,
                     int dp_rank, int dp_size);

  /// Micro-batches per step and rank: global / (micro * dp).
  std::int64_t num_micro_batches() const { return num_micro_batches_; }
  std::int64_t consumed_samples() const { return consumed_; }
  /// True while a whole global batch is left (the partial last one is
  /// dropped, as Megatron's drop_last).
  bool has_next_step() const { return consumed_ + global_batch_ <= total_; }
  /// This rank's micro-batches of the next step (num_micro_batches() lists of
  /// micro_batch_size sample indices); advances consumed_samples by a
  /// global batch.
  std::vector<std::vector<std::int64_t>> next_step();
  /// Sample indices of micro-batch m of this rank for the step starting at
  /// `step_start` consumed samples.
  std::vector<std::int64_t> micro_batch(std::int64_t step_start, std::int64_t m) const;

 private:
  std::int64_t total_, consumed_, global_batch_, micro_batch_;
  int dp_rank_, dp_size_;
  std::int64_t num_micro_batches_;
};

}  // namespace meshtron::data
