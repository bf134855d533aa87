// Every layout of a deck's model on a number of GPUs, ranked: `meshtron
// plan --search`. A layout is the deck with other (tp, pp, dp, virtual
// stages, micro-batch, recompute, SP; T5's encoder-decoder split
// parallel.pipeline_split_rank) and is valid exactly when the trainer
// would accept it: RunConfig::validate and the schedule's own checks
// (train/schedule.cpp) decide, not a copy of their rules.
#pragma once

#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "model/model_spec.hpp"
#include "plan/memory.hpp"
#include "plan/step_time.hpp"

namespace meshtron::plan {

struct Candidate {
  RunConfig config;
  ModelSpec model;        ///< padded for this layout's tp
  double peak_bytes = 0;  ///< the largest rank's
  bool fits = false;
  StepEstimate step;
};

/// The deck `base` (with its global batch) on `gpus` ranks of `memory_bytes`
/// each: valid layouts, those that fit first, then by step time.
/// `vocab_size`: the unpadded vocabulary.
std::vector<Candidate> search_layouts(const RunConfig& base, int vocab_size, int gpus,
                                      double memory_bytes, const Rates& rates, int gpus_per_node);

/// "tp 2 pp 1 dp 4 v 1 mb 2 recompute selective sp on" (T5 over stages:
/// "... split 1")
std::string layout_name(const RunConfig& c);
/// Why `best` ranks above `next`, one line per reason that differs.
std::string why_better(const Candidate& best, const Candidate& next);

}  // namespace meshtron::plan
