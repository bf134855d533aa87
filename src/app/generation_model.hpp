// What `meshtron generate` and `meshtron serve` share: the deck's model
// built under its layout with the weights of checkpoint.load, and the
// decoding settings of the [generate] section.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "data/tokenizer.hpp"
#include "generate/generator.hpp"
#include "train/trainer_checkpoint.hpp"
#include "model/model_spec.hpp"
#include "train/runtime.hpp"
#include "train/trainer.hpp"

namespace meshtron::app {

/// Generation keeps no activations for a backward: no sequence
/// parallelism, no recompute; one prompt batch is the micro-batch.
RunConfig for_generation(RunConfig c);

/// The model of a validated (for_generation) deck on MPI_COMM_WORLD.
class GenerationModel {
 public:
  /// `c` must outlive this object (the trainer keeps a reference). Not owned.
  GenerationModel(const RunConfig& c, int vocab);
  /// Reads the weights of `checkpoint` (collective) and makes the generator.
  io::TrainState load(const std::string& checkpoint);
  generate::Generator& generator() { return *generator_; }
  ParallelRuntime& runtime() { return rt_; }

 private:
  ParallelRuntime rt_;
  ModelSpec model_;
  DType dtype_;
  Trainer trainer_;
  std::unique_ptr<generate::Generator> generator_;
};

/// A text prompt's ids: the tokenizer's BOS (when it uses one, as
/// preprocess starts documents) and the text's ids.
std::vector<std::int32_t> text_prompt_ids(data::Tokenizer& tok, const std::string& text);

/// True once the text of the generated ids (through `decode`) holds one of
/// `strings`; empty `strings`: no predicate. The same answer on every rank.
std::function<bool(const std::vector<std::int32_t>&)> stop_strings_predicate(
    std::function<std::string(const std::vector<std::int32_t>&)> decode,
    std::vector<std::string> strings);

/// The decoding settings of the [generate] section (stop_ids and stop
/// resolved through `tok`; UserError on a bad one).
generate::GenerateParams generate_params(const GenerateSection& g, const data::Tokenizer* tok,
                                         int vocab);

}  // namespace meshtron::app
