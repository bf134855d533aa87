#include "io/hf/gpt2.hpp"

#include <regex>

#include "common/error.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/safetensors.hpp"

#include "io/hf/gpt2_config.hpp"
#include "io/hf/hf_family.hpp"

namespace meshtron::io {

std::string hf_name_of(const std::string& name) {
  static const std::pair<std::regex, const char*> rules[] = {
      {std::regex(R"(^embedding\.word\.weight$)"), "transformer.wte.weight"},
      {std::regex(R"(^embedding\.position\.weight$)"), "transformer.wpe.weight"},
      {std::regex(R"(^layers\.(\d+)\.ln_(1|2)\.(weight|bias)$)"), "transformer.h.$1.ln_$2.$3"},
      {std::regex(R"(^layers\.(\d+)\.attention\.qkv\.(weight|bias)$)"),
       "transformer.h.$1.attn.c_attn.$2"},
      {std::regex(R"(^layers\.(\d+)\.attention\.proj\.(weight|bias)$)"),
       "transformer.h.$1.attn.c_proj.$2"},
      {std::regex(R"(^layers\.(\d+)\.mlp\.fc\.(weight|bias)$)"), "transformer.h.$1.mlp.c_fc.$2"},
      {std::regex(R"(^layers\.(\d+)\.mlp\.proj\.(weight|bias)$)"),
       "transformer.h.$1.mlp.c_proj.$2"},
      {std::regex(R"(^final_norm\.(weight|bias)$)"), "transformer.ln_f.$1"},
      {std::regex(R"(^output_layer\.weight$)"), "lm_head.weight"},
  };
  for (const auto& [pattern, replacement] : rules)
    if (std::regex_match(name, pattern)) return std::regex_replace(name, pattern, replacement);
  throw UserError("no Hugging Face GPT-2 tensor corresponds to parameter '" + name + "'");
}

void import_hf_gpt2(const std::string& model_dir, const ParameterList& params, int tp_rank,
                    int tp_size) {
  SafetensorsFile file(model_dir + "/model.safetensors");
  for (Parameter* p : params) {
    const std::string hf = hf_name_of(p->name);
    MESH_REQUIRE(file.contains(hf), file.path() << ": missing tensor '" << hf << "' for "
                                                << p->name);
    load_shard(*p, file.load(hf), tp_rank, tp_size);
  }
}

HfFamily hf_family_gpt2() {
  HfFamily f;
  f.name = "gpt2";
  f.model_types = {"gpt2"};
  f.architectures = {"GPT2LMHeadModel"};
  f.read_spec = [](const std::string& dir) {
    const HfGpt2Config hf = read_hf_gpt2_config(dir);
    return model_spec_from_hf(hf, int(hf.n_positions), 1, 1);
  };
  f.import_weights = [](const std::string& dir, const ModelSpec&,
                        const ParameterList& params) -> std::vector<std::string> {
    import_hf_gpt2(dir, params, 0, 1);
    return {};
  };
  f.owns = [](const ModelSpec&) { return true; };  // the last family: hf_gpt2_config_from_spec checks
  f.export_model = [](const std::string& dir, const ModelSpec& spec, const ParameterList& params) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (Parameter* p : params) tensors.push_back({hf_name_of(p->name), p->value});
    const HfGpt2Config config = hf_gpt2_config_from_spec(spec);  // rejects a spec GPT-2 cannot hold
    write_hf_weights(dir, tensors);
    write_hf_gpt2_config(dir + "/config.json", config);
    return tensors.size();
  };
  return f;
}

}  // namespace meshtron::io
