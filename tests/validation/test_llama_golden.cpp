// meshtron's Llama family against Hugging Face transformers on
// validation/llama-golden (made by validation/make_llama_golden.py): logits
// and loss, every gradient (in transformers' names and layouts), and the
// losses and gradient norms of 3 AdamW steps with warmup, cosine decay and
// clipping (tests/common/family_golden.hpp).
#include "common/family_golden.hpp"
#include "io/hf/llama.hpp"
#include "io/hf/llama_config.hpp"

namespace meshtron::golden {
namespace {

class LlamaGolden : public FamilyGolden {
 protected:
  std::string family() const override { return "llama"; }
  ModelSpec spec_of(const std::string& dir) const override {
    return io::model_spec_from_hf(io::read_hf_llama_config(dir), kSeq, /*divisible_by=*/128,
                                  /*tp=*/1);
  }
  void import(const std::string& dir, const ModelSpec& spec,
              const ParameterList& params) const override {
    io::import_hf_llama(dir, spec, params, 0, 1);
  }
  HfTensors hf_tensors(const ModelSpec& spec, const ParameterList& params) const override {
    return io::hf_llama_tensors(spec, params);
  }
};

TEST_F(LlamaGolden, LogitsAndLossMatchTransformers) { expect_logits_and_loss(); }

TEST_F(LlamaGolden, EveryGradientMatchesTransformers) {
  // Every HF parameter: embed, 9 per layer, final norm, lm_head.
  EXPECT_EQ(expect_every_gradient(), 2 + 9 * std::size_t(config.num_layers) + 1);
}

TEST_F(LlamaGolden, LossesAndGradientNormsOfThreeAdamWStepsMatchTorch) {
  expect_three_adamw_steps();
}

}  // namespace
}  // namespace meshtron::golden
