#include "train/evaluation.hpp"

#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "common/error.hpp"
#include "config/run_config.hpp"
#include "data/gpt_dataset.hpp"
#include "data/json_line.hpp"
#include "data/ordered_gpt_samples.hpp"
#include "train/trainer.hpp"

namespace meshtron {

namespace {

class SplitRows final : public EvalRows {
 public:
  SplitRows(const RunConfig& run, const std::string& split, int vocab)
      : path_(run.data.path), vocab_(vocab) {
    auto data = std::make_shared<data::IndexedDataset>(run.data.path);
    const auto [first, end] =
        data::split_sequence_range(split, run.data.split, data->num_sequences());
    samples_.emplace(std::move(data), first, end, run.model.seq_length);
  }
  std::int64_t size() const override { return samples_->size(); }
  void row(std::int64_t i, std::vector<std::int32_t>& out) const override {
    out.resize(std::size_t(samples_->seq_length() + 1));
    samples_->sample(i, out.data());
    // The ids index the embedding and the targets the logits, and the
    // device kernels do not check them.
    for (std::int32_t id : out)
      MESH_VERIFY(id >= 0 && id < vocab_, "data.path " << path_ << ": evaluation sample " << i
                                              << " holds token id " << id
                                              << ", outside the model's vocabulary [0, "
                                              << vocab_ << ")");
  }

 private:
  std::string path_;
  int vocab_;
  std::optional<data::OrderedGptSamples> samples_;
};

class ListedRows final : public EvalRows {
 public:
  explicit ListedRows(std::vector<std::vector<std::int32_t>> rows) : rows_(std::move(rows)) {}
  std::int64_t size() const override { return std::int64_t(rows_.size()); }
  void row(std::int64_t i, std::vector<std::int32_t>& out) const override {
    out = rows_[std::size_t(i)];
  }

 private:
  std::vector<std::vector<std::int32_t>> rows_;
};

/// The ids of one {"ids": [...]} line, or empty with `why` set.
std::vector<std::int32_t> ids_of_line(const std::string& line, std::int64_t seq_length,
                                      int vocab, std::string& why) {
  const std::optional<nlohmann::json> value = data::parse_json_line(line, why);
  if (!value) return {};
  const auto ids = value->is_object() ? value->find("ids") : value->end();
  if (!value->is_object() || ids == value->end() || !ids->is_array()) {
    why = "expected {\"ids\": [...]}, found " + value->dump().substr(0, 40);
    return {};
  }
  if (ids->size() < 2 || std::int64_t(ids->size()) > seq_length + 1) {
    why = MESH_MSG(ids->size() << " ids; a row needs 2 to model.seq_length + 1 = "
                               << seq_length + 1);
    return {};
  }
  std::vector<std::int32_t> out;
  for (const nlohmann::json& id : *ids) {
    const bool integer = id.is_number_integer();
    const std::int64_t v = integer ? id.get<std::int64_t>() : -1;
    if (!integer || v < 0 || v >= vocab) {
      why = MESH_MSG("ids[" << out.size() << "] = " << id.dump()
                            << " is not a token id of the model's vocabulary [0, " << vocab
                            << ")");
      return {};
    }
    out.push_back(std::int32_t(v));
  }
  return out;
}

/// Rows [first, first + micro_batch) of `rows` as a micro-batch: each
/// padded with id 0 to seq_length + 1, its padding (and every slot past the
/// last row) masked out of the loss.
MicroBatch padded_micro_batch(const EvalRows& rows, std::int64_t first, const DataLayout& l) {
  const index_t b = l.micro_batch, s = l.seq_length;
  Tensor tokens = Tensor::zeros({b, s + 1}, DType::I32);
  Tensor mask = Tensor::zeros({s * b}, DType::F32);
  std::vector<std::int32_t> row;
  for (index_t j = 0; j < b && first + j < rows.size(); ++j) {
    rows.row(first + j, row);
    std::copy(row.begin(), row.end(), tokens.data<std::int32_t>() + j * (s + 1));
    for (index_t t = 0; t + 1 < index_t(row.size()); ++t) mask.data<float>()[t * b + j] = 1.0f;
  }
  MicroBatch mb = to_seq_major(tokens, first);
  mb.loss_mask = mask;
  return mb;
}

}  // namespace

std::unique_ptr<EvalRows> split_rows(const RunConfig& run, const std::string& split, int vocab) {
  return std::make_unique<SplitRows>(run, split, vocab);
}

std::unique_ptr<EvalRows> jsonl_rows(const std::string& path, std::int64_t seq_length,
                                     int vocab) {
  std::ifstream in(path);
  MESH_REQUIRE(in.good(), "evaluate.inputs: cannot open '" << path << "'");
  std::vector<std::vector<std::int32_t>> rows;
  std::string line, why;
  for (long number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    rows.push_back(ids_of_line(line, seq_length, vocab, why));
    MESH_REQUIRE(why.empty(), "evaluate.inputs " << path << " line " << number << ": " << why);
  }
  MESH_REQUIRE(!rows.empty(), "evaluate.inputs " << path << " holds no {\"ids\": [...]} row");
  return std::make_unique<ListedRows>(std::move(rows));
}

double EvalResult::ppl() const { return std::exp(loss()); }

std::string EvalResult::line() const {
  std::ostringstream os;
  os << "evaluate | samples " << samples << " | tokens " << std::int64_t(tokens) << " | lm loss "
     << std::fixed << std::setprecision(6) << loss() << " | lm loss PPL " << std::setprecision(4)
     << ppl();
  return os.str();
}

std::string EvalResult::json(const std::string& split, const std::string& checkpoint) const {
  nlohmann::ordered_json j;
  j["samples"] = samples;
  j["tokens"] = std::int64_t(tokens);
  j["lm_loss"] = loss();
  j["ppl"] = ppl();
  j["split"] = split;
  j["checkpoint"] = checkpoint;
  return j.dump();
}

EvalResult evaluate_rows(Trainer& trainer, const EvalRows& rows, const DataLayout& layout) {
  EvalResult r;
  r.samples = rows.size();
  for (std::int64_t start = 0; start < r.samples; start += layout.global_batch) {
    std::vector<MicroBatch> batch;
    for (index_t m = 0; m < layout.micro_batches(); ++m)
      batch.push_back(padded_micro_batch(rows, start + layout.sample_offset(m), layout));
    const LossSum s = trainer.evaluate_sum(batch);
    r.loss_sum += s.sum;
    r.tokens += s.tokens;
  }
  return r;
}

void evaluate_test_split(const RunConfig& run, Trainer& trainer, int vocab) {
  if (run.data.source != "indexed" || data::split_weights(run.data.split)[2] == 0) return;
  const Topology& topo = trainer.runtime().topo;
  // Its rows are causal-LM rows (docs/bert.md, docs/t5.md: what is left).
  if (run.model.arch == "bert" || run.model.arch == "t5") {
    if (topo.world_rank() == 0)
      std::cout << " > test split: not evaluated for model.arch = " << run.model.arch << std::endl;
    return;
  }
  const auto rows = split_rows(run, "test", vocab);
  if (rows->size() == 0) {
    if (topo.world_rank() == 0)
      std::cout << " > test split: data.split " << run.data.split << " gives it no sample of "
                << run.model.seq_length + 1 << " tokens of " << run.data.path
                << "; not evaluated" << std::endl;
    return;
  }
  const DataLayout layout{run.model.seq_length, run.training.micro_batch_size,
                          run.training.global_batch_size, topo.dp_rank(), topo.dp(),
                          0, 0, run.run.seed};
  const EvalResult r = evaluate_rows(trainer, *rows, layout);
  if (topo.world_rank() == 0) std::cout << " test split | " << r.line() << std::endl;
}

}  // namespace meshtron
