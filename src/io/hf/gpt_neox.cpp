#include "io/hf/gpt_neox.hpp"

#include <cstring>
#include <regex>

#include "common/error.hpp"
#include "io/hf/hf_weights.hpp"

#include "io/hf/gpt_neox_config.hpp"
#include "io/hf/hf_family.hpp"

namespace meshtron::io {

namespace {

/// The one table of names: the file comment of gpt_neox.hpp, as rules.
const std::vector<std::pair<std::regex, const char*>>& gpt_neox_rules() {
  static const std::vector<std::pair<std::regex, const char*>> rules = {
      {std::regex(R"(^embedding\.word\.weight$)"), "gpt_neox.embed_in.weight"},
      {std::regex(R"(^layers\.(\d+)\.ln_1\.(weight|bias)$)"),
       "gpt_neox.layers.$1.input_layernorm.$2"},
      {std::regex(R"(^layers\.(\d+)\.ln_2\.(weight|bias)$)"),
       "gpt_neox.layers.$1.post_attention_layernorm.$2"},
      {std::regex(R"(^layers\.(\d+)\.attention\.qkv\.(weight|bias)$)"),
       "gpt_neox.layers.$1.attention.query_key_value.$2"},
      {std::regex(R"(^layers\.(\d+)\.attention\.proj\.(weight|bias)$)"),
       "gpt_neox.layers.$1.attention.dense.$2"},
      {std::regex(R"(^layers\.(\d+)\.mlp\.fc\.(weight|bias)$)"),
       "gpt_neox.layers.$1.mlp.dense_h_to_4h.$2"},
      {std::regex(R"(^layers\.(\d+)\.mlp\.proj\.(weight|bias)$)"),
       "gpt_neox.layers.$1.mlp.dense_4h_to_h.$2"},
      {std::regex(R"(^final_norm\.(weight|bias)$)"), "gpt_neox.final_layer_norm.$1"},
      {std::regex(R"(^output_layer\.weight$)"), "embed_out.weight"},
  };
  return rules;
}

bool is_linear_weight(const std::string& name) {
  static const std::regex linear_weight(
      R"(^layers\.\d+\.(attention\.(qkv|proj)|mlp\.(fc|proj))\.weight$)");
  return std::regex_match(name, linear_weight);
}

bool is_qkv(const std::string& name) {
  static const std::regex qkv(R"(^layers\.\d+\.attention\.qkv\.(weight|bias)$)");
  return std::regex_match(name, qkv);
}

/// Rows of `t` (dimension 0; one element each for a vector) in the order
/// `rows`: out[r] = t[rows[r]]; `inverse` scatters instead, out[rows[r]] = t[r].
Tensor reordered_rows(const Tensor& t, const std::vector<index_t>& rows, bool inverse) {
  MESH_VERIFY(t.rank() >= 1 && t.dim(0) == index_t(rows.size()),
              "gpt_neox: " << shape_string(t.shape()) << " has not " << rows.size() << " rows");
  Tensor out = Tensor::empty(t.shape(), t.dtype());
  const std::size_t row_bytes = t.bytes() / rows.size();
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::size_t from = inverse ? r : std::size_t(rows[r]);
    const std::size_t to = inverse ? std::size_t(rows[r]) : r;
    std::memcpy(dst + to * row_bytes, src + from * row_bytes, row_bytes);
  }
  return out;
}

/// `hf` (the file's tensor) in meshtron's global layout for `name`.
Tensor from_hf_layout(const std::string& name, const std::string& hf_name, Tensor t,
                      const ModelSpec& spec, const Shape& global_shape) {
  const bool linear = is_linear_weight(name);
  const Shape want = linear ? Shape{global_shape[1], global_shape[0]} : global_shape;
  MESH_REQUIRE(t.shape() == want, "tensor '" << hf_name << "' has shape "
                                             << shape_string(t.shape()) << ", the model expects "
                                             << shape_string(want)
                                             << (linear ? " (nn.Linear [out, in])" : ""));
  if (is_qkv(name))
    t = reordered_rows(t, gpt_neox_qkv_source_rows(spec.num_heads(), spec.head_dim()),
                       /*inverse=*/false);
  return linear ? transposed(t) : t;
}

}  // namespace

std::string gpt_neox_name_of(const std::string& name) {
  for (const auto& [rule, hf] : gpt_neox_rules())
    if (std::regex_match(name, rule)) return std::regex_replace(name, rule, hf);
  throw UserError("no Hugging Face GPT-NeoX tensor corresponds to parameter '" + name + "'");
}

std::vector<index_t> gpt_neox_qkv_source_rows(index_t heads, index_t head_dim) {
  std::vector<index_t> rows;
  rows.reserve(std::size_t(3 * heads * head_dim));
  for (index_t part = 0; part < 3; ++part)
    for (index_t n = 0; n < heads; ++n)
      for (index_t d = 0; d < head_dim; ++d) rows.push_back(n * 3 * head_dim + part * head_dim + d);
  return rows;
}

void import_hf_gpt_neox(const std::string& model_dir, const ModelSpec& spec,
                        const ParameterList& params, int tp_rank, int tp_size) {
  const HfWeights weights(model_dir);
  for (Parameter* p : params) {
    const std::string hf = gpt_neox_name_of(p->name);
    load_shard(*p, from_hf_layout(p->name, hf, weights.load(hf, p->name), spec, p->global_shape),
               tp_rank, tp_size);
  }
}

std::vector<std::pair<std::string, Tensor>> hf_gpt_neox_tensors(const ModelSpec& spec,
                                                                const ParameterList& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (Parameter* p : params) {
    const Tensor value = p->value.is_host() ? p->value : p->value.to_host();
    Tensor t = is_linear_weight(p->name) ? transposed(value) : value;
    if (is_qkv(p->name))
      t = reordered_rows(t, gpt_neox_qkv_source_rows(spec.num_heads(), spec.head_dim()),
                         /*inverse=*/true);
    out.push_back({gpt_neox_name_of(p->name), t});
  }
  return out;
}

HfFamily hf_family_gpt_neox() {
  HfFamily f;
  f.name = "gpt_neox";
  f.model_types = {"gpt_neox"};
  f.architectures = {"GPTNeoXForCausalLM"};
  f.read_spec = [](const std::string& dir) {
    const HfGptNeoxConfig hf = read_hf_gpt_neox_config(dir);
    return model_spec_from_hf(hf, int(hf.max_position_embeddings), 1, 1);
  };
  f.import_weights = [](const std::string& dir, const ModelSpec& spec,
                        const ParameterList& params) -> std::vector<std::string> {
    import_hf_gpt_neox(dir, spec, params, 0, 1);
    return {};
  };
  f.owns = is_gpt_neox_family;
  f.export_model = [](const std::string& dir, const ModelSpec& spec, const ParameterList& params) {
    const auto tensors = hf_gpt_neox_tensors(spec, params);
    write_hf_weights(dir, tensors);
    write_hf_gpt_neox_config(dir + "/config.json", hf_gpt_neox_config_from_spec(spec));
    return tensors.size();
  };
  return f;
}

}  // namespace meshtron::io
