// GptConfig: the model's shape as the layers need it, derived from the deck
// (or from a Hugging Face config.json) and the tensor-parallel degree.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/types.hpp"

namespace meshtron {

struct RunConfig;
namespace io { struct HfGpt2Config; }

struct GptConfig {
  int num_layers = 2;
  int hidden_size = 64;
  int num_heads = 4;
  int ffn_hidden_size = 256;
  int seq_length = 16;
  int max_positions = 16;
  int vocab_size = 1000;         ///< real vocabulary
  int padded_vocab_size = 1024;  ///< multiple of divisible_by x tp
  double layernorm_epsilon = 1e-5;
  double init_std = 0.02;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  std::string attention_backend = "auto";  ///< auto | fused | unfused (model.attention_backend)

  int head_dim() const { return hidden_size / num_heads; }

  static GptConfig from_run(const RunConfig& run, int vocab_size, int tp);
  static GptConfig from_hf(const io::HfGpt2Config& hf, int seq_length, int divisible_by,
                           int tp);
};

/// Megatron's vocabulary padding: round up to a multiple of divisible_by x tp.
int padded_vocab_size(int vocab, int divisible_by, int tp);
/// "padded vocab (size: 50257) with 175 dummy tokens (new size: 50432)"
std::string padded_vocab_message(int vocab, int padded);

}  // namespace meshtron
