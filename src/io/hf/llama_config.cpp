#include "io/hf/llama_config.hpp"

#include "common/error.hpp"
#include "io/hf/hf_json.hpp"

namespace meshtron::io {

namespace {

using nlohmann::json;

/// The settings transformers reads that meshtron's layers do not compute:
/// each must be absent or state the plain Llama value.
void reject_unbuilt(const json& j, const Fields& f, const HfLlamaConfig& c) {
  f.require(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), "rope_scaling",
            "null (meshtron computes unscaled rotary positions only)");
  if (j.contains("rope_parameters")) {
    const json& r = j["rope_parameters"];
    f.require(r.is_object() && r.value("rope_type", std::string("default")) == "default",
              "rope_parameters", "of rope_type default (meshtron computes unscaled rotary "
              "positions only)");
  }
  for (const char* key : {"attention_bias", "mlp_bias"})
    f.require(!j.contains(key) || j[key] == false, key, "false (Llama's linears have no bias)");
  f.require(!j.contains("hidden_act") || j["hidden_act"] == "silu", "hidden_act",
            "silu (the SwiGLU MLP)");
  f.require(!j.contains("sliding_window") || j["sliding_window"].is_null() ||
                (j["sliding_window"].is_number_integer() &&
                 j["sliding_window"].get<index_t>() >= c.max_position_embeddings),
            "sliding_window", "null or at least max_position_embeddings (meshtron attends "
            "to the whole causal context)");
}

}  // namespace

HfLlamaConfig read_hf_llama_config(const std::string& path) {
  const std::string file = config_file_of(path);
  const json j = parse_json_file(file);
  Fields f(j, file);
  HfLlamaConfig c;
  f.text("model_type", c.model_type);
  MESH_REQUIRE(c.model_type == "llama" || c.model_type == "mistral",
               "Hugging Face config '" << file << "': model_type '" << c.model_type
                                       << "' is not llama or mistral");
  f.size("vocab_size", c.vocab_size);
  f.size("hidden_size", c.hidden_size);
  f.size("intermediate_size", c.intermediate_size);
  f.size("num_hidden_layers", c.num_hidden_layers);
  f.size("num_attention_heads", c.num_attention_heads);
  f.size("num_key_value_heads", c.num_key_value_heads, /*allow_null=*/true);
  f.size("head_dim", c.head_dim, /*allow_null=*/true);
  f.size("max_position_embeddings", c.max_position_embeddings);
  f.number("rms_norm_eps", c.rms_norm_eps);
  f.number("rope_theta", c.rope_theta);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    Fields(j["rope_parameters"], file + " rope_parameters").number("rope_theta", c.rope_theta);
  f.flag("tie_word_embeddings", c.tie_word_embeddings);
  f.number("initializer_range", c.initializer_range);
  reject_unbuilt(j, f, c);
  if (c.num_key_value_heads == 0) c.num_key_value_heads = c.num_attention_heads;
  if (c.head_dim == 0) {
    MESH_REQUIRE(c.hidden_size % c.num_attention_heads == 0,
                 "Hugging Face config '" << file << "': hidden_size " << c.hidden_size
                                         << " is not divisible by num_attention_heads "
                                         << c.num_attention_heads << " (and no head_dim)");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  MESH_REQUIRE(c.num_attention_heads % c.num_key_value_heads == 0,
               "Hugging Face config '" << file << "': num_key_value_heads "
                                       << c.num_key_value_heads
                                       << " does not divide num_attention_heads "
                                       << c.num_attention_heads);
  return c;
}

void write_hf_llama_config(const std::string& path, const HfLlamaConfig& c) {
  write_json_file(path, {
                            {"architectures", json::array({"LlamaForCausalLM"})},
                            {"model_type", "llama"},
                            {"vocab_size", c.vocab_size},
                            {"hidden_size", c.hidden_size},
                            {"intermediate_size", c.intermediate_size},
                            {"num_hidden_layers", c.num_hidden_layers},
                            {"num_attention_heads", c.num_attention_heads},
                            {"num_key_value_heads", c.num_key_value_heads},
                            {"head_dim", c.head_dim},
                            {"max_position_embeddings", c.max_position_embeddings},
                            {"rms_norm_eps", c.rms_norm_eps},
                            {"rope_theta", c.rope_theta},
                            {"rope_scaling", nullptr},
                            {"hidden_act", "silu"},
                            {"attention_bias", false},
                            {"mlp_bias", false},
                            {"tie_word_embeddings", c.tie_word_embeddings},
                            {"initializer_range", c.initializer_range},
                            {"torch_dtype", "float32"},
                        });
}

ModelSpec model_spec_from_hf(const HfLlamaConfig& hf, int seq_length, int divisible_by, int tp) {
  ModelSpec c;
  c.num_layers = int(hf.num_hidden_layers);
  c.hidden_size = int(hf.hidden_size);
  c.seq_length = seq_length;
  c.max_positions = int(hf.max_position_embeddings);
  c.vocab_size = int(hf.vocab_size);
  c.padded_vocab_size = padded_vocab_size(c.vocab_size, divisible_by, tp);
  c.tie_word_embeddings = hf.tie_word_embeddings;
  c.init_std = hf.initializer_range;
  // RMSNorm has no bias whatever NormSpec::bias says; the flag keeps the
  // deck's value so that model.deck reads back as this spec.
  c.block.norm.kind = NormKind::RMSNorm;
  c.block.norm.epsilon = hf.rms_norm_eps;
  auto& a = c.block.attention;
  a.num_heads = int(hf.num_attention_heads);
  a.num_query_groups = int(hf.num_key_value_heads);
  a.head_dim = int(hf.head_dim);
  a.position = PositionEmbedding::Rope;
  a.rotary_percent = 1.0;
  a.rotary_base = hf.rope_theta;
  a.rotary_interleaved = false;  // transformers' rotate_half: the two halves
  a.bias = false;
  c.block.mlp.ffn_hidden_size = int(hf.intermediate_size);
  c.block.mlp.activation = Activation::Swiglu;
  c.block.mlp.bias = false;
  return c;
}

bool is_llama_family(const ModelSpec& c) {
  return c.block.norm.kind == NormKind::RMSNorm &&
         c.block.attention.position == PositionEmbedding::Rope &&
         c.block.mlp.activation == Activation::Swiglu;
}

HfLlamaConfig hf_llama_config_from_spec(const ModelSpec& c) {
  const auto& a = c.block.attention;
  const std::pair<bool, const char*> fixed[] = {
      {c.block.norm.kind == NormKind::RMSNorm && c.block.norm.placement == NormPlacement::Pre,
       "its norms (pre-RMSNorm)"},
      {a.mask == AttentionMask::Causal && a.position == PositionEmbedding::Rope &&
           a.rotary_percent == 1.0 && !a.rotary_interleaved,
       "causal attention with rotary positions over the whole head, halves rotated"},
      {!a.bias && !c.block.mlp.bias, "no bias on any linear layer"},
      {c.block.mlp.activation == Activation::Swiglu, "the SwiGLU MLP"},
      {!c.parallel_residual && !c.embedding_norm, "sequential residuals, no embedding norm"},
  };
  for (const auto& [ok, what] : fixed)
    MESH_REQUIRE(ok, "Hugging Face Llama config: the model differs from Llama in " << what);
  HfLlamaConfig hf;
  hf.vocab_size = c.vocab_size;
  hf.hidden_size = c.hidden_size;
  hf.intermediate_size = c.block.mlp.ffn_hidden_size;
  hf.num_hidden_layers = c.num_layers;
  hf.num_attention_heads = a.num_heads;
  hf.num_key_value_heads = a.num_query_groups;
  hf.head_dim = a.head_dim;
  hf.max_position_embeddings = c.max_positions;
  hf.rms_norm_eps = c.block.norm.epsilon;
  hf.rope_theta = a.rotary_base;
  hf.tie_word_embeddings = c.tie_word_embeddings;
  hf.initializer_range = c.init_std;
  return hf;
}

}  // namespace meshtron::io
