// logging.sample_interval (llm.c's samples during training): every N steps
// the model continues a few fixed prompts greedily and world rank 0 prints
// one line per prompt,
//
//    sample | step 200 | prompt 0 | " the first time in the history of"
//
// the continuation as a JSON string through the run's tokenizer (its ids
// without one). Prompts: logging.sample_prompts (JSONL as generate.prompts)
// or one prompt of the EOD token. Greedy decoding draws no random numbers
// and the cached forward leaves the layers' training state alone, so the
// run's losses are the same with or without samples.
#pragma once

#include <memory>
#include <vector>

#include "config/run_config.hpp"
#include "data/tokenizer.hpp"
#include "generate/generator.hpp"
#include "train/trainer.hpp"

namespace meshtron::app {

class TrainingSamples {
 public:
  /// Reads the prompts; a prompt that leaves no position to generate into
  /// is a UserError. `trainer` and `rt` are not owned.
  TrainingSamples(const RunConfig& c, Trainer& trainer, ParallelRuntime& rt, int vocab);
  /// Collective over the world (every dp replica decodes the same prompts).
  void print(long step);

 private:
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::vector<std::vector<std::int32_t>> prompts_;
  std::vector<int> new_tokens_;  ///< per prompt: sample_tokens, or what the context leaves
  Trainer& trainer_;             ///< Not owned.
  ParallelRuntime& rt_;          ///< Not owned.
  DType dtype_;
};

}  // namespace meshtron::app
