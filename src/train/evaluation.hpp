// Evaluation (Megatron's evaluate): the loss and perplexity of a model on
// rows of token ids, each row scored exactly once as a causal LM over itself
// (position t predicts token t + 1, as transformers' labels = input_ids).
// The rows are a split's samples in order (data/ordered_gpt_samples.hpp) or
// explicit examples of any length from 2 to seq_length + 1 ids.
//
// Batching: rows [k G, (k + 1) G) make evaluation batch k (G =
// global_batch), dealt to the dp ranks' micro-batches as training deals a
// step's samples (DataLayout::sample_offset). A row shorter than seq_length
// + 1, and every slot past the last row, is padded with id 0 and masked out
// of the loss (MicroBatch::loss_mask); rows are never packed together.
// Causal attention and positions that start at 0 in every row make a row's
// losses independent of its padding and of its neighbours.
//
// The result is the sum of the per-token losses over every scored token
// divided by their number, both summed over the whole grid: the same on
// every (tp, pp, dp, virtual stages) layout, to rounding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/data_source.hpp"

namespace meshtron {

struct RunConfig;
class Trainer;

/// Rows to score, each of 2 to seq_length + 1 token ids.
class EvalRows {
 public:
  virtual ~EvalRows() = default;
  virtual std::int64_t size() const = 0;
  /// Row i's ids into `out` (resized to the row's length).
  virtual void row(std::int64_t i, std::vector<std::int32_t>& out) const = 0;
};

/// The samples of `split` (valid | test | all) of run.data.path, split by
/// run.data.split, in order (OrderedGptSamples). A token outside [0, vocab)
/// stops the run naming the sample (MESH_VERIFY: only the rank reading it
/// sees it).
std::unique_ptr<EvalRows> split_rows(const RunConfig& run, const std::string& split, int vocab);
/// The rows of a JSONL file, one {"ids": [...]} per line (blank lines
/// skipped). Every rank reads the whole file, so a malformed line, a row
/// shorter than 2 or longer than seq_length + 1 ids, or an id outside
/// [0, vocab) is a UserError naming the file and the line.
std::unique_ptr<EvalRows> jsonl_rows(const std::string& path, std::int64_t seq_length, int vocab);

struct EvalResult {
  std::int64_t samples = 0;  ///< rows scored
  double tokens = 0;         ///< targets scored
  double loss_sum = 0;       ///< sum of their per-token losses
  double loss() const { return loss_sum / tokens; }
  double ppl() const;
  /// "evaluate | samples N | tokens T | lm loss L | lm loss PPL P"
  std::string line() const;
  /// {"samples", "tokens", "lm_loss", "ppl", "split", "checkpoint"} as one JSON object.
  std::string json(const std::string& split, const std::string& checkpoint) const;
};

/// Scores every row of `rows` with `trainer` (forward only; collective over
/// the world). `layout` gives seq_length, micro_batch (the trainer's) and
/// global_batch, and this rank's dp coordinates; its other fields are unused.
EvalResult evaluate_rows(Trainer& trainer, const EvalRows& rows, const DataLayout& layout);

/// The end of `meshtron train`: with an indexed dataset and a test weight in
/// data.split, scores the test split's samples at the training micro- and
/// global batch size and prints " test split | evaluate | samples ..." on
/// world rank 0 (collective); a note instead when the split holds no sample.
/// Does nothing otherwise.
void evaluate_test_split(const RunConfig& run, Trainer& trainer, int vocab);

}  // namespace meshtron
