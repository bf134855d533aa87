// The golden-model checks of a Hugging Face decoder family against
// validation/<family>-golden (made by validation/make_<family>_golden.py):
// logits and loss, every gradient in transformers' names and layouts, and
// the losses and gradient norms of 3 AdamW steps with warmup, cosine decay
// and clipping (validation/golden_training.py's recipe). GoldenModel runs
// the model on the golden tokens (tests/common/gpt2_golden.hpp uses it too);
// a family's test derives a FamilyGolden fixture naming its folder, config
// reader and weight mapping.
// The golden folder is generated, not optional: without it the tests fail
// and say how to make it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/golden_tokens.hpp"
#include "io/safetensors.hpp"
#include "model/gpt_model.hpp"
#include "train/lr_schedule.hpp"
#include "train/optimizer.hpp"

namespace meshtron::golden {

/// One rank's whole GptModel run on the tokens of a golden.safetensors, and
/// the checks every golden model shares.
class GoldenModel {
 protected:
  /// Opens `golden_file` and builds the model of `spec` in `space`; the
  /// caller imports its weights.
  void build(const std::string& golden_file, const ModelSpec& spec, MemorySpace space) {
    golden = std::make_unique<io::SafetensorsFile>(golden_file);
    config = spec;
    ctx.seq_length = kSeq;
    ctx.micro_batch = kBatch;
    ctx.global_batch = kBatch;
    ctx.training = true;
    ctx.space = space;
    model = std::make_unique<GptModel>(config, StagePlacement::whole_model(config.num_layers),
                                       ctx, DType::F32, 1);
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
    EXPECT_EQ(loss.space(), ctx.space);
    Tensor dloss = Tensor::empty(loss.shape(), DType::F32, ctx.space);
    dloss.fill(1.0 / n);
    model->backward(dloss, ctx, cache);
    return mean;
  }

  /// Step 0's loss and logits within 1e-5 of transformers'.
  void expect_logits_and_loss() {
    GptModel::Cache cache;
    const double loss = forward_backward(0, cache);
    const double expected_loss = golden_tensor("losses").to_doubles()[0];
    EXPECT_LE(std::fabs(loss - expected_loss) / expected_loss, 1e-5)
        << loss << " vs " << expected_loss;
    const std::vector<double> ours =
        logits_in_hf_order(cache.head.logits, config.vocab_size, config.padded_vocab_size);
    EXPECT_LE(rel_error(ours, golden_tensor("logits").to_doubles()), 1e-5);
  }

  /// Losses, learning rates and gradient norms of the 3 AdamW steps.
  void expect_three_adamw_steps() {
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
      // Step 1's norm is of the same weights; later steps' weights carry both
      // sides' round-off through Adam, whose m / sqrt(v) scales every small
      // gradient entry up to an lr-sized step (BLOOM's step 3 differs by
      // 1.2e-5 under transformers 5.17).
      EXPECT_LE(std::fabs(stats.grad_norm - norms[k]) / norms[k], k == 0 ? 1e-5 : 1e-4)
          << "step " << k + 1;
    }
  }

  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  ModelSpec config;
  std::unique_ptr<GptModel> model;
  std::unique_ptr<io::SafetensorsFile> golden;
};

class FamilyGolden : public ::testing::Test, protected GoldenModel {
 protected:
  using HfTensors = std::vector<std::pair<std::string, Tensor>>;
  /// "gpt-neox" for validation/gpt-neox-golden and make_gpt_neox_golden.py.
  virtual std::string family() const = 0;
  /// The spec of the folder's config.json for kSeq tokens, one rank.
  virtual ModelSpec spec_of(const std::string& dir) const = 0;
  virtual void import(const std::string& dir, const ModelSpec& spec,
                      const ParameterList& params) const = 0;
  virtual HfTensors hf_tensors(const ModelSpec& spec, const ParameterList& params) const = 0;

  std::string dir() const { return golden_folder(family()); }

  void SetUp() override {
    const std::string d = dir();
    ASSERT_TRUE(std::filesystem::exists(d + "/golden.safetensors"))
        << d << ": " << how_to_make_golden(family());
    build(d + "/golden.safetensors", spec_of(d), MemorySpace::Host);
    import(d, config, model->parameters());
  }

  /// The gradients in transformers' names and layouts (padded vocabulary
  /// rows still at the end of the [V_pad, h] tables).
  HfTensors hf_gradients() {
    std::vector<Parameter> as_values;
    for (Parameter* p : model->parameters()) {
      as_values.push_back(*p);
      as_values.back().value = p->grad;
    }
    ParameterList list;
    for (Parameter& p : as_values) list.push_back(&p);
    return hf_tensors(config, list);
  }

  /// The golden gradient of the parameter transformers names `hf_name`:
  /// transformers 5 calls GPT-NeoX's head lm_head in memory (the gradient's
  /// name) while its files keep embed_out.
  Tensor golden_gradient(const std::string& hf_name) {
    if (hf_name == "embed_out.weight" && !golden->contains("grad." + hf_name))
      return golden_tensor("grad.lm_head.weight");
    return golden_tensor("grad." + hf_name);
  }

  /// Step 0's gradient of every parameter within 1e-4; returns how many.
  std::size_t expect_every_gradient() {
    GptModel::Cache cache;
    forward_backward(0, cache);
    std::size_t compared = 0;
    for (const auto& [name, grad] : hf_gradients()) {
      const Tensor expected = golden_gradient(name);
      std::vector<double> ours = grad.to_doubles();
      ours.resize(std::size_t(expected.numel()));  // drop padded vocabulary rows
      EXPECT_LE(rel_error(ours, expected.to_doubles()), 1e-4) << name;
      ++compared;
    }
    return compared;
  }
};

}  // namespace meshtron::golden
