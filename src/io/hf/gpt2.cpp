#include "io/hf/gpt2.hpp"

#include <regex>

#include "common/error.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/safetensors.hpp"

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

}  // namespace meshtron::io
