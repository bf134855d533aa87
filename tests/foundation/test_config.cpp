// Input-deck parsing and every validation error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
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

TEST(Config, UnsignedKeysTakeTheirWholeRange) {
  EXPECT_EQ(parse().run.seed, 1234u);
  EXPECT_EQ(parse({"run.seed=0"}).run.seed, 0u);
  EXPECT_EQ(parse({"run.seed=18446744073709551615"}).run.seed, 18446744073709551615u);
  EXPECT_EQ(RunConfig::from_text("[run]\nseed = 42\n").run.seed, 42u);
}

TEST(Config, FloatKeysAcceptTheEdgesOfTheirRanges) {
  RunConfig c = parse({"model.hidden_dropout=0", "optimizer.lr=0", "optimizer.min_lr=0",
                       "optimizer.beta1=0", "training.clip_grad=0", "optimizer.weight_decay=0",
                       "logging.peak_tflops=0"});
  EXPECT_NO_THROW(c.validate(8));
  const std::string help = RunConfig::schema_help();
  EXPECT_NE(help.find("peak learning rate (finite and >= 0)"), std::string::npos) << help;
  EXPECT_NE(help.find("Adam epsilon (finite and > 0)"), std::string::npos) << help;
  EXPECT_NE(help.find("dropout on attention probs (in [0, 1))"), std::string::npos) << help;
}

/// Deck files in a fresh temporary folder, removed with it.
class DeckFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("meshtron_test_config_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  /// The message of reading `paths`, "" when they read.
  static std::string error_of_files(const std::vector<std::string>& paths) {
    try {
      RunConfig::from_files(paths);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }

  std::filesystem::path dir_;
};

TEST_F(DeckFiles, LaterDecksOverrideEarlierOnesAndSetOverridesAll) {
  const std::string base = write("base.deck", kDeck);
  const std::string run = write("run.deck",
                                "[model]\nnum_layers = 6\n[optimizer]\nlr = 1e-3\n"
                                "[training]\ntrain_iters = 7");  // no final newline
  RunConfig c = RunConfig::from_files({base, run});
  EXPECT_EQ(c.model.num_layers, 6);              // the later deck wins
  EXPECT_EQ(c.model.seq_length, 32);             // the sections merge
  EXPECT_EQ(c.parallel.tensor_parallel, 2);      // only the earlier deck sets it
  EXPECT_EQ(c.training.train_iters, 7);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_EQ(c.deck_path, base + " " + run);
  EXPECT_EQ(RunConfig::from_files({run, base}).model.num_layers, 4);  // order decides

  RunConfig set = RunConfig::from_files({base, run}, {"model.num_layers=8"});
  EXPECT_EQ(set.model.num_layers, 8);
  EXPECT_EQ(set.training.train_iters, 7);

  // A checkpoint's deck_text reads back as the same decks, in the same order.
  EXPECT_NE(c.deck_text.find("# --- deck " + run + " ---\n[model]"), std::string::npos)
      << c.deck_text;
  RunConfig again = RunConfig::from_text(c.deck_text);
  EXPECT_EQ(again.model.num_layers, 6);
  EXPECT_EQ(again.model.seq_length, 32);
  EXPECT_EQ(again.training.train_iters, 7);
  EXPECT_EQ(again.resolved_text(), c.resolved_text());
  // One deck's text stays as it was read.
  EXPECT_EQ(RunConfig::from_file(base).deck_text, kDeck);
}

TEST_F(DeckFiles, AKeyTwiceInOneDeckIsStillAnError) {
  const std::string twice = write("twice.deck", "[model]\nnum_layers = 2\nnum_layers = 3\n");
  const std::string msg = error_of_files({twice});
  EXPECT_NE(msg.find(twice), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.num_layers"), std::string::npos) << msg;
}

TEST_F(DeckFiles, AnEmptyDeckIsAnError) {
  const std::string empty = write("empty.deck", "");
  const std::string blank = write("blank.deck", " \n\t\n");
  const std::string base = write("base.deck", kDeck);
  EXPECT_EQ(error_of_files({empty}), "input deck '" + empty + "' is empty");
  EXPECT_EQ(error_of_files({base, blank}), "input deck '" + blank + "' is empty");
}

TEST_F(DeckFiles, ADeckThatIsNotARegularFileIsAnError) {
  const std::string msg = error_of_files({dir_.string()});
  EXPECT_EQ(msg, "cannot open input deck '" + dir_.string() + "': not a regular file (a directory)");
  const std::string missing = (dir_ / "missing.deck").string();
  EXPECT_EQ(error_of_files({write("base.deck", kDeck), missing}),
            "cannot open input deck '" + missing + "': no such file");
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
        ValidationCase{{"optimizer.min_lr=1"}, 8, "min_lr (1) must not exceed optimizer.lr"},
        // Every float key is finite and within its range.
        ValidationCase{{"optimizer.lr=inf"}, 8, "optimizer.lr = inf must be finite and >= 0"},
        ValidationCase{{"optimizer.lr=-1e-3"}, 8, "optimizer.lr = -0.001 must be finite and >= 0"},
        ValidationCase{{"optimizer.eps=nan"}, 8, "optimizer.eps = nan must be finite and > 0"},
        ValidationCase{{"optimizer.eps=0"}, 8, "optimizer.eps = 0 must be finite and > 0"},
        ValidationCase{{"model.init_method_std=nan"}, 8,
                       "model.init_method_std = nan must be finite and > 0"},
        ValidationCase{{"model.layernorm_epsilon=-1"}, 8,
                       "model.layernorm_epsilon = -1 must be finite and > 0"},
        ValidationCase{{"model.hidden_dropout=1"}, 8, "model.hidden_dropout = 1 must be in [0, 1)"},
        ValidationCase{{"model.attention_dropout=-0.1"}, 8,
                       "model.attention_dropout = -0.1 must be in [0, 1)"},
        ValidationCase{{"optimizer.beta2=1"}, 8, "optimizer.beta2 = 1 must be in [0, 1)"},
        ValidationCase{{"optimizer.weight_decay=-0.1"}, 8, "optimizer.weight_decay = -0.1"},
        ValidationCase{{"training.clip_grad=inf"}, 8, "training.clip_grad = inf"},
        ValidationCase{{"logging.peak_tflops=-1"}, 8, "logging.peak_tflops = -1"},
        // Counts are never negative; an unsigned key does not wrap around.
        ValidationCase{{"run.seed=-1"}, 8,
                       "run.seed = '-1' is not an integer in [0, 18446744073709551615]"},
        ValidationCase{{"run.seed=18446744073709551616"}, 8, "run.seed = '18446744073709551616'"},
        ValidationCase{{"training.global_batch_size=-8"}, 8,
                       "training.global_batch_size = -8 is negative"},
        ValidationCase{{"model.ffn_hidden_size=-1"}, 8, "model.ffn_hidden_size = -1 is negative"},
        ValidationCase{{"lr_schedule.decay_iters=-5"}, 8, "lr_schedule.decay_iters = -5 is negative"},
        ValidationCase{{"parallel.tensor_parallel=0"}, 8,
                       "parallel.tensor_parallel = 0 must be at least 1"},
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

namespace meshtron {
namespace {

// What a checkpoint stores reads back to the configuration the run built,
// --set overrides included (they win over the decks, as on the command line).
TEST(Config, PretrainedIsTheFallbackOfLoadAuto) {
  EXPECT_EQ(error_of({"checkpoint.load=auto", "checkpoint.pretrained=base/iter_0000000.h5"}), "");
  EXPECT_EQ(error_of({"checkpoint.load=run/iter_0000010.h5",
                      "checkpoint.pretrained=base/iter_0000000.h5"}),
            "checkpoint.pretrained = base/iter_0000000.h5 needs checkpoint.load = auto (it is the "
            "fallback of auto)");
}

TEST(Config, TextWithOverridesReadsBackToTheSameValues) {
  const RunConfig c = RunConfig::from_text("[model]\nnum_layers = 4\nhidden_size = 64\n",
                                           {"model.num_layers=2", "optimizer.lr=0.5"});
  const RunConfig back = RunConfig::from_text(c.text_with_overrides());
  EXPECT_EQ(back.model.num_layers, 2);
  EXPECT_EQ(back.model.hidden_size, 64);
  EXPECT_EQ(back.optimizer.lr, 0.5);
  const RunConfig plain = RunConfig::from_text("[model]\nnum_layers = 4\n");
  EXPECT_EQ(plain.text_with_overrides(), plain.deck_text);
}

}  // namespace
}  // namespace meshtron
