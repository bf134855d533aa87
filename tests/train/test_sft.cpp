// Supervised fine-tuning data (data.source = jsonl) on one rank:
//  * decoder rows: prompt cut from the left, completion from the right,
//    targets -100 on the prompt and the padding;
//  * T5 rows: encoder and labels cut from the right, the decoder input the
//    labels shifted behind the decoder start;
//  * order: every epoch a permutation of the rows, reshuffled per epoch;
//    dp rank r of 2 or 4 reads the slots of one rank's micro-batches;
//  * the GPT loss over labelled targets only equals the mean of the plain
//    per-token losses over the completion tokens (fp64), whatever the
//    prompt's targets, and its gradient is that mean's (finite differences);
//  * the reader's one-line errors: malformed JSON at line N, a row of no
//    known shape, an empty file, a missing file.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "app/sft_rows.hpp"
#include "common/error.hpp"
#include "tests/generate/generate_test_util.hpp"
#include "train/sft_data.hpp"

namespace meshtron {
namespace {

std::vector<std::int32_t> values(const Tensor& t) {
  const auto* p = t.data<std::int32_t>();
  return {p, p + t.numel()};
}

/// Column j of an [s, b] tensor.
std::vector<std::int32_t> column(const Tensor& t, index_t b, index_t j) {
  std::vector<std::int32_t> out;
  for (index_t i = j; i < t.numel(); i += b) out.push_back(t.data<std::int32_t>()[i]);
  return out;
}

TEST(SftSamples, DecoderRowsCutPromptFromLeftCompletionFromRight) {
  // seq_length 6: a row holds 7 tokens.
  std::vector<SftExample> rows = {{{1, 2, 3}, {4, 5}, 1},
                                  {{1, 2, 3, 4, 5, 6}, {7, 8, 9}, 2},
                                  {{}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, 3}};
  const SftSamples samples(rows, 6, 0, "rows.jsonl");
  EXPECT_EQ(samples.truncated(), 2);
  const MicroBatch mb = samples.micro_batch({0, 1, 2}, 0);
  EXPECT_TRUE(mb.unlabelled_targets);
  const int x = -100;
  // Fits: ids 1 2 3 4 5 + padding 0; targets only on the completion 4 5.
  EXPECT_EQ(column(mb.ids, 3, 0), (std::vector<std::int32_t>{1, 2, 3, 4, 5, 0}));
  EXPECT_EQ(column(mb.targets, 3, 0), (std::vector<std::int32_t>{x, x, 4, 5, x, x}));
  // 6 + 3 tokens: the prompt loses its first two.
  EXPECT_EQ(column(mb.ids, 3, 1), (std::vector<std::int32_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(column(mb.targets, 3, 1), (std::vector<std::int32_t>{x, x, x, 7, 8, 9}));
  // No prompt: the completion cut from the right, every target scored.
  EXPECT_EQ(column(mb.ids, 3, 2), (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(column(mb.targets, 3, 2), (std::vector<std::int32_t>{2, 3, 4, 5, 6, 7}));
  // An empty slot scores nothing.
  EXPECT_EQ(values(samples.micro_batch({-1}, 0).targets), std::vector<std::int32_t>(6, x));
}

TEST(SftSamples, LossMaskForEvaluation) {
  const SftSamples samples({{{1, 2}, {3, 4}, 1}}, 4, 0, "rows.jsonl");
  const MicroBatch mb = with_loss_mask(samples.micro_batch({0}, 0));
  EXPECT_FALSE(mb.unlabelled_targets);
  EXPECT_EQ(values(mb.targets), (std::vector<std::int32_t>{0, 3, 4, 0}));
  const auto* mask = mb.loss_mask.data<float>();
  EXPECT_EQ(std::vector<float>(mask, mask + 4), (std::vector<float>{0, 1, 1, 0}));
}

TEST(SftSamples, RowWithoutScoredTokenNamesItsLine) {
  try {
    SftSamples({{{5}, {}, 1}, {{}, {7}, 4}}, 8, 0, "rows.jsonl");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("rows.jsonl:1: no completion token left"),
              std::string::npos)
        << e.what();
  }
}

TEST(SftSamples, T5RowsCutFromTheRightAndShiftedBehindTheStart) {
  const SftSamples samples({{{5, 6, 7, 8, 1}, {9, 10, 1}, 1}}, 4, 4, "t5.jsonl");
  EXPECT_EQ(samples.truncated(), 1);
  const data::T5Sample s = samples.t5_sample(0);
  EXPECT_EQ(s.enc_tokens, (std::vector<std::int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(s.enc_mask, (std::vector<std::int32_t>{1, 1, 1, 1}));
  EXPECT_EQ(s.labels, (std::vector<std::int32_t>{9, 10, 1, -100}));
  EXPECT_EQ(s.dec_in, (std::vector<std::int32_t>{0, 9, 10, 0}));
  EXPECT_EQ(s.dec_mask, (std::vector<std::int32_t>{1, 1, 1, 0}));
}

/// Rows whose only completion token is its index + 1: a sample's row is
/// its first target.
std::shared_ptr<const SftSamples> numbered_rows(int n) {
  std::vector<SftExample> rows;
  for (int i = 0; i < n; ++i) rows.push_back({{0}, {i + 1}, i + 1});
  return std::make_shared<const SftSamples>(rows, 2, 0, "rows.jsonl");
}

/// Row of each sample of steps 1..steps, in global-batch order, read by dp
/// ranks 0..dp-1 (micro-batch 2, global batch 8).
std::vector<int> rows_read(int n, int dp, long steps) {
  std::vector<std::unique_ptr<DataSource>> ranks;
  for (int r = 0; r < dp; ++r)
    ranks.push_back(make_sft_data({2, 2, 8, r, dp, steps, 0, 11}, 100, numbered_rows(n), nullptr));
  std::vector<int> out(std::size_t(steps * 8));
  for (long step = 1; step <= steps; ++step)
    for (int r = 0; r < dp; ++r)
      for (const MicroBatch& mb : ranks[std::size_t(r)]->train_step(step))
        for (index_t j = 0; j < 2; ++j)
          out[std::size_t((step - 1) * 8 + mb.sample_offset + j)] = mb.targets.data<std::int32_t>()[j] - 1;
  return out;
}

TEST(SftData, EveryEpochAPermutationReshuffled) {
  const std::vector<int> rows = rows_read(12, 1, 6);  // 48 samples: 4 epochs of 12
  std::vector<std::vector<int>> epochs;
  for (int e = 0; e < 4; ++e) {
    std::vector<int> epoch(rows.begin() + e * 12, rows.begin() + (e + 1) * 12);
    std::vector<int> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int> all(12);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "epoch " << e;
    epochs.push_back(epoch);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  std::vector<int> in_order(12);
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_NE(epochs[0], in_order);
}

TEST(SftData, SameSamplesOnOneTwoAndFourDpRanks) {
  const std::vector<int> one = rows_read(13, 1, 5);
  EXPECT_EQ(rows_read(13, 2, 5), one);
  EXPECT_EQ(rows_read(13, 4, 5), one);
}

/// An evaluation context of one [s, b] micro-batch on `r`'s tp group.
LayerContext eval_context(generate_test::Replica& r, index_t s, index_t b) {
  LayerContext ctx{r.rt.tp_group};
  ctx.training = false;
  ctx.seq_length = s;
  ctx.micro_batch = b;
  ctx.global_batch = b;
  return ctx;
}

/// Per-token losses of the GPT model of generate_test (fp64, one rank) on
/// `mb`, its targets read as the flag says.
std::vector<double> gpt_losses(generate_test::Replica& r, const MicroBatch& mb, index_t s,
                               index_t b, bool labelled_only) {
  LayerContext ctx = eval_context(r, s, b);
  GptModel::Cache cache;
  return r.trainer.gpt_chunks().front()->forward(mb.ids, mb.targets, ctx, cache, labelled_only)
      .to_doubles();
}

TEST(SftLoss, MeanOverCompletionTokensWhateverThePromptTargets) {
  generate_test::Replica r(MPI_COMM_SELF, "gpt2", 1, 1, DType::F64);
  const index_t s = 32, b = 2;
  const SftSamples samples({{{11, 12, 13, 14, 15}, {21, 22, 23}, 1}, {{31, 32}, {41, 42, 43, 44}, 2}},
                           s, 0, "rows.jsonl");
  const MicroBatch sft = samples.micro_batch({0, 1}, 0);
  const std::vector<double> weighted = gpt_losses(r, sft, s, b, true);
  // The plain per-token losses, averaged by hand over the scored tokens.
  const MicroBatch plain = with_loss_mask(sft);
  const std::vector<double> each = gpt_losses(r, plain, s, b, false);
  double sum = 0, scored = 0;
  for (std::size_t i = 0; i < each.size(); ++i)
    if (plain.loss_mask.data<float>()[i] != 0) {
      sum += each[i];
      scored += 1;
    }
  EXPECT_EQ(scored, 3 + 4);
  const double mean = std::accumulate(weighted.begin(), weighted.end(), 0.0) / double(s * b);
  EXPECT_NEAR(mean, sum / scored, 1e-12 * std::abs(sum / scored));
  // Other (valid) ids as the prompt's and the padding's targets, read as
  // plain targets: their losses change, the completion's do not.
  MicroBatch relabelled = plain;
  relabelled.targets = Tensor::empty(plain.targets.shape(), DType::I32);
  for (index_t i = 0; i < plain.targets.numel(); ++i)
    relabelled.targets.data<std::int32_t>()[i] =
        plain.loss_mask.data<float>()[i] != 0 ? plain.targets.data<std::int32_t>()[i] : 77;
  const std::vector<double> other = gpt_losses(r, relabelled, s, b, false);
  double other_sum = 0;
  for (std::size_t i = 0; i < other.size(); ++i)
    if (plain.loss_mask.data<float>()[i] != 0) other_sum += other[i];
  EXPECT_EQ(other_sum, sum);
  EXPECT_NE(other, each);
}

TEST(SftLoss, GradientIsTheCompletionMeansFiniteDifference) {
  generate_test::Replica r(MPI_COMM_SELF, "gpt2", 1, 1, DType::F64);
  GptModel& model = *r.trainer.gpt_chunks().front();
  const index_t s = 32, b = 2;
  const SftSamples samples({{{11, 12, 13}, {21, 22}, 1}, {{}, {41, 42, 43, 44}, 2}}, s, 0,
                           "rows.jsonl");
  const MicroBatch mb = samples.micro_batch({0, 1}, 0);
  const auto mean_loss = [&] {
    const std::vector<double> l = gpt_losses(r, mb, s, b, true);
    return std::accumulate(l.begin(), l.end(), 0.0) / double(s * b);
  };
  // d(mean)/d(per-token loss) = 1 / (s b), as the schedules start it.
  LayerContext ctx = eval_context(r, s, b);
  GptModel::Cache cache;
  ParameterList params = model.parameters();
  std::vector<std::vector<double>> before;
  for (Parameter* p : params) before.push_back(p->grad.to_doubles());
  model.forward(mb.ids, mb.targets, ctx, cache, true);
  Tensor dout = Tensor::empty({s * b}, DType::F64);
  for (index_t i = 0; i < s * b; ++i) dout.data<double>()[i] = 1.0 / double(s * b);
  model.backward(dout, ctx, cache);
  int checked = 0;
  for (std::size_t k = 0; k < params.size(); ++k) {
    Parameter& p = *params[k];
    if (p.name != "layers.1.mlp.proj.weight" && p.name != "final_norm.weight") continue;
    const std::vector<double> after = p.grad.to_doubles();
    for (index_t i : {index_t(0), index_t(5)}) {
      const double v = p.value.data<double>()[i], h = 1e-6;
      p.value.data<double>()[i] = v + h;
      const double up = mean_loss();
      p.value.data<double>()[i] = v - h;
      const double down = mean_loss();
      p.value.data<double>()[i] = v;
      const double numeric = (up - down) / (2 * h);
      const double analytic = after[std::size_t(i)] - before[k][std::size_t(i)];
      EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << p.name << " " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4);
}

/// read_sft_rows' error on a file of `text` (decoder rows, no tokenizer).
std::string reader_error(const std::string& text, bool t5 = false) {
  const std::string path = testing::TempDir() + "sft_rows.jsonl";
  std::ofstream(path) << text;
  try {
    app::read_sft_rows(path, "data.path", t5, nullptr, 100);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(SftRows, PreTokenizedRowsAsGiven) {
  const std::string path = testing::TempDir() + "sft_ids.jsonl";
  std::ofstream(path) << "{\"prompt_ids\": [1, 2], \"completion_ids\": [3]}\n\n"
                         "{\"prompt_ids\": [], \"completion_ids\": [4, 5]}\n";
  const auto rows = app::read_sft_rows(path, "data.path", false, nullptr, 100);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].context, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(rows[0].target, (std::vector<std::int32_t>{3}));
  EXPECT_EQ(rows[1].line, 3);
}

TEST(SftRows, OneLineErrors) {
  const std::string ok = "{\"prompt_ids\": [1], \"completion_ids\": [2]}\n";
  EXPECT_NE(reader_error(ok + "{\"prompt_ids\": [1,\n").find("sft_rows.jsonl:2: not valid JSON"),
            std::string::npos);
  EXPECT_NE(reader_error(ok + ok + "{\"question\": \"?\"}\n").find("sft_rows.jsonl:3: a row is"),
            std::string::npos);
  EXPECT_NE(reader_error("{\"input_ids\": [1], \"target_ids\": [2]}\n").find(":1: a row is"),
            std::string::npos);
  EXPECT_NE(reader_error("{\"prompt\": \"a\", \"completion\": \"b\"}\n")
                .find(":1: a text row needs the run's tokenizer"),
            std::string::npos);
  EXPECT_NE(reader_error("{\"prompt_ids\": [1], \"completion_ids\": [100]}\n")
                .find(":1: completion_ids[0] = 100 is outside [0, 100)"),
            std::string::npos);
  EXPECT_NE(reader_error("\n").find("data.path: no row in"), std::string::npos);
  try {
    app::read_sft_rows("/nonexistent/train.jsonl", "data.path", false, nullptr, 100);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "data.path: cannot read '/nonexistent/train.jsonl'");
  }
}

}  // namespace
}  // namespace meshtron
