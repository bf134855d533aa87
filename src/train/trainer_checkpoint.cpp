#include "train/trainer_checkpoint.hpp"

#include <vector>

namespace meshtron {

namespace {

/// The optimizer's per-parameter state, gathered for the checkpoint.
struct FullState {
  std::vector<Tensor> exp_avg, exp_avg_sq, master;  ///< master empty in fp32
};

FullState gather_state(Trainer& trainer) {
  FullState s;
  OptimizerGroups groups = trainer.optimizer_groups();
  trainer.optimizer().full_state(s.exp_avg, s.exp_avg_sq, s.master, groups);
  return s;
}

/// Checkpoint entries for this rank's parameters. The last stage's copy of
/// the tied word table (and any other stage copy, Parameter::stage_copy) is
/// written by the first stage holding it only, but loaded by all.
std::vector<io::CheckpointTensor> checkpoint_tensors(Trainer& trainer, FullState& s,
                                                     bool saving) {
  std::vector<io::CheckpointTensor> out;
  const ParameterList params = trainer.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    bool head_copy = false;
    for (auto& chunk : trainer.chunks())
      head_copy |= !chunk->placement().has_embedding && chunk->head_word_weight() == params[i];
    if (saving && (head_copy || params[i]->stage_copy)) continue;
    Tensor* master = i < s.master.size() && s.master[i].defined() ? &s.master[i] : nullptr;
    out.push_back({params[i], &s.exp_avg[i], &s.exp_avg_sq[i], master});
  }
  return out;
}

}  // namespace

void save_trainer_checkpoint(Trainer& trainer, const std::string& save_dir, io::TrainState state,
                             int keep_last) {
  FullState s = gather_state(trainer);
  state.optimizer_step = trainer.optimizer().step_count();
  DynamicLossScaler* scaler = trainer.loss_scaler();
  state.loss_scale = scaler ? scaler->scale() : 1.0;  // the next step's scale
  state.loss_scale_good_steps = scaler ? scaler->good_steps_in_a_row() : 0;
  io::save_checkpoint(save_dir, trainer.runtime().topo, checkpoint_tensors(trainer, s, true),
                      state, keep_last);
}

namespace {

/// Load `path` into `trainer`: the weights, and the Adam moments when
/// `load_optimizer` (otherwise the moments keep the fresh optimizer's zeros).
io::TrainState load_into(Trainer& trainer, const std::string& path, bool load_optimizer) {
  FullState s = gather_state(trainer);  // tensors of the right shapes to load into
  io::TrainState state;
  io::load_checkpoint(path, trainer.runtime().topo, checkpoint_tensors(trainer, s, false), state,
                      load_optimizer);
  trainer.optimizer().load_full_state(s.exp_avg, s.exp_avg_sq, s.master);
  return state;
}

}  // namespace

io::TrainState load_trainer_weights(Trainer& trainer, const std::string& path) {
  return load_into(trainer, path, /*load_optimizer=*/false);
}

io::TrainState load_trainer_checkpoint(Trainer& trainer, const std::string& path) {
  const io::TrainState state = load_into(trainer, path, /*load_optimizer=*/true);
  trainer.optimizer().set_step_count(state.optimizer_step);
  if (DynamicLossScaler* scaler = trainer.loss_scaler())
    scaler->restore(state.loss_scale, state.loss_scale_good_steps);
  return state;
}

}  // namespace meshtron
