// meshtron's GPT-NeoX family against Hugging Face transformers on
// validation/gpt-neox-golden (made by validation/make_gpt_neox_golden.py):
// logits and loss, every gradient (in transformers' names and layouts, the
// fused query_key_value interleaved per head), and the losses and gradient
// norms of 3 AdamW steps with warmup, cosine decay and clipping
// (tests/common/family_golden.hpp); the model has parallel residuals, rotary
// positions over a quarter of each head and the exact GeLU.
#include "common/family_golden.hpp"
#include "io/hf/gpt_neox.hpp"
#include "io/hf/gpt_neox_config.hpp"

namespace meshtron::golden {
namespace {

class GptNeoxGolden : public FamilyGolden {
 protected:
  std::string family() const override { return "gpt-neox"; }
  ModelSpec spec_of(const std::string& dir) const override {
    return io::model_spec_from_hf(io::read_hf_gpt_neox_config(dir), kSeq, /*divisible_by=*/128,
                                  /*tp=*/1);
  }
  void import(const std::string& dir, const ModelSpec& spec,
              const ParameterList& params) const override {
    io::import_hf_gpt_neox(dir, spec, params, 0, 1);
  }
  HfTensors hf_tensors(const ModelSpec& spec, const ParameterList& params) const override {
    return io::hf_gpt_neox_tensors(spec, params);
  }
};

TEST_F(GptNeoxGolden, TheGoldenModelIsTheNeoxBlock) {
  EXPECT_TRUE(config.parallel_residual);
  EXPECT_EQ(config.block.mlp.activation, Activation::Gelu);
  EXPECT_DOUBLE_EQ(config.block.attention.rotary_percent, 0.25);
  EXPECT_FALSE(config.tie_word_embeddings);
}

TEST_F(GptNeoxGolden, LogitsAndLossMatchTransformers) { expect_logits_and_loss(); }

TEST_F(GptNeoxGolden, EveryGradientMatchesTransformers) {
  // Every HF parameter: embed_in, 12 per layer, the final norm's 2, embed_out.
  EXPECT_EQ(expect_every_gradient(), 1 + 12 * std::size_t(config.num_layers) + 2 + 1);
}

TEST_F(GptNeoxGolden, LossesAndGradientNormsOfThreeAdamWStepsMatchTorch) {
  expect_three_adamw_steps();
}

}  // namespace
}  // namespace meshtron::golden
