#include "io/hf/bloom_config.hpp"

#include "common/error.hpp"
#include "io/hf/hf_json.hpp"

namespace meshtron::io {

using nlohmann::json;

HfBloomConfig read_hf_bloom_config(const std::string& path) {
  const std::string file = config_file_of(path);
  const json j = parse_json_file(file);
  Fields f(j, file);
  std::string model_type = "bloom";
  f.text("model_type", model_type);
  MESH_REQUIRE(model_type == "bloom", "Hugging Face config '" << file << "': model_type '"
                                      << model_type << "' is not bloom");
  HfBloomConfig c;
  f.size("vocab_size", c.vocab_size);
  f.size("hidden_size", c.hidden_size);
  f.size("n_embed", c.hidden_size, /*allow_null=*/true);  // overrides, as in BloomConfig
  f.size("n_layer", c.n_layer);
  f.size("num_hidden_layers", c.n_layer);
  f.size("n_head", c.n_head);
  f.size("num_attention_heads", c.n_head);
  f.number("layer_norm_epsilon", c.layer_norm_epsilon);
  f.number("initializer_range", c.initializer_range);
  f.number("hidden_dropout", c.hidden_dropout);
  f.number("attention_dropout", c.attention_dropout);
  f.flag("tie_word_embeddings", c.tie_word_embeddings);
  f.size("seq_length", c.seq_length);
  bool post_norm_residual = false;
  f.flag("apply_residual_connection_post_layernorm", post_norm_residual);
  f.require(!post_norm_residual, "apply_residual_connection_post_layernorm",
            "false (meshtron's blocks add the residual taken before the norm)");
  MESH_REQUIRE(c.hidden_size % c.n_head == 0,
               "Hugging Face config '" << file << "': hidden_size " << c.hidden_size
                                       << " is not divisible by n_head " << c.n_head);
  return c;
}

void write_hf_bloom_config(const std::string& path, const HfBloomConfig& c) {
  write_json_file(path, {
                            {"architectures", json::array({"BloomForCausalLM"})},
                            {"model_type", "bloom"},
                            {"vocab_size", c.vocab_size},
                            {"hidden_size", c.hidden_size},
                            {"n_layer", c.n_layer},
                            {"n_head", c.n_head},
                            {"layer_norm_epsilon", c.layer_norm_epsilon},
                            {"initializer_range", c.initializer_range},
                            {"hidden_dropout", c.hidden_dropout},
                            {"attention_dropout", c.attention_dropout},
                            {"apply_residual_connection_post_layernorm", false},
                            {"pretraining_tp", 1},
                            {"slow_but_exact", false},
                            {"tie_word_embeddings", c.tie_word_embeddings},
                            {"seq_length", c.seq_length},
                            {"torch_dtype", "float32"},
                        });
}

ModelSpec model_spec_from_hf(const HfBloomConfig& hf, int seq_length, int divisible_by, int tp) {
  ModelSpec c;
  c.num_layers = int(hf.n_layer);
  c.hidden_size = int(hf.hidden_size);
  c.seq_length = seq_length;
  c.max_positions = seq_length;  // no table: ALiBi extrapolates
  c.vocab_size = int(hf.vocab_size);
  c.padded_vocab_size = padded_vocab_size(c.vocab_size, divisible_by, tp);
  c.tie_word_embeddings = hf.tie_word_embeddings;
  c.init_std = hf.initializer_range;
  c.embedding_norm = true;
  c.block.norm.kind = NormKind::LayerNorm;
  c.block.norm.epsilon = hf.layer_norm_epsilon;
  c.block.attention = AttentionSpec::multi_head(c.hidden_size, int(hf.n_head));
  c.block.attention.position = PositionEmbedding::Alibi;
  c.block.mlp.ffn_hidden_size = 4 * c.hidden_size;
  c.block.mlp.activation = Activation::GeluTanh;  // bloom_gelu_forward: the tanh form
  return c;
}

bool is_bloom_family(const ModelSpec& c) {
  return c.block.attention.position == PositionEmbedding::Alibi && c.embedding_norm;
}

HfBloomConfig hf_bloom_config_from_spec(const ModelSpec& c) {
  const auto& a = c.block.attention;
  const auto& n = c.block.norm;
  const std::pair<bool, const char*> fixed[] = {
      {n.kind == NormKind::LayerNorm && n.placement == NormPlacement::Pre && n.bias,
       "its norms (pre-LayerNorm with bias)"},
      {c.embedding_norm, "a norm after the word embedding"},
      {a.mask == AttentionMask::Causal && a.position == PositionEmbedding::Alibi,
       "causal attention with ALiBi positions"},
      {a.num_query_groups == a.num_heads && a.context_width() == c.hidden_size,
       "multi-head attention over hidden_size / heads per head"},
      {a.bias && c.block.mlp.bias, "biases on every linear layer"},
      {c.block.mlp.activation == Activation::GeluTanh &&
           c.block.mlp.ffn_hidden_size == 4 * c.hidden_size,
       "the tanh-GeLU MLP of 4 x hidden_size"},
      {!c.parallel_residual, "sequential residuals"},
  };
  for (const auto& [ok, what] : fixed)
    MESH_REQUIRE(ok, "Hugging Face BLOOM config: the model differs from BLOOM in " << what);
  HfBloomConfig hf;
  hf.vocab_size = c.vocab_size;
  hf.hidden_size = c.hidden_size;
  hf.n_layer = c.num_layers;
  hf.n_head = a.num_heads;
  hf.layer_norm_epsilon = n.epsilon;
  hf.initializer_range = c.init_std;
  hf.hidden_dropout = c.hidden_dropout;
  hf.attention_dropout = c.attention_dropout;
  hf.tie_word_embeddings = c.tie_word_embeddings;
  hf.seq_length = c.max_positions;
  return hf;
}

}  // namespace meshtron::io
