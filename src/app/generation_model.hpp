// What `meshtron generate` and `meshtron serve` share: the deck's model
// built under its layout with the weights of checkpoint.load, and the
// decoding settings of the [generate] section.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "config/run_config.hpp"
#include "data/tokenizer.hpp"
#include "generate/generator.hpp"
#include "generate/t5_generator.hpp"
#include "train/trainer_checkpoint.hpp"
#include "model/model_spec.hpp"
#include "train/runtime.hpp"
#include "train/trainer.hpp"

namespace meshtron::app {

/// Generation keeps no activations for a backward: no sequence
/// parallelism, no recompute; one prompt batch is the micro-batch.
RunConfig for_generation(RunConfig c);

/// T5's decoder start (= pad) and eos ids: the SentencePiece model's
/// (data::t5_special_tokens), else transformers' T5 defaults 0 and 1.
struct T5GenerationIds {
  std::int32_t pad = 0, eos = 1;
};
T5GenerationIds t5_generation_ids(const RunConfig& c, const data::Tokenizer* tok);

/// T5's generator over `trainer`'s model (its stage's T5Model, the
/// pipeline of `rt` split at parallel.pipeline_split_rank), the weights
/// read in place; `tok` (optional) gives the special ids.
std::unique_ptr<generate::T5Generator> make_t5_generator(const RunConfig& c, Trainer& trainer,
                                                         ParallelRuntime& rt, DType dtype,
                                                         const data::Tokenizer* tok);

/// The model of a validated (for_generation) deck on MPI_COMM_WORLD: a
/// decoder-only model (generator()), T5 (t5_generator(), on any tp x pp)
/// or BERT (trainer(): app/fill_mask.hpp).
class GenerationModel {
 public:
  /// `c` must outlive this object (the trainer keeps a reference). Not owned.
  GenerationModel(const RunConfig& c, int vocab);
  /// Reads the weights of `checkpoint` (collective) and makes the generator;
  /// `tok` (optional) gives T5's special ids.
  io::TrainState load(const std::string& checkpoint, const data::Tokenizer* tok = nullptr);
  /// The decoder-only generator; a UserError for T5 (`what` names the caller).
  generate::Generator& generator(const char* what = "this command");
  /// T5's generator, null for a decoder-only model and BERT.
  generate::T5Generator* t5_generator() { return t5_generator_.get(); }
  /// The model's trainer (BERT's fill-mask runs its evaluation schedule).
  Trainer& trainer() { return trainer_; }
  ParallelRuntime& runtime() { return rt_; }

 private:
  const RunConfig& config_;  ///< Not owned.
  ParallelRuntime rt_;
  ModelSpec model_;
  DType dtype_;
  Trainer trainer_;
  std::unique_ptr<generate::Generator> generator_;
  std::unique_ptr<generate::T5Generator> t5_generator_;
};

/// A text prompt's ids in `form` (commands.hpp's PromptForm; BOS as
/// preprocess starts documents). FillMask needs a BERT WordPiece tokenizer
/// (bert_special_ids' UserError otherwise).
std::vector<std::int32_t> text_prompt_ids(data::Tokenizer& tok, const std::string& text,
                                          PromptForm form = PromptForm::Continuation);

/// Every dp rank's lines (in the order each produced them) on every rank
/// of the dp group, rank 0's first.
std::vector<std::string> gather_lines(const std::vector<std::string>& mine, Communicator& dp);
/// Rank `root`'s lines on every rank of `group`.
std::vector<std::string> broadcast_lines(const std::vector<std::string>& lines, Communicator& group,
                                         int root);

/// The text of generated ids.
using TextDecode = std::function<std::string(const std::vector<std::int32_t>&)>;
/// The run's: `tok`'s decode (not owned; must outlive the result), under
/// T5 data::t5_decode (appended sentinels spelled <extra_id_N>); empty
/// without a tokenizer.
TextDecode text_decode(const RunConfig& c, const data::Tokenizer* tok);

/// True once the text of the generated ids (through `decode`) holds one of
/// `strings`; empty `strings`: no predicate. The same answer on every rank.
std::function<bool(const std::vector<std::int32_t>&)> stop_strings_predicate(
    std::function<std::string(const std::vector<std::int32_t>&)> decode,
    std::vector<std::string> strings);

/// The decoding settings of the [generate] section (stop_ids resolved
/// through `tok`, stop strings matched in `decode`'s text, the run's
/// text_decode; UserError on a bad one).
/// Without a tokenizer, "eod" in stop_ids means `eod` when >= 0 (T5's eos).
generate::GenerateParams generate_params(const GenerateSection& g, const data::Tokenizer* tok,
                                         const TextDecode& decode, int vocab,
                                         std::int32_t eod = -1);

}  // namespace meshtron::app
