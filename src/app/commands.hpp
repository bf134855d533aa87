// Subcommands of the meshtron executable. Each takes the arguments after the
// command name and returns the process exit status; user errors throw
// meshtron::UserError on every rank alike.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "data/tokenizer.hpp"
#include "model/model_spec.hpp"
#include "tensor/types.hpp"

namespace meshtron::app {

/// DECK... [--set k=v ...]: the decks and their overrides. The decks are the
/// arguments before the first flag other than --set; later decks override
/// earlier ones, and the overrides all decks (RunConfig::from_files).
struct DeckArgs {
  std::vector<std::string> decks;
  std::vector<std::string> overrides;
  std::vector<std::string> rest;  ///< other flags and their values, for the command to read
};
DeckArgs parse_deck_args(const std::vector<std::string>& args);
/// The decks and overrides of `args`, parsed (not validated); "`command`:
/// missing DECK argument" without a deck.
RunConfig read_decks(const DeckArgs& args, const std::string& command);

/// GPT-2's vocabulary (encoder.json), before padding.
inline constexpr int kGpt2VocabSize = 50257;
/// Vocabulary size: the deck's, else the tokenizer's, else GPT-2's.
int resolve_vocab(const RunConfig& c);
/// The type and files of the deck's tokenizer (data.tokenizer, ...).
data::TokenizerFiles tokenizer_files(const DataSection& d);
/// The deck's tokenizer: the one place the subcommands get it.
std::unique_ptr<data::Tokenizer> load_tokenizer(const DataSection& d);
/// Dtype of the parameter values and activations: fp32, or bf16 / fp16
/// mixed precision on the GPU (fp32 master weights, moments and gradients
/// live in the optimizer and Parameter::grad; see train/optimizer.hpp; fp16
/// adds dynamic loss scaling, train/loss_scaler.hpp).
DType compute_dtype(const RunConfig& c);
/// " > layers per pipeline chunk: 19,17 (balanced; ...)\n" for a validated
/// deck with more than one model chunk (pp x virtual_stages), else "" (info,
/// train's banner): the split the trainer makes of `model`.
std::string pipeline_split_line(const RunConfig& c, const ModelSpec& model);

/// A one-line UserError naming the first architecture key (layers, sizes,
/// heads, positions, vocabulary, norm epsilon) where `deck` differs from the
/// deck stored in the checkpoint at `checkpoint_path`; nothing when that
/// text is empty (files written without one).
void require_same_model(const RunConfig& deck, const std::string& checkpoint_deck_text,
                        const std::string& checkpoint_path);

/// The checkpoint file checkpoint.load names (auto: the latest in
/// checkpoint.save_dir); a UserError "`command` needs checkpoint.load ..."
/// when there is none.
std::string checkpoint_to_load(const RunConfig& c, const std::string& command);

/// What a text prompt becomes (text_prompt_ids): a decoder-only model's
/// prompt (the tokenizer's BOS when it uses one, then the text), T5's
/// encoder input (the text and EOD, no BOS, as transformers' T5Tokenizer
/// ends it with </s>), or BERT's fill-mask input ([CLS] text [SEP], each
/// "[MASK]" of the text the [MASK] id, as BertTokenizer keeps it whole).
enum class PromptForm { Continuation, EncoderInput, FillMask };
/// The form of the deck's model.arch.
PromptForm prompt_form(const RunConfig& c);

/// The prompts of a JSONL file, one {"text": ...} (through `tokenizer` in
/// `form`; none: a UserError) or {"ids": [...]} (as they are) a line; a
/// malformed line, an id outside [0, vocab) or an empty prompt is a
/// UserError naming file:line. `key` names the setting in messages.
std::vector<std::vector<std::int32_t>> read_prompt_file(
    const std::string& path, const std::string& key, data::Tokenizer* tokenizer, int vocab,
    PromptForm form = PromptForm::Continuation);
/// The run's tokenizer (data.tokenizer and its files), or null when the
/// deck names none: the one place that picks it.
std::unique_ptr<data::Tokenizer> run_tokenizer(const RunConfig& c);

int run_info(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
int run_evaluate(const std::vector<std::string>& args);
int run_generate(const std::vector<std::string>& args);
int run_serve(const std::vector<std::string>& args);
int run_preprocess(const std::vector<std::string>& args);
int run_inspect(const std::vector<std::string>& args);
int run_convert(const std::vector<std::string>& args);
int run_jobscript(const std::vector<std::string>& args);
int run_scaling_report(const std::vector<std::string>& args);
int run_plan(const std::vector<std::string>& args);

}  // namespace meshtron::app
