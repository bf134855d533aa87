// Hugging Face GPT-NeoX config.json (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B),
// read into a plain struct and written back, and its mapping to and from a
// ModelSpec.
//
// A missing key takes transformers' GPTNeoXConfig default (listed below).
// The rotary settings have two spellings: rotary_pct and rotary_emb_base at
// the top level (transformers 4), or partial_rotary_factor and rope_theta
// inside "rope_parameters" (transformers 5, which still reads the old
// keys); both are read, rope_parameters winning, and both are written. What
// meshtron does not compute is a one-line UserError when read: rope scaling,
// an activation other than the exact GeLU.
#pragma once

#include <string>

#include "model/model_spec.hpp"
#include "tensor/types.hpp"

namespace meshtron::io {

struct HfGptNeoxConfig {
  index_t vocab_size = 50432;
  index_t hidden_size = 6144;
  index_t num_hidden_layers = 44;
  index_t num_attention_heads = 64;
  index_t intermediate_size = 24576;
  double rotary_pct = 0.25;       ///< share of each head's dims rotated
  double rotary_emb_base = 10000; ///< rope_theta
  index_t max_position_embeddings = 2048;
  double layer_norm_eps = 1e-5;
  bool use_parallel_residual = true;
  bool attention_bias = true;     ///< on query_key_value and dense
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
};

/// Read `path` (a config.json, or a model folder holding one). Throws
/// UserError naming the file and key for a missing file, bad JSON, a
/// model_type other than gpt_neox, a value of the wrong type, a size that is
/// not positive, hidden_size not divisible by num_attention_heads, rope
/// scaling, or a hidden_act other than "gelu".
HfGptNeoxConfig read_hf_gpt_neox_config(const std::string& path);

/// Write `config` as a config.json that transformers' GPTNeoXForCausalLM
/// loads (architectures, model_type gpt_neox and every field above).
void write_hf_gpt_neox_config(const std::string& path, const HfGptNeoxConfig& config);

/// The spec of `hf` for sequences of `seq_length`, the vocabulary padded to
/// a multiple of divisible_by x tp: pre-LayerNorm with biases, rotary
/// positions over the first rotary_pct of each head (half-split, as
/// transformers' rotate_half), multi-head attention, the exact GeLU MLP
/// with biases, parallel or sequential residuals.
ModelSpec model_spec_from_hf(const HfGptNeoxConfig& hf, int seq_length, int divisible_by,
                             int tp);
/// The config.json of `spec`; a UserError names the first part of it that
/// GPT-NeoX's config cannot state.
HfGptNeoxConfig hf_gpt_neox_config_from_spec(const ModelSpec& spec);
/// Whether `spec` is of the GPT-NeoX family (LayerNorm, rotary, the exact
/// GeLU MLP): the family its Hugging Face export takes.
bool is_gpt_neox_family(const ModelSpec& spec);

}  // namespace meshtron::io
