#include "io/hf/gpt2_config.hpp"

#include "common/error.hpp"
#include "io/hf/hf_json.hpp"

namespace meshtron::io {

namespace {

using nlohmann::json;

/// transformers' ACT2FN names of the activations meshtron names.
Activation activation_of(const std::string& hf_name) {
  if (hf_name == "gelu_new" || hf_name == "gelu_pytorch_tanh") return Activation::GeluTanh;
  if (hf_name == "gelu") return Activation::Gelu;
  if (hf_name == "relu") return Activation::Relu;
  throw UserError("Hugging Face config: activation_function '" + hf_name +
                  "' is not one of gelu_new | gelu_pytorch_tanh | gelu | relu");
}

}  // namespace

HfGpt2Config read_hf_gpt2_config(const std::string& path) {
  const std::string file = config_file_of(path);
  const json j = parse_json_file(file);
  std::string model_type = "gpt2";
  Fields f(j, file);
  f.text("model_type", model_type);
  MESH_REQUIRE(model_type == "gpt2", "Hugging Face config '" << file << "': model_type '"
                                     << model_type << "' is not gpt2");

  HfGpt2Config c;
  read_gpt2_keys(f, file, c);
  return c;
}

void read_gpt2_keys(Fields& f, const std::string& file, HfGpt2Config& c) {
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
  c.n_inner = c.mlp_width();
  MESH_REQUIRE(c.n_embd % c.n_head == 0, "Hugging Face config '" << file << "': n_embd "
                                         << c.n_embd << " is not divisible by n_head "
                                         << c.n_head);
}

json gpt2_keys_json(const HfGpt2Config& c) {
  return {
      {"vocab_size", c.vocab_size},
      {"n_positions", c.n_positions},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_inner", c.mlp_width()},
      {"layer_norm_epsilon", c.layer_norm_epsilon},
      {"activation_function", c.activation_function},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"initializer_range", c.initializer_range},
  };
}

void write_hf_gpt2_config(const std::string& path, const HfGpt2Config& c) {
  json j = gpt2_keys_json(c);
  j["architectures"] = json::array({"GPT2LMHeadModel"});
  j["model_type"] = "gpt2";
  write_json_file(path, j);
}

ModelSpec model_spec_from_hf(const HfGpt2Config& hf, int seq_length, int divisible_by, int tp) {
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
  c.block.mlp.ffn_hidden_size = int(hf.mlp_width());
  c.block.mlp.activation = activation_of(hf.activation_function);
  return c;
}

void require_gpt2_block(const ModelSpec& c, const std::string& family) {
  // What GPT2LMHeadModel fixes and its config.json does not state.
  const ModelSpec gpt2;
  const auto& a = c.block.attention;
  const std::pair<bool, const char*> fixed[] = {
      {c.block.norm.kind == gpt2.block.norm.kind && c.block.norm.bias &&
           c.block.norm.placement == gpt2.block.norm.placement,
       "its norms (pre-LayerNorm with bias)"},
      {a.context_width() == c.hidden_size, "attention over the hidden size"},
      {a.mask == gpt2.block.attention.mask && a.position == gpt2.block.attention.position,
       "causal attention with learned absolute positions"},
      {a.bias && c.block.mlp.bias, "biases on every linear layer"},
      {c.block.mlp.activation == Activation::GeluTanh, "the tanh GeLU"},
      {!c.parallel_residual && !c.embedding_norm, "sequential residuals, no embedding norm"},
  };
  for (const auto& [ok, what] : fixed)
    MESH_REQUIRE(ok, "Hugging Face " << family << " config: the model differs from GPT-2 in "
                                     << what);
}

HfGpt2Config hf_gpt2_config_from_spec(const ModelSpec& c) {
  require_gpt2_block(c, "GPT-2");
  const auto& a = c.block.attention;
  MESH_REQUIRE(a.num_query_groups == a.num_heads,
               "Hugging Face GPT-2 config: the model differs from GPT-2 in multi-head attention "
               "(num_query_groups " << a.num_query_groups << ", num_attention_heads "
                                    << a.num_heads << ")");
  HfGpt2Config hf;
  set_gpt2_keys(c, hf);
  return hf;
}

void set_gpt2_keys(const ModelSpec& c, HfGpt2Config& hf) {
  hf.vocab_size = c.vocab_size;
  hf.n_positions = c.max_positions;
  hf.n_embd = c.hidden_size;
  hf.n_layer = c.num_layers;
  hf.n_head = c.block.attention.num_heads;
  hf.n_inner = c.block.mlp.ffn_hidden_size;
  hf.layer_norm_epsilon = c.block.norm.epsilon;
  hf.tie_word_embeddings = c.tie_word_embeddings;
  hf.initializer_range = c.init_std;
}

}  // namespace meshtron::io
