// AdamW over a stage's parameters, with the gradient reductions that make
// the update identical on every decomposition:
//
//   1. sequence-parallel partial gradients (norms, row-parallel biases) are
//      all-reduced over tp;
//   2. the tied word-embedding gradient is all-reduced over the embedding
//      group (first + last pipeline stage) when pp > 1;
//   3. all gradients are all-reduced over dp (the loss is already divided
//      by the global token count, so the sum is the mean gradient);
//   4. the global L2 norm is computed over the whole grid, counting every
//      tp-replicated parameter and the tied embedding once, and gradients are
//      clipped to training.clip_grad;
//   5. AdamW with decoupled weight decay (none on biases and norms).
#pragma once

#include <vector>

#include "model/parameter.hpp"
#include "ops/ops.hpp"
#include "parallel/communicator.hpp"

namespace meshtron {

struct OptimizerGroups {
  Communicator& tp;         ///< Not owned.
  Communicator& dp;         ///< Not owned.
  Communicator& model;      ///< tp x pp ranks (norm reduction). Not owned.
  Communicator* embedding;  ///< first+last stage; null when pp = 1 or middle stage.
};

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double clip_grad = 0.0;  ///< 0 = no clipping
};

struct StepStats {
  double grad_norm = 0;  ///< before clipping
  bool skipped = false;  ///< NaN/Inf in the gradient norm: no update
};

class AdamW {
 public:
  /// `tied_head_copy` is the last stage's copy of the word table (pp > 1),
  /// whose norm is not counted twice; null otherwise.
  AdamW(ParameterList params, const AdamWConfig& config, Parameter* tied_head_copy);

  /// Reduce gradients, clip, update with learning rate `lr`; then zero grads.
  StepStats step(double lr, OptimizerGroups& groups, bool skip_on_nonfinite);
  void zero_grad();

  long step_count() const { return step_; }
  void set_step_count(long s) { step_ = s; }
  /// Adam moments of parameter i (checkpointing).
  Tensor& exp_avg(std::size_t i) { return m_[i]; }
  Tensor& exp_avg_sq(std::size_t i) { return v_[i]; }
  const ParameterList& params() const { return params_; }
  /// Bytes of optimizer state held by this rank (moments).
  std::size_t state_bytes() const;

  /// Reductions 1-3 of the file comment (exposed for tests).
  void reduce_gradients(OptimizerGroups& groups);
  /// Global gradient L2 norm over the grid (reduction 4).
  double global_grad_norm(OptimizerGroups& groups) const;

 private:
  ParameterList params_;
  AdamWConfig config_;
  Parameter* tied_head_copy_;  ///< Not owned.
  std::vector<Tensor> m_, v_;
  long step_ = 0;
};

}  // namespace meshtron
