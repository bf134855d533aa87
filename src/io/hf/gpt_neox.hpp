// Hugging Face GPTNeoXForCausalLM <-> meshtron parameter names and layouts.
//
// transformers' nn.Linear stores [out, in]: every linear weight is
// transposed to meshtron's [in, out]. GPT-NeoX's fused query_key_value
// interleaves q, k and v per head along its output rows, [heads, 3,
// head_dim] (transformers views its output (..., heads, 3 * head_dim) and
// chunks the last dim), where meshtron's qkv holds [q | k | v] columns, each
// [heads, head_dim]: HF row (head n, part p, dim d) = n * 3 dh + p dh + d is
// meshtron column p * heads dh + n dh + d; the bias moves the same way.
// Rotary needs no permutation: transformers' rotate_half over the first
// rotary_ndims of each head is meshtron's half-split partial rotary.
//
//   gpt_neox.embed_in.weight                          embedding.word.weight     as is [V, h]
//   gpt_neox.layers.{i}.input_layernorm.*             layers.{i}.ln_1.*         as is
//   gpt_neox.layers.{i}.post_attention_layernorm.*    layers.{i}.ln_2.*         as is
//   gpt_neox.layers.{i}.attention.query_key_value.*   layers.{i}.attention.qkv.*
//                                                       rows permuted (weight: and transposed)
//   gpt_neox.layers.{i}.attention.dense.*             layers.{i}.attention.proj.*
//   gpt_neox.layers.{i}.mlp.dense_h_to_4h.*           layers.{i}.mlp.fc.*
//   gpt_neox.layers.{i}.mlp.dense_4h_to_h.*           layers.{i}.mlp.proj.*
//   gpt_neox.final_layer_norm.*                       final_norm.*              as is
//   embed_out.weight                                  output_layer.weight       as is (untied)
// (linear weights transposed, biases as they are). The attention's causal
// mask and rotary frequencies that older checkpoints store as buffers are
// not read.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.hpp"
#include "model/parameter.hpp"

namespace meshtron::io {

/// The Hugging Face tensor name of a meshtron parameter name (throws
/// UserError if none).
std::string gpt_neox_name_of(const std::string& meshtron_name);

/// HF query_key_value rows ([heads, 3, head_dim]) -> meshtron's [q | k | v]
/// order: row r of the result is row source_row[r] of the HF tensor.
std::vector<index_t> gpt_neox_qkv_source_rows(index_t heads, index_t head_dim);

/// Load every parameter of `params` (a model of `spec`) from a Hugging Face
/// GPT-NeoX model folder (model.safetensors, or its shards and index). A
/// tensor whose shape is not the parameter's in the file's layout is a
/// UserError naming it.
void import_hf_gpt_neox(const std::string& model_dir, const ModelSpec& spec,
                        const ParameterList& params, int tp_rank, int tp_size);

/// The Hugging Face tensors (name, host tensor) of the parameters of a
/// 1-rank model of `spec`, in transformers' layouts and the values' dtype.
std::vector<std::pair<std::string, Tensor>> hf_gpt_neox_tensors(const ModelSpec& spec,
                                                                const ParameterList& params);

}  // namespace meshtron::io
