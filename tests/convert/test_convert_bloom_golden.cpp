// meshtron convert on the golden BLOOM model of validation/make_bloom_golden.py:
// Hugging Face -> checkpoint -> Hugging Face gives the original tensors bit
// for bit and the same config, from the whole model and from its shards.
// The golden folders are generated, not optional: without them these tests
// fail and say how to make them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "app/commands.hpp"
#include "io/checkpoint.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/hf/bloom_config.hpp"

namespace meshtron {
namespace {

namespace fs = std::filesystem;

const std::string kGolden = std::string(MESHTRON_SOURCE_DIR) + "/validation/bloom-golden";
const std::string kGoldenSharded =
    std::string(MESHTRON_SOURCE_DIR) + "/validation/bloom-golden-sharded";
constexpr const char* kHowToGenerate =
    "golden model absent: on a machine with torch and transformers run\n"
    "  python3 validation/make_bloom_golden.py --out validation/bloom-golden "
    "--sharded-out validation/bloom-golden-sharded\n"
    "and commit both folders (see the script's docstring)";

class BloomGoldenConvert : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("meshtron_bloom_golden_" + std::to_string(getpid()));
    fs::remove_all(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

/// Every tensor of `a` equals the one of `b` of the same name bit for bit.
void expect_same_tensors(const io::HfWeights& a, const io::HfWeights& b) {
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& name : a.names()) {
    const Tensor x = a.load(name), y = b.load(name);
    ASSERT_EQ(x.shape(), y.shape()) << name;
    ASSERT_EQ(x.dtype(), y.dtype()) << name;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.bytes()), 0) << name << " differs";
  }
}

/// convert --from hf `model` --to CKPT, then --to hf: the exported folder.
std::string round_trip(const std::string& model, const fs::path& work) {
  const std::string ckpt = (work / "ckpt").string(), hf = (work / "hf").string();
  EXPECT_EQ(app::run_convert({"--from", "hf", model, "--to", ckpt}), 0);
  EXPECT_EQ(app::run_convert({"--from", ckpt + "/" + io::checkpoint_file_name(0), "--to", "hf", hf}),
            0);
  return hf;
}

TEST_F(BloomGoldenConvert, GoldenRoundTripIsBitExact) {
  ASSERT_TRUE(fs::exists(kGolden + "/model.safetensors")) << kGolden << ": " << kHowToGenerate;
  const std::string hf = round_trip(kGolden, dir);
  expect_same_tensors(io::HfWeights(kGolden), io::HfWeights(hf));
  const io::HfBloomConfig a = io::read_hf_bloom_config(kGolden), b = io::read_hf_bloom_config(hf);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.seq_length, b.seq_length);
  EXPECT_DOUBLE_EQ(a.layer_norm_epsilon, b.layer_norm_epsilon);
  EXPECT_TRUE(b.tie_word_embeddings);
  // The checkpoint holds the embedding norm and no position table or head
  // of its own, and model.deck describes the family.
  const io::CheckpointInfo info =
      io::inspect_checkpoint((dir / "ckpt" / io::checkpoint_file_name(0)).string());
  std::set<std::string> paths;
  for (const auto& t : info.tensors) paths.insert(t.path);
  EXPECT_TRUE(paths.count("model/embedding.norm.weight") && paths.count("model/embedding.norm.bias"));
  EXPECT_FALSE(paths.count("model/embedding.position.weight") || paths.count("model/output_layer.weight"));
  std::ifstream deck(dir / "ckpt" / "model.deck");
  const std::string text((std::istreambuf_iterator<char>(deck)), {});
  for (const char* key : {"position_embedding_type = alibi", "embedding_norm = true",
                          "num_attention_heads = 6"})
    EXPECT_NE(text.find(key), std::string::npos) << key << " not in\n" << text;
}

TEST_F(BloomGoldenConvert, ShardedGoldenLoadsAsTheWholeOne) {
  ASSERT_TRUE(fs::exists(kGoldenSharded + "/model.safetensors.index.json"))
      << kGoldenSharded << ": " << kHowToGenerate;
  const std::string hf = round_trip(kGoldenSharded, dir);
  expect_same_tensors(io::HfWeights(kGolden), io::HfWeights(hf));
}

}  // namespace
}  // namespace meshtron
