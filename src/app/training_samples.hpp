// logging.sample_interval (llm.c's samples during training): every N steps
// world rank 0 prints one line per fixed prompt, by model family:
//
//   GPT   the greedy continuation of the prompt,
//           sample | step 200 | prompt 0 | " the first time in the history of"
//   T5    the encoder input -> the decoder's greedy output (T5Generator over
//         the training layout; sentinels spelled <extra_id_N>),
//           sample | step 200 | prompt 0 | "The <extra_id_0> walks." -> "<extra_id_0> dog"
//   BERT  the prompt with each [MASK] filled by its best token, then each
//         mask's top tokens and probabilities (app/fill_mask.hpp),
//           sample | step 200 | prompt 0 | "paris is the capital of france ." |
//             mask 1: "paris" 0.412, "london" 0.101, ...
//
// Text through the run's tokenizer (ids without one, GPT and T5). Prompts:
// logging.sample_prompts (JSONL as generate.prompts: text through the
// tokenizer in the family's form, or ids) or built-in ones: the EOD token
// (GPT), T5's </s> alone, or three sentences with a [MASK] (BERT, "the
// capital of france is [MASK] ." first; [MASK] needs the WordPiece
// tokenizer). The models are the
// trainer's own (no copy of the weights); greedy decoding and the
// evaluation forward draw no random numbers and leave the layers' training
// state alone, so the run's losses are the same with or without samples.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "app/generation_model.hpp"
#include "config/run_config.hpp"
#include "data/tokenizer.hpp"
#include "train/trainer.hpp"

namespace meshtron::app {

class TrainingSamples {
 public:
  /// Reads the prompts; a prompt that leaves no position to generate into
  /// (GPT), or holds no [MASK] or more tokens than model.seq_length (BERT),
  /// is a UserError. `c`, `trainer` and `rt` are not owned.
  TrainingSamples(const RunConfig& c, Trainer& trainer, ParallelRuntime& rt, int vocab);
  /// Collective over the world (every dp replica runs the same prompts).
  void print(long step);

 private:
  void read_prompts(int vocab);
  void print_gpt(long step);
  void print_t5(long step);
  void print_bert(long step);
  /// World rank 0 prints " sample | step S | prompt I | body".
  void print_line(long step, std::size_t prompt, const std::string& body) const;
  /// `ids` as a JSON string of their text, or a JSON array without a tokenizer.
  std::string quoted(const std::vector<std::int32_t>& ids) const;

  const RunConfig& c_;  ///< Not owned.
  std::unique_ptr<data::Tokenizer> tokenizer_;
  TextDecode decode_;
  std::vector<std::vector<std::int32_t>> prompts_;
  std::vector<int> new_tokens_;  ///< GPT, per prompt: sample_tokens, or what the context leaves
  Trainer& trainer_;             ///< Not owned.
  ParallelRuntime& rt_;          ///< Not owned.
  DType dtype_;
};

}  // namespace meshtron::app
