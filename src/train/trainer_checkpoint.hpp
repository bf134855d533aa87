// A Trainer's whole state in a checkpoint (io/checkpoint.hpp), and back:
// parameters, Adam moments, the optimizer's step count, the fp16 loss scale.
//
// Under bf16/fp16 the parameters saved are the optimizer's fp32 master
// weights (gathered over dp for the distributed optimizer), not the 16-bit
// compute copies; a load sets the master from them and each 16-bit value to
// its rounding, as a step does. So a resumed run repeats the uninterrupted
// one bit for bit (DESIGN.md §3, invariant 3) in every precision, and the
// file keeps the global fp32 layout any tp/pp/dp can load. In fp32 the
// values are their own master and the file is as before.
#pragma once

#include <string>

#include "io/checkpoint.hpp"
#include "train/trainer.hpp"

namespace meshtron {

/// Write save_dir/iter_N.h5 for state.iteration (collective over the
/// world). `state` supplies iteration, consumed samples, seed, skipped
/// steps and deck text; the optimizer step and loss scale come from `trainer`.
void save_trainer_checkpoint(Trainer& trainer, const std::string& save_dir, io::TrainState state,
                             int keep_last);

/// Restore `trainer` from `path` (collective) and return the file's train
/// state (iteration, skipped steps, ...).
io::TrainState load_trainer_checkpoint(Trainer& trainer, const std::string& path);

/// Fine-tuning's load (Megatron's --finetune / --no-load-optim): only the
/// weights of `path`, which may hold no optimizer state (as `convert` writes
/// it), under trainer's decomposition; the optimizer stays fresh (zero
/// moments, step 0) with its fp32 master set from the file. Collective;
/// returns the file's train state for reporting only.
io::TrainState load_trainer_weights(Trainer& trainer, const std::string& path);

}  // namespace meshtron
