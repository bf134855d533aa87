// meshtron convert on the golden BLOOM model of validation/make_bloom_golden.py:
// Hugging Face -> checkpoint -> Hugging Face gives the original tensors bit
// for bit and the same config, from the whole model and from its shards
// (tests/common/family_convert_golden.hpp).
#include <set>

#include "common/family_convert_golden.hpp"
#include "io/hf/bloom_config.hpp"

namespace meshtron::golden {
namespace {

class BloomGoldenConvert : public FamilyConvertGolden {
 protected:
  std::string family() const override { return "bloom"; }
};

TEST_F(BloomGoldenConvert, GoldenRoundTripIsBitExact) {
  ASSERT_NO_FATAL_FAILURE(round_trip_golden());
  const io::HfBloomConfig a = io::read_hf_bloom_config(golden()),
                          b = io::read_hf_bloom_config(exported());
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.seq_length, b.seq_length);
  EXPECT_DOUBLE_EQ(a.layer_norm_epsilon, b.layer_norm_epsilon);
  EXPECT_TRUE(b.tie_word_embeddings);
  // The checkpoint holds the embedding norm and no position table or head
  // of its own, and model.deck describes the family.
  const io::CheckpointInfo info = io::inspect_checkpoint(checkpoint());
  std::set<std::string> paths;
  for (const auto& t : info.tensors) paths.insert(t.path);
  EXPECT_TRUE(paths.count("model/embedding.norm.weight") && paths.count("model/embedding.norm.bias"));
  EXPECT_FALSE(paths.count("model/embedding.position.weight") || paths.count("model/output_layer.weight"));
  expect_deck_holds({"position_embedding_type = alibi", "embedding_norm = true",
                     "num_attention_heads = 6"});
}

TEST_F(BloomGoldenConvert, ShardedGoldenLoadsAsTheWholeOne) {
  expect_sharded_golden_loads_as_the_whole_one();
}

}  // namespace
}  // namespace meshtron::golden
