#include "io/hf/t5_config.hpp"

#include "common/error.hpp"
#include "io/hf/hf_json.hpp"
#include "model/t5_model.hpp"

namespace meshtron::io {

namespace {

using nlohmann::json;

/// MT5Config's defaults where they differ from T5Config's.
void apply_mt5_defaults(HfT5Config& c) {
  c.vocab_size = 250112;
  c.d_ff = 1024;
  c.num_layers = 8;
  c.num_heads = 6;
  c.feed_forward_proj = "gated-gelu";
  c.tie_word_embeddings = false;
}

/// A token id: a non-negative integer (absent: the default stands).
void read_token_id(const json& j, const Fields& f, const char* key, index_t& out) {
  if (!j.contains(key)) return;
  f.require(j[key].is_number_integer() && j[key].get<index_t>() >= 0, key,
            "a non-negative integer (one token id)");
  out = j[key].get<index_t>();
}

/// feed_forward_proj, and the dense_act_fn / is_gated_act that transformers
/// lets a file set over it: relu ungated or gelu_new gated only.
void read_activation(const json& j, const Fields& f, HfT5Config& c) {
  f.text("feed_forward_proj", c.feed_forward_proj);
  f.require(c.feed_forward_proj == "relu" || c.feed_forward_proj == "gated-gelu",
            "feed_forward_proj", "relu or gated-gelu (the two T5 MLPs meshtron computes)");
  bool gated = c.gated();
  std::string act = gated ? "gelu_new" : "relu";
  f.flag("is_gated_act", gated);
  f.text("dense_act_fn", act);
  f.require(gated == c.gated(), "is_gated_act",
            c.gated() ? "true (feed_forward_proj gated-gelu)" : "false (feed_forward_proj relu)");
  f.require(act == (gated ? "gelu_new" : "relu"), "dense_act_fn",
            gated ? "gelu_new (feed_forward_proj gated-gelu)" : "relu (feed_forward_proj relu)");
}

}  // namespace

HfT5Config read_hf_t5_config(const std::string& path) {
  const std::string file = config_file_of(path);
  const json j = parse_json_file(file);
  Fields f(j, file);
  HfT5Config c;
  f.text("model_type", c.model_type);
  MESH_REQUIRE(c.model_type == "t5" || c.model_type == "mt5",
               "Hugging Face config '" << file << "': model_type '" << c.model_type
                                       << "' is not t5 or mt5");
  if (c.model_type == "mt5") apply_mt5_defaults(c);
  f.size("vocab_size", c.vocab_size);
  f.size("d_model", c.d_model);
  f.size("d_kv", c.d_kv);
  f.size("d_ff", c.d_ff);
  f.size("num_layers", c.num_layers);
  f.size("num_decoder_layers", c.num_decoder_layers, /*allow_null=*/true);
  f.size("num_heads", c.num_heads);
  f.size("relative_attention_num_buckets", c.relative_attention_num_buckets);
  f.size("relative_attention_max_distance", c.relative_attention_max_distance);
  f.number("layer_norm_epsilon", c.layer_norm_epsilon);
  f.number("dropout_rate", c.dropout_rate);
  f.number("initializer_factor", c.initializer_factor);
  f.flag("tie_word_embeddings", c.tie_word_embeddings);
  read_token_id(j, f, "pad_token_id", c.pad_token_id);
  read_token_id(j, f, "eos_token_id", c.eos_token_id);
  read_token_id(j, f, "decoder_start_token_id", c.decoder_start_token_id);
  read_activation(j, f, c);
  if (c.num_decoder_layers == 0) c.num_decoder_layers = c.num_layers;
  return c;
}

void write_hf_t5_config(const std::string& path, const HfT5Config& c) {
  const bool mt5 = c.model_type == "mt5";
  write_json_file(path, {
                            {"architectures", json::array({mt5 ? "MT5ForConditionalGeneration"
                                                               : "T5ForConditionalGeneration"})},
                            {"model_type", mt5 ? "mt5" : "t5"},
                            {"vocab_size", c.vocab_size},
                            {"d_model", c.d_model},
                            {"d_kv", c.d_kv},
                            {"d_ff", c.d_ff},
                            {"num_layers", c.num_layers},
                            {"num_decoder_layers", c.num_decoder_layers},
                            {"num_heads", c.num_heads},
                            {"relative_attention_num_buckets", c.relative_attention_num_buckets},
                            {"relative_attention_max_distance", c.relative_attention_max_distance},
                            {"layer_norm_epsilon", c.layer_norm_epsilon},
                            {"dropout_rate", c.dropout_rate},
                            {"initializer_factor", c.initializer_factor},
                            {"feed_forward_proj", c.feed_forward_proj},
                            {"dense_act_fn", c.gated() ? "gelu_new" : "relu"},
                            {"is_gated_act", c.gated()},
                            {"tie_word_embeddings", c.tie_word_embeddings},
                            {"pad_token_id", c.pad_token_id},
                            {"eos_token_id", c.eos_token_id},
                            {"decoder_start_token_id", c.decoder_start_token_id},
                            {"is_encoder_decoder", true},
                            {"use_cache", true},
                            {"torch_dtype", "float32"},
                        });
}

ModelSpec model_spec_from_hf(const HfT5Config& hf, int divisible_by, int tp) {
  ModelSpec s = t5_spec(int(hf.num_layers), int(hf.num_decoder_layers), int(hf.d_model),
                        int(hf.num_heads), int(hf.d_kv), int(hf.d_ff),
                        hf.gated() ? Activation::GegluTanh : Activation::Relu,
                        hf.tie_word_embeddings, int(hf.vocab_size), kHfT5SeqLength,
                        kHfT5SeqLength, int(hf.relative_attention_num_buckets),
                        int(hf.relative_attention_max_distance), hf.layer_norm_epsilon);
  s.padded_vocab_size = padded_vocab_size(s.vocab_size, divisible_by, tp);
  s.hidden_dropout = s.attention_dropout = hf.dropout_rate;
  return s;
}

HfT5Config hf_t5_config_from_spec(const ModelSpec& s) {
  const auto& a = s.block.attention;
  const auto act = s.block.mlp.activation;
  const std::pair<bool, const char*> fixed[] = {
      {s.model_class == ModelClass::T5, "its class (not an encoder-decoder)"},
      {s.block.norm.kind == NormKind::RMSNorm && s.block.norm.placement == NormPlacement::Pre &&
           !s.block.norm.bias,
       "its norms (pre-RMSNorm without bias)"},
      {a.position == PositionEmbedding::Relative && !a.scale_scores &&
           a.num_query_groups == a.num_heads,
       "unscaled multi-head attention with relative position buckets"},
      {!a.bias && !s.block.mlp.bias, "no bias on any linear layer"},
      {act == Activation::Relu || act == Activation::GegluTanh,
       "its MLP (relu or gated-gelu = geglu_tanh)"},
      {!s.parallel_residual && !s.embedding_norm && s.num_token_types == 0,
       "sequential residuals, no embedding norm, no token types"},
  };
  for (const auto& [ok, what] : fixed)
    MESH_REQUIRE(ok, "Hugging Face T5 config: the model differs from T5 in " << what);
  HfT5Config hf;
  hf.vocab_size = s.vocab_size;
  hf.d_model = s.hidden_size;
  hf.d_kv = a.head_dim;
  hf.d_ff = s.block.mlp.ffn_hidden_size;
  hf.num_layers = s.num_layers;
  hf.num_decoder_layers = s.num_decoder_layers > 0 ? s.num_decoder_layers : s.num_layers;
  hf.num_heads = a.num_heads;
  hf.relative_attention_num_buckets = s.relative_attention_num_buckets;
  hf.relative_attention_max_distance = s.relative_attention_max_distance;
  hf.layer_norm_epsilon = s.block.norm.epsilon;
  hf.dropout_rate = s.hidden_dropout;
  hf.feed_forward_proj = act == Activation::GegluTanh ? "gated-gelu" : "relu";
  hf.tie_word_embeddings = s.tie_word_embeddings;
  return hf;
}

}  // namespace meshtron::io
