// Hugging Face BLOOM interop: the per-head query_key_value layout against
// meshtron's [q | k | v], a random checkpoint through convert both ways
// (bit-exact, with and without BigScience's bare names), and the
// config.json mapping and its errors. The golden model's round trip:
// test_convert_bloom_golden.cpp.
#include <gtest/gtest.h>

#include <cstring>

#include "app/commands.hpp"
#include "common/convert_test_util.hpp"
#include "common/expect_user_error.hpp"
#include "io/checkpoint.hpp"
#include "io/hf/bloom.hpp"
#include "io/hf/bloom_config.hpp"
#include "io/hf/hf_weights.hpp"

namespace meshtron {
namespace {

using testing_util::expect_user_error;

class BloomIo : public testing_util::ScratchFolderTest {};

constexpr index_t kHidden = 12, kHeads = 3, kVocab = 10;  // head_dim 4

io::HfBloomConfig tiny_config() {
  io::HfBloomConfig c;
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.n_layer = 2;
  c.n_head = kHeads;
  c.seq_length = 8;
  return c;
}

/// Random tensors of tiny_config() in transformers' names and layouts.
std::vector<std::pair<std::string, Tensor>> random_hf_tensors(const std::string& prefix) {
  testing_util::RandomTensors t(11);
  const index_t h = kHidden;
  std::vector<std::pair<std::string, Tensor>> out = {
      {prefix + "word_embeddings.weight", t({kVocab, h})},
      {prefix + "word_embeddings_layernorm.weight", t({h})},
      {prefix + "word_embeddings_layernorm.bias", t({h})},
      {prefix + "ln_f.weight", t({h})},
      {prefix + "ln_f.bias", t({h})}};
  for (int i = 0; i < 2; ++i) {
    const std::string l = prefix + "h." + std::to_string(i) + ".";
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"}) {
      out.push_back({l + norm + ".weight", t({h})});
      out.push_back({l + norm + ".bias", t({h})});
    }
    const std::pair<const char*, Shape> linears[] = {
        {"self_attention.query_key_value", {3 * h, h}},
        {"self_attention.dense", {h, h}},
        {"mlp.dense_h_to_4h", {4 * h, h}},
        {"mlp.dense_4h_to_h", {h, 4 * h}}};
    for (const auto& [name, shape] : linears) {
      out.push_back({l + name + ".weight", t(shape)});
      out.push_back({l + name + ".bias", t({shape[0]})});
    }
  }
  return out;
}

void write_model(const std::string& folder, const std::string& prefix) {
  io::write_hf_weights(folder, random_hf_tensors(prefix));
  io::write_hf_bloom_config(folder + "/config.json", tiny_config());
}

TEST(BloomMapping, QkvRowsMoveFromHeadsMajorToPartsMajorAndBack) {
  const index_t d = 2, heads = 3;  // rows (head, part, e) in BLOOM's order
  Tensor rows = Tensor::empty({3 * heads * d, 2});
  for (index_t r = 0; r < rows.dim(0); ++r)
    for (index_t c = 0; c < 2; ++c) rows.data<float>()[r * 2 + c] = float(10 * r + c);
  const Tensor ours = io::permute_bloom_qkv_rows(rows, heads, d, /*to_bloom=*/false);
  for (index_t h = 0; h < heads; ++h)
    for (index_t part = 0; part < 3; ++part)
      for (index_t e = 0; e < d; ++e) {
        const index_t bloom = (h * 3 + part) * d + e, meshtron = (part * heads + h) * d + e;
        EXPECT_EQ(ours.data<float>()[meshtron * 2 + 1], rows.data<float>()[bloom * 2 + 1]);
      }
  const Tensor back = io::permute_bloom_qkv_rows(ours, heads, d, /*to_bloom=*/true);
  EXPECT_EQ(std::memcmp(back.raw(), rows.raw(), rows.bytes()), 0);
  EXPECT_EQ(io::bloom_name_of("embedding.norm.bias"),
            "transformer.word_embeddings_layernorm.bias");
  EXPECT_EQ(io::bloom_name_of("layers.1.attention.qkv.weight"),
            "transformer.h.1.self_attention.query_key_value.weight");
  EXPECT_EQ(io::bloom_name_of("layers.0.mlp.proj.bias"), "transformer.h.0.mlp.dense_4h_to_h.bias");
  expect_user_error([] { io::bloom_name_of("embedding.position.weight"); },
                    {"embedding.position.weight"});
}

TEST_F(BloomIo, RandomCheckpointRoundTripsBitForBit) {
  // BigScience's bare names read as transformers' prefixed ones; the export
  // writes transformers' names.
  for (const std::string prefix : {"transformer.", ""}) {
    SCOPED_TRACE(prefix);
    const std::string model = file("hf_in" + prefix), ckpt = file("ckpt" + prefix),
                      out = file("hf_out" + prefix);
    write_model(model, prefix);
    ASSERT_EQ(app::run_convert({"--from", "hf", model, "--to", ckpt}), 0);
    ASSERT_EQ(app::run_convert(
                  {"--from", ckpt + "/" + io::checkpoint_file_name(0), "--to", "hf", out}),
              0);
    const io::HfWeights a(model), b(out);
    ASSERT_EQ(a.names().size(), b.names().size());
    for (const std::string& name : a.names()) {
      const Tensor x = a.load(name), y = b.load("transformer." + name.substr(prefix.size()));
      ASSERT_EQ(x.shape(), y.shape()) << name;
      EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.bytes()), 0) << name << " differs";
    }
    const io::HfBloomConfig c = io::read_hf_bloom_config(out);
    EXPECT_EQ(c.n_head, kHeads);
    EXPECT_EQ(c.hidden_size, kHidden);
    EXPECT_EQ(c.seq_length, 8);
    EXPECT_TRUE(c.tie_word_embeddings);
  }
}

TEST_F(BloomIo, ConfigMapsToTheSpecAndBack) {
  write("config.json", R"({"architectures": ["BloomForCausalLM"], "model_type": "bloom",
    "vocab_size": 250880, "n_embed": 1024, "n_layer": 24, "num_attention_heads": 16,
    "layer_norm_epsilon": 1e-5, "apply_residual_connection_post_layernorm": false,
    "pretraining_tp": 1, "slow_but_exact": false, "seq_length": 2048})");
  const io::HfBloomConfig c = io::read_hf_bloom_config(dir.string());
  EXPECT_EQ(c.hidden_size, 1024);  // n_embed
  EXPECT_EQ(c.n_head, 16);         // num_attention_heads
  const ModelSpec s = io::model_spec_from_hf(c, 2048, 128, 2);
  EXPECT_EQ(s.block.attention.position, PositionEmbedding::Alibi);
  EXPECT_EQ(s.block.attention.head_dim, 64);
  EXPECT_TRUE(s.embedding_norm && s.tie_word_embeddings);
  EXPECT_EQ(s.block.mlp.activation, Activation::GeluTanh);
  EXPECT_EQ(s.ffn_hidden_size(), 4096);
  EXPECT_TRUE(s.block.attention.bias && s.block.mlp.bias && s.block.norm.bias);
  EXPECT_TRUE(io::is_bloom_family(s));
  EXPECT_FALSE(io::is_bloom_family(ModelSpec{}));
  const io::HfBloomConfig back = io::hf_bloom_config_from_spec(s);
  EXPECT_EQ(back.hidden_size, 1024);
  EXPECT_EQ(back.n_layer, 24);
  EXPECT_EQ(back.seq_length, 2048);
  expect_user_error([] { io::hf_bloom_config_from_spec(ModelSpec{}); }, {"BLOOM"});
}

TEST_F(BloomIo, ConfigRejectsWhatMeshtronDoesNotComputeInOneLine) {
  const std::pair<const char*, std::vector<std::string>> bad[] = {
      {R"({"model_type": "bloom", "apply_residual_connection_post_layernorm": true})",
       {"apply_residual_connection_post_layernorm"}},
      {R"({"model_type": "bloom", "hidden_size": 64, "n_head": 5})", {"n_head 5"}},
      {R"({"model_type": "gpt2"})", {"gpt2", "not bloom"}},
  };
  for (const auto& [text, needles] : bad) {
    SCOPED_TRACE(text);
    write("bad.json", text);
    expect_user_error([&] { io::read_hf_bloom_config(file("bad.json")); }, needles);
  }
}

}  // namespace
}  // namespace meshtron
