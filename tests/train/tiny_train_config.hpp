// The tiny GPT run of the trainer's single-process tests (2 layers, 16
// hidden, 8 tokens, vocabulary 50, micro-batch 2), validated for one rank.
#pragma once

#include "config/run_config.hpp"

namespace meshtron::testing {

inline RunConfig tiny_train_config(int global_batch_size = 4) {
  RunConfig c = RunConfig::from_text(R"(
[model]
num_layers = 2
hidden_size = 16
num_attention_heads = 2
seq_length = 8
vocab_size = 50
make_vocab_size_divisible_by = 8
[training]
micro_batch_size = 2
global_batch_size = 4
train_iters = 10
[lr_schedule]
warmup_iters = 0
)");
  c.training.global_batch_size = global_batch_size;
  c.validate(1);
  return c;
}

}  // namespace meshtron::testing
