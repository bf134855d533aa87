// meshtron convert on the golden GPT-NeoX model of
// validation/make_gpt_neox_golden.py: Hugging Face -> checkpoint -> Hugging
// Face gives the original tensors bit for bit (query_key_value permuted to
// [q | k | v] and back) and the same config, from the whole model and from
// its shards. The golden folders are generated, not optional: without them
// these tests fail and say how to make them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "app/commands.hpp"
#include "io/checkpoint.hpp"
#include "io/hf/gpt_neox_config.hpp"
#include "io/hf/hf_weights.hpp"

namespace meshtron {
namespace {

namespace fs = std::filesystem;

const std::string kGolden = std::string(MESHTRON_SOURCE_DIR) + "/validation/gpt-neox-golden";
const std::string kGoldenSharded =
    std::string(MESHTRON_SOURCE_DIR) + "/validation/gpt-neox-golden-sharded";
constexpr const char* kHowToGenerate =
    "golden model absent: on a machine with torch and transformers run\n"
    "  python3 validation/make_gpt_neox_golden.py --out validation/gpt-neox-golden "
    "--sharded-out validation/gpt-neox-golden-sharded\n"
    "and commit both folders (see the script's docstring)";

class GptNeoxGoldenConvert : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("meshtron_neox_golden_" + std::to_string(getpid()));
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

TEST_F(GptNeoxGoldenConvert, GoldenRoundTripIsBitExact) {
  ASSERT_TRUE(fs::exists(kGolden + "/model.safetensors")) << kGolden << ": " << kHowToGenerate;
  const std::string hf = round_trip(kGolden, dir);
  expect_same_tensors(io::HfWeights(kGolden), io::HfWeights(hf));
  const io::HfGptNeoxConfig a = io::read_hf_gpt_neox_config(kGolden),
                            b = io::read_hf_gpt_neox_config(hf);
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
  std::ifstream deck(dir / "ckpt" / "model.deck");
  const std::string text((std::istreambuf_iterator<char>(deck)), {});
  for (const char* key : {"position_embedding_type = rope", "rotary_percent = 0.25",
                          "activation = gelu\n", "parallel_residual = true",
                          "untie_embeddings_and_output_weights = true"})
    EXPECT_NE(text.find(key), std::string::npos) << key << " not in\n" << text;
}

TEST_F(GptNeoxGoldenConvert, ShardedGoldenLoadsAsTheWholeOne) {
  ASSERT_TRUE(fs::exists(kGoldenSharded + "/model.safetensors.index.json"))
      << kGoldenSharded << ": " << kHowToGenerate;
  const std::string hf = round_trip(kGoldenSharded, dir);
  expect_same_tensors(io::HfWeights(kGolden), io::HfWeights(hf));
}

}  // namespace
}  // namespace meshtron
