// Hugging Face BLOOM config.json (BloomForCausalLM), read into a plain
// struct and written back, and its mapping to and from a ModelSpec.
//
// BLOOM is a pre-LayerNorm decoder with biases everywhere, ALiBi positions
// (no position table), a LayerNorm right after the word embedding, the tanh
// GeLU over a 4 x hidden MLP and the LM head tied to the word embedding. A
// missing key takes transformers' BloomConfig default (listed below); older
// configs spell hidden_size "n_embed", and both are read. BLOOM states no
// context length: BigScience's configs carry "seq_length", read when there
// (else 2048, BLOOM's training context) and written back.
// apply_residual_connection_post_layernorm = true (the residual taken after
// the norm) is a one-line UserError: meshtron's blocks add the residual
// before it. pretraining_tp and slow_but_exact only choose how transformers
// splits the same sums and are not kept.
#pragma once

#include <string>

#include "model/model_spec.hpp"
#include "tensor/types.hpp"

namespace meshtron::io {

struct HfBloomConfig {
  index_t vocab_size = 250880;
  index_t hidden_size = 64;
  index_t n_layer = 2;
  index_t n_head = 8;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  bool tie_word_embeddings = true;
  index_t seq_length = 2048;
};

/// Read `path` (a config.json, or a model folder holding one). Throws a
/// one-line UserError naming the file and key for a missing file, bad JSON,
/// a model_type other than "bloom", a wrong type, a size that is not
/// positive, hidden_size not divisible by n_head, or
/// apply_residual_connection_post_layernorm = true.
HfBloomConfig read_hf_bloom_config(const std::string& path);

/// Write `config` as a config.json that transformers' BloomForCausalLM
/// loads (architectures, model_type and every field above).
void write_hf_bloom_config(const std::string& path, const HfBloomConfig& config);

/// The spec of `hf` for sequences of `seq_length`, the vocabulary padded to
/// a multiple of divisible_by x tp.
ModelSpec model_spec_from_hf(const HfBloomConfig& hf, int seq_length, int divisible_by, int tp);

/// Whether `spec` is of the BLOOM family (ALiBi positions and a norm after
/// the embedding): the family its Hugging Face export takes.
bool is_bloom_family(const ModelSpec& spec);

/// The config.json of `spec`; a UserError names the first part of it that
/// BLOOM's config cannot state.
HfBloomConfig hf_bloom_config_from_spec(const ModelSpec& spec);

}  // namespace meshtron::io
