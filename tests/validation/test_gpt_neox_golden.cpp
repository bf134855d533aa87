// meshtron's GPT-NeoX family against Hugging Face transformers on
// validation/gpt-neox-golden (made by validation/make_gpt_neox_golden.py):
// logits and loss, every gradient (in transformers' names and layouts, the
// fused query_key_value interleaved per head), and the losses and gradient
// norms of 3 AdamW steps with warmup, cosine decay and clipping; the model
// has parallel residuals, rotary positions over a quarter of each head and
// the exact GeLU. The golden folder is generated, not optional: without it
// the tests fail and say how to make it.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/golden_tokens.hpp"
#include "io/hf/gpt_neox.hpp"
#include "io/hf/gpt_neox_config.hpp"
#include "io/safetensors.hpp"
#include "model/gpt_model.hpp"
#include "train/lr_schedule.hpp"
#include "train/optimizer.hpp"

namespace meshtron::golden {
namespace {

const std::string kDir = std::string(MESHTRON_SOURCE_DIR) + "/validation/gpt-neox-golden";

class GptNeoxGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kDir + "/golden.safetensors"))
        << kDir << ": golden model absent: on a machine with torch and transformers run\n"
        << "  python3 validation/make_gpt_neox_golden.py --out validation/gpt-neox-golden "
           "--sharded-out validation/gpt-neox-golden-sharded\n"
        << "and commit both folders (see the script's docstring)";
    golden = std::make_unique<io::SafetensorsFile>(kDir + "/golden.safetensors");
    config = io::model_spec_from_hf(io::read_hf_gpt_neox_config(kDir), kSeq,
                                    /*divisible_by=*/128, /*tp=*/1);
    ctx.seq_length = kSeq;
    ctx.micro_batch = kBatch;
    ctx.global_batch = kBatch;
    ctx.training = true;
    model = std::make_unique<GptModel>(config, StagePlacement::whole_model(config.num_layers),
                                       ctx, DType::F32, 1);
    io::import_hf_gpt_neox(kDir, config, model->parameters(), 0, 1);
  }

  Tensor golden_tensor(const std::string& name) { return golden->load(name, DType::F32); }

  /// Forward + backward of step k; returns the mean loss.
  double forward_backward(int k, GptModel::Cache& cache) {
    Tensor ids, targets;
    step_tokens(golden->load("tokens"), k, ids, targets);
    Tensor loss = model->forward(ids, targets, ctx, cache);
    const double n = double(loss.numel());
    double mean = 0;
    for (double v : loss.to_doubles()) mean += v / n;
    Tensor dloss = Tensor::empty(loss.shape(), DType::F32);
    dloss.fill(1.0 / n);
    model->backward(dloss, ctx, cache);
    return mean;
  }

  /// The gradients in transformers' names and layouts (padded vocabulary
  /// rows still at the end of the [V_pad, h] tables).
  std::vector<std::pair<std::string, Tensor>> hf_gradients() {
    std::vector<Parameter> as_values;
    for (Parameter* p : model->parameters()) {
      as_values.push_back(*p);
      as_values.back().value = p->grad;
    }
    ParameterList list;
    for (Parameter& p : as_values) list.push_back(&p);
    return io::hf_gpt_neox_tensors(config, list);
  }

  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  ModelSpec config;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<io::SafetensorsFile> golden;
};

TEST_F(GptNeoxGolden, TheGoldenModelIsTheNeoxBlock) {
  EXPECT_TRUE(config.parallel_residual);
  EXPECT_EQ(config.block.mlp.activation, Activation::Gelu);
  EXPECT_DOUBLE_EQ(config.block.attention.rotary_percent, 0.25);
  EXPECT_FALSE(config.tie_word_embeddings);
}

TEST_F(GptNeoxGolden, LogitsAndLossMatchTransformers) {
  GptModel::Cache cache;
  const double loss = forward_backward(0, cache);
  const double expected_loss = golden_tensor("losses").to_doubles()[0];
  EXPECT_LE(std::fabs(loss - expected_loss) / expected_loss, 1e-5)
      << loss << " vs " << expected_loss;

  const std::vector<double> ours =
      golden::logits_in_hf_order(cache.head.logits, config.vocab_size, config.padded_vocab_size);
  EXPECT_LE(rel_error(ours, golden_tensor("logits").to_doubles()), 1e-5);
}

TEST_F(GptNeoxGolden, EveryGradientMatchesTransformers) {
  GptModel::Cache cache;
  forward_backward(0, cache);
  std::size_t compared = 0;
  for (const auto& [name, grad] : hf_gradients()) {
    const Tensor expected = golden_tensor("grad." + name);
    std::vector<double> ours = grad.to_doubles();
    ours.resize(std::size_t(expected.numel()));  // drop padded vocabulary rows
    EXPECT_LE(rel_error(ours, expected.to_doubles()), 1e-4) << name;
    ++compared;
  }
  // Every HF parameter: embed_in, 12 per layer, the final norm's 2, embed_out.
  EXPECT_EQ(compared, 1 + 12 * std::size_t(config.num_layers) + 2 + 1);
}

TEST_F(GptNeoxGolden, LossesAndGradientNormsOfThreeAdamWStepsMatchTorch) {
  MpiCommunicator self2{MPI_COMM_SELF};
  OptimizerGroups groups{self, self, self2, nullptr};
  AdamWConfig adam{0.9, 0.95, 1e-8, 0.1, 1.0};
  AdamW optimizer(model->parameters(), adam, nullptr);
  LrSchedule schedule{1e-3, 1e-4, 2, 4, "cosine"};
  const auto losses = golden_tensor("losses").to_doubles();
  const auto norms = golden_tensor("grad_norms").to_doubles();
  const auto lrs = golden_tensor("lrs").to_doubles();
  for (int k = 0; k < 3; ++k) {
    GptModel::Cache cache;
    const double loss = forward_backward(k, cache);
    EXPECT_NEAR(schedule.at(k + 1), lrs[k], 1e-10);
    const StepStats stats = optimizer.step(schedule.at(k + 1), groups, true);
    EXPECT_LE(std::fabs(loss - losses[k]) / losses[k], 1e-5) << "step " << k + 1;
    EXPECT_LE(std::fabs(stats.grad_norm - norms[k]) / norms[k], 1e-5) << "step " << k + 1;
  }
}

}  // namespace
}  // namespace meshtron::golden
