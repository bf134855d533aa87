#include "train/t5_evaluation.hpp"

#include <algorithm>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "data/json_line.hpp"
#include "model/t5_model.hpp"
#include "train/trainer.hpp"

namespace meshtron {

namespace {

using data::read_int_field;

/// The number of entries of `row`'s `labels` if it is an array of 1 to
/// decoder_length, else 0 with `why` set.
std::size_t labels_length(const nlohmann::json& row, std::int64_t decoder_length,
                          std::string& why) {
  const auto labels = row.find("labels");
  if (labels == row.end()) {
    why = "no \"labels\"";
    return 0;
  }
  const std::size_t m = labels->is_array() ? labels->size() : 0;
  if (m < 1 || m > std::size_t(decoder_length))
    why = MESH_MSG("\"labels\" must be an array of 1 to model.decoder_seq_length = "
                   << decoder_length << " integers");
  return why.empty() ? m : 0;
}

/// transformers' T5 _shift_right: decoder_start_token_id, then the labels
/// but the last, -100 read as the pad id.
std::vector<std::int32_t> shifted_right(const std::vector<std::int32_t>& labels) {
  std::vector<std::int32_t> out(labels.size(), kT5DecoderStartId);
  for (std::size_t i = 1; i < labels.size(); ++i)
    out[i] = labels[i - 1] == -100 ? kT5DecoderStartId : labels[i - 1];
  return out;
}

/// `x` (its fields the row's lengths) padded to the deck's lengths.
void pad_row(data::T5Sample& x, std::int64_t encoder_length, std::int64_t decoder_length) {
  const std::size_t m = x.labels.size();
  x.enc_tokens.resize(std::size_t(encoder_length), 0);
  x.enc_mask.resize(std::size_t(encoder_length), 0);
  x.dec_in.resize(std::size_t(decoder_length), kT5DecoderStartId);
  x.labels.resize(std::size_t(decoder_length), -100);
  x.dec_mask.assign(std::size_t(decoder_length), 0);
  std::fill_n(x.dec_mask.begin(), m, 1);
  x.loss_mask.assign(std::size_t(decoder_length), 0);
  for (std::size_t i = 0; i < x.labels.size(); ++i) x.loss_mask[i] = x.labels[i] != -100;
}

/// One line's row, or nullopt with `why` set.
std::optional<data::T5Sample> row_of_line(const std::string& line, std::int64_t encoder_length,
                                          std::int64_t decoder_length, int vocab,
                                          std::string& why) {
  const std::optional<nlohmann::json> value = data::parse_json_line(line, why);
  if (!value) return std::nullopt;
  const auto ids = value->is_object() ? value->find("input_ids") : value->end();
  if (!value->is_object() || ids == value->end() || !ids->is_array()) {
    why = "expected {\"input_ids\": [...], \"labels\": [...], ...}, found " +
          value->dump().substr(0, 40);
    return std::nullopt;
  }
  const std::size_t n = ids->size();
  if (n < 1 || n > std::size_t(encoder_length)) {
    why = MESH_MSG(n << " input_ids; a row needs 1 to model.seq_length = " << encoder_length);
    return std::nullopt;
  }
  const std::size_t m = labels_length(*value, decoder_length, why);
  if (m == 0) return std::nullopt;
  data::T5Sample x;
  x.enc_tokens.assign(n, 0);
  x.enc_mask.assign(n, 1);
  x.labels.assign(m, -100);
  x.dec_in.assign(m, 0);
  for (const std::string& e :
       {read_int_field(*value, {"input_ids", 0, vocab, false, true}, n, x.enc_tokens),
        read_int_field(*value, {"attention_mask", 0, 2, false, false}, n, x.enc_mask),
        read_int_field(*value, {"labels", 0, vocab, true, true}, m, x.labels)})
    if (why.empty()) why = e;
  if (why.empty()) {
    if (value->contains("decoder_input_ids"))
      why = read_int_field(*value, {"decoder_input_ids", 0, vocab, false, true}, m, x.dec_in);
    else
      x.dec_in = shifted_right(x.labels);
  }
  if (why.empty() && std::find(x.enc_mask.begin(), x.enc_mask.end(), 1) == x.enc_mask.end())
    why = "attention_mask has no 1 (no real token)";
  if (!why.empty()) return std::nullopt;
  pad_row(x, encoder_length, decoder_length);
  return x;
}

/// A slot past the last row: one real encoder token, one decoder token, no label.
data::T5Sample filler_row(std::int64_t encoder_length, std::int64_t decoder_length) {
  data::T5Sample x;
  x.enc_tokens = {0};
  x.enc_mask = {1};
  x.labels = {-100};
  x.dec_in = {kT5DecoderStartId};
  pad_row(x, encoder_length, decoder_length);
  return x;
}

}  // namespace

std::vector<data::T5Sample> t5_jsonl_rows(const std::string& path, std::int64_t encoder_length,
                                          std::int64_t decoder_length, int vocab) {
  std::ifstream in(path);
  MESH_REQUIRE(in.good(), "evaluate.inputs: cannot open '" << path << "'");
  std::vector<data::T5Sample> rows;
  std::string line, why;
  for (long number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::optional<data::T5Sample> row =
        row_of_line(line, encoder_length, decoder_length, vocab, why);
    MESH_REQUIRE(row, "evaluate.inputs " << path << " line " << number << ": " << why);
    rows.push_back(std::move(*row));
  }
  MESH_REQUIRE(!rows.empty(), "evaluate.inputs " << path
                                                 << " holds no {\"input_ids\": [...], \"labels\": "
                                                    "[...]} row");
  return rows;
}

T5RowScores score_t5_rows(Trainer& trainer, const std::vector<data::T5Sample>& rows,
                          const DataLayout& layout) {
  const data::T5Sample filler = filler_row(layout.seq_length, layout.decoder_seq_length);
  const auto count = std::int64_t(rows.size());
  T5RowScores out{std::vector<double>(rows.size(), 0.0), std::vector<double>(rows.size(), 0.0)};
  const index_t b = layout.micro_batch;
  for (std::int64_t start = 0; start < count; start += layout.global_batch) {
    std::vector<std::vector<data::T5Sample>> samples(std::size_t(layout.micro_batches()));
    std::vector<std::int64_t> firsts;
    std::vector<MicroBatch> batch;
    for (index_t m = 0; m < layout.micro_batches(); ++m) {
      const std::int64_t first = start + layout.sample_offset(m);
      std::vector<data::T5Sample>& mine = samples[std::size_t(m)];
      for (index_t j = 0; j < b; ++j)
        mine.push_back(first + j < count ? rows[std::size_t(first + j)] : filler);
      firsts.push_back(first);
      batch.push_back(t5_micro_batch(mine, first));
    }
    trainer.evaluate_heads(batch, [&](int m, const StageCache& cache) {
      // Token t of sample j is row t * b + j of the per-token losses.
      const std::vector<double> losses =
          static_cast<const T5Model::Cache&>(cache).losses.to_doubles();
      const std::vector<data::T5Sample>& mine = samples[std::size_t(m)];
      const std::int64_t first = firsts[std::size_t(m)];
      MESH_VERIFY(losses.size() == mine.front().labels.size() * std::size_t(b),
                  "T5 per-token losses: " << losses.size() << " for " << b << " samples of "
                                          << mine.front().labels.size() << " decoder tokens");
      for (index_t j = 0; j < b && first + j < count; ++j)
        for (std::size_t t = 0; t < mine[std::size_t(j)].labels.size(); ++t) {
          if (mine[std::size_t(j)].labels[t] == -100) continue;
          out.loss_sum[std::size_t(first + j)] += losses[t * std::size_t(b) + std::size_t(j)];
          out.labelled[std::size_t(first + j)] += 1;
        }
    });
  }
  return out;
}

}  // namespace meshtron
