#include "io/hf/gpt_neox_config.hpp"

#include "common/error.hpp"
#include "io/hf/hf_json.hpp"

namespace meshtron::io {

namespace {

using nlohmann::json;

/// rotary_pct and rotary_emb_base, then rope_parameters' spellings of them
/// (transformers 5), which win; rope scaling is rejected.
void read_rotary(const json& j, const Fields& f, HfGptNeoxConfig& c) {
  f.number("rotary_pct", c.rotary_pct);
  f.number("partial_rotary_factor", c.rotary_pct);
  f.number("rotary_emb_base", c.rotary_emb_base);
  f.number("rope_theta", c.rotary_emb_base);
  f.require(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), "rope_scaling",
            "null (meshtron computes unscaled rotary positions only)");
  if (!j.contains("rope_parameters") || j["rope_parameters"].is_null()) return;
  const json& r = j["rope_parameters"];
  f.require(r.is_object() && r.value("rope_type", std::string("default")) == "default",
            "rope_parameters", "of rope_type default (meshtron computes unscaled rotary "
            "positions only)");
  const Fields rope(r, f.file() + " rope_parameters");
  rope.number("partial_rotary_factor", c.rotary_pct);
  rope.number("rope_theta", c.rotary_emb_base);
}

}  // namespace

HfGptNeoxConfig read_hf_gpt_neox_config(const std::string& path) {
  const std::string file = config_file_of(path);
  const json j = parse_json_file(file);
  Fields f(j, file);
  std::string model_type = "gpt_neox";
  f.text("model_type", model_type);
  MESH_REQUIRE(model_type == "gpt_neox", "Hugging Face config '" << file << "': model_type '"
                                             << model_type << "' is not gpt_neox");
  HfGptNeoxConfig c;
  f.size("vocab_size", c.vocab_size);
  f.size("hidden_size", c.hidden_size);
  f.size("num_hidden_layers", c.num_hidden_layers);
  f.size("num_attention_heads", c.num_attention_heads);
  f.size("intermediate_size", c.intermediate_size);
  f.size("max_position_embeddings", c.max_position_embeddings);
  f.number("layer_norm_eps", c.layer_norm_eps);
  f.flag("use_parallel_residual", c.use_parallel_residual);
  f.flag("attention_bias", c.attention_bias);
  f.flag("tie_word_embeddings", c.tie_word_embeddings);
  f.number("initializer_range", c.initializer_range);
  read_rotary(j, f, c);
  f.require(!j.contains("hidden_act") || j["hidden_act"] == "gelu", "hidden_act",
            "gelu (the exact GeLU MLP)");
  MESH_REQUIRE(c.hidden_size % c.num_attention_heads == 0,
               "Hugging Face config '" << file << "': hidden_size " << c.hidden_size
                                       << " is not divisible by num_attention_heads "
                                       << c.num_attention_heads);
  return c;
}

void write_hf_gpt_neox_config(const std::string& path, const HfGptNeoxConfig& c) {
  write_json_file(path, {
                            {"architectures", json::array({"GPTNeoXForCausalLM"})},
                            {"model_type", "gpt_neox"},
                            {"vocab_size", c.vocab_size},
                            {"hidden_size", c.hidden_size},
                            {"num_hidden_layers", c.num_hidden_layers},
                            {"num_attention_heads", c.num_attention_heads},
                            {"intermediate_size", c.intermediate_size},
                            {"hidden_act", "gelu"},
                            {"rotary_pct", c.rotary_pct},
                            {"rotary_emb_base", c.rotary_emb_base},
                            {"rope_parameters",
                             {{"rope_type", "default"},
                              {"rope_theta", c.rotary_emb_base},
                              {"partial_rotary_factor", c.rotary_pct}}},
                            {"max_position_embeddings", c.max_position_embeddings},
                            {"layer_norm_eps", c.layer_norm_eps},
                            {"use_parallel_residual", c.use_parallel_residual},
                            {"attention_bias", c.attention_bias},
                            {"tie_word_embeddings", c.tie_word_embeddings},
                            {"initializer_range", c.initializer_range},
                            {"torch_dtype", "float32"},
                        });
}

ModelSpec model_spec_from_hf(const HfGptNeoxConfig& hf, int seq_length, int divisible_by,
                             int tp) {
  ModelSpec c;
  c.num_layers = int(hf.num_hidden_layers);
  c.hidden_size = int(hf.hidden_size);
  c.seq_length = seq_length;
  c.max_positions = int(hf.max_position_embeddings);
  c.vocab_size = int(hf.vocab_size);
  c.padded_vocab_size = padded_vocab_size(c.vocab_size, divisible_by, tp);
  c.tie_word_embeddings = hf.tie_word_embeddings;
  c.init_std = hf.initializer_range;
  c.parallel_residual = hf.use_parallel_residual;
  c.block.norm.epsilon = hf.layer_norm_eps;
  auto& a = c.block.attention;
  a = AttentionSpec::multi_head(c.hidden_size, int(hf.num_attention_heads));
  a.position = PositionEmbedding::Rope;
  a.rotary_percent = hf.rotary_pct;
  a.rotary_base = hf.rotary_emb_base;
  a.rotary_interleaved = false;  // transformers' rotate_half: the two halves
  a.bias = hf.attention_bias;
  c.block.mlp.ffn_hidden_size = int(hf.intermediate_size);
  c.block.mlp.activation = Activation::Gelu;
  c.block.mlp.bias = true;
  return c;
}

bool is_gpt_neox_family(const ModelSpec& c) {
  return c.block.norm.kind == NormKind::LayerNorm &&
         c.block.attention.position == PositionEmbedding::Rope &&
         c.block.mlp.activation == Activation::Gelu;
}

HfGptNeoxConfig hf_gpt_neox_config_from_spec(const ModelSpec& c) {
  const auto& a = c.block.attention;
  const std::pair<bool, const char*> fixed[] = {
      {c.block.norm.kind == NormKind::LayerNorm && c.block.norm.bias &&
           c.block.norm.placement == NormPlacement::Pre,
       "its norms (pre-LayerNorm with a bias)"},
      {a.mask == AttentionMask::Causal && a.position == PositionEmbedding::Rope &&
           !a.rotary_interleaved && a.num_query_groups == a.num_heads &&
           a.head_dim * a.num_heads == c.hidden_size,
       "causal multi-head attention of hidden / heads dims with rotary positions, halves "
       "rotated"},
      {c.block.mlp.activation == Activation::Gelu && c.block.mlp.bias,
       "the exact GeLU MLP with biases"},
      {!c.embedding_norm, "no embedding norm"},
  };
  for (const auto& [ok, what] : fixed)
    MESH_REQUIRE(ok, "Hugging Face GPT-NeoX config: the model differs from GPT-NeoX in " << what);
  HfGptNeoxConfig hf;
  hf.vocab_size = c.vocab_size;
  hf.hidden_size = c.hidden_size;
  hf.num_hidden_layers = c.num_layers;
  hf.num_attention_heads = a.num_heads;
  hf.intermediate_size = c.block.mlp.ffn_hidden_size;
  hf.rotary_pct = a.rotary_percent;
  hf.rotary_emb_base = a.rotary_base;
  hf.max_position_embeddings = c.max_positions;
  hf.layer_norm_eps = c.block.norm.epsilon;
  hf.use_parallel_residual = c.parallel_residual;
  hf.attention_bias = a.bias;
  hf.tie_word_embeddings = c.tie_word_embeddings;
  hf.initializer_range = c.init_std;
  return hf;
}

}  // namespace meshtron::io
