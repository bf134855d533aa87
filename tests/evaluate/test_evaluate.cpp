// meshtron evaluate on the golden GPT-2 (validation/gpt2-golden, converted by
// `meshtron convert`), on one rank and on tp 2 x pp 2 x dp 2 (8 ranks):
//  * explicit rows (evaluate.inputs) of different lengths against the loss
//    transformers' golden logits give them;
//  * the ordered samples of a dataset of golden rows, split by documents,
//    against the loss transformers' golden logits give them;
//  * a split's samples against the same windows given as explicit rows;
//  * the test-split line at the end of `meshtron train` against
//    `meshtron evaluate` of the checkpoint it saved, on another layout.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "common/mpi_test_util.hpp"
#include "data/indexed_dataset.hpp"
#include "data/ordered_gpt_samples.hpp"
#include "io/safetensors.hpp"
#include "tests/evaluate/evaluate_rows.hpp"

namespace meshtron {
namespace {

using Ids = std::vector<std::int32_t>;
using testing_util::world_rank;
using testing_util::world_size;

const std::string kSource = MESHTRON_SOURCE_DIR;
const std::string kDeck = kSource + "/tests/evaluate/golden.deck";
const std::string kCheckpoint = MESHTRON_EVALUATE_CHECKPOINT;  // the convert fixture's
constexpr int kSeq = 16;

/// A path in the build folder unique to `name` and this run's world size
/// (the 1- and 8-rank runs may run at once).
std::string work_path(const std::string& name) {
  return std::string(MESHTRON_EVALUATE_WORK) + "/" + name + "_np" + std::to_string(world_size());
}

/// The layout of this run: one rank, or tp 2 x pp 2 x dp 2.
std::vector<std::string> layout_sets() {
  if (world_size() == 1) return {};
  EXPECT_EQ(world_size(), 8) << "the 8-rank run checks tp 2 x pp 2 x dp 2";
  return {"parallel.tensor_parallel=2", "parallel.pipeline_parallel=2",
          "parallel.data_parallel=2"};
}

std::vector<std::string> deck_args(const std::vector<std::string>& sets) {
  std::vector<std::string> args = {kDeck, "--set", "run.output_dir=" + work_path("runs")};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  return args;
}

struct Scored {
  std::int64_t samples = 0, tokens = 0;
  double lm_loss = 0;
};

/// `meshtron evaluate` of the golden checkpoint with `sets` on this run's
/// layout; evaluate.output read back on every rank.
Scored evaluate(const std::string& name, std::vector<std::string> sets) {
  const std::string output = work_path(name) + ".json";
  sets.push_back("evaluate.output=" + output);
  if (std::none_of(sets.begin(), sets.end(),
                   [](const std::string& s) { return s.rfind("checkpoint.load=", 0) == 0; }))
    sets.push_back("checkpoint.load=" + kCheckpoint);
  if (std::none_of(sets.begin(), sets.end(),
                   [](const std::string& s) { return s.rfind("parallel.", 0) == 0; }))
    for (const std::string& s : layout_sets()) sets.push_back(s);
  EXPECT_EQ(app::run_evaluate(deck_args(sets)), 0);
  MPI_Barrier(MPI_COMM_WORLD);
  std::ifstream in(output);
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j.at("samples").get<std::int64_t>(), j.at("tokens").get<std::int64_t>(),
          j.at("lm_loss").get<double>()};
}

using evaluate_test::write_on_rank0;

/// Rank 0 writes `documents` (one sequence each) as an indexed dataset.
void write_dataset(const std::string& prefix, const std::vector<Ids>& documents) {
  if (world_rank() == 0) {
    data::IndexedDatasetWriter writer(prefix, data::TokenDType::U16);
    for (const Ids& d : documents) writer.add_document(d);
    writer.finalize();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

std::string jsonl_of(const std::vector<Ids>& rows) {
  std::string text;
  for (const Ids& r : rows) text += nlohmann::json{{"ids", r}}.dump() + "\n";
  return text;
}

/// The windows of kSeq + 1 tokens, stride kSeq, over `documents` in order.
std::vector<Ids> windows_of(const std::vector<Ids>& documents) {
  Ids stream;
  for (const Ids& d : documents) stream.insert(stream.end(), d.begin(), d.end());
  std::vector<Ids> out;
  for (std::size_t j = 0; (j + 1) * kSeq < stream.size(); ++j)
    out.emplace_back(stream.begin() + std::ptrdiff_t(j * kSeq),
                     stream.begin() + std::ptrdiff_t(j * kSeq + kSeq + 1));
  return out;
}

/// Documents of the given lengths, ids < 1000 from a fixed generator.
std::vector<Ids> fixed_documents(const std::vector<int>& lengths) {
  std::mt19937 engine(99);
  std::vector<Ids> out;
  for (int n : lengths) {
    Ids d;
    for (int i = 0; i < n; ++i) d.push_back(std::int32_t(engine() % 1000));
    out.push_back(d);
  }
  return out;
}

double relative(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

/// transformers' step-0 logits of the golden rows (tokens[0, r, :16]) and
/// the losses of their prefixes. Causal attention: a prefix's logits are the
/// full row's, so any prefix of a golden row has its loss here.
struct GoldenRows {
  static constexpr int V = 1000;
  io::SafetensorsFile golden{kSource + "/validation/gpt2-golden/golden.safetensors"};
  Tensor tokens = golden.load("tokens");  // int32 [3, 2, 17]; step 0 is [0]
  std::vector<double> logits = golden.load("logits", DType::F32).to_doubles();  // [2, 16, V]

  Ids prefix(int r, int length) const {
    const std::int32_t* ids = tokens.data<std::int32_t>() + r * (kSeq + 1);
    return Ids(ids, ids + length);
  }
  /// Sum of the cross-entropies of positions [0, length - 1) of row r.
  double loss_sum(int r, int length) const {
    const Ids ids = prefix(r, length);
    double sum = 0;
    for (int t = 0; t + 1 < length; ++t) {
      const double* z = logits.data() + (r * kSeq + t) * V;
      const double max = *std::max_element(z, z + V);
      double sum_exp = 0;
      for (int v = 0; v < V; ++v) sum_exp += std::exp(z[v] - max);
      sum += max + std::log(sum_exp) - z[ids[std::size_t(t) + 1]];
    }
    return sum;
  }
};

TEST(Evaluate, ExplicitRowsOfDifferentLengthsMatchTransformers) {
  const GoldenRows golden;
  const std::pair<int, int> rows[] = {{0, 17}, {1, 9}, {0, 5}, {1, 2}, {1, 16}};  // (row, length)
  std::vector<Ids> jsonl;
  double sum = 0;
  std::int64_t count = 0;
  for (const auto& [r, length] : rows) {
    jsonl.push_back(golden.prefix(r, length));
    sum += golden.loss_sum(r, length);
    count += length - 1;
  }
  const std::string path = work_path("rows") + ".jsonl";
  write_on_rank0(path, jsonl_of(jsonl));
  // 5 rows in batches of 2 (1 rank) or 4 (dp 2): the last one partial.
  const Scored s = evaluate("rows", {"evaluate.inputs=" + path});
  EXPECT_EQ(s.samples, 5);
  EXPECT_EQ(s.tokens, count);
  EXPECT_LE(relative(s.lm_loss, sum / double(count)), 1e-5)
      << s.lm_loss << " vs transformers " << sum / double(count);
}

TEST(Evaluate, DatasetSamplesMatchTransformers) {
  // Three documents split "1,1,1": train row 1, valid row 0, test row 1. A
  // split's first window starts its own stream, so each split's one sample
  // is a whole golden row (17 tokens = kSeq + 1), whose loss transformers'
  // logits give. On dp 2 one rank's batch is empty: padding only.
  const GoldenRows golden;
  const std::string prefix = work_path("golden_documents");
  write_dataset(prefix, {golden.prefix(1, kSeq + 1), golden.prefix(0, kSeq + 1),
                         golden.prefix(1, kSeq + 1)});
  for (const auto& [split, row] : {std::pair<std::string, int>{"valid", 0}, {"test", 1}}) {
    SCOPED_TRACE(split);
    const Scored s = evaluate("dataset_" + split, {"data.path=" + prefix, "data.split=1,1,1",
                                                   "evaluate.split=" + split});
    EXPECT_EQ(s.samples, 1);
    EXPECT_EQ(s.tokens, kSeq);
    const double expected = golden.loss_sum(row, kSeq + 1) / kSeq;
    EXPECT_LE(relative(s.lm_loss, expected), 1e-5) << s.lm_loss << " vs transformers " << expected;
  }
}

// Split "2,2,2" of 6 documents: train 0-1, valid 2-3, test 4-5.
const std::vector<int> kSplitLengths = {37, 23, 50, 29, 19, 61};

TEST(Evaluate, SplitSamplesScoreAsTheSameWindowsGivenAsRows) {
  const std::vector<Ids> documents = fixed_documents(kSplitLengths);
  const std::string prefix = work_path("split_documents");
  write_dataset(prefix, documents);
  for (const char* split : {"valid", "test"}) {
    const std::size_t first = split == std::string("valid") ? 2 : 4;
    const std::vector<Ids> windows =
        windows_of({documents[first], documents[first + 1]});
    const std::string rows = work_path(std::string(split) + "_windows") + ".jsonl";
    write_on_rank0(rows, jsonl_of(windows));
    const Scored from_split =
        evaluate(std::string(split) + "_split", {"data.path=" + prefix, "data.split=2,2,2",
                                                 "evaluate.split=" + std::string(split),
                                                 "evaluate.micro_batch_size=3"});
    const Scored from_rows = evaluate(std::string(split) + "_rows",
                                      {"evaluate.inputs=" + rows, "evaluate.micro_batch_size=3"});
    EXPECT_EQ(from_split.samples, std::int64_t(windows.size())) << split;
    EXPECT_EQ(from_split.tokens, kSeq * from_split.samples) << split;
    EXPECT_EQ(from_rows.tokens, from_split.tokens) << split;
    EXPECT_LE(relative(from_split.lm_loss, from_rows.lm_loss), 1e-12) << split;
  }
}

TEST(Evaluate, OrderedSamplesAreTheWindowsOfTheStream) {
  // Empty and one-token sequences included: a window crosses them.
  const std::vector<Ids> documents = fixed_documents({5, 0, 7, 1, 20, 0, 9});
  const std::string prefix = work_path("ordered_rank" + std::to_string(world_rank()));
  {
    data::IndexedDatasetWriter writer(prefix, data::TokenDType::U16);
    for (const Ids& d : documents) writer.add_document(d);
    writer.finalize();
  }
  auto data = std::make_shared<data::IndexedDataset>(prefix);
  Ids stream;
  for (std::size_t d = 1; d < documents.size(); ++d)
    stream.insert(stream.end(), documents[d].begin(), documents[d].end());
  for (std::int64_t s : {1, 3, 4, 36}) {
    data::OrderedGptSamples samples(data, 1, std::int64_t(documents.size()), s);
    ASSERT_EQ(samples.size(), (std::int64_t(stream.size()) - 1) / s) << "s = " << s;
    for (std::int64_t i = 0; i < samples.size(); ++i) {
      Ids window(std::size_t(s + 1));
      samples.sample(i, window.data());
      EXPECT_EQ(window, Ids(stream.begin() + i * s, stream.begin() + i * s + s + 1))
          << "s = " << s << ", sample " << i;
    }
  }
}

TEST(Evaluate, TrainEndsWithTheTestLossThatEvaluateReproducesOnAnotherLayout) {
  const std::vector<Ids> documents = fixed_documents(kSplitLengths);
  const std::string prefix = work_path("train_documents");
  write_dataset(prefix, documents);
  const std::string save_dir = work_path("train_checkpoints");
  if (world_rank() == 0) std::filesystem::remove_all(save_dir);
  std::vector<std::string> sets = {"data.source=indexed", "data.path=" + prefix, "data.split=2,2,2",
                                   "checkpoint.save_dir=" + save_dir, "training.train_iters=2"};
  for (const std::string& s : layout_sets()) sets.push_back(s);
  std::ostringstream printed;
  std::streambuf* const stdout_buffer = std::cout.rdbuf(printed.rdbuf());
  const int status = app::run_train(deck_args(sets));
  std::cout.rdbuf(stdout_buffer);
  ASSERT_EQ(status, 0);
  // Another layout for the evaluation: dp only, or tp 4 x dp 2.
  const std::vector<std::string> other =
      world_size() == 1 ? std::vector<std::string>{"training.micro_batch_size=1"}
                        : std::vector<std::string>{"parallel.tensor_parallel=4",
                                                   "parallel.pipeline_parallel=1",
                                                   "parallel.data_parallel=2"};
  std::vector<std::string> eval_sets = {"data.path=" + prefix, "data.split=2,2,2",
                                        "checkpoint.save_dir=" + save_dir,
                                        "checkpoint.load=auto", "evaluate.split=test"};
  eval_sets.insert(eval_sets.end(), other.begin(), other.end());
  const Scored s = evaluate("after_train", eval_sets);
  if (world_rank() != 0) return;  // only rank 0 prints
  std::smatch m;
  const std::string text = printed.str();
  const std::regex line(R"( test split \| evaluate \| samples (\d+) \| tokens (\d+) \| lm loss ([0-9.]+) \| lm loss PPL ([0-9.]+))");
  ASSERT_TRUE(std::regex_search(text, m, line)) << text;
  EXPECT_EQ(std::stoll(m[1]), s.samples);
  EXPECT_EQ(std::stoll(m[2]), s.tokens);
  EXPECT_NEAR(std::stod(m[3]), s.lm_loss, 2e-6);  // printed with 6 decimals
}

TEST(Evaluate, VirtualStagesAndBatchingLeaveTheLossAsItIs) {
  // tests/train/tiny.deck (4 layers, vocabulary 100) after 2 steps: on 8
  // ranks tp 2 x pp 2 x dp 2 with 2 virtual stages against dp 8; on one
  // rank micro-batches of 3 against 1.
  const std::string tiny = kSource + "/tests/train/tiny.deck";
  const std::string save_dir = work_path("tiny_checkpoints");
  if (world_rank() == 0) std::filesystem::remove_all(save_dir);
  MPI_Barrier(MPI_COMM_WORLD);
  auto sets_for = [&](const std::vector<std::string>& sets) {
    std::vector<std::string> args = {tiny, "--set", "run.output_dir=" + work_path("runs"),
                                     "--set", "checkpoint.save_dir=" + save_dir};
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    return args;
  };
  std::ostringstream quiet;
  std::streambuf* const stdout_buffer = std::cout.rdbuf(quiet.rdbuf());
  ASSERT_EQ(app::run_train(sets_for({"training.train_iters=2", "lr_schedule.decay_iters=2"})), 0);
  std::cout.rdbuf(stdout_buffer);
  std::vector<Ids> rows;
  std::mt19937 engine(5);
  for (int length : {17, 5, 9, 2, 13, 17, 3}) {
    rows.emplace_back();
    for (int i = 0; i < length; ++i) rows.back().push_back(std::int32_t(engine() % 100));
  }
  const std::string inputs = work_path("tiny_rows") + ".jsonl";
  write_on_rank0(inputs, jsonl_of(rows));
  auto loss_with = [&](const std::string& name, const std::vector<std::string>& layout) {
    const std::string output = work_path(name) + ".json";
    std::vector<std::string> sets = {"checkpoint.load=auto", "evaluate.inputs=" + inputs,
                                     "evaluate.output=" + output};
    sets.insert(sets.end(), layout.begin(), layout.end());
    EXPECT_EQ(app::run_evaluate(sets_for(sets)), 0);
    MPI_Barrier(MPI_COMM_WORLD);
    std::ifstream in(output);
    return nlohmann::json::parse(in).at("lm_loss").get<double>();
  };
  const bool one = world_size() == 1;
  const double a = loss_with("tiny_a", one ? std::vector<std::string>{"evaluate.micro_batch_size=1"}
                                           : std::vector<std::string>{"parallel.data_parallel=8"});
  const double b = loss_with(
      "tiny_b", one ? std::vector<std::string>{"evaluate.micro_batch_size=3"}
                    : std::vector<std::string>{"parallel.tensor_parallel=2",
                                               "parallel.pipeline_parallel=2",
                                               "parallel.schedule=interleaved",
                                               "parallel.virtual_stages=2"});
  EXPECT_LE(relative(b, a), 1e-6) << b << " vs " << a;
}

}  // namespace
}  // namespace meshtron
