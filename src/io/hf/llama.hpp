// Hugging Face LlamaForCausalLM / MistralForCausalLM <-> meshtron parameter
// names and layouts.
//
// meshtron stores linear weights [in, out]; transformers' nn.Linear stores
// [out, in], so every projection is transposed. meshtron's fused linears
// hold their logical parts side by side along the output columns (each
// part split over tp on its own): qkv = [q | k | v] (heads x head_dim,
// then groups x head_dim twice) and the SwiGLU fc = [gate | up].
// Rotary needs no permutation: transformers' rotate_half is meshtron's
// half-split layout.
//
//   model.embed_tokens.weight                     embedding.word.weight       as is [V, h]
//   model.layers.{i}.input_layernorm.weight       layers.{i}.ln_1.weight      as is
//   model.layers.{i}.self_attn.{q,k,v}_proj.weight layers.{i}.attention.qkv.weight
//                                                   [h, q | k | v] = [q^T | k^T | v^T]
//   model.layers.{i}.self_attn.o_proj.weight      layers.{i}.attention.proj.weight  transposed
//   model.layers.{i}.post_attention_layernorm.weight layers.{i}.ln_2.weight   as is
//   model.layers.{i}.mlp.{gate,up}_proj.weight    layers.{i}.mlp.fc.weight
//                                                   [h, gate | up] = [gate^T | up^T]
//   model.layers.{i}.mlp.down_proj.weight         layers.{i}.mlp.proj.weight  transposed
//   model.norm.weight                             final_norm.weight           as is
//   lm_head.weight                                output_layer.weight         as is [V, h]
//
// A tied model (tie_word_embeddings) has no lm_head.weight of its own: it is
// neither read nor written. The rules are llama_tensor_rules() in llama.cpp.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.hpp"
#include "model/parameter.hpp"

namespace meshtron::io {

/// How the Hugging Face tensors of one meshtron parameter make its global
/// tensor.
struct LlamaTensorMapping {
  std::vector<std::string> hf_names;  ///< one, or the parts of a fused linear in order
  bool transposed = false;            ///< [out, in] in the file: a linear weight
};

/// The Hugging Face tensors of a meshtron parameter name (throws UserError
/// if none).
LlamaTensorMapping llama_mapping_of(const std::string& meshtron_name);

/// Load every parameter of `params` (a model of `spec`) from a Hugging Face
/// Llama model folder (model.safetensors, or its shards and index),
/// converting dtypes as needed.
void import_hf_llama(const std::string& model_dir, const ModelSpec& spec,
                     const ParameterList& params, int tp_rank, int tp_size);

/// The Hugging Face tensors (name, host tensor) of the parameters of a
/// 1-rank model of `spec`, in transformers' layouts and the values' dtype.
std::vector<std::pair<std::string, Tensor>> hf_llama_tensors(const ModelSpec& spec,
                                                             const ParameterList& params);

}  // namespace meshtron::io
