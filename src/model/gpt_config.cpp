#include "model/gpt_config.hpp"

#include "common/error.hpp"
#include "config/run_config.hpp"
#include "io/hf_config.hpp"

namespace meshtron {

int padded_vocab_size(int vocab, int divisible_by, int tp) {
  const int multiple = divisible_by * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

std::string padded_vocab_message(int vocab, int padded) {
  return MESH_MSG("padded vocab (size: " << vocab << ") with " << padded - vocab
                                         << " dummy tokens (new size: " << padded << ")");
}

GptConfig GptConfig::from_run(const RunConfig& run, int vocab_size, int tp) {
  const auto& m = run.model;
  GptConfig c;
  c.num_layers = m.num_layers;
  c.hidden_size = m.hidden_size;
  c.num_heads = m.num_attention_heads;
  c.ffn_hidden_size = m.ffn();
  c.seq_length = m.seq_length;
  c.max_positions = m.max_positions();
  c.vocab_size = m.vocab_size > 0 ? m.vocab_size : vocab_size;
  c.padded_vocab_size = meshtron::padded_vocab_size(c.vocab_size, m.make_vocab_size_divisible_by, tp);
  c.layernorm_epsilon = m.layernorm_epsilon;
  c.init_std = m.init_method_std;
  c.hidden_dropout = m.hidden_dropout;
  c.attention_dropout = m.attention_dropout;
  c.attention_backend = m.attention_backend;
  return c;
}

GptConfig GptConfig::from_hf(const io::HfGpt2Config& hf, int seq_length, int divisible_by,
                             int tp) {
  MESH_REQUIRE(hf.activation_function == "gelu_new" || hf.activation_function == "gelu_pytorch_tanh",
               "HF config: activation_function '" << hf.activation_function
                   << "' is not GPT-2's tanh GeLU");
  GptConfig c;
  c.num_layers = int(hf.n_layer);
  c.hidden_size = int(hf.n_embd);
  c.num_heads = int(hf.n_head);
  c.ffn_hidden_size = int(hf.mlp_width());
  c.seq_length = seq_length;
  c.max_positions = int(hf.n_positions);
  c.vocab_size = int(hf.vocab_size);
  c.padded_vocab_size = meshtron::padded_vocab_size(c.vocab_size, divisible_by, tp);
  c.layernorm_epsilon = hf.layer_norm_epsilon;
  c.init_std = hf.initializer_range;
  return c;
}

}  // namespace meshtron
