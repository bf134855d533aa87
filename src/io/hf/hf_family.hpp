// The Hugging Face model families `meshtron convert` reads and writes, one
// entry each: which config.json is theirs, the spec it describes, how their
// weights become meshtron's parameters and back. A new family is its own
// files under io/hf/ (config, weight mapping, and a function returning its
// HfFamily) plus one line in hf_families() (hf_family.cpp).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/model_spec.hpp"
#include "model/parameter.hpp"

namespace meshtron::io {

struct HfFamily {
  std::string name;                        ///< "llama", as convert prints it
  std::vector<std::string> model_types;    ///< config.json model_type values
  std::vector<std::string> architectures;  ///< architectures[0] values (no model_type)
  /// The spec of a model folder's config.json (one rank, no vocab padding).
  std::function<ModelSpec(const std::string& dir)> read_spec;
  /// Load every parameter of `params` (a model of `spec`) from the folder;
  /// returns the names of those the folder may lack and lacks (BERT's heads
  /// in a BertForMaskedLM or BertModel file), left at their initialisation.
  std::function<std::vector<std::string>(const std::string& dir, const ModelSpec& spec,
                                         const ParameterList& params)>
      import_weights;
  /// Whether `spec` is of this family (the export's choice).
  std::function<bool(const ModelSpec& spec)> owns;
  /// Write config.json and the weights of a 1-rank model of `spec`; returns
  /// the number of tensors written.
  std::function<std::size_t(const std::string& dir, const ModelSpec& spec,
                            const ParameterList& params)>
      export_model;
};

/// Every family, the most specific first (GPT-2, which owns any spec the
/// others do not, last).
const std::vector<HfFamily>& hf_families();
/// The family config.json of `dir` names (model_type, else its first
/// architecture; neither: GPT-2); a UserError lists the known ones.
const HfFamily& hf_family_of_folder(const std::string& dir);
/// The first family that owns `spec`.
const HfFamily& hf_family_of_spec(const ModelSpec& spec);

// Each family's entry, defined beside its weight mapping.
HfFamily hf_family_gpt2();
HfFamily hf_family_gpt_bigcode();
HfFamily hf_family_llama();
HfFamily hf_family_bloom();
HfFamily hf_family_gpt_neox();
HfFamily hf_family_megatron_bert();
HfFamily hf_family_bert();
HfFamily hf_family_t5();

}  // namespace meshtron::io
