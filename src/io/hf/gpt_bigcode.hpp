// Hugging Face GPTBigCodeForCausalLM <-> meshtron parameter names and layouts.
//
// GPTBigCode's names are GPT-2's (gpt2.hpp) but its linears are nn.Linear,
// [out, in]: every linear weight is transposed to meshtron's [in, out];
// biases, norms and embeddings are as they are. With multi_query, c_attn's
// output is [q (n_embd) | k (head_dim) | v (head_dim)] (transformers splits
// it (embed_dim, 2 * kv_dim), then the kv part (head_dim, head_dim)), which
// is meshtron's qkv [q | k | v] with one query group, so no part moves.
//
//   transformer.wte.weight             embedding.word.weight        as is [V, h]
//   transformer.wpe.weight             embedding.position.weight    as is
//   transformer.h.{i}.ln_{1,2}.*       layers.{i}.ln_{1,2}.*        as is
//   transformer.h.{i}.attn.c_attn.weight   layers.{i}.attention.qkv.weight  transposed
//   transformer.h.{i}.attn.c_proj.weight   layers.{i}.attention.proj.weight transposed
//   transformer.h.{i}.mlp.c_fc.weight      layers.{i}.mlp.fc.weight         transposed
//   transformer.h.{i}.mlp.c_proj.weight    layers.{i}.mlp.proj.weight       transposed
//   transformer.h.{i}.*.bias           layers.{i}.*.bias            as is
//   transformer.ln_f.*                 final_norm.*                 as is
//   lm_head.weight                     output_layer.weight          as is (untied only)
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.hpp"
#include "model/parameter.hpp"

namespace meshtron::io {

/// Whether the tensor of a meshtron parameter is stored transposed ([out,
/// in]) in a GPTBigCode checkpoint: the weights of the linear layers.
bool gpt_bigcode_transposed(const std::string& meshtron_name);

/// Load every parameter of `params` (a model of `spec`) from a Hugging Face
/// GPTBigCode model folder (model.safetensors, or its shards and index). A
/// tensor whose shape is not the parameter's in the file's layout is a
/// UserError naming it.
void import_hf_gpt_bigcode(const std::string& model_dir, const ParameterList& params,
                           int tp_rank, int tp_size);

/// The Hugging Face tensors (name, host tensor) of the parameters of a
/// 1-rank model, in transformers' layouts and the values' dtype.
std::vector<std::pair<std::string, Tensor>> hf_gpt_bigcode_tensors(const ParameterList& params);

}  // namespace meshtron::io
