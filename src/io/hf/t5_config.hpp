// Hugging Face T5 / mT5 config.json (T5ForConditionalGeneration,
// MT5ForConditionalGeneration), read into a plain struct and written back,
// and its mapping to and from a ModelSpec.
//
// A missing key takes transformers' default for the file's model_type:
//   t5:  vocab 32128, d_ff 2048, 6 layers, 8 heads, feed_forward_proj relu,
//        tie_word_embeddings true (T5 v1.0);
//   mt5: vocab 250112, d_ff 1024, 8 layers, 6 heads, gated-gelu, untied.
// Both: d_model 512, d_kv 64, 32 buckets, max_distance 128, layer_norm_epsilon
// 1e-6, dropout_rate 0.1, initializer_factor 1, pad 0, eos 1, decoder start 0;
// num_decoder_layers null or absent means num_layers.
//
// feed_forward_proj is "relu" (wo(relu(wi x))) or "gated-gelu" (wo(gelu_new(wi_0 x) *
// wi_1 x), which transformers spells dense_act_fn "gelu_new", is_gated_act
// true). transformers lets a config.json's own dense_act_fn and is_gated_act
// override what feed_forward_proj implies, so both are read too; any other
// activation or gating is a one-line UserError naming the file and key.
#pragma once

#include <string>

#include "model/model_spec.hpp"
#include "tensor/types.hpp"

namespace meshtron::io {

struct HfT5Config {
  std::string model_type = "t5";  ///< t5 | mt5: the defaults above, and what is written
  index_t vocab_size = 32128;
  index_t d_model = 512;
  index_t d_kv = 64;
  index_t d_ff = 2048;
  index_t num_layers = 6;
  index_t num_decoder_layers = 0;  ///< 0 in a file (null) means num_layers; resolved on read
  index_t num_heads = 8;
  index_t relative_attention_num_buckets = 32;
  index_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  double dropout_rate = 0.1;
  double initializer_factor = 1.0;
  std::string feed_forward_proj = "relu";  ///< relu | gated-gelu
  bool tie_word_embeddings = true;
  index_t pad_token_id = 0;
  index_t eos_token_id = 1;
  index_t decoder_start_token_id = 0;

  bool gated() const { return feed_forward_proj == "gated-gelu"; }
};

/// The sequence lengths a spec read from a config.json gets (T5's relative
/// positions have no table to bound them; transformers' former n_positions
/// and Megatron's --seq-length): a deck states its own.
inline constexpr int kHfT5SeqLength = 512;

/// Read `path` (a config.json, or a model folder holding one). UserError
/// naming the file and key for a missing file, bad JSON, a model_type other
/// than t5 | mt5, a value of the wrong type, a size that is not positive, and
/// an activation or gating other than the two above.
HfT5Config read_hf_t5_config(const std::string& path);

/// Write `config` as a config.json that transformers loads as its
/// model_type's ForConditionalGeneration class (every key above, the
/// activation spelled all three ways).
void write_hf_t5_config(const std::string& path, const HfT5Config& config);

/// The T5 spec of `hf` (t5_spec: pre-RMSNorm without bias, unscaled
/// multi-head attention with relative position buckets, padding masks, no
/// linear biases, ReLU or GegluTanh; both sequence lengths kHfT5SeqLength;
/// dropout_rate on the hidden states and the attention probabilities), the
/// vocabulary padded to a multiple of divisible_by x tp.
ModelSpec model_spec_from_hf(const HfT5Config& hf, int divisible_by, int tp);
/// The config.json of `spec` (model_type t5, ids 0 / 1 / 0); a UserError
/// names the first part of it that T5's config cannot state.
HfT5Config hf_t5_config_from_spec(const ModelSpec& spec);

}  // namespace meshtron::io
