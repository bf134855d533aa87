#include "io/hf/hf_family.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "io/hf/hf_json.hpp"

namespace meshtron::io {

const std::vector<HfFamily>& hf_families() {
  static const std::vector<HfFamily> families = {
      hf_family_megatron_bert(), hf_family_bert(), hf_family_t5(), hf_family_llama(), hf_family_bloom(), hf_family_gpt_neox(), hf_family_gpt_bigcode(),
      hf_family_gpt2()};
  return families;
}

namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

const HfFamily& hf_family_of_folder(const std::string& dir) {
  const std::string file = config_file_of(dir);
  const nlohmann::json j = parse_json_file(file);
  std::string type, arch;
  Fields(j, file).text("model_type", type);
  if (j.contains("architectures") && j["architectures"].is_array() &&
      !j["architectures"].empty() && j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  std::string known;
  for (const HfFamily& f : hf_families()) {
    if (type.empty() ? contains(f.architectures, arch) : contains(f.model_types, type)) return f;
    for (const std::string& t : f.model_types) known += (known.empty() ? "" : ", ") + t;
  }
  MESH_REQUIRE(type.empty() && arch.empty(),
               "Hugging Face config '" << file << "': model_type '" << type << "' ("
                                       << (arch.empty() ? "no architectures" : arch)
                                       << ") is not one of " << known);
  return hf_families().back();  // a bare GPT-2 config (n_embd, n_layer, ...) names neither
}

const HfFamily& hf_family_of_spec(const ModelSpec& spec) {
  for (const HfFamily& f : hf_families())
    if (f.owns(spec)) return f;
  throw UserError("no Hugging Face family writes this model");  // GPT-2 owns every spec
}

}  // namespace meshtron::io
