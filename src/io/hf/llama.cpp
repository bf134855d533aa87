#include "io/hf/llama.hpp"

#include <regex>

#include "common/error.hpp"
#include "io/hf/hf_weights.hpp"

#include "io/hf/hf_family.hpp"
#include "io/hf/llama_config.hpp"

namespace meshtron::io {

namespace {

struct LlamaRule {
  std::regex meshtron;
  std::vector<const char*> hf;  ///< replacements of the meshtron name, one per part
  bool transposed;
};

/// The one table of names: the file comment of llama.hpp, as rules.
const std::vector<LlamaRule>& llama_tensor_rules() {
  static const std::vector<LlamaRule> rules = {
      {std::regex(R"(^embedding\.word\.weight$)"), {"model.embed_tokens.weight"}, false},
      {std::regex(R"(^layers\.(\d+)\.ln_1\.weight$)"),
       {"model.layers.$1.input_layernorm.weight"}, false},
      {std::regex(R"(^layers\.(\d+)\.attention\.qkv\.weight$)"),
       {"model.layers.$1.self_attn.q_proj.weight", "model.layers.$1.self_attn.k_proj.weight",
        "model.layers.$1.self_attn.v_proj.weight"},
       true},
      {std::regex(R"(^layers\.(\d+)\.attention\.proj\.weight$)"),
       {"model.layers.$1.self_attn.o_proj.weight"}, true},
      {std::regex(R"(^layers\.(\d+)\.ln_2\.weight$)"),
       {"model.layers.$1.post_attention_layernorm.weight"}, false},
      {std::regex(R"(^layers\.(\d+)\.mlp\.fc\.weight$)"),
       {"model.layers.$1.mlp.gate_proj.weight", "model.layers.$1.mlp.up_proj.weight"}, true},
      {std::regex(R"(^layers\.(\d+)\.mlp\.proj\.weight$)"),
       {"model.layers.$1.mlp.down_proj.weight"}, true},
      {std::regex(R"(^final_norm\.weight$)"), {"model.norm.weight"}, false},
      {std::regex(R"(^output_layer\.weight$)"), {"lm_head.weight"}, false},
  };
  return rules;
}

/// Output columns of each part of a fused linear (q | k | v, gate | up).
std::vector<index_t> part_columns(const std::string& name, const ModelSpec& spec) {
  const auto& a = spec.block.attention;
  if (name.ends_with(".attention.qkv.weight"))
    return {index_t(a.context_width()), index_t(a.num_query_groups) * a.head_dim,
            index_t(a.num_query_groups) * a.head_dim};
  if (name.ends_with(".mlp.fc.weight"))
    return {spec.block.mlp.ffn_hidden_size, spec.block.mlp.ffn_hidden_size};
  return {};
}

/// The global tensor of `p` from its Hugging Face parts.
Tensor global_tensor(const Parameter& p, const LlamaTensorMapping& m, const ModelSpec& spec,
                     const HfWeights& weights) {
  std::vector<Tensor> parts;
  const std::vector<index_t> widths = part_columns(p.name, spec);
  for (std::size_t k = 0; k < m.hf_names.size(); ++k) {
    parts.push_back(weights.load(m.hf_names[k], p.name));
    const Tensor& t = parts.back();
    MESH_REQUIRE(t.dtype() == parts[0].dtype(), "tensor '" << m.hf_names[k] << "' is "
                     << dtype_name(t.dtype()) << ", '" << m.hf_names[0] << "' "
                     << dtype_name(parts[0].dtype()) << ": one dtype per fused parameter");
    if (!widths.empty())
      MESH_REQUIRE(t.rank() == 2 && t.dim(0) == widths[k],
                   "tensor '" << m.hf_names[k] << "' has shape " << shape_string(t.shape())
                              << ", the model expects " << widths[k] << " rows");
  }
  const Tensor rows = parts.size() == 1 ? parts[0] : stacked_rows(parts);
  return m.transposed ? transposed(rows) : rows;
}

}  // namespace

LlamaTensorMapping llama_mapping_of(const std::string& name) {
  for (const auto& rule : llama_tensor_rules()) {
    if (!std::regex_match(name, rule.meshtron)) continue;
    LlamaTensorMapping m{{}, rule.transposed};
    for (const char* hf : rule.hf) m.hf_names.push_back(std::regex_replace(name, rule.meshtron, hf));
    return m;
  }
  throw UserError("no Hugging Face Llama tensor corresponds to parameter '" + name + "'");
}

void import_hf_llama(const std::string& model_dir, const ModelSpec& spec,
                     const ParameterList& params, int tp_rank, int tp_size) {
  const HfWeights weights(model_dir);
  for (Parameter* p : params)
    load_shard(*p, global_tensor(*p, llama_mapping_of(p->name), spec, weights), tp_rank, tp_size);
}

std::vector<std::pair<std::string, Tensor>> hf_llama_tensors(const ModelSpec& spec,
                                                             const ParameterList& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (Parameter* p : params) {
    const LlamaTensorMapping m = llama_mapping_of(p->name);
    const Tensor value = p->value.is_host() ? p->value : p->value.to_host();
    const Tensor rows = m.transposed ? transposed(value) : value;
    if (m.hf_names.size() == 1) {
      out.push_back({m.hf_names[0], rows});
      continue;
    }
    index_t begin = 0;
    const std::vector<index_t> widths = part_columns(p->name, spec);
    for (std::size_t k = 0; k < m.hf_names.size(); ++k) {
      out.push_back({m.hf_names[k], rows.slice_rows(begin, begin + widths[k]).clone()});
      begin += widths[k];
    }
  }
  return out;
}

HfFamily hf_family_llama() {
  HfFamily f;
  f.name = "llama";
  f.model_types = {"llama", "mistral"};
  f.architectures = {"LlamaForCausalLM", "MistralForCausalLM"};
  f.read_spec = [](const std::string& dir) {
    const HfLlamaConfig hf = read_hf_llama_config(dir);
    return model_spec_from_hf(hf, int(hf.max_position_embeddings), 1, 1);
  };
  f.import_weights = [](const std::string& dir, const ModelSpec& spec,
                        const ParameterList& params) -> std::vector<std::string> {
    import_hf_llama(dir, spec, params, 0, 1);
    return {};
  };
  f.owns = is_llama_family;
  f.export_model = [](const std::string& dir, const ModelSpec& spec, const ParameterList& params) {
    const auto tensors = hf_llama_tensors(spec, params);
    write_hf_weights(dir, tensors);
    write_hf_llama_config(dir + "/config.json", hf_llama_config_from_spec(spec));
    return tensors.size();
  };
  return f;
}

}  // namespace meshtron::io
