// BERT's fill-mask, as transformers' pipeline("fill-mask") gives it: for
// each [MASK] of a prompt, the masked-LM head's top k tokens with their
// probabilities (softmax of the prediction logits over the whole
// vocabulary), and the prompt with each mask filled by its best token.
// `meshtron generate` writes one JSON line a prompt,
//
//   {"index": 0, "prompt_ids": [101, 1996, ..., 103, 1012, 102],
//    "masks": [{"position": 6, "tokens": [{"id": 3000, "token": "paris",
//               "score": 0.41}, ...]}],
//    "text": "the capital of france is paris ."}
//
// and logging.sample_interval prints the same of a few fixed prompts.
//
// The prompts run through the trainer's evaluation schedule (any tp x pp x
// dp, no dropout) in whole batches of the deck's layout, each padded to
// model.seq_length with its padding keys masked (train/bert_evaluation.hpp).
// The last stage takes each mask row's top k over the vocab-parallel logits
// with generate::top_k_tokens (each tp rank's best k merged, never the whole
// vocabulary on one rank) and passes them to the other stages; the dp
// replicas then exchange theirs, so every rank holds every result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/run_config.hpp"
#include "data/tokenizer.hpp"
#include "generate/sampler.hpp"
#include "train/trainer.hpp"

namespace meshtron::app {

/// One [MASK]: its position in the prompt and the k best tokens
/// (TokenChoice::logprob: log of the probability), best first.
struct MaskFill {
  std::int64_t position = 0;
  std::vector<generate::TokenChoice> tokens;
};

struct FillMaskResult {
  std::int64_t index = 0;  ///< the prompt's
  std::vector<std::int32_t> prompt;
  std::vector<MaskFill> masks;
};

/// Tokens per mask: generate.top_k, or transformers' default 5 when it is 0.
int fill_mask_top_k(const GenerateSection& g);

/// Every prompt holds a [MASK] (`mask_id`) and fits model.seq_length: a
/// UserError naming `key` and the prompt otherwise.
void require_fill_mask_prompts(const std::vector<std::vector<std::int32_t>>& prompts,
                               std::int32_t mask_id, std::int64_t seq_length,
                               const std::string& key);

/// Every prompt's result, in prompt order, on every rank. Collective over
/// the world.
std::vector<FillMaskResult> fill_mask(Trainer& trainer, const RunConfig& c,
                                      const std::vector<std::vector<std::int32_t>>& prompts,
                                      std::int32_t mask_id, int top_k);

/// The JSON line of a result (the layout above): each token spelled by
/// `tok`, "score" its probability, "text" the prompt with the best fills
/// decoded without [CLS], [SEP] and [PAD].
nlohmann::json fill_mask_json(const FillMaskResult& r, const data::Tokenizer& tok);

}  // namespace meshtron::app
