// meshtron convert on the golden GPT-NeoX model of
// validation/make_gpt_neox_golden.py: Hugging Face -> checkpoint -> Hugging
// Face gives the original tensors bit for bit (query_key_value permuted to
// [q | k | v] and back) and the same config, from the whole model and from
// its shards (tests/common/family_convert_golden.hpp).
#include "common/family_convert_golden.hpp"
#include "io/hf/gpt_neox_config.hpp"

namespace meshtron::golden {
namespace {

class GptNeoxGoldenConvert : public FamilyConvertGolden {
 protected:
  std::string family() const override { return "gpt-neox"; }
};

TEST_F(GptNeoxGoldenConvert, GoldenRoundTripIsBitExact) {
  ASSERT_NO_FATAL_FAILURE(round_trip_golden());
  const io::HfGptNeoxConfig a = io::read_hf_gpt_neox_config(golden()),
                            b = io::read_hf_gpt_neox_config(exported());
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_DOUBLE_EQ(a.rotary_pct, b.rotary_pct);
  EXPECT_DOUBLE_EQ(a.rotary_emb_base, b.rotary_emb_base);
  EXPECT_DOUBLE_EQ(a.layer_norm_eps, b.layer_norm_eps);
  EXPECT_TRUE(b.use_parallel_residual);
  EXPECT_FALSE(b.tie_word_embeddings);
  expect_deck_holds({"position_embedding_type = rope", "rotary_percent = 0.25",
                     "activation = gelu\n", "parallel_residual = true",
                     "untie_embeddings_and_output_weights = true"});
}

TEST_F(GptNeoxGoldenConvert, ShardedGoldenLoadsAsTheWholeOne) {
  expect_sharded_golden_loads_as_the_whole_one();
}

}  // namespace
}  // namespace meshtron::golden
