// meshtron evaluate on T5 rows (evaluate.inputs, train/t5_evaluation.hpp)
// on one rank, on pp 2 (2 ranks) and on tp 2 x dp 2 (4 ranks): a fixed tiny T5Model, saved as
// a checkpoint, scored by `meshtron evaluate` over rows of different
// encoder and decoder lengths (attention_mask given or not, encoder padding
// given by it, decoder_input_ids given or shifted right from the labels,
// labels with -100 inside, a row without labels, a partial last batch),
// against the same model's forward of each row alone at its own lengths
// through the library API, with the cross-entropy computed here in double.
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
#include "model/t5_model.hpp"
#include "parallel/communicator.hpp"
#include "parallel/topology.hpp"
#include "tests/evaluate/evaluate_rows.hpp"

namespace meshtron {
namespace {

using Ids = std::vector<std::int32_t>;
using testing_util::world_rank;
using testing_util::world_size;
constexpr int kEncSeq = 16, kDecSeq = 8, kVocab = 100;

constexpr const char* kFamily = "t5";  ///< the prefix of this test's files

std::string work_path(const std::string& name) { return evaluate_test::work_path(kFamily, name); }

ModelSpec tiny_t5() {
  return t5_spec(2, 2, 32, 4, 8, 64, Activation::Relu, /*tie_word_embeddings=*/true, kVocab,
                 kEncSeq, kDecSeq, /*buckets=*/8, /*max_distance=*/12);
}

/// The deck `meshtron evaluate` reads (also the checkpoint's deck text).
std::string deck_text() {
  return "[run]\nname = evaluate-t5-test\n" + model_deck_section(tiny_t5()) +
         "hidden_dropout = 0.0\nattention_dropout = 0.0\n"
         "[training]\nmicro_batch_size = 2\ntrain_iters = 1\n[logging]\nprogress = off\n";
}

/// One example as transformers takes it; `real` encoder tokens before the
/// padding its attention mask marks.
struct Row {
  Ids ids, attention_mask, labels, decoder_ids;
  std::size_t real() const {
    return attention_mask.empty() ? ids.size()
                                  : std::size_t(std::count(attention_mask.begin(),
                                                           attention_mask.end(), 1));
  }
  /// decoder_input_ids, or transformers' shift right of the labels (pad = start = 0).
  Ids decoder_inputs() const {
    if (!decoder_ids.empty()) return decoder_ids;
    Ids out = {0};
    for (std::size_t i = 0; i + 1 < labels.size(); ++i)
      out.push_back(labels[i] == -100 ? 0 : labels[i]);
    return out;
  }
  std::string json() const {
    nlohmann::json j{{"input_ids", ids}, {"labels", labels}};
    if (!attention_mask.empty()) j["attention_mask"] = attention_mask;
    if (!decoder_ids.empty()) j["decoder_input_ids"] = decoder_ids;
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
  const auto labels = [&](int n, std::vector<int> unlabelled) {
    Ids out = ids(n);
    for (int i : unlabelled) out[std::size_t(i)] = -100;
    return out;
  };
  Ids mask(10, 1), ones(12, 1);
  mask.resize(16, 0);
  return {
      {ids(16), {}, labels(8, {}), {}},                 // full lengths, shifted right
      {ids(9), {}, labels(5, {4}), ids(5)},             // decoder_input_ids given
      {ids(16), mask, labels(6, {2, 5}), {}},           // 6 padding tokens; -100 shifted to pad
      {ids(5), {}, labels(3, {0, 1, 2}), {}},           // no labelled token
      {ids(12), ones, labels(7, {0}), ids(7)},          // a mask of ones, decoder ids given
  };
}

/// A fixed model of tiny_t5(): its initial weights plus uniform noise
/// (+-0.5), large enough that the scores depend on every input.
struct FixedModel {
  FixedModel() {
    ctx.micro_batch = 1;
    ctx.global_batch = 1;
    model = std::make_unique<T5Model>(tiny_t5(), ctx, DType::F32, 3);
    evaluate_test::add_weight_noise(model->parameters());
  }
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  /// Rank 0 saves the model as a checkpoint of deck_text(); its path.
  std::string save_checkpoint() const {
    return evaluate_test::save_fixed_checkpoint(kFamily, model->parameters(), deck_text());
  }
  std::unique_ptr<T5Model> model;
};

/// Each row's summed cross-entropy over its labelled tokens and their number.
struct Expected {
  std::vector<double> loss_sum, labelled;
};

Tensor int_tensor(const Ids& v, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::I32);
  std::copy(v.begin(), v.end(), t.data<std::int32_t>());
  return t;
}

/// Each row alone (b = 1) at its real encoder length and its labels' length, no padding.
Expected score_rows_alone(FixedModel& m, const std::vector<Row>& rows) {
  Expected e;
  for (const Row& r : rows) {
    const auto n = index_t(r.real()), d = index_t(r.labels.size());
    const Ids ids(r.ids.begin(), r.ids.begin() + n);
    T5Batch batch{int_tensor(ids, {n}), int_tensor(Ids(std::size_t(n), 1), {1, n}),
                  int_tensor(r.decoder_inputs(), {d}), Tensor(), int_tensor(r.labels, {d})};
    T5Model::Cache cache;
    m.model->forward(batch, m.ctx, cache);
    const Tensor& logits = T5Model::logits(cache);
    const std::vector<double> z = logits.to_doubles();
    double sum = 0, labelled = 0;
    for (index_t t = 0; t < d; ++t) {
      const std::int32_t label = r.labels[std::size_t(t)];
      if (label == -100) continue;
      const double* row = z.data() + t * logits.dim(1);
      sum += evaluate_test::cross_entropy(row, kVocab, label);
      labelled += 1;
    }
    e.loss_sum.push_back(sum);
    e.labelled.push_back(labelled);
  }
  return e;
}

TEST(EvaluateT5, InputRowsScoreAsEachRowAlone) {
  ASSERT_TRUE(world_size() == 1 || world_size() == 2 || world_size() == 4)
      << "1 rank, pp 2, or tp 2 x dp 2";
  FixedModel m;
  const std::vector<Row> rows = fixed_rows();
  const Expected e = score_rows_alone(m, rows);
  double loss_sum = 0, labelled = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    loss_sum += e.loss_sum[i];
    labelled += e.labelled[i];
  }
  ASSERT_EQ(labelled, 8 + 4 + 4 + 0 + 6);
  const std::string checkpoint = m.save_checkpoint();
  std::string text;
  for (const Row& r : rows) text += r.json() + "\n";
  const std::string inputs = work_path("rows") + ".jsonl";
  evaluate_test::write_on_rank0(inputs, text);

  // 5 rows in batches of 2 (1 rank) or 4 (dp 2): the last one partial.
  const nlohmann::json j = evaluate_test::evaluate(kFamily, checkpoint, inputs);
  const double loss = loss_sum / labelled;
  EXPECT_LE(std::fabs(j.at("loss").get<double>() - loss) / loss, 1e-5)
      << j.dump() << " vs loss " << loss;
  EXPECT_LE(std::fabs(j.at("ppl").get<double>() - std::exp(loss)) / std::exp(loss), 1e-5);
  EXPECT_EQ(j.at("labelled_tokens").get<int>(), 22);
  EXPECT_EQ(j.at("rows").get<int>(), 5);
  EXPECT_EQ(j.at("split").get<std::string>(), "inputs");
  const nlohmann::json& per_row = j.at("row_losses");
  ASSERT_EQ(per_row.size(), rows.size()) << j.dump();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(i);
    if (e.labelled[i] == 0) {
      EXPECT_TRUE(per_row[i].is_null()) << j.dump();
      continue;
    }
    const double want = e.loss_sum[i] / e.labelled[i];
    EXPECT_LE(std::fabs(per_row[i].get<double>() - want) / want, 1e-5) << j.dump();
  }
}

TEST(EvaluateT5, BadRowsAreNamed) {
  FixedModel m;
  const std::string checkpoint = m.save_checkpoint();
  const std::pair<std::string, std::string> cases[] = {
      {R"({"input_ids": [1, 2, 3]})", "line 1: no \"labels\""},
      {R"({"input_ids": [1, 2], "labels": [1, 2, 3, 4, 5, 6, 7, 8, 9]})",
       "line 1: \"labels\" must be an array of 1 to model.decoder_seq_length = 8 integers"},
      {R"({"input_ids": [1, 2, 3], "labels": [-100, 100, 5]})",
       "line 1: labels[1] = 100 is outside [0, 100) and not -100"},
      {R"({"input_ids": [1, 2], "attention_mask": [0, 0], "labels": [4]})",
       "line 1: attention_mask has no 1 (no real token)"},
      {R"({"input_ids": [1, 2], "labels": [4, 5], "decoder_input_ids": [0]})",
       "line 1: \"decoder_input_ids\" must be an array of 2 integers"},
      {R"({"input_ids": [1, 2], "labels": [4, 5], "decoder_input_ids": [0, -100]})",
       "line 1: decoder_input_ids[1] = -100 is outside [0, 100)"},
      {R"({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], )"
       R"("labels": [1]})",
       "line 1: 17 input_ids; a row needs 1 to model.seq_length = 16"},
  };
  for (const auto& [row, message] : cases) {
    const std::string inputs = work_path("bad") + ".jsonl";
    evaluate_test::write_on_rank0(inputs, "\n" + row + "\n");
    SCOPED_TRACE(row);
    testing_util::expect_user_error([&] { evaluate_test::evaluate(kFamily, checkpoint, inputs); },
                                    {inputs, "line 2" + message.substr(6)});
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
}  // namespace meshtron
