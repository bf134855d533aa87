// meshtron convert on the golden Llama model of validation/make_llama_golden.py:
// Hugging Face -> checkpoint -> Hugging Face gives the original tensors bit
// for bit and the same config, from the whole model and from its shards.
// The golden folders are generated, not optional: without them these tests
// fail and say how to make them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "app/commands.hpp"
#include "io/checkpoint.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/hf/llama_config.hpp"

namespace meshtron {
namespace {

namespace fs = std::filesystem;

const std::string kGolden = std::string(MESHTRON_SOURCE_DIR) + "/validation/llama-golden";
const std::string kGoldenSharded =
    std::string(MESHTRON_SOURCE_DIR) + "/validation/llama-golden-sharded";
constexpr const char* kHowToGenerate =
    "golden model absent: on a machine with torch and transformers run\n"
    "  python3 validation/make_llama_golden.py --out validation/llama-golden "
    "--sharded-out validation/llama-golden-sharded\n"
    "and commit both folders (see the script's docstring)";

class LlamaGoldenConvert : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("meshtron_llama_golden_" + std::to_string(getpid()));
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

TEST_F(LlamaGoldenConvert, GoldenRoundTripIsBitExact) {
  ASSERT_TRUE(fs::exists(kGolden + "/model.safetensors")) << kGolden << ": " << kHowToGenerate;
  const std::string hf = round_trip(kGolden, dir);
  expect_same_tensors(io::HfWeights(kGolden), io::HfWeights(hf));
  const io::HfLlamaConfig a = io::read_hf_llama_config(kGolden), b = io::read_hf_llama_config(hf);
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
  const io::CheckpointInfo info =
      io::inspect_checkpoint((dir / "ckpt" / io::checkpoint_file_name(0)).string());
  bool head = false;
  for (const auto& t : info.tensors)
    if (t.path == "model/output_layer.weight") head = t.shape == Shape{a.vocab_size, a.hidden_size};
  EXPECT_TRUE(head) << "no model/output_layer.weight of shape [vocab, hidden]";
  std::ifstream deck(dir / "ckpt" / "model.deck");
  const std::string text((std::istreambuf_iterator<char>(deck)), {});
  for (const char* key : {"normalization = RMSNorm", "position_embedding_type = rope",
                          "activation = swiglu", "add_bias_linear = false",
                          "untie_embeddings_and_output_weights = true", "num_query_groups = 2"})
    EXPECT_NE(text.find(key), std::string::npos) << key << " not in\n" << text;
}

TEST_F(LlamaGoldenConvert, ShardedGoldenLoadsAsTheWholeOne) {
  ASSERT_TRUE(fs::exists(kGoldenSharded + "/model.safetensors.index.json"))
      << kGoldenSharded << ": " << kHowToGenerate;
  const std::string hf = round_trip(kGoldenSharded, dir);
  expect_same_tensors(io::HfWeights(kGolden), io::HfWeights(hf));
}

}  // namespace
}  // namespace meshtron
