// Hugging Face BERT <-> meshtron's BertModel: its config.json and its
// weights, in either layout of the same mapping:
//   Megatron  MegatronBertForPreTraining (model_type megatron-bert): pre-LN
//             blocks and a final norm (bert.encoder.ln);
//   Google    BertForPreTraining (model_type bert; BertForMaskedLM and
//             BertModel files read too): the embedding norm and post-LN
//             blocks (ModelSpec NormPlacement::Post, embedding_norm), no
//             final norm.
//
// meshtron stores linear weights [in, out], nn.Linear [out, in]: every
// projection is transposed. meshtron's qkv is one linear [h, q | k | v]
// (and its bias [q | k | v]); transformers keeps query, key and value apart.
//
//   bert.embeddings.word_embeddings.weight        embedding.word.weight        [V, h]
//   bert.embeddings.position_embeddings.weight    embedding.position.weight    [P, h]
//   bert.embeddings.token_type_embeddings.weight  embedding.token_type.weight  [T, h]
//   bert.encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias}
//                                                 layers.{i}.attention.qkv.*   [q | k | v]
//   bert.encoder.layer.{i}.attention.output.dense.*  layers.{i}.attention.proj.*
//   bert.encoder.layer.{i}.intermediate.dense.*   layers.{i}.mlp.fc.*
//   bert.encoder.layer.{i}.output.dense.*         layers.{i}.mlp.proj.*
//   bert.pooler.dense.*                           pooler.*
//   cls.predictions.transform.dense.*             mlm_head.dense.*
//   cls.predictions.transform.LayerNorm.*         mlm_head.norm.*
//   cls.predictions.bias                          mlm_head.bias                [V]
//   cls.seq_relationship.*                        binary_head.*
// Megatron's norms:
//   bert.encoder.layer.{i}.attention.ln.*         layers.{i}.ln_1.*
//   bert.encoder.layer.{i}.ln.*                   layers.{i}.ln_2.*
//   bert.encoder.ln.*                             final_norm.*
// Google's norms:
//   bert.embeddings.LayerNorm.*                   embedding.norm.*
//   bert.encoder.layer.{i}.attention.output.LayerNorm.*  layers.{i}.ln_1.*
//   bert.encoder.layer.{i}.output.LayerNorm.*     layers.{i}.ln_2.*
//
// cls.predictions.decoder.weight is the word table (tied) and
// cls.predictions.decoder.bias is cls.predictions.bias: neither is read,
// nor written (save_pretrained drops tied tensors too). Reading a Google
// file also takes a LayerNorm's gamma / beta (TensorFlow-era names) for its
// weight / bias, names without the "bert." of a BertModel's own file, and
// leaves the pooler, the MLM head and the binary head at their
// initialisation where the file has none (BertForMaskedLM, BertModel).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.hpp"
#include "model/parameter.hpp"
#include "tensor/types.hpp"

namespace meshtron::io {

enum class BertLayout { Megatron, Google };
/// "MegatronBertForPreTraining" | "BertForPreTraining"
const char* architecture_of(BertLayout layout);
/// Google for post-norm blocks, else Megatron.
BertLayout bert_layout_of(const ModelSpec& spec);

/// MegatronBertConfig's (and BertConfig's: the same) fields and defaults
/// that shape the model.
struct HfMegatronBertConfig {
  BertLayout layout = BertLayout::Megatron;  ///< Google for model_type bert
  index_t vocab_size = 29056;
  index_t hidden_size = 1024;
  index_t num_hidden_layers = 24;
  index_t num_attention_heads = 16;
  index_t intermediate_size = 4096;
  index_t max_position_embeddings = 512;
  index_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  double initializer_range = 0.02;
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
};

/// Reads `path` (config.json or its folder; model_type bert: the Google
/// layout); a UserError names the file and key for a hidden_act other than
/// "gelu", a position_embedding_type other than "absolute", a decoder,
/// untied word embeddings, or heads not dividing hidden.
HfMegatronBertConfig read_hf_megatron_bert_config(const std::string& path);
void write_hf_megatron_bert_config(const std::string& path, const HfMegatronBertConfig& c);
/// The BERT spec of `hf` (sequence length max_position_embeddings), the
/// vocabulary padded to a multiple of divisible_by x tp.
ModelSpec model_spec_from_hf(const HfMegatronBertConfig& hf, int divisible_by, int tp);
HfMegatronBertConfig hf_megatron_bert_config_from_spec(const ModelSpec& spec);

class HfWeights;
/// `name` as `weights` store it: itself, or the tied decoder's name of the
/// same tensor (cls.predictions.decoder.{weight,bias}) where a file keeps
/// the pair under that one.
std::string megatron_bert_stored_name(const std::string& name, const HfWeights& weights);

/// Loads every parameter of `params` (a BertModel of `spec`, this rank's
/// shards) from a Hugging Face folder of the spec's layout; returns the
/// names of the head parameters a Google file lacks (BertForMaskedLM: the
/// pooler and the binary head; BertModel: the MLM and binary heads), which
/// keep their initialisation.
std::vector<std::string> import_hf_megatron_bert(const std::string& model_dir,
                                                 const ModelSpec& spec,
                                                 const ParameterList& params, int tp_rank,
                                                 int tp_size);
/// The Hugging Face tensors (name, host tensor) of a 1-rank BertModel.
std::vector<std::pair<std::string, Tensor>> hf_megatron_bert_tensors(const ModelSpec& spec,
                                                                     const ParameterList& params);

}  // namespace meshtron::io
