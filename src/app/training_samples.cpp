#include "app/training_samples.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/fill_mask.hpp"
#include "common/error.hpp"
#include "data/bert_tokenizer.hpp"
#include "generate/generator.hpp"

namespace meshtron::app {

namespace {

/// The EOD id: the tokenizer's, GPT-2's <|endoftext|> for its vocabulary,
/// else 0.
std::int32_t eod_id(const data::Tokenizer* tok, int vocab) {
  if (tok) return tok->eod_id();
  return vocab == kGpt2VocabSize ? kGpt2VocabSize - 1 : 0;
}

/// BERT's built-in prompts: sentences whose blanks a trained model fills.
constexpr const char* kBertPrompts[] = {"the capital of france is [MASK] .",
                                        "the man worked as a [MASK] .",
                                        "she went to the [MASK] to buy some milk ."};

/// The [MASK] id of the run's tokenizer (a UserError without a WordPiece one).
std::int32_t mask_id(const data::Tokenizer* tok) {
  MESH_REQUIRE(tok, "model.arch = bert: logging.sample_interval (fill-mask) needs the run's "
                    "WordPiece tokenizer (data.tokenizer = bert_wordpiece_lowercase or "
                    "bert_wordpiece_cased)");
  return data::bert_special_ids(*tok).mask;
}

std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

TrainingSamples::TrainingSamples(const RunConfig& c, Trainer& trainer, ParallelRuntime& rt,
                                 int vocab)
    : c_(c),
      tokenizer_(run_tokenizer(c)),
      decode_(text_decode(c, tokenizer_.get())),
      trainer_(trainer),
      rt_(rt),
      dtype_(compute_dtype(c)) {
  read_prompts(vocab);
  if (c.model.arch == "bert")
    require_fill_mask_prompts(prompts_, mask_id(tokenizer_.get()), c.model.seq_length,
                              "logging.sample_prompts");
  if (prompt_form(c) != PromptForm::Continuation) return;
  const int positions = trainer.chunks().front()->config().max_positions;
  for (std::size_t i = 0; i < prompts_.size(); ++i) {
    const int room = positions - int(prompts_[i].size());
    MESH_REQUIRE(room > 0, "logging.sample_prompts: prompt " << i << " has " << prompts_[i].size()
                               << " tokens; the model has " << positions << " positions");
    new_tokens_.push_back(std::min(c.logging.sample_tokens, room));
  }
}

void TrainingSamples::read_prompts(int vocab) {
  const PromptForm form = prompt_form(c_);
  const std::string& path = c_.logging.sample_prompts;
  if (!path.empty()) {
    prompts_ = read_prompt_file(path, "logging.sample_prompts", tokenizer_.get(), vocab, form);
  } else if (form == PromptForm::FillMask) {
    mask_id(tokenizer_.get());  // the WordPiece tokenizer's UserError first
    for (const char* text : kBertPrompts) prompts_.push_back(text_prompt_ids(*tokenizer_, text, form));
  } else if (form == PromptForm::EncoderInput) {
    prompts_ = {{t5_generation_ids(c_, tokenizer_.get()).eos}};
  } else {
    prompts_ = {{eod_id(tokenizer_.get(), vocab)}};
  }
}

void TrainingSamples::print(long step) {
  trainer_.parameters();  // completes an overlapped parameter all-gather
  switch (prompt_form(c_)) {
    case PromptForm::EncoderInput: return print_t5(step);
    case PromptForm::FillMask: return print_bert(step);
    case PromptForm::Continuation: return print_gpt(step);
  }
}

void TrainingSamples::print_gpt(long step) {
  generate::Generator generator(trainer_.gpt_chunks(), rt_, dtype_);
  for (std::size_t i = 0; i < prompts_.size(); ++i) {
    generate::GenerateParams p;
    p.max_new_tokens = new_tokens_[i];
    const auto r = generator.generate({{std::int64_t(i), prompts_[i]}}, p).front();
    print_line(step, i, quoted(r.ids));
  }
}

void TrainingSamples::print_t5(long step) {
  const auto generator = make_t5_generator(c_, trainer_, rt_, dtype_, tokenizer_.get());
  generate::GenerateParams p;
  p.max_new_tokens = c_.logging.sample_tokens;
  p.stop_ids = {t5_generation_ids(c_, tokenizer_.get()).eos};
  for (std::size_t i = 0; i < prompts_.size(); ++i) {
    const auto r = generator->generate({{std::int64_t(i), prompts_[i]}}, p).front();
    print_line(step, i, quoted(prompts_[i]) + " -> " + quoted(r.ids));
  }
}

void TrainingSamples::print_bert(long step) {
  const auto results = fill_mask(trainer_, c_, prompts_, mask_id(tokenizer_.get()),
                                 fill_mask_top_k(c_.generate));
  for (std::size_t i = 0; i < results.size(); ++i) {
    const nlohmann::json j = fill_mask_json(results[i], *tokenizer_);
    std::string body = json_text(j["text"]);
    for (const auto& m : j["masks"]) {
      body += " | mask " + std::to_string(m["position"].get<long>()) + ":";
      const char* separator = " ";
      for (const auto& t : m["tokens"]) {
        char score[32];
        std::snprintf(score, sizeof score, " %.3g", t["score"].get<double>());
        body += separator + json_text(t["token"]) + score;
        separator = ", ";
      }
    }
    print_line(step, i, body);
  }
}

void TrainingSamples::print_line(long step, std::size_t prompt, const std::string& body) const {
  if (rt_.topo.world_rank() != 0) return;
  std::cout << " sample | step " << step << " | prompt " << prompt << " | " << body << std::endl;
}

std::string TrainingSamples::quoted(const std::vector<std::int32_t>& ids) const {
  return decode_ ? json_text(decode_(ids)) : json_text(ids);
}

}  // namespace meshtron::app
