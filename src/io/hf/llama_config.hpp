// Hugging Face Llama / Mistral config.json (LlamaForCausalLM,
// MistralForCausalLM), read into a plain struct and written back, and its
// mapping to and from a ModelSpec.
//
// A missing key takes transformers' LlamaConfig default (listed below);
// num_key_value_heads null means num_attention_heads, head_dim null means
// hidden_size / num_attention_heads, and reading resolves both. Newer
// transformers state rope_theta inside "rope_parameters"; both spellings
// are read. What meshtron does not compute is a one-line UserError when
// read: rope scaling (Llama 3.1's "llama3", linear, dynamic, YaRN, ...), a
// Mistral sliding window shorter than the context, biases on the linears,
// an activation other than SiLU.
#pragma once

#include <string>

#include "model/model_spec.hpp"
#include "tensor/types.hpp"

namespace meshtron::io {

struct HfLlamaConfig {
  std::string model_type = "llama";  ///< llama | mistral (same layers without a sliding window)
  index_t vocab_size = 32000;
  index_t hidden_size = 4096;
  index_t intermediate_size = 11008;
  index_t num_hidden_layers = 32;
  index_t num_attention_heads = 32;
  index_t num_key_value_heads = 0;  ///< 0 in a file (null) means num_attention_heads
  index_t head_dim = 0;             ///< 0 in a file (null) means hidden / heads
  index_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
};

/// Read `path` (a config.json, or a model folder holding one). Throws
/// UserError naming the file and key for a missing file, bad JSON, a
/// model_type other than llama | mistral, a value of the wrong type, a size
/// that is not positive, heads not divisible by kv heads, and every
/// setting named in the file comment that meshtron does not compute.
/// num_key_value_heads and head_dim are resolved.
HfLlamaConfig read_hf_llama_config(const std::string& path);

/// Write `config` as a config.json that transformers' LlamaForCausalLM
/// loads (architectures, model_type llama and every field above).
void write_hf_llama_config(const std::string& path, const HfLlamaConfig& config);

/// The spec of `hf` for sequences of `seq_length`, the vocabulary padded to
/// a multiple of divisible_by x tp: pre-RMSNorm, rotary positions (half-split,
/// the whole head), grouped-query attention, SwiGLU, no linear biases.
ModelSpec model_spec_from_hf(const HfLlamaConfig& hf, int seq_length, int divisible_by, int tp);
/// The config.json of `spec`; a UserError names the first part of it that
/// Llama's config cannot state.
HfLlamaConfig hf_llama_config_from_spec(const ModelSpec& spec);
/// Whether `spec` is of the Llama family (RMSNorm, rotary, SwiGLU): the
/// family its Hugging Face export takes.
bool is_llama_family(const ModelSpec& spec);

}  // namespace meshtron::io
