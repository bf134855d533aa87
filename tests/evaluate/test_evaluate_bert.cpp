// meshtron evaluate on BERT rows (evaluate.inputs, train/bert_evaluation.hpp)
// on one rank, on pp 2 (2 ranks) and on tp 2 x dp 2 (4 ranks): a fixed tiny BertModel, saved as
// a checkpoint, scored by `meshtron evaluate` over rows of different lengths
// (token types given or not, padding given by an attention mask, rows
// without labels or without a next-sentence label, a partial last batch),
// against the same model's forward of each row alone at its own length
// through the library API, with the MLM cross-entropy and the binary head's
// argmax computed here in double.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/expect_user_error.hpp"
#include "common/mpi_test_util.hpp"
#include "config/model_spec_from_deck.hpp"
#include "model/bert_model.hpp"
#include "parallel/communicator.hpp"
#include "parallel/topology.hpp"
#include "tests/evaluate/evaluate_rows.hpp"

namespace meshtron {
namespace {

using Ids = std::vector<std::int32_t>;
using testing_util::world_rank;
using testing_util::world_size;
constexpr int kSeq = 16, kVocab = 100;

constexpr const char* kFamily = "bert";  ///< the prefix of this test's files

std::string work_path(const std::string& name) { return evaluate_test::work_path(kFamily, name); }

ModelSpec tiny_bert() { return bert_spec(2, 32, 4, 64, kVocab, kSeq, kSeq, 2); }

/// The deck `meshtron evaluate` reads (also the checkpoint's deck text).
std::string deck_text() {
  return "[run]\nname = evaluate-bert-test\n" + model_deck_section(tiny_bert()) +
         "hidden_dropout = 0.0\nattention_dropout = 0.0\n"
         "[training]\nmicro_batch_size = 2\ntrain_iters = 1\n[logging]\nprogress = off\n";
}

/// One example as transformers takes it; `real` tokens before the padding
/// its attention mask marks.
struct Row {
  Ids ids, token_types, attention_mask, labels;
  int next_sentence = -1;  ///< -1: no next_sentence_label
  std::size_t real() const {
    return attention_mask.empty() ? ids.size()
                                  : std::size_t(std::count(attention_mask.begin(),
                                                           attention_mask.end(), 1));
  }
  std::string json() const {
    nlohmann::json j{{"input_ids", ids}};
    if (!token_types.empty()) j["token_type_ids"] = token_types;
    if (!attention_mask.empty()) j["attention_mask"] = attention_mask;
    if (!labels.empty()) j["labels"] = labels;
    if (next_sentence >= 0) j["next_sentence_label"] = next_sentence;
    return j.dump();
  }
};

std::vector<Row> fixed_rows() {
  std::mt19937 engine(5);
  const auto ids = [&](int n) {
    Ids out;
    for (int i = 0; i < n; ++i) out.push_back(std::int32_t(engine() % kVocab));
    return out;
  };
  const auto labels = [&](int n, std::vector<int> at) {
    Ids out(std::size_t(n), -100);
    for (int i : at) out[std::size_t(i)] = std::int32_t(engine() % kVocab);
    return out;
  };
  Ids halves(8, 0), mask(10, 1);
  halves.resize(16, 1);
  mask.resize(16, 0);
  Ids types_10(4, 0);
  types_10.resize(16, 1);
  return {
      {ids(16), halves, {}, labels(16, {1, 7, 12}), 0},
      {ids(9), {}, {}, labels(9, {0, 4}), 1},
      {ids(16), types_10, mask, labels(16, {2, 5, 9}), 1},  // 6 padding tokens
      {ids(5), {}, {}, {}, 0},                              // no labels
      {ids(12), {}, {}, labels(12, {3, 4, 8, 11}), -1},    // no next-sentence label
  };
}

/// A fixed model of tiny_bert(): its initial weights plus uniform noise
/// (+-0.5), large enough that the scores depend on every input.
struct FixedModel {
  FixedModel() {
    ctx.seq_length = kSeq;
    ctx.micro_batch = 1;
    ctx.global_batch = 1;
    model = std::make_unique<BertModel>(tiny_bert(), ctx, DType::F32, 3);
    evaluate_test::add_weight_noise(model->parameters());
  }
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  /// Rank 0 saves the model as a checkpoint of deck_text(); its path.
  std::string save_checkpoint() const {
    return evaluate_test::save_fixed_checkpoint(kFamily, model->parameters(), deck_text());
  }
  std::unique_ptr<BertModel> model;
};

struct Expected {
  double mlm_loss_sum = 0, masked = 0, correct = 0, labelled_rows = 0;
};

/// Each row alone (b = 1) at its real length, no padding.
Expected score_rows_alone(FixedModel& m, const std::vector<Row>& rows) {
  Expected e;
  for (const Row& r : rows) {
    const index_t n = index_t(r.real());
    const auto ints = [&](const Ids& v, std::int32_t fill) {
      Tensor t = Tensor::empty({n}, DType::I32);
      for (index_t i = 0; i < n; ++i)
        t.data<std::int32_t>()[i] = v.empty() ? fill : v[std::size_t(i)];
      return t;
    };
    BertBatch batch{ints(r.ids, 0), ints(r.token_types, 0), Tensor::empty({1, n}, DType::I32),
                    ints(r.labels, -100), Tensor::empty({1}, DType::I32)};
    batch.padding_mask.fill(1.0);
    batch.next_sentence.data<std::int32_t>()[0] = std::max(r.next_sentence, 0);
    m.ctx.seq_length = n;
    BertModel::Cache cache;
    m.model->forward(batch, m.ctx, cache);
    const std::vector<double> z = BertModel::prediction_logits(cache).to_doubles();
    for (index_t t = 0; t < n; ++t) {
      const std::int32_t label = r.labels.empty() ? -100 : r.labels[std::size_t(t)];
      if (label == -100) continue;
      const double* row = z.data() + t * kVocab;
      e.mlm_loss_sum += evaluate_test::cross_entropy(row, kVocab, label);
      e.masked += 1;
    }
    if (r.next_sentence >= 0) {
      const std::vector<double> b = BertModel::binary_logits(cache).to_doubles();
      e.correct += (b[1] > b[0] ? 1 : 0) == r.next_sentence;
      e.labelled_rows += 1;
    }
  }
  return e;
}

TEST(EvaluateBert, InputRowsScoreAsEachRowAlone) {
  ASSERT_TRUE(world_size() == 1 || world_size() == 2 || world_size() == 4)
      << "1 rank, pp 2, or tp 2 x dp 2";
  FixedModel m;
  const std::vector<Row> rows = fixed_rows();
  const Expected e = score_rows_alone(m, rows);
  ASSERT_EQ(e.masked, 12);
  ASSERT_EQ(e.labelled_rows, 4);
  const std::string checkpoint = m.save_checkpoint();
  std::string text;
  for (const Row& r : rows) text += r.json() + "\n";
  const std::string inputs = work_path("rows") + ".jsonl";
  evaluate_test::write_on_rank0(inputs, text);

  // 5 rows in batches of 2 (1 rank) or 4 (dp 2): the last one partial.
  const nlohmann::json j = evaluate_test::evaluate(kFamily, checkpoint, inputs);
  const double mlm = e.mlm_loss_sum / e.masked;
  EXPECT_LE(std::fabs(j.at("mlm_loss").get<double>() - mlm) / mlm, 1e-5)
      << j.dump() << " vs mlm loss " << mlm;
  EXPECT_EQ(j.at("binary_accuracy").get<double>(), e.correct / e.labelled_rows) << j.dump();
  EXPECT_EQ(j.at("masked_tokens").get<int>(), 12);
  EXPECT_EQ(j.at("samples").get<int>(), 4);
  EXPECT_EQ(j.at("split").get<std::string>(), "inputs");
}

TEST(EvaluateBert, BadRowsAreNamed) {
  FixedModel m;
  const std::string checkpoint = m.save_checkpoint();
  const std::pair<std::string, std::string> cases[] = {
      {R"({"input_ids": [1, 2, 3], "labels": [-100, 100, 5]})",
       "line 1: labels[1] = 100 is outside [0, 100) and not -100"},
      {R"({"input_ids": [1, 2], "attention_mask": [0, 0]})",
       "line 1: attention_mask has no 1 (no real token)"},
      {R"({"input_ids": [1, 2], "token_type_ids": [0]})",
       "line 1: \"token_type_ids\" must be an array of 2 integers"},
      {R"({"input_ids": [1], "next_sentence_label": 2})",
       "line 1: next_sentence_label = 2 is not 0 or 1"},
  };
  for (const auto& [row, message] : cases) {
    const std::string inputs = work_path("bad") + ".jsonl";
    evaluate_test::write_on_rank0(inputs, row + "\n");
    SCOPED_TRACE(row);
    testing_util::expect_user_error(
        [&] { evaluate_test::evaluate(kFamily, checkpoint, inputs); }, {inputs, message});
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
}  // namespace meshtron
