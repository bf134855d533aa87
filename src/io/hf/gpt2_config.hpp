// Hugging Face GPT-2 config.json, read into a plain struct and written back,
// and its mapping to and from a ModelSpec.
//
// Only the keys that fix the architecture and its initialisation are kept;
// a missing key takes transformers' GPT2Config default (listed below), and
// "n_inner": null means 4 * n_embd, which reading resolves.
#pragma once

#include <string>

#include "io/hf/hf_json.hpp"
#include "model/model_spec.hpp"
#include "tensor/types.hpp"

namespace meshtron::io {

struct HfGpt2Config {
  index_t vocab_size = 50257;
  index_t n_positions = 1024;  ///< context length (learned position table)
  index_t n_embd = 768;
  index_t n_layer = 12;
  index_t n_head = 12;
  index_t n_inner = 0;  ///< MLP width; 0 in a file (null) means 4 * n_embd
  double layer_norm_epsilon = 1e-5;
  std::string activation_function = "gelu_new";
  bool tie_word_embeddings = true;  ///< lm_head.weight shares wte
  double initializer_range = 0.02;

  /// n_inner with the 0 → 4 * n_embd rule applied.
  index_t mlp_width() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
};

/// GPT-2's keys, which GPTBigCode's config.json shares: read through `f`
/// into `c` (n_inner resolved; n_embd must be divisible by n_head), and
/// written as JSON.
void read_gpt2_keys(Fields& f, const std::string& file, HfGpt2Config& c);
nlohmann::json gpt2_keys_json(const HfGpt2Config& c);
/// The keys of `spec` into `hf`, its activation name left as it is (no
/// check of what GPT-2's config can state).
void set_gpt2_keys(const ModelSpec& spec, HfGpt2Config& hf);

/// Read `path` (a config.json, or a model folder holding one). Throws
/// UserError naming the file and key for a missing file, bad JSON, a
/// model_type other than "gpt2", a value of the wrong type, a size that is
/// not positive, or n_embd not divisible by n_head. n_inner is resolved.
HfGpt2Config read_hf_gpt2_config(const std::string& path);

/// Write `config` as a config.json that transformers' GPT2LMHeadModel
/// loads (architectures, model_type and every field above).
void write_hf_gpt2_config(const std::string& path, const HfGpt2Config& config);

/// The spec of `hf` for sequences of `seq_length`, the vocabulary padded to
/// a multiple of divisible_by x tp. An activation_function with no
/// meshtron name is a UserError; one that meshtron names but does not build
/// is left for the layers to reject.
ModelSpec model_spec_from_hf(const HfGpt2Config& hf, int seq_length, int divisible_by, int tp);
/// The config.json of `spec`; a UserError names the first part of it that
/// GPT-2's config cannot state.
HfGpt2Config hf_gpt2_config_from_spec(const ModelSpec& spec);

/// UserError "Hugging Face <family> config: ..." naming the first part of
/// `spec` other than GPT-2's block (pre-LayerNorm with bias, learned
/// positions, biases, tanh GeLU, sequential residuals); the grouping of its
/// attention heads is the caller's to check.
void require_gpt2_block(const ModelSpec& spec, const std::string& family);

}  // namespace meshtron::io
