// Decomposition invariance (DESIGN.md invariant 1): every (tp, pp, dp) layout
// of the world, with each schedule, with and without the distributed
// optimizer and sequence parallelism, trains 3 steps with dropout on and
// matches the single-rank run, which runs on MPI_COMM_SELF inside the same
// job. Two checks per layout:
//
//  * fp32 (the host path): per-step losses and gradient norms to 1e-5
//    relative, every parameter to 1e-4 norm-wise relative. Parameters are
//    not held to 1e-5: after AdamW, an element whose gradient is near fp32
//    rounding level is divided by its own tiny RMS, so a different summation
//    order (dp all-reduce vs sequential accumulation) becomes an lr-sized
//    step; we measured up to 2.3e-5 norm-wise on qkv.bias with correct code.
//  * fp64 (same code, double precision): losses, gradient norms and every
//    parameter to 1e-10, which rules out any real decomposition error.
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include <mpi.h>

#include <cmath>

#include "decomposition_expect.hpp"
#include "config/model_spec_from_deck.hpp"
#include "train/metrics.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;


std::vector<Layout> all_layouts(int world) {
  std::vector<Layout> out;
  for (int tp = 1; tp <= world; tp *= 2)
    for (int pp = 1; tp * pp <= world; pp *= 2) {
      if (world % (tp * pp)) continue;
      const int dp = world / (tp * pp);
      const int micro_batches = 16 / dp;
      for (std::string schedule : {"gpipe", "1f1b", "interleaved"}) {
        if (schedule == "interleaved" && (pp == 1 || 8 % (2 * pp) || micro_batches % pp))
          continue;
        for (bool distopt : {false, true})
          for (bool sp : {false, true}) {
            if (sp && tp == 1) continue;
            out.push_back({tp, pp, dp, schedule, distopt, sp});
          }
      }
    }
  return out;
}

class Decomposition : public ::testing::TestWithParam<Layout> {};

TEST_P(Decomposition, MatchesSingleRankRun) { expect_matches_single_rank(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Layouts, Decomposition, ::testing::ValuesIn(all_layouts(world_size())),
                         [](const auto& info) { return info.param.name(); });

// parallel.sequence_parallel_keep_gathered: the column-parallel layers keep
// their gathered input for the weight gradient instead of gathering again.
TEST(Decomposition, SequenceParallelKeepingGatheredInputMatchesSingleRankRun) {
  const int world = world_size();
  if (world % 2) GTEST_SKIP() << "needs an even world";
  Layout kept{2, 1, world / 2, "1f1b", false, true};
  kept.overrides = {"parallel.sequence_parallel_keep_gathered=true"};
  expect_matches_single_rank(kept);
}

/// Each of `variants` (deck overrides) on tp 2 and tp 4 with SP (those the
/// world divides) against the single-rank run.
void expect_sp_variants_match_single_rank(const std::vector<std::vector<std::string>>& variants) {
  const int world = world_size();
  if (world % 2) GTEST_SKIP() << "needs an even world";
  for (int tp : {2, 4}) {
    if (world % tp) continue;
    for (const auto& overrides : variants) {
      Layout layout{tp, 1, world / tp, "1f1b", false, true};
      layout.overrides = overrides;
      expect_matches_single_rank(layout);
    }
  }
}

// parallel.split_row_parallel_backward is on by default (every SP layout
// above runs it); here both settings, with keep_gathered, at tp 2 and 4.
TEST(Decomposition, SplitAndUnsplitRowParallelBackwardMatchSingleRankRun) {
  const std::string keep = "parallel.sequence_parallel_keep_gathered=true";
  expect_sp_variants_match_single_rank({{"parallel.split_row_parallel_backward=true", keep},
                                        {"parallel.split_row_parallel_backward=false", keep}});
}

// parallel.split_column_parallel_forward (off by default): the qkv and fc1
// GEMMs on this rank's own rows while the all-gather brings the others', with
// and without keep_gathered, at tp 2 and 4.
TEST(Decomposition, SplitColumnParallelForwardMatchesSingleRankRun) {
  const std::string split = "parallel.split_column_parallel_forward=true";
  expect_sp_variants_match_single_rank({{split, "parallel.sequence_parallel_keep_gathered=true"},
                                        {split, "parallel.sequence_parallel_keep_gathered=false"}});
}

TEST(Decomposition, NamedUnevenPipelineSplitMatchesSingleRankRun) {
  const int world = world_size();
  if (world % 2) GTEST_SKIP() << "needs an even world";
  Layout uneven{1, 2, world / 2, "1f1b"};
  uneven.overrides = {"parallel.pipeline_layers=3,5"};
  expect_same_run(train_layout(MPI_COMM_WORLD, uneven, DType::F64),
                  single_rank_reference(DType::F64), 1e-10, 1e-10);
}

// model.untie_embeddings_and_output_weights: the head's own
// output_layer.weight (vocabulary rows split over tp, on the last stage only,
// no embedding-group reduction) on tp 2 x pp 2, with and without the
// distributed optimizer, against one rank of the same untied model.
TEST(Decomposition, UntiedOutputWeightsMatchSingleRankRun) {
  const int world = world_size();
  if (world % 4) GTEST_SKIP() << "needs a world divisible by 4";
  const std::vector<std::string> untied{"model.untie_embeddings_and_output_weights=true"};
  const RunResult one_rank = train_layout(MPI_COMM_SELF, Layout{.overrides = untied}, DType::F64);
  ASSERT_TRUE(one_rank.params.count("output_layer.weight"));
  EXPECT_NE(one_rank.params.at("output_layer.weight"), one_rank.params.at("embedding.word.weight"));
  for (bool distopt : {false, true}) {
    Layout layout{2, 2, world / 4, "1f1b", distopt, true};
    layout.overrides = untied;
    SCOPED_TRACE(layout.name());
    expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F64), one_rank, 1e-10, 1e-10);
  }
}

// "balanced" through the trainer, 1f1b and interleaved (uneven model chunks,
// which no named split makes). With a vocabulary of 1000 the head is worth
// 2.5 of this model's layers (32 x 1000 / 12800), so the split is uneven:
// 5,3 over 2 stages, 3,2,2,1 over 2 x 2 chunks; against one rank of the
// same model.
TEST(Decomposition, BalancedPipelineSplitsMatchSingleRankRun) {
  const int world = world_size();
  if (world % 2) GTEST_SKIP() << "needs an even world";
  const std::vector<std::string> vocab{"model.vocab_size=1000"};
  const RunResult one_rank = train_layout(MPI_COMM_SELF, Layout{.overrides = vocab}, DType::F64);
  for (const auto& [schedule, want] : {std::pair<std::string, std::vector<int>>{"1f1b", {5, 3}},
                                       {"interleaved", {3, 2, 2, 1}}}) {
    SCOPED_TRACE(schedule);
    Layout balanced{1, 2, world / 2, schedule};
    balanced.overrides = vocab;
    balanced.overrides.push_back("parallel.pipeline_layers=balanced");
    const RunConfig config = tiny_config(balanced, world);
    const ModelSpec model = model_spec_from_deck(config, 1000, 1);
    EXPECT_EQ(config.parallel.chunk_layers(model.num_layers, head_cost_in_layers(model)), want);
    expect_same_run(train_layout(MPI_COMM_WORLD, balanced, DType::F64), one_rank, 1e-10, 1e-10);
  }
}

// model.attention_backend = fused: the host's fused attention, which drops
// the probabilities with the unfused path's mask of the global (sample, head,
// i, j) index (this deck's attention_dropout is 0.1), on tp (heads split, with
// SP), pp and dp (samples split) against the unfused single-rank run.
TEST(Decomposition, FusedAttentionWithDropoutMatchesSingleRankRun) {
  const int world = world_size();
  if (world % 2) GTEST_SKIP() << "needs an even world";
  std::vector<Layout> layouts = {Layout{2, 1, world / 2, "1f1b", false, true},
                                 Layout{1, 2, world / 2, "1f1b"}};
  if (world % 4 == 0) layouts.push_back(Layout{2, 2, world / 4, "1f1b", true, true});
  for (Layout layout : layouts) {
    layout.overrides = {"model.attention_backend=fused"};
    SCOPED_TRACE(layout.name());
    expect_matches_single_rank(layout);
  }
}

// Llama's norm and MLP (RMSNorm, the final norm too; SwiGLU with fc = [gate
// | up], each half sharded over tp) on tp 2 with SP, pp 2, and tp 2 x pp 2 x
// dp 2 with the distributed optimizer, against one rank of the same model.
TEST(Decomposition, RmsNormAndSwigluMatchSingleRankRun) {
  const int world = world_size();
  if (world % 2) GTEST_SKIP() << "needs an even world";
  const std::vector<std::string> llama{"model.normalization=RMSNorm", "model.activation=swiglu"};
  std::vector<Layout> layouts = {Layout{2, 1, world / 2, "1f1b", false, true},
                                 Layout{1, 2, world / 2, "1f1b"}};
  if (world % 4 == 0) layouts.push_back(Layout{2, 2, world / 4, "1f1b", true, true});
  const RunResult one_rank_fp32 = train_layout(MPI_COMM_SELF, Layout{.overrides = llama},
                                               DType::F32);
  const RunResult one_rank_fp64 = train_layout(MPI_COMM_SELF, Layout{.overrides = llama},
                                               DType::F64);
  // Not GPT-2's run: the settings reached the model.
  EXPECT_GT(std::fabs(one_rank_fp32.losses.back() -
                      single_rank_reference(DType::F32).losses.back()),
            1e-4);
  EXPECT_EQ(one_rank_fp32.params.count("layers.0.ln_1.bias"), 0u);
  for (Layout layout : layouts) {
    layout.overrides = llama;
    SCOPED_TRACE(layout.name());
    expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F32), one_rank_fp32, 1e-5, 1e-4);
    expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F64), one_rank_fp64, 1e-10,
                    1e-10);
  }
}

// GPT-NeoX's block: a parallel residual (x + attention(ln_1 x) + mlp(ln_2 x),
// each branch reduce-scattered on its own under SP), partial rotary (half of
// each head's 8 dims), the exact GeLU, untied head; on tp 2 with SP, pp 2
// (gpipe, interleaved), and tp 2 x pp 2 x dp with the distributed optimizer,
// with dropout (the adds in the dropout kernels) and without it (the adds in
// the GEMMs), with selective and full recompute, against one rank of the
// same model.
TEST(Decomposition, GptNeoxParallelResidualMatchesSingleRankRun) {
  const int world = world_size();
  if (world % 2) GTEST_SKIP() << "needs an even world";
  const auto neox_keys = [](bool parallel_residual) {
    return std::vector<std::string>{
        "model.num_attention_heads=4", "model.position_embedding_type=rope",
        "model.rotary_percent=0.5", "model.activation=gelu",
        "model.untie_embeddings_and_output_weights=true",
        std::string("model.parallel_residual=") + (parallel_residual ? "true" : "false")};
  };
  const std::vector<std::string> neox = neox_keys(true);
  std::vector<Layout> layouts = {Layout{2, 1, world / 2, "1f1b", false, true},
                                 Layout{1, 2, world / 2, "gpipe"},
                                 Layout{1, 2, world / 2, "interleaved"}};
  if (world % 4 == 0) layouts.push_back(Layout{2, 2, world / 4, "1f1b", true, true});
  // Not the sequential block's run: the parallel residual reached the layers.
  const std::vector<std::string> sequential = neox_keys(false);
  EXPECT_GT(std::fabs(train_layout(MPI_COMM_SELF, Layout{.overrides = neox}, DType::F32)
                          .losses.back() -
                      train_layout(MPI_COMM_SELF, Layout{.overrides = sequential}, DType::F32)
                          .losses.back()),
            1e-4);
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, std::vector<std::string>{"model.hidden_dropout=0"},
        std::vector<std::string>{"training.recompute=selective"},
        std::vector<std::string>{"training.recompute=full"}}) {
    std::vector<std::string> keys = neox;
    keys.insert(keys.end(), extra.begin(), extra.end());
    for (DType dtype : {DType::F32, DType::F64}) {
      const RunResult one_rank = train_layout(MPI_COMM_SELF, Layout{.overrides = keys}, dtype);
      EXPECT_EQ(one_rank.params.count("embedding.position.weight"), 0u);
      EXPECT_EQ(one_rank.params.count("output_layer.weight"), 1u);
      const bool fp64 = dtype == DType::F64;
      for (Layout layout : layouts) {
        layout.overrides = keys;
        SCOPED_TRACE(::testing::Message() << layout.name() << " " << dtype_name(dtype) << " "
                                          << (extra.empty() ? "" : extra[0]));
        expect_same_run(train_layout(MPI_COMM_WORLD, layout, dtype), one_rank,
                        fp64 ? 1e-10 : 1e-5, fp64 ? 1e-10 : 1e-4);
      }
    }
  }
}

// The one-rank memorisation run the GPU tests build on (testing::memorise):
// on the host path too the loss of a fixed batch falls, every step updates.
// Rotary positions and grouped queries (8 heads, 4 kv groups: each rank of
// tp 2 holds 4 q heads and 2 groups, of tp 4 2 and 1) on tp 2 x pp 2 with SP
// and the distributed optimizer, tp 4 with SP, and interleaved pp 4 (pp 2 on
// 4 ranks), alone and in Llama's block (RMSNorm, SwiGLU, no biases).
TEST(Decomposition, RotaryGroupedQueriesMatchSingleRankRun) {
  const int world = world_size();
  if (world % 4) GTEST_SKIP() << "needs a world of a multiple of 4";
  const std::vector<std::string> attention = {"model.num_attention_heads=8",
                                              "model.num_query_groups=4",
                                              "model.position_embedding_type=rope"};
  std::vector<std::string> llama = attention;
  llama.insert(llama.end(), {"model.normalization=RMSNorm", "model.activation=swiglu",
                             "model.add_bias_linear=false"});
  const std::vector<Layout> layouts = {Layout{2, 2, world / 4, "1f1b", true, true},
                                       Layout{4, 1, world / 4, "1f1b", false, true},
                                       Layout{1, world / 2, 2, "interleaved", true, false}};
  for (const auto& keys : {attention, llama}) {
    for (DType dtype : {DType::F32, DType::F64}) {
      const RunResult one_rank = train_layout(MPI_COMM_SELF, Layout{.overrides = keys}, dtype);
      // q | k | v of 8 + 4 + 4 heads of 4 over hidden 32, and no position table.
      EXPECT_EQ(one_rank.params.at("layers.0.attention.qkv.weight").size(), 32u * 64u);
      EXPECT_EQ(one_rank.params.count("embedding.position.weight"), 0u);
      const bool fp64 = dtype == DType::F64;
      for (Layout layout : layouts) {
        layout.overrides = keys;
        SCOPED_TRACE(::testing::Message() << layout.name() << ", " << dtype_name(dtype) << ", "
                                          << keys.size() << " keys");
        expect_same_run(train_layout(MPI_COMM_WORLD, layout, dtype), one_rank,
                        fp64 ? 1e-10 : 1e-5, fp64 ? 1e-10 : 1e-4);
      }
    }
  }
}

// Grouped queries through the fused core (k and v repeated per query head,
// their gradients summed back over the group) equal the unfused core's
// grouped GEMMs on one rank, and on tp 2 x pp 2 with SP, dropout on.
TEST(Decomposition, GroupedQueriesFusedCoreMatchesUnfused) {
  const int world = world_size();
  if (world % 4) GTEST_SKIP() << "needs a world of a multiple of 4";
  const std::vector<std::string> grouped = {"model.num_attention_heads=8",
                                            "model.num_query_groups=2",
                                            "model.position_embedding_type=rope"};
  std::vector<std::string> fused = grouped;
  fused.push_back("model.attention_backend=fused");
  const RunResult unfused_run = train_layout(MPI_COMM_SELF, Layout{.overrides = grouped}, DType::F64);
  expect_same_run(train_layout(MPI_COMM_SELF, Layout{.overrides = fused}, DType::F64), unfused_run,
                  1e-10, 1e-10);
  Layout layout{2, 2, world / 4, "1f1b", true, true};
  layout.overrides = fused;
  expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F64), unfused_run, 1e-10, 1e-10);
}

// ALiBi and the embedding norm (BLOOM's block): 4 heads, so each tp rank of
// tp 2 adds the slopes of its own 2 global heads, on tp 2 with SP, pp 2, and
// tp 2 x pp 2 with the distributed optimizer over the rest dp.
TEST(Decomposition, AlibiEmbeddingNormMatchSingleRankRun) {
  const int world = world_size();
  if (world % 4) GTEST_SKIP() << "needs a world of a multiple of 4";
  const std::vector<std::string> bloom = {"model.num_attention_heads=4",
                                          "model.position_embedding_type=alibi",
                                          "model.embedding_norm=true"};
  const Layout layouts[] = {{2, 1, world / 2, "1f1b", false, true},
                            {1, 2, world / 2, "1f1b", false, false},
                            {2, 2, world / 4, "1f1b", true, true}};
  for (DType dtype : {DType::F32, DType::F64}) {
    const RunResult one_rank = train_layout(MPI_COMM_SELF, Layout{.overrides = bloom}, dtype);
    EXPECT_EQ(one_rank.params.count("embedding.position.weight"), 0u);
    ASSERT_EQ(one_rank.params.count("embedding.norm.bias"), 1u);
    double moved = 0;  // the norm trains: its bias leaves 0
    for (double v : one_rank.params.at("embedding.norm.bias")) moved = std::max(moved, std::fabs(v));
    EXPECT_GT(moved, 0.0);
    const bool fp64 = dtype == DType::F64;
    for (Layout layout : layouts) {
      layout.overrides = bloom;
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << ", " << layout.name());
      expect_same_run(train_layout(MPI_COMM_WORLD, layout, dtype), one_rank,
                      fp64 ? 1e-10 : 1e-5, fp64 ? 1e-10 : 1e-4);
    }
  }
}

// The fused core with ALiBi (each tp rank passes the slopes of its own
// global heads) and with BERT's key padding mask (each dp rank the mask of
// its own samples), attention dropout on, on tp 2 x pp 2 with SP and the
// distributed optimizer, against the unfused core on one rank.
TEST(Decomposition, FusedAlibiAndPaddingMaskMatchUnfusedSingleRankRun) {
  const int world = world_size();
  if (world % 4) GTEST_SKIP() << "needs a world of a multiple of 4";
  const std::vector<std::string> families[] = {
      {"model.num_attention_heads=4", "model.position_embedding_type=alibi",
       "model.embedding_norm=true"},
      {"model.arch=bert"}};
  for (const std::vector<std::string>& family : families) {
    SCOPED_TRACE(family.front());
    std::vector<std::string> unfused = family, fused = family;
    unfused.push_back("model.attention_backend=unfused");
    fused.push_back("model.attention_backend=fused");
    const RunResult one_rank =
        train_layout(MPI_COMM_SELF, Layout{.overrides = unfused}, DType::F64);
    Layout layout{2, 2, world / 4, "1f1b", true, true};
    layout.overrides = fused;
    expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F64), one_rank, 1e-10, 1e-10);
  }
}

TEST(Reference, MemorisingOneBatchLowersItsLoss) {
  const MemorisedRun run = memorise({"optimizer.lr=1e-2", "optimizer.min_lr=1e-3"}, DType::F32, 6);
  ASSERT_EQ(run.steps.size(), 6u);
  EXPECT_EQ(run.optimizer_steps, 6);
  EXPECT_LT(run.losses().back(), run.losses().front() - 0.1);
  EXPECT_FALSE(run.params.empty());
}

TEST(Reference, LossesAreFiniteAndTrainingMovesTheModel) {
  const RunResult& ref = single_rank_reference(DType::F32);
  for (double l : ref.losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_GT(ref.losses[0], 4.0);  // ~ln(100) at initialisation
  const RunResult one_step = train_layout(MPI_COMM_SELF, Layout{}, DType::F32, 1);
  // Three steps move the parameters further than one (the test can fail if
  // the optimizer did nothing).
  EXPECT_GT(norm_rel_error(ref.params.at("layers.0.mlp.fc.weight"),
                          one_step.params.at("layers.0.mlp.fc.weight")),
            1e-4);
}

}  // namespace
}  // namespace meshtron::testing
