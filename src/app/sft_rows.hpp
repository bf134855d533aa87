// data.source = jsonl: the rows of a JSON-lines file (docs/data.md,
// "Supervised fine-tuning"), tokenized at start-up with the run's tokenizer
// as generate tokenizes prompts (text_prompt_ids):
//
//   decoder  {"prompt": P, "completion": C}   context = BOS (where the
//            tokenizer has one) + P, target = C + EOD; the loss on the
//            target only (Megatron's SFT, TRL's completion-only loss)
//            {"text": T}                       target = BOS + T + EOD, all scored
//            {"prompt_ids": [...], "completion_ids": [...]}   as given
//   T5       {"input": I, "target": O}         context = I + </s>, target =
//            O + </s> (T5Tokenizer's ids, T5ForConditionalGeneration's labels)
//            {"input_ids": [...], "target_ids": [...]}         as given
//
// Every rank reads the whole file, so a missing or empty file, a line that
// is not JSON, a row of no known shape, a text row without a tokenizer or an
// id outside [0, vocab) is the same one-line UserError on every rank,
// naming the file and the line.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "data/tokenizer.hpp"
#include "train/sft_data.hpp"

namespace meshtron::app {

/// The rows of `path` (`key` names the setting in messages); `t5` picks the
/// T5 row shapes.
std::vector<SftExample> read_sft_rows(const std::string& path, const std::string& key, bool t5,
                                      data::Tokenizer* tokenizer, int vocab);

/// The rows of `path` fitted to the deck's lengths (SftSamples); `report`:
/// print their number and how many were cut on stdout.
std::shared_ptr<const SftSamples> sft_samples(const RunConfig& c, const std::string& path,
                                              const std::string& key, int vocab, bool report);

/// data.source = jsonl: data.path for training, data.valid_path (if set)
/// for validation.
std::unique_ptr<DataSource> make_jsonl_data(const RunConfig& c, const DataLayout& layout,
                                            int vocab, bool report);

}  // namespace meshtron::app
