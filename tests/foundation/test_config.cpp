// Input-deck parsing and every validation error.
#include <gtest/gtest.h>

#include <string>

#include "common/error.hpp"
#include "config/run_config.hpp"

namespace meshtron {
namespace {

const char* kDeck = R"(
[model]
num_layers = 4
hidden_size = 64
num_attention_heads = 4
seq_length = 32
[parallel]
tensor_parallel = 2
pipeline_parallel = 2
data_parallel = auto
[training]
micro_batch_size = 2
global_batch_size = 8
train_iters = 10
)";

RunConfig parse(std::vector<std::string> overrides = {}) {
  return RunConfig::from_text(kDeck, overrides);
}

/// The validation message for the deck with `overrides` on `world` ranks.
std::string error_of(std::vector<std::string> overrides, int world = 8) {
  try {
    RunConfig c = parse(overrides);
    c.validate(world);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ParsesTypedValuesAndDefaults) {
  RunConfig c = parse();
  EXPECT_EQ(c.model.num_layers, 4);
  EXPECT_EQ(c.parallel.tensor_parallel, 2);
  EXPECT_EQ(c.parallel.data_parallel, 0);  // auto until validated
  EXPECT_EQ(c.optimizer.type, "adamw");    // default
  EXPECT_DOUBLE_EQ(c.model.hidden_dropout, 0.1);
  c.validate(8);
  EXPECT_EQ(c.parallel.data_parallel, 2);
  EXPECT_EQ(c.lr_schedule.decay_iters, 10);  // defaults to train_iters
  EXPECT_EQ(c.model.ffn(), 256);
}

TEST(Config, OverridesWinOverTheDeck) {
  RunConfig c = parse({"model.num_layers=8", "parallel.sequence_parallel=true",
                       "optimizer.lr=1e-2"});
  EXPECT_EQ(c.model.num_layers, 8);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-2);
}

TEST(Config, ResolvedTextEchoesEverySection) {
  RunConfig c = parse();
  c.validate(8);
  const std::string text = c.resolved_text();
  for (const char* s : {"[run]", "[model]", "[parallel]", "[training]", "[optimizer]",
                        "[lr_schedule]", "[data]", "[checkpoint]", "[logging]"})
    EXPECT_NE(text.find(s), std::string::npos) << s;
  EXPECT_NE(text.find("data_parallel                  = 2"), std::string::npos) << text;
  EXPECT_NE(RunConfig::schema_help().find("model.hidden_size"), std::string::npos);
}

// The tunables of the CUDA kernels are deck keys (their refusals are
// ValidationCases): defaults, the values they take, and --help-deck's lines.
TEST(Config, KernelTunablesAreDeckKeys) {
  RunConfig defaults = parse();
  defaults.validate(8);
  EXPECT_FALSE(defaults.run.gemm_autotune);
  EXPECT_EQ(defaults.training.fused_attention_kernels, "auto");
  RunConfig c = parse({"run.device=cuda", "run.gemm_autotune=true",
                       "training.fused_attention_kernels=own"});
  c.validate(8);
  EXPECT_TRUE(c.run.gemm_autotune);
  EXPECT_EQ(c.training.fused_attention_kernels, "own");
  EXPECT_NE(c.resolved_text().find("fused_attention_kernels        = own"), std::string::npos)
      << c.resolved_text();
  const std::string help = RunConfig::schema_help();
  for (const char* line : {"run.gemm_autotune                        bool    default false ",
                           "training.fused_attention_kernels         string  default auto "})
    EXPECT_NE(help.find(line), std::string::npos) << line << " in\n" << help;
  EXPECT_THROW(parse({"run.gemm_autotune=1x"}), UserError);
}

// The deck that training.cuda_graphs accepts (its refusals are ValidationCases).
TEST(Config, CudaGraphsOnOneGpuIsValid) {
  RunConfig c = parse({"training.cuda_graphs=true", "run.device=cuda",
                       "parallel.tensor_parallel=1", "parallel.pipeline_parallel=1"});
  c.validate(1);
  EXPECT_TRUE(c.training.cuda_graphs);
}

TEST(Config, UnknownKeysAndBadValuesAreErrors) {
  EXPECT_THROW(RunConfig::from_text("[model]\nnum_layer = 3\n"), UserError);
  EXPECT_THROW(RunConfig::from_text("[modle]\nnum_layers = 3\n"), UserError);
  EXPECT_THROW(RunConfig::from_text("[model]\nnum_layers = three\n"), UserError);
  EXPECT_THROW(parse({"model.nope=1"}), UserError);
  EXPECT_THROW(parse({"no_equals_sign"}), UserError);
  EXPECT_THROW(parse({"parallel.data_parallel=two"}), UserError);
  EXPECT_THROW(RunConfig::from_file("/nonexistent/deck.ini"), UserError);
}

struct ValidationCase {
  std::vector<std::string> overrides;
  int world;
  const char* must_mention;
};

class ConfigValidation : public ::testing::TestWithParam<ValidationCase> {};

TEST_P(ConfigValidation, NamesTheOffendingValues) {
  const auto& p = GetParam();
  const std::string msg = error_of(p.overrides, p.world);
  EXPECT_NE(msg.find(p.must_mention), std::string::npos)
      << "message: '" << msg << "' should mention '" << p.must_mention << "'";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Errors, ConfigValidation,
    ::testing::Values(
        ValidationCase{{}, 6, "world size 6"},
        ValidationCase{{"parallel.data_parallel=3"}, 8, "data_parallel (3)"},
        ValidationCase{{"parallel.tensor_parallel=3"}, 12, "num_attention_heads (4)"},
        ValidationCase{{"parallel.pipeline_parallel=3", "parallel.tensor_parallel=1"}, 3,
                       "num_layers (4)"},
        ValidationCase{{"parallel.tensor_parallel=1", "parallel.sequence_parallel=true"},
                       4, "sequence_parallel"},
        ValidationCase{{"parallel.sequence_parallel_keep_gathered=true"}, 8,
                       "keep_gathered = true needs parallel.sequence_parallel"},
        ValidationCase{{"parallel.tp_copy_engine=true"}, 8,
                       "tp_copy_engine = true needs run.device = cuda"},
        ValidationCase{{"parallel.tp_copy_engine_min_bytes=-1"}, 8,
                       "parallel.tp_copy_engine_min_bytes must be >= 0, got -1"},
        ValidationCase{{"parallel.tp_interleave=true"}, 8,
                       "tp_interleave = true needs parallel.pipeline_parallel = 1 (got 2)"},
        ValidationCase{{"parallel.tp_interleave=true", "parallel.pipeline_parallel=1",
                        "training.micro_batch_size=2", "training.global_batch_size=8"},
                       8, "at least 2 micro-batches per step on each dp rank (got 1"},
        ValidationCase{{"training.cuda_graphs=true", "run.device=cuda", "parallel.tensor_parallel=1",
                        "parallel.pipeline_parallel=1", "parallel.tp_interleave=true",
                        "training.global_batch_size=32"},
                       8, "parallel.tp_interleave = false"},
        ValidationCase{{"parallel.tp_interleave_streams=2"}, 8,
                       "tp_interleave_streams = 2 needs parallel.tp_interleave = true"},
        ValidationCase{{"parallel.tp_interleave_streams=3"}, 8, "must be 1 or 2"},
        ValidationCase{{"run.gemm_autotune=true"}, 8,
                       "gemm_autotune = true needs run.device = cuda"},
        ValidationCase{{"training.fused_attention_kernels=cudnn", "run.device=cuda"}, 8,
                       "training.fused_attention_kernels = 'cudnn' is not one of auto | own"},
        ValidationCase{{"training.fused_attention_kernels=own"}, 8,
                       "fused_attention_kernels = own needs run.device = cuda"},
        ValidationCase{{"training.cuda_graphs=true"}, 8, "cuda_graphs = true needs run.device"},
        ValidationCase{{"training.cuda_graphs=true", "run.device=cuda"}, 8,
                       "parallel.pipeline_parallel = 1 (got 2)"},
        ValidationCase{{"training.cuda_graphs=true", "run.device=cuda",
                        "parallel.pipeline_parallel=1", "parallel.tp_copy_engine=true"},
                       8, "parallel.tp_copy_engine = false"},
        ValidationCase{{"training.cuda_graphs=true", "run.device=cuda",
                        "parallel.tensor_parallel=1", "parallel.pipeline_parallel=1",
                        "parallel.distributed_optimizer=true",
                        "parallel.overlap_grad_reduce=true"},
                       4, "overlap_grad_reduce = overlap_param_gather = false"},
        ValidationCase{{"run.device=cuda", "logging.profile=true", "logging.profile_step_start=5",
                        "logging.profile_step_end=5"},
                       8, "1 <= start < end"},
        ValidationCase{{"run.device=cuda", "logging.profile=true", "training.train_iters=3",
                        "logging.profile_step_end=9"},
                       8, "traces past training.train_iters"},
        ValidationCase{{"model.hidden_size=66"}, 8, "hidden_size (66)"},
        ValidationCase{{"model.seq_length=64", "model.max_position_embeddings=32"}, 8,
                       "max_position_embeddings (32)"},
        ValidationCase{{"training.global_batch_size=6"}, 8, "global_batch_size (6)"},
        ValidationCase{{"parallel.schedule=zigzag"}, 8, "zigzag"},
        ValidationCase{{"parallel.virtual_stages=2"}, 8, "interleaved"},
        ValidationCase{{"parallel.schedule=interleaved", "parallel.virtual_stages=4"}, 8,
                       "virtual_stages (4)"},
        ValidationCase{{"training.precision=fp8"}, 8, "fp8"},
        ValidationCase{{"training.precision=bf16"}, 8, "run.device = cuda"},
        ValidationCase{{"training.logits_dtype=bf16"}, 8, "fp32 | compute"},
        ValidationCase{{"training.attention_dropout_rng=curand"}, 8, "meshtron | cudnn"},
        ValidationCase{{"training.attention_dropout_rng=cudnn"}, 8,
                       "attention_dropout_rng = cudnn needs run.device = cuda"},
        ValidationCase{{"training.attention_dropout_rng=cudnn", "run.device=cuda"}, 8,
                       "needs training.precision = bf16 or fp16"},
        ValidationCase{{"training.attention_dropout_rng=cudnn", "run.device=cuda",
                        "training.precision=bf16", "model.attention_backend=unfused"},
                       8, "not model.attention_backend = unfused"},
        ValidationCase{{"model.hidden_dropout=1.5"}, 8, "hidden_dropout"},
        ValidationCase{{"optimizer.min_lr=1"}, 8, "min_lr"},
        ValidationCase{{"lr_schedule.decay_style=step"}, 8, "decay_style"},
        ValidationCase{{"data.source=indexed"}, 8, "data.path"},
        ValidationCase{{"run.device=tpu"}, 8, "tpu"},
        ValidationCase{{"parallel.pipeline_layers=1,2"}, 8, "pipeline_layers = 1,2 names 2 stages with 3 layers"},
        ValidationCase{{"parallel.pipeline_layers=4,x"}, 8, "'x' is not a positive layer count"},
        ValidationCase{{"parallel.pipeline_layers=0,4"}, 8, "'0' is not a positive layer count"},
        ValidationCase{{"parallel.pipeline_layers=balanced", "model.num_layers=1"}, 8,
                       "num_layers (1) is fewer than the 2 model chunks"},
        ValidationCase{{"parallel.pipeline_layers=balanced", "parallel.schedule=interleaved",
                        "parallel.virtual_stages=2", "model.num_layers=3"}, 8,
                       "num_layers (3) is fewer than the 4 model chunks"},
        ValidationCase{{"parallel.pipeline_layers=2,2", "parallel.schedule=interleaved",
                        "parallel.virtual_stages=2"}, 8, "cannot be combined with virtual stages"}));

TEST(Config, NamedUnevenPipelineSplit) {
  RunConfig c = parse({"parallel.pipeline_layers=1,3"});
  c.validate(8);
  EXPECT_EQ(c.parallel.chunk_layers(4), (std::vector<int>{1, 3}));
  RunConfig uniform = parse();
  uniform.validate(8);
  EXPECT_EQ(uniform.parallel.chunk_layers(4), (std::vector<int>{2, 2}));
}

TEST(Config, BalancedPipelineSplitCountsTheHeadOnTheLastStage) {
  // GPT-2 774M (36 layers, head worth 2.89 layers) on 2 stages: 19,17, the
  // split measured fastest on 2 H100s (perf/e2e_gpu.py --pp-split; perf/RESULTS.md,
  // "pp 2 at 774M").
  EXPECT_EQ(balanced_stage_layers(36, 2, 2.89), (std::vector<int>{19, 17}));
  // No head: uniform where the layers divide, the earlier stages first where not.
  EXPECT_EQ(balanced_stage_layers(8, 4, 0.0), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(balanced_stage_layers(10, 4, 0.0), (std::vector<int>{3, 3, 2, 2}));
  // A head worth more than all layers: the last stage keeps one layer.
  EXPECT_EQ(balanced_stage_layers(8, 2, 39.0), (std::vector<int>{7, 1}));
  // 124M (12 layers, head 3.97) on 4 stages: costs 4, 4, 3, 1 + 3.97.
  EXPECT_EQ(balanced_stage_layers(12, 4, 3.97), (std::vector<int>{4, 4, 3, 1}));
  EXPECT_THROW(balanced_stage_layers(1, 2, 0.0), UserError);

  RunConfig c = parse({"parallel.pipeline_layers=balanced"});
  c.validate(8);
  EXPECT_EQ(c.parallel.chunk_layers(4, 0.5), (std::vector<int>{2, 2}));
  EXPECT_EQ(c.parallel.chunk_layers(4, 1.5), (std::vector<int>{3, 1}));
  // Interleaved: balanced over the pp x v model chunks (the last has the head).
  EXPECT_EQ(balanced_stage_layers(36, 4, 2.89), (std::vector<int>{10, 10, 9, 7}));
  RunConfig interleaved = parse({"parallel.pipeline_layers=balanced", "model.num_layers=8",
                                 "parallel.schedule=interleaved", "parallel.virtual_stages=2"});
  interleaved.validate(8);
  EXPECT_EQ(interleaved.parallel.chunk_layers(8, 1.5), (std::vector<int>{3, 2, 2, 1}));
  RunConfig uniform = parse({"model.num_layers=8", "parallel.schedule=interleaved",
                             "parallel.virtual_stages=2"});
  uniform.validate(8);
  EXPECT_EQ(uniform.parallel.chunk_layers(8), (std::vector<int>{2, 2, 2, 2}));
}

}  // namespace
}  // namespace meshtron
