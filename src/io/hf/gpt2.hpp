// Hugging Face GPT2LMHeadModel <-> meshtron parameter names and shards.
//
// meshtron stores linear weights [in, out], as GPT-2's Conv1D does, so the
// tensors map one to one without transposes:
//   transformer.wte.weight            embedding.word.weight   (rows split over tp)
//   transformer.wpe.weight            embedding.position.weight
//   transformer.h.{i}.ln_1.*          layers.{i}.ln_1.*
//   transformer.h.{i}.attn.c_attn.*   layers.{i}.attention.qkv.*  (q|k|v blocks split)
//   transformer.h.{i}.attn.c_proj.*   layers.{i}.attention.proj.*
//   transformer.h.{i}.ln_2.*          layers.{i}.ln_2.*
//   transformer.h.{i}.mlp.c_fc.*      layers.{i}.mlp.fc.*
//   transformer.h.{i}.mlp.c_proj.*    layers.{i}.mlp.proj.*
//   transformer.ln_f.*                final_norm.*
//   lm_head.weight                    output_layer.weight     (untied only; rows split over tp)
// A tied lm_head.weight is wte and not stored.
#pragma once

#include <string>

#include "model/parameter.hpp"

namespace meshtron::io {

/// HF tensor name of a meshtron parameter name (throws UserError if none).
std::string hf_name_of(const std::string& meshtron_name);

/// Load every parameter of `params` from a Hugging Face model folder
/// (config.json + model.safetensors), converting dtypes as needed.
void import_hf_gpt2(const std::string& model_dir, const ParameterList& params, int tp_rank,
                    int tp_size);

}  // namespace meshtron::io
