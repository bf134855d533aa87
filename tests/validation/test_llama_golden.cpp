// meshtron's Llama family against Hugging Face transformers on
// validation/llama-golden (made by validation/make_llama_golden.py): logits
// and loss, every gradient (in transformers' names and layouts), and the
// losses and gradient norms of 3 AdamW steps with warmup, cosine decay and
// clipping. The golden folder is generated, not optional: without it the
// tests fail and say how to make it.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/golden_tokens.hpp"
#include "io/hf/llama.hpp"
#include "io/hf/llama_config.hpp"
#include "io/safetensors.hpp"
#include "model/gpt_model.hpp"
#include "train/lr_schedule.hpp"
#include "train/optimizer.hpp"

namespace meshtron::golden {
namespace {

const std::string kDir = std::string(MESHTRON_SOURCE_DIR) + "/validation/llama-golden";

class LlamaGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kDir + "/golden.safetensors"))
        << kDir << ": golden model absent: on a machine with torch and transformers run\n"
        << "  python3 validation/make_llama_golden.py --out validation/llama-golden "
           "--sharded-out validation/llama-golden-sharded\n"
        << "and commit both folders (see the script's docstring)";
    golden = std::make_unique<io::SafetensorsFile>(kDir + "/golden.safetensors");
    config = io::model_spec_from_hf(io::read_hf_llama_config(kDir), kSeq, /*divisible_by=*/128,
                                    /*tp=*/1);
    ctx.seq_length = kSeq;
    ctx.micro_batch = kBatch;
    ctx.global_batch = kBatch;
    ctx.training = true;
    model = std::make_unique<GptModel>(config, StagePlacement::whole_model(config.num_layers),
                                       ctx, DType::F32, 1);
    io::import_hf_llama(kDir, config, model->parameters(), 0, 1);
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
    return io::hf_llama_tensors(config, list);
  }

  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  ModelSpec config;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<io::SafetensorsFile> golden;
};

TEST_F(LlamaGolden, LogitsAndLossMatchTransformers) {
  GptModel::Cache cache;
  const double loss = forward_backward(0, cache);
  const double expected_loss = golden_tensor("losses").to_doubles()[0];
  EXPECT_LE(std::fabs(loss - expected_loss) / expected_loss, 1e-5)
      << loss << " vs " << expected_loss;

  const std::vector<double> ours =
      golden::logits_in_hf_order(cache.head.logits, config.vocab_size, config.padded_vocab_size);
  EXPECT_LE(rel_error(ours, golden_tensor("logits").to_doubles()), 1e-5);
}

TEST_F(LlamaGolden, EveryGradientMatchesTransformers) {
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
  // Every HF parameter: embed, 9 per layer, final norm, lm_head.
  EXPECT_EQ(compared, 2 + 9 * std::size_t(config.num_layers) + 1);
}

TEST_F(LlamaGolden, LossesAndGradientNormsOfThreeAdamWStepsMatchTorch) {
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
