// Shared machinery of the decomposition-invariance tests: train a tiny GPT
// (or BERT, with the override model.arch=bert: on BERT's synthetic batches)
// for a few steps on a given (tp, pp, dp) layout, and gather its parameters
// into global tensors to compare with the 1-rank reference run.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "ops/ops.hpp"
#include "train/trainer.hpp"

namespace meshtron::testing {

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  std::string schedule = "1f1b";
  bool distributed_optimizer = false;
  bool sequence_parallel = false;
  /// Further deck overrides ("training.recompute=full", ...), applied last.
  std::vector<std::string> overrides = {};
  std::string name() const;  ///< gpt_tp2_pp2_dp2_1f1b_distopt_sp (bert_... with model.arch=bert)
};

struct RunResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::map<std::string, std::vector<double>> params;  ///< global, unpadded
  std::vector<int> max_in_flight;                     ///< per step, this rank
  std::size_t optimizer_state_bytes = 0;              ///< Adam moments, this rank
  /// Overlapped gradient reduction, per step on this rank: buckets started
  /// during the backward, and non-blocking reduce-scatters the dp group began.
  std::vector<int> buckets_started_early;
  std::vector<long> dp_nonblocking_started;
  int bucket_count = 0;  ///< 0 without overlap
  std::vector<long> interleave_switches;  ///< per step (parallel.tp_interleave)
};

/// The tiny model: 8 layers, hidden 32, 8 heads, seq 8, vocab 100, dropout on,
/// global batch 16, micro-batch 1, AdamW with clipping, 3 steps.
/// `space` Cuda validates it with run.device = cuda (unless the overrides set run.device).
RunConfig tiny_config(const Layout& layout, int world, MemorySpace space = MemorySpace::Host);

/// Train `steps` steps on `comm` with `layout` in `dtype` (fp32, or fp64 for
/// the strict check) and gather the parameters (collective over comm; every
/// rank gets the full result). `space` Cuda trains on the GPU path
/// (run.device = cuda: device tensors, NCCL communicators).
RunResult train_layout(MPI_Comm comm, const Layout& layout, DType dtype, int steps = 3,
                       MemorySpace space = MemorySpace::Host);

/// The tiny deck with `overrides` (run.device among them) trained on one
/// rank (MPI_COMM_SELF) for `steps` steps on one fixed batch (memorisation:
/// the loss falls), the batch of step 1 of the synthetic data.
struct MemorisedRun {
  std::vector<StepReport> steps;
  long optimizer_steps = 0;
  std::map<std::string, std::vector<double>> params;  ///< final values
  std::vector<double> losses() const;
};
MemorisedRun memorise(const std::vector<std::string>& overrides, DType dtype, int steps,
                      const LossScalerConfig& scaler = {});

/// Norm-wise relative error ||a - b||_2 / ||b||_2. Element-wise errors are
/// not meaningful after AdamW in fp32: an element whose gradient is ~0 (the
/// attention key bias, exactly 0 in exact arithmetic) is divided by its own
/// tiny RMS, so summation-order rounding becomes an lr-sized step.
double norm_rel_error(const std::vector<double>& a, const std::vector<double>& b);

/// The attention probabilities' dropout site (the unfused path's view [b,
/// heads, S*S]) of `batch` samples x `heads` heads of S x S, placed at
/// (sample_offset, head_offset) in [*, heads_global (0: heads), S*S]; a fixed
/// seed, step and stream.
ops::DropoutSite attention_probs_site(index_t batch, index_t heads, index_t S,
                                      index_t sample_offset = 0, index_t head_offset = 0,
                                      index_t heads_global = 0);

}  // namespace meshtron::testing
