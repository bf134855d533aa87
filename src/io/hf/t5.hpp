// Hugging Face T5ForConditionalGeneration / MT5ForConditionalGeneration <->
// meshtron's T5Model: parameter names and layouts.
//
// meshtron stores linear weights [in, out]; transformers' nn.Linear stores
// [out, in], so every projection is transposed. meshtron's fused linears hold
// their parts side by side along the output columns (each part split over tp
// on its own): self-attention qkv = [q | k | v], cross-attention kv = [k | v],
// the gated MLP's fc = [gate | up] (gate = wi_0, the gelu'd one; up = wi_1).
// E = encoder.block.{i}, D = decoder.block.{i}, A = SelfAttention, X = EncDecAttention,
// F = DenseReluDense:
//
//   shared.weight                     embedding.word.weight                  as is [V, h]
//   encoder.block.0.layer.0.A.relative_attention_bias.weight
//                                     encoder.relative_bias.weight           as is [buckets, H]
//   E.layer.0.layer_norm.weight       encoder.layers.{i}.ln_1.weight
//   E.layer.0.A.{q,k,v}.weight        encoder.layers.{i}.attention.qkv.weight  [q^T | k^T | v^T]
//   E.layer.0.A.o.weight              encoder.layers.{i}.attention.proj.weight  transposed
//   E.layer.1.layer_norm.weight       encoder.layers.{i}.ln_2.weight
//   E.layer.1.F.wi.weight, or F.wi_0.weight and F.wi_1.weight
//                                     encoder.layers.{i}.mlp.fc.weight  wi^T, or [wi_0^T | wi_1^T]
//   E.layer.1.F.wo.weight             encoder.layers.{i}.mlp.proj.weight     transposed
//   encoder.final_layer_norm.weight   encoder.final_norm.weight
//   decoder.block.0.layer.0.A.relative_attention_bias.weight
//                                     decoder.relative_bias.weight           as is [buckets, H]
//   D.layer.0.layer_norm.weight       decoder.layers.{i}.ln_1.weight
//   D.layer.0.A.{q,k,v}.weight        decoder.layers.{i}.self_attention.qkv.weight  as E's
//   D.layer.0.A.o.weight              decoder.layers.{i}.self_attention.proj.weight  transposed
//   D.layer.1.layer_norm.weight       decoder.layers.{i}.ln_2.weight
//   D.layer.1.X.q.weight              decoder.layers.{i}.cross_attention.q.weight  transposed
//   D.layer.1.X.{k,v}.weight          decoder.layers.{i}.cross_attention.kv.weight  [k^T | v^T]
//   D.layer.1.X.o.weight              decoder.layers.{i}.cross_attention.proj.weight  transposed
//   D.layer.2.layer_norm.weight       decoder.layers.{i}.ln_3.weight
//   D.layer.2.F.*                     decoder.layers.{i}.mlp.{fc,proj}.weight  as the encoder's
//   decoder.final_layer_norm.weight   decoder.final_norm.weight
//   lm_head.weight                    output_layer.weight  as is [V, h], untied only
//
// Only block 0 of each stack owns the relative-attention table (the other
// blocks add the same bias). encoder.embed_tokens.weight and
// decoder.embed_tokens.weight are the shared table: read when shared.weight is
// absent, never written; a tied model's lm_head.weight, when a file has one,
// is the same table and is not read. The rules are t5_tensor_rules() in t5.cpp.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.hpp"
#include "model/parameter.hpp"

namespace meshtron::io {

class HfWeights;

/// How the Hugging Face tensors of one meshtron parameter make its global
/// tensor.
struct T5TensorMapping {
  std::vector<std::string> hf_names;  ///< one, or the equal parts of a fused linear in order
  bool transposed = false;            ///< [out, in] in the file: a linear weight
};

/// The Hugging Face tensors of a meshtron parameter name; `gated` picks
/// wi_0 | wi_1 over wi for mlp.fc (throws UserError if none).
T5TensorMapping t5_mapping_of(const std::string& meshtron_name, bool gated);

/// `name` as `weights` store it: itself, or for shared.weight the first of
/// encoder.embed_tokens.weight / decoder.embed_tokens.weight a file keeps.
std::string t5_stored_name(const std::string& name, const HfWeights& weights);

/// Load every parameter of `params` (this rank's shards of a T5Model of
/// `spec`) from a Hugging Face T5 / mT5 model folder (model.safetensors, or
/// its shards and index), converting dtypes as needed.
void import_hf_t5(const std::string& model_dir, const ModelSpec& spec, const ParameterList& params,
                  int tp_rank, int tp_size);

/// The Hugging Face tensors (name, host tensor) of the parameters of a
/// 1-rank T5Model of `spec`, in transformers' layouts and the values' dtype.
std::vector<std::pair<std::string, Tensor>> hf_t5_tensors(const ModelSpec& spec,
                                                          const ParameterList& params);

}  // namespace meshtron::io
