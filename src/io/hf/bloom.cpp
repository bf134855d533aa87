#include "io/hf/bloom.hpp"

#include <cstring>
#include <regex>

#include "common/error.hpp"
#include "io/hf/hf_weights.hpp"

#include "io/hf/bloom_config.hpp"
#include "io/hf/hf_family.hpp"

namespace meshtron::io {

namespace {

constexpr const char* kBasePrefix = "transformer.";

bool is_linear_weight(const std::string& name) {
  static const std::regex linear(
      R"(^layers\.\d+\.(attention\.(qkv|proj)|mlp\.(fc|proj))\.weight$)");
  return std::regex_match(name, linear);
}

bool is_qkv(const std::string& name) { return name.find(".attention.qkv.") != std::string::npos; }

/// The name in the folder: `hf`, or `hf` without "transformer." (BigScience's
/// files).
std::string name_in(const HfWeights& weights, const std::string& hf) {
  if (weights.contains(hf) || !hf.starts_with(kBasePrefix)) return hf;
  const std::string bare = hf.substr(std::strlen(kBasePrefix));
  return weights.contains(bare) ? bare : hf;
}

}  // namespace

std::string bloom_name_of(const std::string& name) {
  static const std::pair<std::regex, const char*> rules[] = {
      {std::regex(R"(^embedding\.word\.weight$)"), "transformer.word_embeddings.weight"},
      {std::regex(R"(^embedding\.norm\.(weight|bias)$)"),
       "transformer.word_embeddings_layernorm.$1"},
      {std::regex(R"(^layers\.(\d+)\.ln_1\.(weight|bias)$)"),
       "transformer.h.$1.input_layernorm.$2"},
      {std::regex(R"(^layers\.(\d+)\.attention\.qkv\.(weight|bias)$)"),
       "transformer.h.$1.self_attention.query_key_value.$2"},
      {std::regex(R"(^layers\.(\d+)\.attention\.proj\.(weight|bias)$)"),
       "transformer.h.$1.self_attention.dense.$2"},
      {std::regex(R"(^layers\.(\d+)\.ln_2\.(weight|bias)$)"),
       "transformer.h.$1.post_attention_layernorm.$2"},
      {std::regex(R"(^layers\.(\d+)\.mlp\.fc\.(weight|bias)$)"),
       "transformer.h.$1.mlp.dense_h_to_4h.$2"},
      {std::regex(R"(^layers\.(\d+)\.mlp\.proj\.(weight|bias)$)"),
       "transformer.h.$1.mlp.dense_4h_to_h.$2"},
      {std::regex(R"(^final_norm\.(weight|bias)$)"), "transformer.ln_f.$1"},
      {std::regex(R"(^output_layer\.weight$)"), "lm_head.weight"},
  };
  for (const auto& [pattern, replacement] : rules)
    if (std::regex_match(name, pattern)) return std::regex_replace(name, pattern, replacement);
  throw UserError("no Hugging Face BLOOM tensor corresponds to parameter '" + name + "'");
}

Tensor permute_bloom_qkv_rows(const Tensor& rows, index_t heads, index_t head_dim,
                              bool to_bloom) {
  MESH_VERIFY(rows.is_host() && rows.rank() >= 1 && rows.dim(0) == 3 * heads * head_dim,
              "permute_bloom_qkv_rows: " << shape_string(rows.shape()) << " is not 3 x "
                                         << heads << " heads x " << head_dim << " rows");
  Tensor out = Tensor::empty(rows.shape(), rows.dtype());
  const std::size_t block = rows.bytes() / std::size_t(3 * heads);  // head_dim rows
  const auto* src = static_cast<const char*>(rows.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (index_t h = 0; h < heads; ++h)
    for (index_t part = 0; part < 3; ++part) {
      const std::size_t bloom = std::size_t(h * 3 + part) * block;
      const std::size_t meshtron = std::size_t(part * heads + h) * block;
      std::memcpy(dst + (to_bloom ? bloom : meshtron), src + (to_bloom ? meshtron : bloom),
                  block);
    }
  return out;
}

void import_hf_bloom(const std::string& model_dir, const ModelSpec& spec,
                     const ParameterList& params, int tp_rank, int tp_size) {
  const HfWeights weights(model_dir);
  const index_t heads = spec.num_heads(), d = spec.head_dim();
  for (Parameter* p : params) {
    const std::string hf = name_in(weights, bloom_name_of(p->name));
    Tensor t = weights.load(hf, p->name);
    const Shape expected = is_linear_weight(p->name)
                               ? Shape{p->global_shape[1], p->global_shape[0]}
                               : p->global_shape;
    MESH_REQUIRE(t.shape() == expected, "tensor '" << hf << "' has shape "
                                                   << shape_string(t.shape())
                                                   << ", the model expects "
                                                   << shape_string(expected));
    if (is_qkv(p->name)) t = permute_bloom_qkv_rows(t, heads, d, /*to_bloom=*/false);
    if (is_linear_weight(p->name)) t = transposed(t);
    load_shard(*p, t, tp_rank, tp_size);
  }
}

std::vector<std::pair<std::string, Tensor>> hf_bloom_tensors(const ModelSpec& spec,
                                                             const ParameterList& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (Parameter* p : params) {
    Tensor t = p->value.is_host() ? p->value : p->value.to_host();
    if (is_linear_weight(p->name)) t = transposed(t);
    if (is_qkv(p->name))
      t = permute_bloom_qkv_rows(t, spec.num_heads(), spec.head_dim(), /*to_bloom=*/true);
    out.push_back({bloom_name_of(p->name), t});
  }
  return out;
}

HfFamily hf_family_bloom() {
  HfFamily f;
  f.name = "bloom";
  f.model_types = {"bloom"};
  f.architectures = {"BloomForCausalLM"};
  f.read_spec = [](const std::string& dir) {
    const HfBloomConfig hf = read_hf_bloom_config(dir);
    return model_spec_from_hf(hf, int(hf.seq_length), 1, 1);
  };
  f.import_weights = [](const std::string& dir, const ModelSpec& spec,
                        const ParameterList& params) -> std::vector<std::string> {
    import_hf_bloom(dir, spec, params, 0, 1);
    return {};
  };
  f.owns = is_bloom_family;
  f.export_model = [](const std::string& dir, const ModelSpec& spec, const ParameterList& params) {
    const auto tensors = hf_bloom_tensors(spec, params);
    write_hf_weights(dir, tensors);
    write_hf_bloom_config(dir + "/config.json", hf_bloom_config_from_spec(spec));
    return tensors.size();
  };
  return f;
}

}  // namespace meshtron::io
