// Hugging Face GPT-NeoX interop: a tiny random GPTNeoXForCausalLM checkpoint
// written here, its per-head interleaved query_key_value placed as
// meshtron's [q | k | v] columns, convert's round trip bit for bit (parallel
// and sequential residuals), both spellings of the rotary settings, and the
// config values meshtron does not compute rejected in one line.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "app/commands.hpp"
#include "common/convert_test_util.hpp"
#include "common/error.hpp"
#include "common/expect_user_error.hpp"
#include "io/hf/gpt_neox.hpp"
#include "io/hf/gpt_neox_config.hpp"
#include "io/hf/hf_weights.hpp"

namespace meshtron {
namespace {

namespace fs = std::filesystem;

using testing_util::at;
using testing_util::expect_user_error;

/// hidden 8, 2 heads of 4 (rotary over 2 of them), ffn 12, vocab 10, 16
/// positions, one layer, untied; transformers 4's spelling of the rotary keys.
std::string config_text(bool parallel_residual) {
  return std::string(R"({
  "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
  "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
  "intermediate_size": 12, "hidden_act": "gelu", "rotary_pct": 0.5, "rotary_emb_base": 10000,
  "max_position_embeddings": 16, "layer_norm_eps": 1e-5, "attention_bias": true,
  "tie_word_embeddings": false, "use_parallel_residual": )") +
         (parallel_residual ? "true" : "false") + "}";
}

/// Random tensors of config_text() in transformers' layouts (nn.Linear [out, in]).
std::vector<std::pair<std::string, Tensor>> random_hf_tensors() {
  testing_util::RandomTensors t(23);
  const std::string l = "gpt_neox.layers.0.";
  return {{"gpt_neox.embed_in.weight", t({10, 8})},
          {l + "input_layernorm.weight", t({8})},
          {l + "input_layernorm.bias", t({8})},
          {l + "post_attention_layernorm.weight", t({8})},
          {l + "post_attention_layernorm.bias", t({8})},
          {l + "attention.query_key_value.weight", t({24, 8})},
          {l + "attention.query_key_value.bias", t({24})},
          {l + "attention.dense.weight", t({8, 8})},
          {l + "attention.dense.bias", t({8})},
          {l + "mlp.dense_h_to_4h.weight", t({12, 8})},
          {l + "mlp.dense_h_to_4h.bias", t({12})},
          {l + "mlp.dense_4h_to_h.weight", t({8, 12})},
          {l + "mlp.dense_4h_to_h.bias", t({8})},
          {"gpt_neox.final_layer_norm.weight", t({8})},
          {"gpt_neox.final_layer_norm.bias", t({8})},
          {"embed_out.weight", t({10, 8})}};
}

class GptNeoxIo : public testing_util::ScratchFolderTest {
 protected:
  void SetUp() override {
    ScratchFolderTest::SetUp();
    write_config("hf", config_text(true));
    io::write_hf_weights(file("hf"), hf);
    by_name.insert(hf.begin(), hf.end());
  }
  std::vector<std::pair<std::string, Tensor>> hf = random_hf_tensors();
  std::map<std::string, Tensor> by_name;
};

/// The qkv parameters of a 1-rank model of `c` (names and global shapes), zero.
struct QkvParams : testing_util::ZeroParams {
  explicit QkvParams(const ModelSpec& c) {
    const index_t h = c.hidden_size, qkv = c.block.attention.qkv_width();
    add("layers.0.attention.qkv.weight", {h, qkv});
    add("layers.0.attention.qkv.bias", {qkv});
  }
};

TEST(GptNeoxMapping, NamesEveryTensorOfTheTable) {
  using io::gpt_neox_name_of;
  EXPECT_EQ(gpt_neox_name_of("embedding.word.weight"), "gpt_neox.embed_in.weight");
  EXPECT_EQ(gpt_neox_name_of("layers.3.ln_1.bias"), "gpt_neox.layers.3.input_layernorm.bias");
  EXPECT_EQ(gpt_neox_name_of("layers.3.ln_2.weight"),
            "gpt_neox.layers.3.post_attention_layernorm.weight");
  EXPECT_EQ(gpt_neox_name_of("layers.12.attention.qkv.weight"),
            "gpt_neox.layers.12.attention.query_key_value.weight");
  EXPECT_EQ(gpt_neox_name_of("layers.0.attention.proj.bias"),
            "gpt_neox.layers.0.attention.dense.bias");
  EXPECT_EQ(gpt_neox_name_of("layers.0.mlp.fc.weight"), "gpt_neox.layers.0.mlp.dense_h_to_4h.weight");
  EXPECT_EQ(gpt_neox_name_of("layers.0.mlp.proj.bias"), "gpt_neox.layers.0.mlp.dense_4h_to_h.bias");
  EXPECT_EQ(gpt_neox_name_of("final_norm.weight"), "gpt_neox.final_layer_norm.weight");
  EXPECT_EQ(gpt_neox_name_of("output_layer.weight"), "embed_out.weight");
  expect_user_error([] { gpt_neox_name_of("embedding.position.weight"); },
                    {"embedding.position.weight"});
}

TEST(GptNeoxMapping, QkvRowsFollowTheHeadsThenTheParts) {
  // 2 heads of 2: HF rows (h0: q0 q1 k0 k1 v0 v1, h1: ...) = 0..11; meshtron
  // rows q(h0) q(h1) | k(h0) k(h1) | v(h0) v(h1).
  EXPECT_EQ(io::gpt_neox_qkv_source_rows(2, 2),
            (std::vector<index_t>{0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11}));
}

TEST_F(GptNeoxIo, ConfigMapsToTheNeoxBlock) {
  const io::HfGptNeoxConfig hf_config = io::read_hf_gpt_neox_config(file("hf"));
  const ModelSpec c = io::model_spec_from_hf(hf_config, 16, 1, 1);
  EXPECT_TRUE(c.parallel_residual);
  EXPECT_EQ(c.block.norm.kind, NormKind::LayerNorm);
  EXPECT_EQ(c.block.attention.num_heads, 2);
  EXPECT_EQ(c.block.attention.num_query_groups, 2);
  EXPECT_EQ(c.block.attention.head_dim, 4);
  EXPECT_EQ(c.block.attention.position, PositionEmbedding::Rope);
  EXPECT_DOUBLE_EQ(c.block.attention.rotary_percent, 0.5);
  EXPECT_FALSE(c.block.attention.rotary_interleaved);
  EXPECT_EQ(c.block.mlp.activation, Activation::Gelu);
  EXPECT_TRUE(c.block.attention.bias && c.block.mlp.bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(io::is_gpt_neox_family(c));
  EXPECT_FALSE(io::is_gpt_neox_family(ModelSpec{}));
  const io::HfGptNeoxConfig back = io::hf_gpt_neox_config_from_spec(c);
  EXPECT_EQ(back.intermediate_size, 12);
  EXPECT_DOUBLE_EQ(back.rotary_pct, 0.5);
  EXPECT_TRUE(back.use_parallel_residual);
  expect_user_error([] { io::hf_gpt_neox_config_from_spec(ModelSpec{}); },
                    {"GPT-NeoX", "rotary"});
}

TEST_F(GptNeoxIo, ConfigReadsTransformers5RopeParameters) {
  write_config("v5", R"({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                        "partial_rotary_factor": 0.75}})");
  const io::HfGptNeoxConfig c = io::read_hf_gpt_neox_config(file("v5"));
  EXPECT_DOUBLE_EQ(c.rotary_pct, 0.75);
  EXPECT_DOUBLE_EQ(c.rotary_emb_base, 500.0);
  EXPECT_TRUE(c.use_parallel_residual);  // transformers' default
  // What the writer writes reads back the same (both spellings agree).
  io::write_hf_gpt_neox_config(file("v5/back.json"), c);
  const io::HfGptNeoxConfig b = io::read_hf_gpt_neox_config(file("v5/back.json"));
  EXPECT_DOUBLE_EQ(b.rotary_pct, 0.75);
  EXPECT_DOUBLE_EQ(b.rotary_emb_base, 500.0);
}

TEST_F(GptNeoxIo, ImportPermutesTheInterleavedQkvAndTransposes) {
  const ModelSpec c = io::model_spec_from_hf(io::read_hf_gpt_neox_config(file("hf")), 16, 1, 1);
  QkvParams params(c);
  io::import_hf_gpt_neox(file("hf"), c, params.list(), 0, 1);
  const std::string l = "gpt_neox.layers.0.attention.query_key_value.";
  const Tensor& w = by_name[l + "weight"];
  const Tensor& b = by_name[l + "bias"];
  const Tensor& qkv = params["layers.0.attention.qkv.weight"];
  const Tensor& qkv_bias = params["layers.0.attention.qkv.bias"];
  for (index_t part = 0; part < 3; ++part)
    for (index_t head = 0; head < 2; ++head)
      for (index_t d = 0; d < 4; ++d) {
        const index_t hf_row = head * 12 + part * 4 + d, column = part * 8 + head * 4 + d;
        for (index_t i = 0; i < 8; ++i) EXPECT_EQ(at(qkv, i, column), at(w, hf_row, i));
        EXPECT_EQ(qkv_bias.data<float>()[column], b.data<float>()[hf_row]);
      }
}

TEST_F(GptNeoxIo, ConvertRoundTripIsBitIdentical) {
  for (bool parallel : {true, false}) {
    SCOPED_TRACE(parallel ? "parallel residual" : "sequential residual");
    write_config("hf", config_text(parallel));
    fs::remove_all(dir / "ckpt");
    fs::remove_all(dir / "out");
    ASSERT_EQ(app::run_convert({"--from", "hf", file("hf"), "--to", file("ckpt")}), 0);
    std::ifstream deck(file("ckpt/model.deck"));
    const std::string deck_text((std::istreambuf_iterator<char>(deck)), {});
    EXPECT_NE(deck_text.find("activation = gelu\n"), std::string::npos) << deck_text;
    EXPECT_NE(deck_text.find("rotary_percent = 0.5"), std::string::npos) << deck_text;
    EXPECT_EQ(deck_text.find("parallel_residual = true") != std::string::npos, parallel);
    ASSERT_EQ(app::run_convert({"--from", file("ckpt/iter_0000000.h5"), "--to", "hf",
                                file("out")}),
              0);
    const io::HfWeights out(file("out"));
    ASSERT_EQ(out.names().size(), hf.size());
    for (const auto& [name, original] : hf) {
      const Tensor t = out.load(name);
      ASSERT_EQ(t.shape(), original.shape()) << name;
      EXPECT_EQ(std::memcmp(t.raw(), original.raw(), original.bytes()), 0) << name;
    }
    const io::HfGptNeoxConfig back = io::read_hf_gpt_neox_config(file("out"));
    EXPECT_EQ(back.use_parallel_residual, parallel);
    EXPECT_DOUBLE_EQ(back.rotary_pct, 0.5);
    EXPECT_EQ(back.intermediate_size, 12);
    EXPECT_FALSE(back.tie_word_embeddings);
  }
}

TEST_F(GptNeoxIo, MisshapedTensorIsAUserError) {
  auto bad = hf;
  bad[5].second = Tensor::zeros({8, 24});  // query_key_value as [in, out]
  io::write_hf_weights(file("bad"), bad);
  const ModelSpec c = io::model_spec_from_hf(io::read_hf_gpt_neox_config(file("hf")), 16, 1, 1);
  QkvParams params(c);
  expect_user_error([&] { io::import_hf_gpt_neox(file("bad"), c, params.list(), 0, 1); },
                    {"gpt_neox.layers.0.attention.query_key_value.weight", "[24, 8]"});
}

TEST_F(GptNeoxIo, ConfigRejectsWhatMeshtronDoesNotComputeInOneLine) {
  const std::string head = R"({"model_type": "gpt_neox", "hidden_size": 8, "num_attention_heads": 2, )";
  const std::pair<std::string, std::vector<std::string>> bad[] = {
      {head + R"("hidden_act": "gelu_new"})", {"hidden_act", "gelu"}},
      {head + R"("rope_scaling": {"type": "linear", "factor": 2.0}})", {"rope_scaling"}},
      {head + R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})",
       {"rope_parameters"}},
      {R"({"model_type": "gpt_neox", "hidden_size": 9, "num_attention_heads": 2})",
       {"not divisible"}},
      {R"({"model_type": "llama"})", {"llama", "gpt_neox"}},
  };
  for (const auto& [text, needles] : bad) {
    SCOPED_TRACE(text);
    write_config("bad", text);
    expect_user_error([&] { io::read_hf_gpt_neox_config(file("bad")); }, needles);
  }
  write_config("convert", head + R"("hidden_act": "relu"})");
  expect_user_error([&] {
    app::run_convert({"--from", "hf", file("convert"), "--to", file("ckpt")});
  }, {"hidden_act"});
}

}  // namespace
}  // namespace meshtron
