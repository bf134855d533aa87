// Supervised fine-tuning data (data.source = jsonl; docs/data.md): rows
// already tokenized (app/sft_rows.hpp reads them), one row per sample,
// right-padded, the loss on the completion (decoder) or target (T5) only.
//
//   decoder  tokens = context ++ target, cut to seq_length + 1: the context
//            (the prompt) from the left, keeping its end next to the
//            completion, then the target from the right. ids = tokens[0, s),
//            targets = tokens[1, s] where the token belongs to the target,
//            -100 elsewhere (prompt, padding); padding ids are 0.
//   T5       encoder = context, cut to seq_length from the right, padded
//            with 0 (mask 0); labels = target, cut to decoder_seq_length
//            from the right, -100 on padding; decoder input = the labels
//            shifted right behind the decoder start (pad id 0), as
//            T5ForConditionalGeneration makes it from labels.
//
// Order: sample i of the run (step k's global batch holds samples
// [(k-1) G, k G)) is row perm_e(i mod N) of epoch e = i / N, perm_e a
// shuffle of the N training rows seeded by (run.seed + e) (Megatron's
// random sampler reshuffles every epoch so). It depends on no rank, so the
// same samples go to 1, 2 or 4 dp ranks, and a restart at step k reads the
// samples an uninterrupted run would. Validation batch k holds the
// validation rows [k G, (k+1) G) in file order, cycling.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "data/t5_samples.hpp"
#include "train/data_source.hpp"

namespace meshtron {

/// One tokenized row. Decoder: `context` the prompt (empty for a {"text"}
/// row), `target` the completion; T5: the encoder input and the labels.
struct SftExample {
  std::vector<std::int32_t> context, target;
  long line = 0;  ///< its line in the file, for messages
};

/// The rows of one file fitted to the model's lengths (see the file
/// comment); a row left without a scored token is a UserError naming its
/// line (`where` names the file).
class SftSamples {
 public:
  /// `decoder_seq_length` > 0: T5 rows; 0: decoder rows.
  SftSamples(std::vector<SftExample> rows, index_t seq_length, index_t decoder_seq_length,
             const std::string& where);
  std::int64_t size() const { return std::int64_t(rows_.size()); }
  /// Rows cut to fit.
  std::int64_t truncated() const { return truncated_; }
  bool t5() const { return decoder_seq_length_ > 0; }
  /// Row i as a T5 sample (t5() only).
  data::T5Sample t5_sample(std::int64_t i) const;
  /// The micro-batch of rows `rows` (-1: an empty slot, nothing scored),
  /// in [s, b] order, its first sample `sample_offset` of the step.
  MicroBatch micro_batch(const std::vector<std::int64_t>& rows, index_t sample_offset) const;

 private:
  std::vector<SftExample> rows_;  ///< fitted
  index_t seq_length_, decoder_seq_length_;
  std::int64_t truncated_ = 0;
};

/// The micro-batch with its unscored targets as a loss mask instead
/// (MicroBatch::loss_mask, targets -100 read as 0): what
/// Trainer::evaluate_sum scores, summing over the scored tokens.
MicroBatch with_loss_mask(MicroBatch mb);

/// This dp rank's micro-batches of the evaluation batch of rows [first,
/// first + global_batch) of `samples` in file order; slots past the last
/// row are empty.
std::vector<MicroBatch> sft_eval_batch(const SftSamples& samples, const DataLayout& layout,
                                       std::int64_t first);

/// data.source = jsonl: `train` shuffled per epoch, `valid` (null: none) in
/// order, as the file comment says.
std::unique_ptr<DataSource> make_sft_data(const DataLayout& layout, int vocab_size,
                                          std::shared_ptr<const SftSamples> train,
                                          std::shared_ptr<const SftSamples> valid);

}  // namespace meshtron
