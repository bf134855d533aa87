// Hugging Face GPTBigCode interop: a tiny multi-query checkpoint written
// here, its tensors placed transposed with q | k | v where meshtron's qkv
// holds them, convert's round trip bit for bit, and the config values
// meshtron does not compute rejected in one line.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include "app/commands.hpp"
#include "common/convert_test_util.hpp"
#include "common/error.hpp"
#include "common/expect_user_error.hpp"
#include "io/hf/gpt_bigcode.hpp"
#include "io/hf/gpt_bigcode_config.hpp"
#include "io/hf/hf_weights.hpp"

namespace meshtron {
namespace {

using testing_util::at;
using testing_util::expect_user_error;

/// n_embd 8, 2 heads of 4 sharing one k and one v head, n_inner 12,
/// vocab 10, 16 positions, one layer, untied.
constexpr const char* kConfig = R"({
  "architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode",
  "vocab_size": 10, "n_positions": 16, "n_embd": 8, "n_layer": 1, "n_head": 2,
  "n_inner": 12, "activation_function": "gelu_pytorch_tanh", "multi_query": true,
  "scale_attn_weights": true, "attention_softmax_in_fp32": true,
  "layer_norm_epsilon": 1e-5, "tie_word_embeddings": false})";

/// Random tensors of kConfig in transformers' layouts (nn.Linear [out, in]).
std::vector<std::pair<std::string, Tensor>> random_hf_tensors() {
  testing_util::RandomTensors t(11);
  const std::string l = "transformer.h.0.";
  return {{"transformer.wte.weight", t({10, 8})},
          {"transformer.wpe.weight", t({16, 8})},
          {l + "ln_1.weight", t({8})},
          {l + "ln_1.bias", t({8})},
          {l + "attn.c_attn.weight", t({8 + 4 + 4, 8})},
          {l + "attn.c_attn.bias", t({16})},
          {l + "attn.c_proj.weight", t({8, 8})},
          {l + "attn.c_proj.bias", t({8})},
          {l + "ln_2.weight", t({8})},
          {l + "ln_2.bias", t({8})},
          {l + "mlp.c_fc.weight", t({12, 8})},
          {l + "mlp.c_fc.bias", t({12})},
          {l + "mlp.c_proj.weight", t({8, 12})},
          {l + "mlp.c_proj.bias", t({8})},
          {"transformer.ln_f.weight", t({8})},
          {"transformer.ln_f.bias", t({8})},
          {"lm_head.weight", t({10, 8})}};
}

class GptBigCodeIo : public testing_util::ScratchFolderTest {
 protected:
  void SetUp() override {
    ScratchFolderTest::SetUp();
    write_config("hf", kConfig);
    io::write_hf_weights(file("hf"), hf);
    by_name.insert(hf.begin(), hf.end());
  }
  std::vector<std::pair<std::string, Tensor>> hf = random_hf_tensors();
  std::map<std::string, Tensor> by_name;
};

/// The parameters of a 1-rank model of `c` (names and global shapes), zero.
struct Params : testing_util::ZeroParams {
  explicit Params(const ModelSpec& c) {
    const index_t h = c.hidden_size, f = c.ffn_hidden_size();
    const index_t qkv = c.block.attention.qkv_width();
    add("embedding.word.weight", {c.vocab_size, h});
    add("layers.0.attention.qkv.weight", {h, qkv});
    add("layers.0.attention.qkv.bias", {qkv});
    add("layers.0.attention.proj.weight", {h, h});
    add("layers.0.mlp.fc.weight", {h, f});
    add("layers.0.mlp.proj.weight", {f, h});
  }
};

TEST_F(GptBigCodeIo, ConfigMapsToGpt2BlockWithOneQueryGroup) {
  const io::HfGptBigCodeConfig hf_config = io::read_hf_gpt_bigcode_config(file("hf"));
  const ModelSpec c = io::model_spec_from_hf(hf_config, 16, 1, 1);
  EXPECT_EQ(c.block.attention.num_heads, 2);
  EXPECT_EQ(c.block.attention.num_query_groups, 1);
  EXPECT_EQ(c.block.attention.head_dim, 4);
  EXPECT_EQ(c.block.attention.qkv_width(), 16);
  EXPECT_EQ(c.ffn_hidden_size(), 12);
  EXPECT_EQ(c.block.mlp.activation, Activation::GeluTanh);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(io::is_gpt_bigcode_family(c));
  const io::HfGptBigCodeConfig back = io::hf_gpt_bigcode_config_from_spec(c);
  EXPECT_EQ(back.n_head, 2);
  EXPECT_EQ(back.n_inner, 12);
  EXPECT_EQ(back.n_positions, 16);
  ModelSpec mha = c;
  mha.block.attention.num_query_groups = 2;
  EXPECT_FALSE(io::is_gpt_bigcode_family(mha));
  expect_user_error([&] { io::hf_gpt_bigcode_config_from_spec(mha); }, {"2 query groups"});
}

TEST_F(GptBigCodeIo, ImportTransposesLinearsWithQkvInPlace) {
  const ModelSpec c = io::model_spec_from_hf(io::read_hf_gpt_bigcode_config(file("hf")), 16, 1, 1);
  Params params(c);
  io::import_hf_gpt_bigcode(file("hf"), params.list(), 0, 1);
  const std::string l = "transformer.h.0.";
  const Tensor& c_attn = by_name[l + "attn.c_attn.weight"];
  const Tensor& qkv = params["layers.0.attention.qkv.weight"];
  for (index_t i = 0; i < 8; ++i) {
    for (index_t o = 0; o < 8; ++o) EXPECT_EQ(at(qkv, i, o), at(c_attn, o, i)) << "q";
    for (index_t o = 0; o < 4; ++o) {
      EXPECT_EQ(at(qkv, i, 8 + o), at(c_attn, 8 + o, i)) << "k";
      EXPECT_EQ(at(qkv, i, 12 + o), at(c_attn, 12 + o, i)) << "v";
    }
  }
  EXPECT_EQ(std::memcmp(params["layers.0.attention.qkv.bias"].raw(),
                        by_name[l + "attn.c_attn.bias"].raw(), 16 * sizeof(float)),
            0);
  EXPECT_EQ(at(params["layers.0.mlp.fc.weight"], 7, 11), at(by_name[l + "mlp.c_fc.weight"], 11, 7));
  EXPECT_EQ(at(params["layers.0.mlp.proj.weight"], 11, 3),
            at(by_name[l + "mlp.c_proj.weight"], 3, 11));
  EXPECT_EQ(at(params["layers.0.attention.proj.weight"], 1, 6),
            at(by_name[l + "attn.c_proj.weight"], 6, 1));
  EXPECT_EQ(at(params["embedding.word.weight"], 9, 2), at(by_name["transformer.wte.weight"], 9, 2));
}

TEST_F(GptBigCodeIo, ConvertRoundTripIsBitIdentical) {
  ASSERT_EQ(app::run_convert({"--from", "hf", file("hf"), "--to", file("ckpt")}), 0);
  std::ifstream deck(file("ckpt/model.deck"));
  const std::string deck_text((std::istreambuf_iterator<char>(deck)), {});
  EXPECT_NE(deck_text.find("num_query_groups = 1"), std::string::npos) << deck_text;
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
  const io::HfGptBigCodeConfig back = io::read_hf_gpt_bigcode_config(file("out"));
  EXPECT_EQ(back.n_head, 2);
  EXPECT_EQ(back.n_inner, 12);
  EXPECT_FALSE(back.tie_word_embeddings);
}

TEST_F(GptBigCodeIo, MisshapedTensorIsAUserError) {
  auto bad = hf;
  bad[4].second = Tensor::zeros({8 + 8 + 8, 8});  // c_attn of multi-head attention
  io::write_hf_weights(file("bad"), bad);
  const ModelSpec c = io::model_spec_from_hf(io::read_hf_gpt_bigcode_config(file("hf")), 16, 1, 1);
  Params params(c);
  expect_user_error([&] { io::import_hf_gpt_bigcode(file("bad"), params.list(), 0, 1); },
                    {"transformer.h.0.attn.c_attn.weight", "[16, 8]"});
}

TEST_F(GptBigCodeIo, ConfigRejectsWhatMeshtronDoesNotComputeInOneLine) {
  const std::string head = R"({"model_type": "gpt_bigcode", "n_embd": 8, "n_head": 2, )";
  write_config("mha", head + R"("multi_query": false})");
  expect_user_error([&] { io::read_hf_gpt_bigcode_config(file("mha")); }, {"multi_query false"});
  write_config("unscaled", head + R"("scale_attn_weights": false})");
  expect_user_error([&] { io::read_hf_gpt_bigcode_config(file("unscaled")); },
                    {"scale_attn_weights false"});
  write_config("relu", head + R"("activation_function": "relu"})");
  expect_user_error([&] { io::read_hf_gpt_bigcode_config(file("relu")); }, {"'relu'"});
  write_config("odd", R"({"model_type": "gpt_bigcode", "n_embd": 9, "n_head": 2})");
  expect_user_error([&] { io::read_hf_gpt_bigcode_config(file("odd")); }, {"not divisible"});
  write_config("mha_convert", head + R"("multi_query": false})");
  expect_user_error([&] {
    app::run_convert({"--from", "hf", file("mha_convert"), "--to", file("ckpt")});
  }, {"multi_query false"});
}

}  // namespace
}  // namespace meshtron
