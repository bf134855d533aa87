// meshtron convert on the golden Llama model of validation/make_llama_golden.py:
// Hugging Face -> checkpoint -> Hugging Face gives the original tensors bit
// for bit and the same config, from the whole model and from its shards
// (tests/common/family_convert_golden.hpp).
#include "common/family_convert_golden.hpp"
#include "io/hf/llama_config.hpp"

namespace meshtron::golden {
namespace {

class LlamaGoldenConvert : public FamilyConvertGolden {
 protected:
  std::string family() const override { return "llama"; }
};

TEST_F(LlamaGoldenConvert, GoldenRoundTripIsBitExact) {
  ASSERT_NO_FATAL_FAILURE(round_trip_golden());
  const io::HfLlamaConfig a = io::read_hf_llama_config(golden()),
                          b = io::read_hf_llama_config(exported());
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_DOUBLE_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta);
  EXPECT_FALSE(b.tie_word_embeddings);
  // The checkpoint holds the untied head in its global unpadded shape, and
  // model.deck describes the family.
  const io::CheckpointInfo info = io::inspect_checkpoint(checkpoint());
  bool head = false;
  for (const auto& t : info.tensors)
    if (t.path == "model/output_layer.weight") head = t.shape == Shape{a.vocab_size, a.hidden_size};
  EXPECT_TRUE(head) << "no model/output_layer.weight of shape [vocab, hidden]";
  expect_deck_holds({"normalization = RMSNorm", "position_embedding_type = rope",
                     "activation = swiglu", "add_bias_linear = false",
                     "untie_embeddings_and_output_weights = true", "num_query_groups = 2"});
}

TEST_F(LlamaGoldenConvert, ShardedGoldenLoadsAsTheWholeOne) {
  expect_sharded_golden_loads_as_the_whole_one();
}

}  // namespace
}  // namespace meshtron::golden
