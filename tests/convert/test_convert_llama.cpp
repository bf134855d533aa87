// Hugging Face Llama interop: the name and layout mapping (q | k | v and
// gate | up fused, [out, in] transposed), sharded weights with their index,
// the config.json mapping, and convert's family dispatch. The golden
// model's round trip: test_convert_llama_golden.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "app/commands.hpp"
#include "common/convert_test_util.hpp"
#include "common/error.hpp"
#include "common/expect_user_error.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/hf/llama.hpp"
#include "io/hf/llama_config.hpp"

namespace meshtron {
namespace {

namespace fs = std::filesystem;

using testing_util::at;
using testing_util::expect_user_error;

class LlamaIo : public testing_util::ScratchFolderTest {};

// ---------------------------------------------------------------- names ---

TEST(LlamaMapping, NamesEveryTensorOfTheTable) {
  using io::llama_mapping_of;
  EXPECT_EQ(llama_mapping_of("embedding.word.weight").hf_names,
            std::vector<std::string>{"model.embed_tokens.weight"});
  EXPECT_FALSE(llama_mapping_of("embedding.word.weight").transposed);
  const auto qkv = llama_mapping_of("layers.11.attention.qkv.weight");
  EXPECT_EQ(qkv.hf_names, (std::vector<std::string>{"model.layers.11.self_attn.q_proj.weight",
                                                    "model.layers.11.self_attn.k_proj.weight",
                                                    "model.layers.11.self_attn.v_proj.weight"}));
  EXPECT_TRUE(qkv.transposed);
  const auto fc = llama_mapping_of("layers.0.mlp.fc.weight");
  EXPECT_EQ(fc.hf_names, (std::vector<std::string>{"model.layers.0.mlp.gate_proj.weight",
                                                   "model.layers.0.mlp.up_proj.weight"}));
  EXPECT_EQ(llama_mapping_of("layers.3.attention.proj.weight").hf_names[0],
            "model.layers.3.self_attn.o_proj.weight");
  EXPECT_EQ(llama_mapping_of("layers.3.mlp.proj.weight").hf_names[0],
            "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(llama_mapping_of("layers.2.ln_1.weight").hf_names[0],
            "model.layers.2.input_layernorm.weight");
  EXPECT_EQ(llama_mapping_of("layers.2.ln_2.weight").hf_names[0],
            "model.layers.2.post_attention_layernorm.weight");
  EXPECT_EQ(llama_mapping_of("final_norm.weight").hf_names[0], "model.norm.weight");
  EXPECT_EQ(llama_mapping_of("output_layer.weight").hf_names[0], "lm_head.weight");
  expect_user_error([] { llama_mapping_of("layers.0.attention.qkv.bias"); },
                    {"layers.0.attention.qkv.bias"});
}

// ----------------------------------------------------- weights, layouts ---

/// h 8, 2 heads of 4 with 1 kv group, ffn 6, vocab 10, one layer, untied.
ModelSpec tiny_llama() {
  io::HfLlamaConfig hf;
  hf.vocab_size = 10;
  hf.hidden_size = 8;
  hf.intermediate_size = 6;
  hf.num_hidden_layers = 1;
  hf.num_attention_heads = 2;
  hf.num_key_value_heads = 1;
  hf.head_dim = 4;
  hf.max_position_embeddings = 16;
  return io::model_spec_from_hf(hf, 16, 1, 1);
}

/// The parameters a 1-rank model of tiny_llama() holds (names and global
/// shapes), zero-valued.
struct TinyParams : testing_util::ZeroParams {
  explicit TinyParams(const ModelSpec& c) {
    const index_t h = c.hidden_size, f = c.ffn_hidden_size();
    add("embedding.word.weight", {c.vocab_size, h});
    add("layers.0.ln_1.weight", {h});
    add("layers.0.attention.qkv.weight", {h, c.block.attention.qkv_width()});
    add("layers.0.attention.proj.weight", {c.block.attention.context_width(), h});
    add("layers.0.ln_2.weight", {h});
    add("layers.0.mlp.fc.weight", {h, 2 * f});
    add("layers.0.mlp.proj.weight", {f, h});
    add("final_norm.weight", {h});
    add("output_layer.weight", {c.vocab_size, h});
  }
};

/// Random Hugging Face tensors of tiny_llama(), in transformers' layouts.
std::vector<std::pair<std::string, Tensor>> random_hf_tensors() {
  testing_util::RandomTensors t(7);
  const std::string l = "model.layers.0.";
  return {{"model.embed_tokens.weight", t({10, 8})},
          {l + "input_layernorm.weight", t({8})},
          {l + "self_attn.q_proj.weight", t({8, 8})},
          {l + "self_attn.k_proj.weight", t({4, 8})},
          {l + "self_attn.v_proj.weight", t({4, 8})},
          {l + "self_attn.o_proj.weight", t({8, 8})},
          {l + "post_attention_layernorm.weight", t({8})},
          {l + "mlp.gate_proj.weight", t({6, 8})},
          {l + "mlp.up_proj.weight", t({6, 8})},
          {l + "mlp.down_proj.weight", t({8, 6})},
          {"model.norm.weight", t({8})},
          {"lm_head.weight", t({10, 8})}};
}

TEST_F(LlamaIo, ImportPlacesPartsTransposedAndExportRestoresThemBitForBit) {
  const ModelSpec spec = tiny_llama();
  const auto hf = random_hf_tensors();
  std::map<std::string, Tensor> by_name(hf.begin(), hf.end());
  // Sharded (every tensor above 200 bytes alone in its shard) and whole.
  for (const std::uint64_t shard_bytes : {io::kHfMaxShardBytes, std::uint64_t(200)}) {
    SCOPED_TRACE(shard_bytes);
    const std::string model_dir = file("model_" + std::to_string(shard_bytes));
    io::write_hf_weights(model_dir, hf, shard_bytes);
    const bool sharded = shard_bytes == 200;
    EXPECT_EQ(fs::exists(model_dir + "/model.safetensors.index.json"), sharded);
    EXPECT_EQ(fs::exists(model_dir + "/model.safetensors"), !sharded);
    if (sharded) EXPECT_TRUE(fs::exists(model_dir + "/model-00002-of-00012.safetensors"));

    TinyParams params(spec);
    io::import_hf_llama(model_dir, spec, params.list(), 0, 1);
    const std::string l = "model.layers.0.";
    const Tensor& qkv = params["layers.0.attention.qkv.weight"];
    const Tensor& fc = params["layers.0.mlp.fc.weight"];
    for (index_t i = 0; i < 8; ++i) {  // meshtron [in, out] = HF [out, in]^T, parts side by side
      for (index_t o = 0; o < 8; ++o)
        EXPECT_EQ(at(qkv, i, o), at(by_name[l + "self_attn.q_proj.weight"], o, i));
      for (index_t o = 0; o < 4; ++o) {
        EXPECT_EQ(at(qkv, i, 8 + o), at(by_name[l + "self_attn.k_proj.weight"], o, i));
        EXPECT_EQ(at(qkv, i, 12 + o), at(by_name[l + "self_attn.v_proj.weight"], o, i));
      }
      for (index_t o = 0; o < 6; ++o) {
        EXPECT_EQ(at(fc, i, o), at(by_name[l + "mlp.gate_proj.weight"], o, i));
        EXPECT_EQ(at(fc, i, 6 + o), at(by_name[l + "mlp.up_proj.weight"], o, i));
      }
    }
    EXPECT_EQ(at(params["layers.0.mlp.proj.weight"], 5, 7),
              at(by_name[l + "mlp.down_proj.weight"], 7, 5));
    EXPECT_EQ(at(params["output_layer.weight"], 9, 3), at(by_name["lm_head.weight"], 9, 3));

    const auto back = io::hf_llama_tensors(spec, params.list());
    ASSERT_EQ(back.size(), hf.size());
    for (const auto& [name, tensor] : back) {
      ASSERT_TRUE(by_name.count(name)) << name;
      const Tensor& original = by_name[name];
      ASSERT_EQ(tensor.shape(), original.shape()) << name;
      EXPECT_EQ(std::memcmp(tensor.raw(), original.raw(), original.bytes()), 0) << name;
    }
  }
}

TEST_F(LlamaIo, MissingOrMisshapedPartsAreUserErrors) {
  const ModelSpec spec = tiny_llama();
  auto hf = random_hf_tensors();
  auto without = hf;
  without.erase(without.begin() + 4);  // v_proj
  io::write_hf_weights(file("no_v"), without);
  TinyParams params(spec);
  expect_user_error([&] { io::import_hf_llama(file("no_v"), spec, params.list(), 0, 1); },
                    {"model.layers.0.self_attn.v_proj.weight", "layers.0.attention.qkv.weight"});
  hf[3].second = Tensor::zeros({8, 8});  // k_proj as wide as q_proj: not 1 kv group
  io::write_hf_weights(file("wide_k"), hf);
  expect_user_error([&] { io::import_hf_llama(file("wide_k"), spec, params.list(), 0, 1); },
                    {"k_proj", "4 rows"});
  fs::create_directories(file("bad_index"));
  std::ofstream(file("bad_index/model.safetensors.index.json")) << R"({"metadata": {}})";
  expect_user_error([&] { io::HfWeights w(file("bad_index")); }, {"weight_map"});
}

// --------------------------------------------------------------- config ---

TEST_F(LlamaIo, ConfigResolvesDefaultsAndMapsToTheSpec) {
  write("config.json", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": null, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16"})");
  const io::HfLlamaConfig c = io::read_hf_llama_config(dir.string());
  EXPECT_EQ(c.head_dim, 64);  // hidden / heads
  EXPECT_EQ(c.num_key_value_heads, 8);
  const ModelSpec s = io::model_spec_from_hf(c, 4096, 128, 2);
  EXPECT_EQ(s.block.norm.kind, NormKind::RMSNorm);
  EXPECT_DOUBLE_EQ(s.block.norm.epsilon, 1e-5);
  EXPECT_EQ(s.block.attention.num_query_groups, 8);
  EXPECT_EQ(s.block.attention.head_dim, 64);
  EXPECT_EQ(s.block.attention.position, PositionEmbedding::Rope);
  EXPECT_DOUBLE_EQ(s.block.attention.rotary_base, 500000.0);
  EXPECT_FALSE(s.block.attention.rotary_interleaved);
  EXPECT_EQ(s.block.mlp.activation, Activation::Swiglu);
  EXPECT_EQ(s.ffn_hidden_size(), 8192);
  EXPECT_FALSE(s.block.attention.bias || s.block.mlp.bias);
  EXPECT_TRUE(s.tie_word_embeddings);
  EXPECT_EQ(s.padded_vocab_size, 128256);
  EXPECT_EQ(s.seq_length, 4096);
  EXPECT_EQ(s.max_positions, 8192);
  EXPECT_TRUE(io::is_llama_family(s));
  EXPECT_FALSE(io::is_llama_family(ModelSpec{}));

  io::write_hf_llama_config(file("back.json"), io::hf_llama_config_from_spec(s));
  const io::HfLlamaConfig b = io::read_hf_llama_config(file("back.json"));
  EXPECT_EQ(b.vocab_size, c.vocab_size);
  EXPECT_EQ(b.hidden_size, c.hidden_size);
  EXPECT_EQ(b.intermediate_size, c.intermediate_size);
  EXPECT_EQ(b.num_hidden_layers, c.num_hidden_layers);
  EXPECT_EQ(b.num_attention_heads, c.num_attention_heads);
  EXPECT_EQ(b.num_key_value_heads, c.num_key_value_heads);
  EXPECT_EQ(b.head_dim, c.head_dim);
  EXPECT_EQ(b.max_position_embeddings, c.max_position_embeddings);
  EXPECT_DOUBLE_EQ(b.rms_norm_eps, c.rms_norm_eps);
  EXPECT_DOUBLE_EQ(b.rope_theta, c.rope_theta);
  EXPECT_EQ(b.tie_word_embeddings, c.tie_word_embeddings);

  expect_user_error([] { io::hf_llama_config_from_spec(ModelSpec{}); }, {"Llama", "norms"});
}

TEST_F(LlamaIo, ConfigReadsRopeParametersAndMistral) {
  write("new.json", R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})");
  EXPECT_DOUBLE_EQ(io::read_hf_llama_config(file("new.json")).rope_theta, 1e6);
  write("mistral.json", R"({"model_type": "mistral", "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": null,
    "max_position_embeddings": 32768})");
  EXPECT_EQ(io::read_hf_llama_config(file("mistral.json")).num_key_value_heads, 2);
}

TEST_F(LlamaIo, ConfigRejectsWhatMeshtronDoesNotComputeInOneLine) {
  const std::pair<const char*, std::vector<std::string>> bad[] = {
      {R"({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})",
       {"rope_scaling", "llama3"}},
      {R"({"model_type": "llama", "rope_parameters": {"rope_type": "yarn"}})",
       {"rope_parameters"}},
      {R"({"model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768})",
       {"sliding_window", "4096"}},
      {R"({"model_type": "llama", "attention_bias": true})", {"attention_bias"}},
      {R"({"model_type": "llama", "mlp_bias": true})", {"mlp_bias"}},
      {R"({"model_type": "llama", "hidden_act": "gelu"})", {"hidden_act", "silu"}},
      {R"({"model_type": "llama", "hidden_size": 48, "num_attention_heads": 6,
          "num_key_value_heads": 4})",
       {"num_key_value_heads"}},
      {R"({"model_type": "gpt2"})", {"gpt2", "llama or mistral"}},
      {R"({"model_type": "llama", "hidden_size": -1})", {"hidden_size"}},
  };
  for (const auto& [text, needles] : bad) {
    SCOPED_TRACE(text);
    write("bad.json", text);
    expect_user_error([&] { io::read_hf_llama_config(file("bad.json")); }, needles);
  }
}

TEST_F(LlamaIo, ConvertNamesAnUnknownFamily) {
  write("config.json", R"({"architectures": ["RobertaForMaskedLM"], "model_type": "roberta"})");
  expect_user_error(
      [&] { app::run_convert({"--from", "hf", dir.string(), "--to", file("ckpt")}); },
      {"model_type 'roberta' (RobertaForMaskedLM) is not one of megatron-bert, bert, t5, mt5, llama, mistral, bloom, gpt_neox, gpt_bigcode, gpt2"});
}

}  // namespace
}  // namespace meshtron
