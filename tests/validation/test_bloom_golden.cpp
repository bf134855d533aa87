// meshtron's BLOOM family (ALiBi, embedding LayerNorm) against Hugging Face
// transformers on validation/bloom-golden (made by
// validation/make_bloom_golden.py): logits and loss, every gradient (in
// transformers' names and layouts), and the losses and gradient norms of 3
// AdamW steps with warmup, cosine decay and clipping
// (tests/common/family_golden.hpp).
#include "common/family_golden.hpp"
#include "io/hf/bloom.hpp"
#include "io/hf/bloom_config.hpp"

namespace meshtron::golden {
namespace {

class BloomGolden : public FamilyGolden {
 protected:
  std::string family() const override { return "bloom"; }
  ModelSpec spec_of(const std::string& dir) const override {
    return io::model_spec_from_hf(io::read_hf_bloom_config(dir), kSeq, /*divisible_by=*/128,
                                  /*tp=*/1);
  }
  void import(const std::string& dir, const ModelSpec& spec,
              const ParameterList& params) const override {
    io::import_hf_bloom(dir, spec, params, 0, 1);
  }
  HfTensors hf_tensors(const ModelSpec& spec, const ParameterList& params) const override {
    return io::hf_bloom_tensors(spec, params);
  }
};

TEST_F(BloomGolden, LogitsAndLossMatchTransformers) { expect_logits_and_loss(); }

TEST_F(BloomGolden, EveryGradientMatchesTransformers) {
  // Every HF parameter: word embedding and its norm (3), 12 per layer
  // (2 norms and 4 linears, weight and bias each), ln_f (2); the head is tied.
  EXPECT_EQ(expect_every_gradient(), 3 + 12 * std::size_t(config.num_layers) + 2);
}

TEST_F(BloomGolden, LossesAndGradientNormsOfThreeAdamWStepsMatchTorch) {
  expect_three_adamw_steps();
}

}  // namespace
}  // namespace meshtron::golden
