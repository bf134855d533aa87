#include "app/training_samples.hpp"

#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "common/error.hpp"

namespace meshtron::app {

namespace {

/// The EOD id: the tokenizer's, GPT-2's <|endoftext|> for its vocabulary,
/// else 0.
std::int32_t eod_id(const data::Tokenizer* tok, int vocab) {
  if (tok) return tok->eod_id();
  return vocab == kGpt2VocabSize ? kGpt2VocabSize - 1 : 0;
}

}  // namespace

TrainingSamples::TrainingSamples(const RunConfig& c, Trainer& trainer, ParallelRuntime& rt,
                                 int vocab)
    : tokenizer_(run_tokenizer(c)), trainer_(trainer), rt_(rt), dtype_(compute_dtype(c)) {
  const std::string& path = c.logging.sample_prompts;
  prompts_ = path.empty() ? std::vector<std::vector<std::int32_t>>{{eod_id(tokenizer_.get(), vocab)}}
                          : read_prompt_file(path, "logging.sample_prompts", tokenizer_.get(), vocab);
  const int positions = trainer.chunks().front()->config().max_positions;
  for (std::size_t i = 0; i < prompts_.size(); ++i) {
    const int room = positions - int(prompts_[i].size());
    MESH_REQUIRE(room > 0, "logging.sample_prompts: prompt " << i << " has " << prompts_[i].size()
                               << " tokens; the model has " << positions << " positions");
    new_tokens_.push_back(std::min(c.logging.sample_tokens, room));
  }
}

void TrainingSamples::print(long step) {
  const std::vector<GptModel*> chunks = trainer_.gpt_chunks();
  trainer_.parameters();  // completes an overlapped parameter all-gather
  generate::Generator generator(chunks, rt_, dtype_);
  for (std::size_t i = 0; i < prompts_.size(); ++i) {
    generate::GenerateParams p;
    p.max_new_tokens = new_tokens_[i];
    const auto r = generator.generate({{std::int64_t(i), prompts_[i]}}, p).front();
    if (rt_.topo.world_rank() != 0) continue;
    const nlohmann::json text = tokenizer_ ? nlohmann::json(tokenizer_->decode(r.ids))
                                           : nlohmann::json(r.ids);
    std::cout << " sample | step " << step << " | prompt " << i << " | "
              << text.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  }
}

}  // namespace meshtron::app
