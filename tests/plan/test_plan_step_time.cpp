// meshtron plan's step time from each family's real shape: its model FLOPs
// per step are the trainer's (train/metrics' formula), and T5's decoder
// stack, cross-attention and encoder-decoder pipeline split enter its
// compute, tp and pp traffic and its bubble.
#include <gtest/gtest.h>

#include <set>

#include "config/model_spec_from_deck.hpp"
#include "plan/search.hpp"
#include "train/metrics.hpp"

namespace meshtron::plan {
namespace {

constexpr int kVocab = 100;

/// A small deck of `arch` (gpt, bert or t5: 12 + 12 layers, s_e 32, s_d 8),
/// fp32 on the CPU (4-byte activations), 8 micro-batches of 2 per dp rank.
RunConfig deck(const std::string& arch, int tp, int pp, int split = 0, int decoder_s = 8) {
  std::string text = "[model]\narch = " + arch +
                     "\nnum_layers = 12\nhidden_size = 64\nnum_attention_heads = 4\n"
                     "seq_length = 32\nmax_position_embeddings = 32\nvocab_size = 100\n";
  if (arch == "t5")
    text += "decoder_seq_length = " + std::to_string(decoder_s) +
            "\nposition_embedding_type = relative\n[data]\nvocab_extra_ids = 4\n";
  text += "[training]\nmicro_batch_size = 2\nglobal_batch_size = 16\n";
  RunConfig c = RunConfig::from_text(text);
  c.parallel.tensor_parallel = tp;
  c.parallel.pipeline_parallel = pp;
  c.parallel.pipeline_split_rank = split;
  c.validate(tp * pp);
  return c;
}

Rates cpu_rates() {
  return read_rates(std::string(MESHTRON_SOURCE_DIR) + "/plan/rates/cpu.json");
}

StepEstimate estimate(const RunConfig& c) {
  const ModelSpec m = model_spec_from_deck(c, kVocab, c.parallel.tensor_parallel);
  return estimate_step(c, m, cpu_rates(), 8);
}

TEST(PlanStepTime, ModelFlopsPerStepAreTheTrainersForGptBertAndT5) {
  struct Layout {
    int tp, pp, split;
  };
  for (const char* arch : {"gpt", "bert", "t5"})
    for (const Layout& l : {Layout{1, 1, 0}, Layout{2, 1, 0}, Layout{2, 2, 0}, Layout{1, 4, 1}}) {
      const bool t5 = std::string(arch) == "t5";
      const RunConfig c = deck(arch, l.tp, l.pp, t5 ? l.split : 0);
      SCOPED_TRACE(std::string(arch) + " " + layout_name(c));
      const ModelSpec m = model_spec_from_deck(c, kVocab, l.tp);
      const StepEstimate step = estimate_step(c, m, cpu_rates(), 8);
      // The step line's tokens are the encoder's (T5) or the sequence's.
      const double trainer = model_flops_per_token(m) * c.training.global_batch_size * m.seq_length;
      EXPECT_NEAR(step.model_flops, trainer, 1e-12 * trainer);
      EXPECT_NEAR(step.model_tflops_per_gpu,
                  model_flops_per_token(m) * step.tokens_per_s_per_gpu / 1e12,
                  1e-12 * step.model_tflops_per_gpu);
    }
}

TEST(PlanStepTime, T5DecoderLengthEntersComputeAndTpTraffic) {
  const StepEstimate short_decoder = estimate(deck("t5", 2, 1, 0, 8));
  const StepEstimate long_decoder = estimate(deck("t5", 2, 1, 0, 32));
  EXPECT_GT(long_decoder.model_flops, short_decoder.model_flops);
  EXPECT_GT(long_decoder.compute_s, short_decoder.compute_s);
  EXPECT_GT(long_decoder.step_s, short_decoder.step_s);
  // Per micro-batch: 4 all-reduces of s b h per encoder layer, 4 + 2 of
  // s_d b h and one of s_e b h (d encoder output) per decoder layer, each
  // moving 2 (t - 1) / t of its 4-byte [rows, 64] payload.
  const auto all_reduce = [](double rows) { return 2 * 4.0 * rows * 2 * 64 * 0.5; };
  const double micro_batches = 8, se = 32, sd = 8;
  const double want = micro_batches * (12 * 4 * all_reduce(se) +
                                       12 * (6 * all_reduce(sd) + all_reduce(se)));
  EXPECT_DOUBLE_EQ(short_decoder.bytes.tp, want);
}

TEST(PlanStepTime, T5StagesSendTheEncoderOutputThroughTheDecoder) {
  // 4-byte rows of 64 over b = 2, both ways, 8 micro-batches: s_e rows up
  // to the split, s_e + s_d rows between decoder stages.
  const double row = 4.0 * 64 * 2 * 2 * 8;
  EXPECT_DOUBLE_EQ(estimate(deck("t5", 1, 2, 1)).bytes.pp, row * 32);
  EXPECT_DOUBLE_EQ(estimate(deck("t5", 1, 4, 2)).bytes.pp, row * (32 + 8));
  EXPECT_DOUBLE_EQ(estimate(deck("gpt", 1, 4)).bytes.pp, row * 32);
}

TEST(PlanStepTime, T5BubbleFollowsItsUnequalStages) {
  // 12 encoder layers at s_e 32 on one stage, 4 decoder layers at s_d 8 on
  // each of three: the encoder stage is the slowest, so the bubble is
  // below the equal stages' (pp - 1) / m and the split matters.
  const StepEstimate one = estimate(deck("t5", 1, 4, 1)), three = estimate(deck("t5", 1, 4, 3));
  EXPECT_GT(one.bubble, 0);
  EXPECT_LT(one.bubble, 3.0 / 8);
  EXPECT_NE(one.step_s, three.step_s);
  EXPECT_DOUBLE_EQ(estimate(deck("gpt", 1, 4)).bubble, 3.0 / 8);
}

TEST(PlanSearch, T5LayoutsPlaceTheSplitAndNeverInterleave) {
  const RunConfig base = deck("t5", 1, 1);
  const auto found = search_layouts(base, kVocab, 4, 1e12, cpu_rates(), 4);
  ASSERT_FALSE(found.empty());
  std::set<std::pair<int, int>> splits;  // (pp, split)
  for (const Candidate& k : found) {
    RunConfig c = k.config;
    EXPECT_NO_THROW(c.validate(4)) << layout_name(c);
    EXPECT_EQ(c.parallel.virtual_stages, 1) << layout_name(c);
    EXPECT_NE(c.parallel.schedule, "interleaved") << layout_name(c);
    splits.insert({c.parallel.pipeline_parallel, c.degrees().pipeline_split_rank});
  }
  // 12 + 12 layers divide over every split of 2 and 4 stages.
  EXPECT_EQ(splits, (std::set<std::pair<int, int>>{{1, 0}, {2, 1}, {4, 1}, {4, 2}, {4, 3}}));
}

}  // namespace
}  // namespace meshtron::plan
