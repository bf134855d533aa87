#include "io/hf/t5.hpp"

#include <regex>

#include "common/error.hpp"
#include "io/hf/hf_family.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/hf/t5_config.hpp"

namespace meshtron::io {

namespace {

struct T5Rule {
  std::regex meshtron;
  std::vector<const char*> hf;        ///< replacements of the meshtron name, one per part
  bool transposed;
  std::vector<const char*> hf_gated;  ///< the gated MLP's parts, where they differ
};

/// A rule's pattern for a parameter of encoder (decoder) layer $1.
std::regex encoder_layer(const char* rest) {
  return std::regex(std::string(R"(^encoder\.layers\.(\d+)\.)") + rest);
}
std::regex decoder_layer(const char* rest) {
  return std::regex(std::string(R"(^decoder\.layers\.(\d+)\.)") + rest);
}

/// The one table of names: the file comment of t5.hpp, as rules.
const std::vector<T5Rule>& t5_tensor_rules() {
  static const std::vector<T5Rule> rules = {
      {std::regex(R"(^embedding\.word\.weight$)"), {"shared.weight"}, false, {}},
      {std::regex(R"(^(encoder|decoder)\.relative_bias\.weight$)"),
       {"$1.block.0.layer.0.SelfAttention.relative_attention_bias.weight"}, false, {}},
      {std::regex(R"(^(encoder|decoder)\.final_norm\.weight$)"), {"$1.final_layer_norm.weight"},
       false, {}},
      {std::regex(R"(^output_layer\.weight$)"), {"lm_head.weight"}, false, {}},
      // Encoder block: layer.0 self-attention, layer.1 feed-forward.
      {encoder_layer(R"(ln_1\.weight$)"), {"encoder.block.$1.layer.0.layer_norm.weight"}, false,
       {}},
      {encoder_layer(R"(attention\.qkv\.weight$)"),
       {"encoder.block.$1.layer.0.SelfAttention.q.weight",
        "encoder.block.$1.layer.0.SelfAttention.k.weight",
        "encoder.block.$1.layer.0.SelfAttention.v.weight"},
       true, {}},
      {encoder_layer(R"(attention\.proj\.weight$)"),
       {"encoder.block.$1.layer.0.SelfAttention.o.weight"}, true, {}},
      {encoder_layer(R"(ln_2\.weight$)"), {"encoder.block.$1.layer.1.layer_norm.weight"}, false,
       {}},
      {encoder_layer(R"(mlp\.fc\.weight$)"),
       {"encoder.block.$1.layer.1.DenseReluDense.wi.weight"}, true,
       {"encoder.block.$1.layer.1.DenseReluDense.wi_0.weight",
        "encoder.block.$1.layer.1.DenseReluDense.wi_1.weight"}},
      {encoder_layer(R"(mlp\.proj\.weight$)"),
       {"encoder.block.$1.layer.1.DenseReluDense.wo.weight"}, true, {}},
      // Decoder block: layer.0 self-attention, layer.1 cross-attention, layer.2 feed-forward.
      {decoder_layer(R"(ln_1\.weight$)"), {"decoder.block.$1.layer.0.layer_norm.weight"}, false,
       {}},
      {decoder_layer(R"(self_attention\.qkv\.weight$)"),
       {"decoder.block.$1.layer.0.SelfAttention.q.weight",
        "decoder.block.$1.layer.0.SelfAttention.k.weight",
        "decoder.block.$1.layer.0.SelfAttention.v.weight"},
       true, {}},
      {decoder_layer(R"(self_attention\.proj\.weight$)"),
       {"decoder.block.$1.layer.0.SelfAttention.o.weight"}, true, {}},
      {decoder_layer(R"(ln_2\.weight$)"), {"decoder.block.$1.layer.1.layer_norm.weight"}, false,
       {}},
      {decoder_layer(R"(cross_attention\.q\.weight$)"),
       {"decoder.block.$1.layer.1.EncDecAttention.q.weight"}, true, {}},
      {decoder_layer(R"(cross_attention\.kv\.weight$)"),
       {"decoder.block.$1.layer.1.EncDecAttention.k.weight",
        "decoder.block.$1.layer.1.EncDecAttention.v.weight"},
       true, {}},
      {decoder_layer(R"(cross_attention\.proj\.weight$)"),
       {"decoder.block.$1.layer.1.EncDecAttention.o.weight"}, true, {}},
      {decoder_layer(R"(ln_3\.weight$)"), {"decoder.block.$1.layer.2.layer_norm.weight"}, false,
       {}},
      {decoder_layer(R"(mlp\.fc\.weight$)"),
       {"decoder.block.$1.layer.2.DenseReluDense.wi.weight"}, true,
       {"decoder.block.$1.layer.2.DenseReluDense.wi_0.weight",
        "decoder.block.$1.layer.2.DenseReluDense.wi_1.weight"}},
      {decoder_layer(R"(mlp\.proj\.weight$)"),
       {"decoder.block.$1.layer.2.DenseReluDense.wo.weight"}, true, {}},
  };
  return rules;
}

/// The parts stacked along dimension 0: one dtype, one shape each.
Tensor stacked_parts(const std::vector<Tensor>& parts, const std::vector<std::string>& names) {
  Shape shape = parts[0].shape();
  for (std::size_t k = 1; k < parts.size(); ++k)
    MESH_REQUIRE(parts[k].dtype() == parts[0].dtype() && parts[k].shape() == shape,
                 "tensor '" << names[k] << "' (" << dtype_name(parts[k].dtype()) << " "
                            << shape_string(parts[k].shape()) << ") differs from '" << names[0]
                            << "' (" << dtype_name(parts[0].dtype()) << " "
                            << shape_string(shape) << "): the parts of one fused linear agree");
  return stacked_rows(parts);
}

bool gated(const ModelSpec& spec) { return is_gated(spec.block.mlp.activation); }

}  // namespace

T5TensorMapping t5_mapping_of(const std::string& name, bool gated_mlp) {
  for (const auto& rule : t5_tensor_rules()) {
    if (!std::regex_match(name, rule.meshtron)) continue;
    T5TensorMapping m{{}, rule.transposed};
    const auto& hf = gated_mlp && !rule.hf_gated.empty() ? rule.hf_gated : rule.hf;
    for (const char* n : hf) m.hf_names.push_back(std::regex_replace(name, rule.meshtron, n));
    return m;
  }
  throw UserError("no Hugging Face T5 tensor corresponds to parameter '" + name + "'");
}

std::string t5_stored_name(const std::string& name, const HfWeights& weights) {
  if (name != "shared.weight" || weights.contains(name)) return name;
  for (const char* alias : {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"})
    if (weights.contains(alias)) return alias;
  return name;
}

void import_hf_t5(const std::string& model_dir, const ModelSpec& spec, const ParameterList& params,
                  int tp_rank, int tp_size) {
  const HfWeights weights(model_dir);
  for (Parameter* p : params) {
    const T5TensorMapping m = t5_mapping_of(p->name, gated(spec));
    std::vector<Tensor> parts;
    for (const std::string& hf : m.hf_names)
      parts.push_back(weights.load(t5_stored_name(hf, weights), p->name));
    const Tensor rows = parts.size() == 1 ? parts[0] : stacked_parts(parts, m.hf_names);
    load_shard(*p, m.transposed ? transposed(rows) : rows, tp_rank, tp_size);
  }
}

std::vector<std::pair<std::string, Tensor>> hf_t5_tensors(const ModelSpec& spec,
                                                          const ParameterList& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (Parameter* p : params) {
    const T5TensorMapping m = t5_mapping_of(p->name, gated(spec));
    const Tensor value = p->value.is_host() ? p->value : p->value.to_host();
    const Tensor rows = m.transposed ? transposed(value) : value;
    const index_t part = rows.dim(0) / index_t(m.hf_names.size());  // equal parts
    for (std::size_t k = 0; k < m.hf_names.size(); ++k)
      out.push_back({m.hf_names[k],
                     m.hf_names.size() == 1
                         ? rows
                         : rows.slice_rows(index_t(k) * part, index_t(k + 1) * part).clone()});
  }
  return out;
}

HfFamily hf_family_t5() {
  HfFamily f;
  f.name = "t5";
  f.model_types = {"t5", "mt5"};
  f.architectures = {"T5ForConditionalGeneration", "MT5ForConditionalGeneration"};
  f.read_spec = [](const std::string& dir) {
    return model_spec_from_hf(read_hf_t5_config(dir), 1, 1);
  };
  f.import_weights = [](const std::string& dir, const ModelSpec& spec,
                        const ParameterList& params) -> std::vector<std::string> {
    import_hf_t5(dir, spec, params, 0, 1);
    return {};
  };
  f.owns = [](const ModelSpec& s) { return s.model_class == ModelClass::T5; };
  f.export_model = [](const std::string& dir, const ModelSpec& spec, const ParameterList& params) {
    const auto tensors = hf_t5_tensors(spec, params);
    write_hf_weights(dir, tensors);
    write_hf_t5_config(dir + "/config.json", hf_t5_config_from_spec(spec));
    return tensors.size();
  };
  return f;
}

}  // namespace meshtron::io
