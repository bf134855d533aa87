#include "io/hf/gpt_bigcode_config.hpp"

#include "common/error.hpp"
#include "io/hf/gpt2_config.hpp"
#include "io/hf/hf_json.hpp"

namespace meshtron::io {

using nlohmann::json;

HfGptBigCodeConfig read_hf_gpt_bigcode_config(const std::string& path) {
  const std::string file = config_file_of(path);
  const json j = parse_json_file(file);
  std::string model_type = "gpt_bigcode";
  Fields f(j, file);
  f.text("model_type", model_type);
  MESH_REQUIRE(model_type == "gpt_bigcode", "Hugging Face config '" << file << "': model_type '"
                                            << model_type << "' is not gpt_bigcode");

  HfGptBigCodeConfig c;
  bool multi_query = true, scale_attn_weights = true;
  f.size("vocab_size", c.vocab_size);
  f.size("n_positions", c.n_positions);
  f.size("n_embd", c.n_embd);
  f.size("n_layer", c.n_layer);
  f.size("n_head", c.n_head);
  f.size("n_inner", c.n_inner, /*allow_null=*/true);
  f.number("layer_norm_epsilon", c.layer_norm_epsilon);
  f.text("activation_function", c.activation_function);
  f.flag("tie_word_embeddings", c.tie_word_embeddings);
  f.number("initializer_range", c.initializer_range);
  f.flag("multi_query", multi_query);
  f.flag("scale_attn_weights", scale_attn_weights);
  c.n_inner = c.mlp_width();
  MESH_REQUIRE(c.n_embd % c.n_head == 0, "Hugging Face config '" << file << "': n_embd "
                                         << c.n_embd << " is not divisible by n_head "
                                         << c.n_head);
  MESH_REQUIRE(multi_query, "Hugging Face config '" << file
                            << "': multi_query false (per-head interleaved c_attn) is not "
                               "supported, only multi-query GPTBigCode");
  MESH_REQUIRE(scale_attn_weights, "Hugging Face config '" << file
                                   << "': scale_attn_weights false (no 1/sqrt(head_dim) "
                                      "scaling) is not supported");
  MESH_REQUIRE(c.activation_function == "gelu_pytorch_tanh" ||
                   c.activation_function == "gelu_new",
               "Hugging Face config '" << file << "': activation_function '"
                   << c.activation_function << "' is not gelu_pytorch_tanh | gelu_new");
  return c;
}

void write_hf_gpt_bigcode_config(const std::string& path, const HfGptBigCodeConfig& c) {
  const json j = {
      {"architectures", json::array({"GPTBigCodeForCausalLM"})},
      {"model_type", "gpt_bigcode"},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.n_positions},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_inner", c.mlp_width()},
      {"layer_norm_epsilon", c.layer_norm_epsilon},
      {"activation_function", c.activation_function},
      {"multi_query", true},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"initializer_range", c.initializer_range},
  };
  write_json_file(path, j);
}

ModelSpec model_spec_from_hf(const HfGptBigCodeConfig& hf, int seq_length, int divisible_by,
                             int tp) {
  ModelSpec c;
  c.num_layers = int(hf.n_layer);
  c.hidden_size = int(hf.n_embd);
  c.seq_length = seq_length;
  c.max_positions = int(hf.n_positions);
  c.vocab_size = int(hf.vocab_size);
  c.padded_vocab_size = padded_vocab_size(c.vocab_size, divisible_by, tp);
  c.tie_word_embeddings = hf.tie_word_embeddings;
  c.init_std = hf.initializer_range;
  c.block.norm.epsilon = hf.layer_norm_epsilon;
  c.block.attention = AttentionSpec::multi_head(c.hidden_size, int(hf.n_head));
  c.block.attention.num_query_groups = 1;
  c.block.mlp.ffn_hidden_size = int(hf.mlp_width());
  c.block.mlp.activation = Activation::GeluTanh;
  return c;
}

bool is_gpt_bigcode_family(const ModelSpec& spec) {
  const auto& a = spec.block.attention;
  return a.num_query_groups == 1 && a.num_heads > 1 &&
         a.position == PositionEmbedding::LearnedAbsolute;
}

HfGptBigCodeConfig hf_gpt_bigcode_config_from_spec(const ModelSpec& c) {
  require_gpt2_block(c, "GPTBigCode");
  const auto& a = c.block.attention;
  MESH_REQUIRE(a.num_query_groups == 1, "Hugging Face GPTBigCode config: the model has "
                                            << a.num_query_groups
                                            << " query groups, GPTBigCode one (multi-query)");
  HfGptBigCodeConfig hf;
  hf.vocab_size = c.vocab_size;
  hf.n_positions = c.max_positions;
  hf.n_embd = c.hidden_size;
  hf.n_layer = c.num_layers;
  hf.n_head = a.num_heads;
  hf.n_inner = c.block.mlp.ffn_hidden_size;
  hf.layer_norm_epsilon = c.block.norm.epsilon;
  hf.tie_word_embeddings = c.tie_word_embeddings;
  hf.initializer_range = c.init_std;
  return hf;
}

}  // namespace meshtron::io
