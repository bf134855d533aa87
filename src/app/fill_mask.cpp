#include "app/fill_mask.hpp"

#include <algorithm>
#include <cmath>

#include "app/generation_model.hpp"
#include "common/error.hpp"
#include "data/bert_tokenizer.hpp"
#include "model/bert_model.hpp"
#include "model/embedding.hpp"
#include "train/bert_evaluation.hpp"

namespace meshtron::app {

namespace {

/// transformers' FillMaskPipeline top_k default.
constexpr int kDefaultTopK = 5;
/// generate::top_k_tokens' bound (ops::logit_candidates' on the device).
constexpr int kMaxTopK = 1024;

/// A prompt as a BERT sample of seq_length: token type 0, its own tokens
/// attended, the rest padding; each mask labelled (with the mask id: any
/// valid label) so that the MLM loss the forward also computes counts one.
data::BertSample prompt_sample(const std::vector<std::int32_t>& ids, std::int32_t mask_id,
                               std::int64_t seq_length) {
  const auto s = std::size_t(seq_length);
  data::BertSample x;
  x.tokens = ids;
  x.tokens.resize(s, 0);
  x.token_types.assign(s, 0);
  x.padding_mask.assign(s, 0);
  std::fill_n(x.padding_mask.begin(), ids.size(), 1);
  x.labels.assign(s, -100);
  x.loss_mask.assign(s, 0);
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == mask_id) x.labels[i] = mask_id, x.loss_mask[i] = 1;
  return x;
}

/// The results of micro-batch rows [first, first + b) that are prompts,
/// from the last stage's cache (prediction logits [s*b, V_pad/tp], row
/// position * b + j). Collective over tp.
std::vector<FillMaskResult> micro_batch_fills(const BertModel::Cache& cache, const ModelSpec& spec,
                                              TensorParallelGroup& tp, std::int64_t first,
                                              std::int64_t b,
                                              const std::vector<std::vector<std::int32_t>>& prompts,
                                              std::int32_t mask_id, int top_k) {
  const auto best = generate::top_k_tokens(BertModel::prediction_logits(cache),
                                           vocab_begin(spec, tp), spec.vocab_size, top_k, tp.comm);
  std::vector<FillMaskResult> out;
  for (std::int64_t j = 0; j < b && first + j < std::int64_t(prompts.size()); ++j) {
    FillMaskResult r{first + j, prompts[std::size_t(first + j)], {}};
    for (std::size_t p = 0; p < r.prompt.size(); ++p)
      if (r.prompt[p] == mask_id)
        r.masks.push_back({std::int64_t(p), best[std::size_t(std::int64_t(p) * b + j)]});
    out.push_back(std::move(r));
  }
  return out;
}

/// A result as one line between ranks (log-probabilities exact: nlohmann
/// writes doubles round-trip).
std::string to_line(const FillMaskResult& r) {
  nlohmann::json masks = nlohmann::json::array();
  for (const MaskFill& m : r.masks) {
    nlohmann::json ids = nlohmann::json::array(), logprobs = nlohmann::json::array();
    for (const auto& t : m.tokens) ids.push_back(t.id), logprobs.push_back(t.logprob);
    masks.push_back({{"position", m.position}, {"ids", ids}, {"logprobs", logprobs}});
  }
  return nlohmann::json{{"index", r.index}, {"prompt", r.prompt}, {"masks", masks}}.dump();
}

FillMaskResult from_line(const std::string& line) {
  const auto j = nlohmann::json::parse(line);
  FillMaskResult r{j["index"].get<std::int64_t>(), j["prompt"].get<std::vector<std::int32_t>>(), {}};
  for (const auto& m : j["masks"]) {
    MaskFill fill{m["position"].get<std::int64_t>(), {}};
    for (std::size_t k = 0; k < m["ids"].size(); ++k)
      fill.tokens.push_back({m["ids"][k].get<std::int32_t>(), m["logprobs"][k].get<double>()});
    r.masks.push_back(std::move(fill));
  }
  return r;
}

/// The last stage's lines on every stage, then every dp replica's on every
/// rank, as results in prompt order.
std::vector<FillMaskResult> share_results(const std::vector<FillMaskResult>& mine,
                                          ParallelRuntime& rt, std::size_t count) {
  std::vector<std::string> lines;
  for (const auto& r : mine) lines.push_back(to_line(r));
  lines = gather_lines(broadcast_lines(lines, rt.pp, rt.pp.size() - 1), rt.dp);
  std::vector<FillMaskResult> out(count);
  for (const auto& l : lines) {
    FillMaskResult r = from_line(l);
    out[std::size_t(r.index)] = std::move(r);
  }
  return out;
}

}  // namespace

int fill_mask_top_k(const GenerateSection& g) {
  const int k = g.top_k == 0 ? kDefaultTopK : g.top_k;
  MESH_REQUIRE(k >= 1 && k <= kMaxTopK,
               "generate.top_k = " << g.top_k << ": fill-mask takes 1 to " << kMaxTopK
                                   << " tokens a mask (0: " << kDefaultTopK << ")");
  return k;
}

void require_fill_mask_prompts(const std::vector<std::vector<std::int32_t>>& prompts,
                               std::int32_t mask_id, std::int64_t seq_length,
                               const std::string& key) {
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    MESH_REQUIRE(std::find(p.begin(), p.end(), mask_id) != p.end(),
                 key << ": prompt " << i << " holds no [MASK] (id " << mask_id
                     << "); fill-mask predicts the masked tokens of a BERT prompt");
    MESH_REQUIRE(std::int64_t(p.size()) <= seq_length,
                 key << ": prompt " << i << " has " << p.size()
                     << " tokens; model.seq_length = " << seq_length);
  }
}

std::vector<FillMaskResult> fill_mask(Trainer& trainer, const RunConfig& c,
                                      const std::vector<std::vector<std::int32_t>>& prompts,
                                      std::int32_t mask_id, int top_k) {
  ParallelRuntime& rt = trainer.runtime();
  const ModelSpec& spec = trainer.chunks().front()->config();
  const DataLayout layout{c.model.seq_length, c.training.micro_batch_size,
                          c.training.global_batch_size, rt.topo.dp_rank(), rt.topo.dp(), 0, 0,
                          c.run.seed};
  std::vector<data::BertSample> samples;
  for (const auto& p : prompts) samples.push_back(prompt_sample(p, mask_id, layout.seq_length));
  trainer.parameters();  // completes an overlapped parameter all-gather
  std::vector<FillMaskResult> mine;
  evaluate_bert_samples(trainer, samples, layout,
                        [&](std::int64_t first, const BertModel::Cache& cache) {
                          for (auto& r : micro_batch_fills(cache, spec, rt.tp_group, first,
                                                           layout.micro_batch, prompts, mask_id,
                                                           top_k))
                            mine.push_back(std::move(r));
                        });
  return share_results(mine, rt, prompts.size());
}

nlohmann::json fill_mask_json(const FillMaskResult& r, const data::Tokenizer& tok) {
  const data::BertSpecialIds& special = data::bert_special_ids(tok);
  std::vector<std::int32_t> filled = r.prompt;
  nlohmann::json masks = nlohmann::json::array();
  for (const MaskFill& m : r.masks) {
    nlohmann::json tokens = nlohmann::json::array();
    for (const auto& t : m.tokens)
      tokens.push_back({{"id", t.id}, {"token", tok.decode(std::vector<std::int32_t>{t.id})},
                        {"score", std::exp(t.logprob)}});
    masks.push_back({{"position", m.position}, {"tokens", tokens}});
    if (!m.tokens.empty()) filled[std::size_t(m.position)] = m.tokens.front().id;
  }
  std::erase_if(filled, [&](std::int32_t id) {
    return id == special.cls || id == special.sep || id == special.pad;
  });
  return {{"index", r.index}, {"prompt_ids", r.prompt}, {"masks", masks},
          {"text", tok.decode(filled)}};
}

}  // namespace meshtron::app
