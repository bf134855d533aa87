// Hugging Face BloomForCausalLM <-> meshtron parameter names and layouts.
//
// transformers' nn.Linear stores [out, in]; meshtron [in, out]: every linear
// weight is transposed. BLOOM's fused query_key_value interleaves q, k and v
// per head along its outputs, [heads, 3, head_dim] (BloomAttention's
// _reshape splits it so); meshtron's qkv holds [q | k | v], each [heads,
// head_dim]. The output rows (weight) and entries (bias) are permuted
// between the two, a pure reordering, so the round trip is bit-exact.
//
//   transformer.word_embeddings.weight            embedding.word.weight  as is [V, h]
//   transformer.word_embeddings_layernorm.*       embedding.norm.*       as is
//   transformer.h.{i}.input_layernorm.*           layers.{i}.ln_1.*      as is
//   transformer.h.{i}.self_attention.query_key_value.weight
//                                                 layers.{i}.attention.qkv.weight
//                                                   transposed, heads-major -> [q | k | v]
//   transformer.h.{i}.self_attention.query_key_value.bias
//                                                 layers.{i}.attention.qkv.bias  likewise
//   transformer.h.{i}.self_attention.dense.*      layers.{i}.attention.proj.*  weight transposed
//   transformer.h.{i}.post_attention_layernorm.*  layers.{i}.ln_2.*      as is
//   transformer.h.{i}.mlp.dense_h_to_4h.*         layers.{i}.mlp.fc.*    weight transposed
//   transformer.h.{i}.mlp.dense_4h_to_h.*         layers.{i}.mlp.proj.*  weight transposed
//   transformer.ln_f.*                            final_norm.*           as is
//   lm_head.weight                                output_layer.weight    as is (untied only)
//
// BigScience's own files name the base model's tensors without the
// "transformer." prefix (saved from BloomModel); reading takes either.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.hpp"
#include "model/parameter.hpp"

namespace meshtron::io {

/// The Hugging Face tensor name of a meshtron parameter name (throws
/// UserError if none).
std::string bloom_name_of(const std::string& meshtron_name);

/// BLOOM's per-head [heads, 3, head_dim] rows of a fused qkv tensor (rows
/// along dimension 0) as meshtron's [3, heads, head_dim] (`to_bloom`
/// false), or back (true). Element bytes move as they are.
Tensor permute_bloom_qkv_rows(const Tensor& rows, index_t heads, index_t head_dim, bool to_bloom);

/// Load every parameter of `params` (a model of `spec`) from a Hugging Face
/// BLOOM model folder (model.safetensors, or its shards and index). A
/// tensor whose shape is not the parameter's is a UserError naming it.
void import_hf_bloom(const std::string& model_dir, const ModelSpec& spec,
                     const ParameterList& params, int tp_rank, int tp_size);

/// The Hugging Face tensors (name, host tensor) of the parameters of a
/// 1-rank model of `spec`, in transformers' layouts and the values' dtype.
std::vector<std::pair<std::string, Tensor>> hf_bloom_tensors(const ModelSpec& spec,
                                                             const ParameterList& params);

}  // namespace meshtron::io
