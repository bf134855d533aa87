#include "train/bert_evaluation.hpp"

#include <algorithm>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "data/json_line.hpp"
#include "train/trainer.hpp"

namespace meshtron {

namespace {

using data::read_int_field;

/// One line's row, or nullopt with `why` set.
std::optional<BertEvalRow> row_of_line(const std::string& line, std::int64_t seq_length,
                                       int vocab, int num_token_types, std::string& why) {
  const std::optional<nlohmann::json> value = data::parse_json_line(line, why);
  if (!value) return std::nullopt;
  const auto ids = value->is_object() ? value->find("input_ids") : value->end();
  if (!value->is_object() || ids == value->end() || !ids->is_array()) {
    why = "expected {\"input_ids\": [...], ...}, found " + value->dump().substr(0, 40);
    return std::nullopt;
  }
  const std::size_t n = ids->size(), s = std::size_t(seq_length);
  if (n < 1 || n > s) {
    why = MESH_MSG(n << " input_ids; a row needs 1 to model.seq_length = " << seq_length);
    return std::nullopt;
  }
  BertEvalRow r;
  data::BertSample& x = r.sample;
  x.tokens.assign(n, 0);
  x.token_types.assign(n, 0);
  x.padding_mask.assign(n, 1);
  x.labels.assign(n, -100);
  for (const std::string& e :
       {read_int_field(*value, {"input_ids", 0, vocab, false, true}, n, x.tokens),
        read_int_field(*value, {"token_type_ids", 0, num_token_types, false, false}, n,
                       x.token_types),
        read_int_field(*value, {"attention_mask", 0, 2, false, false}, n, x.padding_mask),
        read_int_field(*value, {"labels", 0, vocab, true, false}, n, x.labels)})
    if (why.empty()) why = e;
  const auto next = value->find("next_sentence_label");
  r.has_next_sentence = next != value->end();
  if (why.empty() && r.has_next_sentence) {
    if (*next == 0 || *next == 1) x.is_random = next->get<std::int32_t>();
    else why = "next_sentence_label = " + next->dump() + " is not 0 or 1";
  }
  if (why.empty() && std::find(x.padding_mask.begin(), x.padding_mask.end(), 1) ==
                         x.padding_mask.end())
    why = "attention_mask has no 1 (no real token)";
  if (!why.empty()) return std::nullopt;
  x.tokens.resize(s, 0);
  x.token_types.resize(s, 0);
  x.padding_mask.resize(s, 0);
  x.labels.resize(s, -100);
  x.loss_mask.assign(s, 0);
  for (std::size_t i = 0; i < s; ++i) x.loss_mask[i] = x.labels[i] != -100;
  return r;
}

/// A slot past the last row: one real token, no label, not counted.
BertEvalRow filler_row(std::int64_t seq_length) {
  BertEvalRow r;
  const auto s = std::size_t(seq_length);
  r.sample.tokens.assign(s, 0);
  r.sample.token_types.assign(s, 0);
  r.sample.labels.assign(s, -100);
  r.sample.loss_mask.assign(s, 0);
  r.sample.padding_mask.assign(s, 0);
  r.sample.padding_mask[0] = 1;
  return r;
}

}  // namespace

std::vector<BertEvalRow> bert_jsonl_rows(const std::string& path, std::int64_t seq_length,
                                         int vocab, int num_token_types) {
  std::ifstream in(path);
  MESH_REQUIRE(in.good(), "evaluate.inputs: cannot open '" << path << "'");
  std::vector<BertEvalRow> rows;
  std::string line, why;
  for (long number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::optional<BertEvalRow> row = row_of_line(line, seq_length, vocab, num_token_types, why);
    MESH_REQUIRE(row, "evaluate.inputs " << path << " line " << number << ": " << why);
    rows.push_back(std::move(*row));
  }
  MESH_REQUIRE(!rows.empty(), "evaluate.inputs " << path << " holds no {\"input_ids\": [...]} row");
  return rows;
}

void evaluate_bert_samples(Trainer& trainer, const std::vector<data::BertSample>& samples,
                           const DataLayout& layout, const BertHeadFn& on_head) {
  const data::BertSample filler = filler_row(layout.seq_length).sample;
  const auto count = std::int64_t(samples.size());
  for (std::int64_t start = 0; start < count; start += layout.global_batch) {
    std::vector<std::int64_t> firsts;
    std::vector<MicroBatch> batch;
    for (index_t m = 0; m < layout.micro_batches(); ++m) {
      const std::int64_t first = start + layout.sample_offset(m);
      std::vector<data::BertSample> rows;
      for (index_t j = 0; j < layout.micro_batch; ++j)
        rows.push_back(first + j < count ? samples[std::size_t(first + j)] : filler);
      firsts.push_back(first);
      batch.push_back(bert_micro_batch(rows, first));
    }
    trainer.evaluate_heads(batch, [&](int m, const StageCache& cache) {
      on_head(firsts[std::size_t(m)], static_cast<const BertModel::Cache&>(cache));
    });
  }
}

BertModel::Scores score_bert_rows(Trainer& trainer, const std::vector<BertEvalRow>& rows,
                                  const DataLayout& layout) {
  std::vector<data::BertSample> samples;
  for (const BertEvalRow& r : rows) samples.push_back(r.sample);
  const auto count = std::int64_t(rows.size());
  BertModel::Scores sum;
  evaluate_bert_samples(trainer, samples, layout, [&](std::int64_t first, const BertModel::Cache& cache) {
    // Fillers have no labels: the MLM sums are the rows'. The binary
    // head's right answers are recounted over the rows that carry a label.
    const BertModel::Scores s = BertModel::scores(cache);
    sum.mlm_loss_sum += s.mlm_loss_sum;
    sum.labelled += s.labelled;
    const std::vector<double> logits = BertModel::binary_logits(cache).to_doubles();
    for (std::int64_t j = 0; j < layout.micro_batch && first + j < count; ++j) {
      const BertEvalRow& r = rows[std::size_t(first + j)];
      if (!r.has_next_sentence) continue;
      const int predicted = logits[2 * j + 1] > logits[2 * j] ? 1 : 0;
      sum.binary_correct += predicted == r.sample.is_random;
      sum.samples += 1;
    }
  });
  return sum;
}

}  // namespace meshtron
