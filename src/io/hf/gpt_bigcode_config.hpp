// Hugging Face GPTBigCode (StarCoder, SantaCoder) config.json, read into a
// plain struct and written back, and its mapping to and from a ModelSpec.
//
// GPTBigCode is GPT-2's block with multi-query attention (one k and one v
// head shared by every query head). A missing key takes transformers'
// GPTBigCodeConfig default (listed below); "n_inner": null means 4 * n_embd.
// Only multi_query = true is read: with false, c_attn interleaves q, k and v
// per head, a layout meshtron's qkv does not hold. attention_softmax_in_fp32
// and scale_attention_softmax_in_fp32 only choose the precision of the
// softmax (meshtron's is always fp32) and are not kept.
#pragma once

#include <string>

#include "io/hf/gpt2_config.hpp"
#include "model/model_spec.hpp"

namespace meshtron::io {

/// GPT-2's keys (its defaults but the activation's), written with
/// multi_query = true and scale_attn_weights = true.
struct HfGptBigCodeConfig : HfGpt2Config {
  HfGptBigCodeConfig() { activation_function = "gelu_pytorch_tanh"; }
};

/// Read `path` (a config.json, or a model folder holding one). Throws a
/// one-line UserError naming the file and key for a missing file, bad JSON,
/// a model_type other than "gpt_bigcode", a wrong type, a size that is not
/// positive, n_embd not divisible by n_head, multi_query false,
/// scale_attn_weights false, or an activation other than the tanh GeLU.
HfGptBigCodeConfig read_hf_gpt_bigcode_config(const std::string& path);

/// Write `config` as a config.json that transformers' GPTBigCodeForCausalLM
/// loads (architectures, model_type, multi_query and every field above).
void write_hf_gpt_bigcode_config(const std::string& path, const HfGptBigCodeConfig& config);

/// The spec of `hf` for sequences of `seq_length`, the vocabulary padded to
/// a multiple of divisible_by x tp: GPT-2's with num_query_groups = 1.
ModelSpec model_spec_from_hf(const HfGptBigCodeConfig& hf, int seq_length, int divisible_by,
                             int tp);

/// Whether `spec` is GPT-2's block with multi-query attention (one query
/// group and more than one head), the model GPTBigCode states.
bool is_gpt_bigcode_family(const ModelSpec& spec);

/// The config.json of `spec`; a UserError names the first part of it that
/// GPTBigCode's config cannot state.
HfGptBigCodeConfig hf_gpt_bigcode_config_from_spec(const ModelSpec& spec);

}  // namespace meshtron::io
