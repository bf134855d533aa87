#include "io/hf/megatron_bert.hpp"

#include <cstring>
#include <regex>

#include "common/error.hpp"
#include "io/hf/hf_family.hpp"
#include "io/hf/hf_json.hpp"
#include "io/hf/hf_weights.hpp"

namespace meshtron::io {

namespace {

using nlohmann::json;

struct BertRule {
  std::regex meshtron;
  std::vector<const char*> hf;  ///< one name, or q, k, v's
  bool transposed;
};

/// `(weight|bias)` rules cover both; only weights of linears are transposed.
BertRule norm_rule(const char* meshtron, const char* hf) {
  return {std::regex(std::string("^") + meshtron + R"(\.(weight|bias)$)"), {hf}, false};
}

/// The table of megatron_bert.hpp's comment: the rules both layouts share,
/// then the norms of `layout`.
std::vector<BertRule> make_rules(BertLayout layout) {
  std::vector<BertRule> rules = {
      {std::regex(R"(^embedding\.word\.weight$)"), {"bert.embeddings.word_embeddings.weight"}, false},
      {std::regex(R"(^embedding\.position\.weight$)"),
       {"bert.embeddings.position_embeddings.weight"}, false},
      {std::regex(R"(^embedding\.token_type\.weight$)"),
       {"bert.embeddings.token_type_embeddings.weight"}, false},
      {std::regex(R"(^layers\.(\d+)\.attention\.qkv\.weight$)"),
       {"bert.encoder.layer.$1.attention.self.query.weight",
        "bert.encoder.layer.$1.attention.self.key.weight",
        "bert.encoder.layer.$1.attention.self.value.weight"},
       true},
      {std::regex(R"(^layers\.(\d+)\.attention\.qkv\.bias$)"),
       {"bert.encoder.layer.$1.attention.self.query.bias",
        "bert.encoder.layer.$1.attention.self.key.bias",
        "bert.encoder.layer.$1.attention.self.value.bias"},
       false},
      {std::regex(R"(^layers\.(\d+)\.attention\.proj\.bias$)"),
       {"bert.encoder.layer.$1.attention.output.dense.bias"}, false},
      {std::regex(R"(^layers\.(\d+)\.attention\.proj\.weight$)"),
       {"bert.encoder.layer.$1.attention.output.dense.weight"}, true},
      {std::regex(R"(^layers\.(\d+)\.mlp\.fc\.bias$)"),
       {"bert.encoder.layer.$1.intermediate.dense.bias"}, false},
      {std::regex(R"(^layers\.(\d+)\.mlp\.fc\.weight$)"),
       {"bert.encoder.layer.$1.intermediate.dense.weight"}, true},
      {std::regex(R"(^layers\.(\d+)\.mlp\.proj\.bias$)"),
       {"bert.encoder.layer.$1.output.dense.bias"}, false},
      {std::regex(R"(^layers\.(\d+)\.mlp\.proj\.weight$)"),
       {"bert.encoder.layer.$1.output.dense.weight"}, true},
      {std::regex(R"(^pooler\.bias$)"), {"bert.pooler.dense.bias"}, false},
      {std::regex(R"(^pooler\.weight$)"), {"bert.pooler.dense.weight"}, true},
      {std::regex(R"(^mlm_head\.dense\.bias$)"), {"cls.predictions.transform.dense.bias"}, false},
      {std::regex(R"(^mlm_head\.dense\.weight$)"), {"cls.predictions.transform.dense.weight"}, true},
      norm_rule(R"(mlm_head\.norm)", "cls.predictions.transform.LayerNorm.$1"),
      {std::regex(R"(^mlm_head\.bias$)"), {"cls.predictions.bias"}, false},
      {std::regex(R"(^binary_head\.bias$)"), {"cls.seq_relationship.bias"}, false},
      {std::regex(R"(^binary_head\.weight$)"), {"cls.seq_relationship.weight"}, true},
  };
  if (layout == BertLayout::Megatron) {
    rules.push_back(norm_rule(R"(layers\.(\d+)\.ln_1)", "bert.encoder.layer.$1.attention.ln.$2"));
    rules.push_back(norm_rule(R"(layers\.(\d+)\.ln_2)", "bert.encoder.layer.$1.ln.$2"));
    rules.push_back(norm_rule(R"(final_norm)", "bert.encoder.ln.$1"));
  } else {
    rules.push_back(norm_rule(R"(embedding\.norm)", "bert.embeddings.LayerNorm.$1"));
    rules.push_back(norm_rule(R"(layers\.(\d+)\.ln_1)",
                              "bert.encoder.layer.$1.attention.output.LayerNorm.$2"));
    rules.push_back(norm_rule(R"(layers\.(\d+)\.ln_2)", "bert.encoder.layer.$1.output.LayerNorm.$2"));
  }
  return rules;
}

const std::vector<BertRule>& bert_rules(BertLayout layout) {
  static const std::vector<BertRule> megatron = make_rules(BertLayout::Megatron),
                                     google = make_rules(BertLayout::Google);
  return layout == BertLayout::Megatron ? megatron : google;
}

struct BertMapping {
  std::vector<std::string> hf_names;
  bool transposed = false;
};

BertMapping mapping_of(const std::string& name, BertLayout layout) {
  for (const auto& rule : bert_rules(layout)) {
    if (!std::regex_match(name, rule.meshtron)) continue;
    BertMapping m{{}, rule.transposed};
    for (const char* hf : rule.hf) m.hf_names.push_back(std::regex_replace(name, rule.meshtron, hf));
    return m;
  }
  throw UserError("no Hugging Face " + std::string(architecture_of(layout)) +
                  " tensor corresponds to parameter '" + name + "'");
}

/// q, k, v (each `rows` leading entries) one after the other along dim 0.
Tensor stacked(const std::vector<Tensor>& parts) {
  for (const Tensor& p : parts)  // the same trailing size: numel / dim(0) alike
    MESH_REQUIRE(p.dtype() == parts[0].dtype() &&
                     p.numel() * parts[0].dim(0) == parts[0].numel() * p.dim(0),
                 "MegatronBert: query, key and value must share dtype and shape");
  return stacked_rows(parts);
}

/// Leading-dimension slice [begin, end) of a host tensor of rank 1 or 2, copied.
Tensor leading_slice(const Tensor& t, index_t begin, index_t end) {
  const index_t row = t.numel() / t.dim(0);
  Shape shape = t.shape();
  shape[0] = end - begin;
  Tensor out = Tensor::empty(shape, t.dtype());
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + begin * row * dtype_size(t.dtype()),
              out.bytes());
  return out;
}

}  // namespace

const char* architecture_of(BertLayout layout) {
  return layout == BertLayout::Megatron ? "MegatronBertForPreTraining" : "BertForPreTraining";
}

BertLayout bert_layout_of(const ModelSpec& spec) {
  return spec.block.norm.placement == NormPlacement::Pre ? BertLayout::Megatron
                                                         : BertLayout::Google;
}

std::string megatron_bert_stored_name(const std::string& name, const HfWeights& weights) {
  std::vector<std::string> candidates = {name};
  if (name == "cls.predictions.bias") candidates.push_back("cls.predictions.decoder.bias");
  if (name == "bert.embeddings.word_embeddings.weight")
    candidates.push_back("cls.predictions.decoder.weight");
  // TensorFlow-era files name a LayerNorm's weight and bias gamma and beta
  // (transformers renames them on load).
  const std::regex legacy(R"(^(.*\.LayerNorm\.)(weight|bias)$)");
  std::smatch m;
  if (std::regex_match(name, m, legacy))
    candidates.push_back(m[1].str() + (m[2] == "weight" ? "gamma" : "beta"));
  // A BertModel's own file has no "bert." before its names.
  for (std::size_t i = 0, n = candidates.size(); i < n; ++i)
    if (candidates[i].rfind("bert.", 0) == 0) candidates.push_back(candidates[i].substr(5));
  for (const std::string& c : candidates)
    if (weights.contains(c)) return c;
  return name;
}

HfMegatronBertConfig read_hf_megatron_bert_config(const std::string& path) {
  const std::string file = config_file_of(path);
  const json j = parse_json_file(file);
  Fields f(j, file);
  HfMegatronBertConfig c;
  f.size("vocab_size", c.vocab_size);
  f.size("hidden_size", c.hidden_size);
  f.size("num_hidden_layers", c.num_hidden_layers);
  f.size("num_attention_heads", c.num_attention_heads);
  f.size("intermediate_size", c.intermediate_size);
  f.size("max_position_embeddings", c.max_position_embeddings);
  f.size("type_vocab_size", c.type_vocab_size);
  f.number("layer_norm_eps", c.layer_norm_eps);
  f.number("initializer_range", c.initializer_range);
  f.number("hidden_dropout_prob", c.hidden_dropout_prob);
  f.number("attention_probs_dropout_prob", c.attention_probs_dropout_prob);
  if (j.contains("model_type") && j["model_type"] == "bert") c.layout = BertLayout::Google;
  f.require(!j.contains("is_decoder") || j["is_decoder"] == false, "is_decoder",
            "false (an encoder: bidirectional attention)");
  f.require(!j.contains("hidden_act") || j["hidden_act"] == "gelu", "hidden_act",
            "gelu (the exact GeLU)");
  f.require(!j.contains("position_embedding_type") || j["position_embedding_type"] == "absolute",
            "position_embedding_type", "absolute (learned positions)");
  f.require(!j.contains("tie_word_embeddings") || j["tie_word_embeddings"] == true,
            "tie_word_embeddings", "true (the MLM decoder is the word table)");
  MESH_REQUIRE(c.hidden_size % c.num_attention_heads == 0,
               "Hugging Face config '" << file << "': hidden_size " << c.hidden_size
                                       << " is not divisible by num_attention_heads "
                                       << c.num_attention_heads);
  return c;
}

void write_hf_megatron_bert_config(const std::string& path, const HfMegatronBertConfig& c) {
  const bool megatron = c.layout == BertLayout::Megatron;
  write_json_file(path, {
                            {"architectures", json::array({architecture_of(c.layout)})},
                            {"model_type", megatron ? "megatron-bert" : "bert"},
                            {"vocab_size", c.vocab_size},
                            {"hidden_size", c.hidden_size},
                            {"num_hidden_layers", c.num_hidden_layers},
                            {"num_attention_heads", c.num_attention_heads},
                            {"intermediate_size", c.intermediate_size},
                            {"hidden_act", "gelu"},
                            {"max_position_embeddings", c.max_position_embeddings},
                            {"type_vocab_size", c.type_vocab_size},
                            {"layer_norm_eps", c.layer_norm_eps},
                            {"initializer_range", c.initializer_range},
                            {"hidden_dropout_prob", c.hidden_dropout_prob},
                            {"attention_probs_dropout_prob", c.attention_probs_dropout_prob},
                            {"position_embedding_type", "absolute"},
                            {"tie_word_embeddings", true},
                            {"torch_dtype", "float32"},
                        });
}

ModelSpec model_spec_from_hf(const HfMegatronBertConfig& hf, int divisible_by, int tp) {
  ModelSpec s;
  s.model_class = ModelClass::BertPretraining;
  s.num_layers = int(hf.num_hidden_layers);
  s.hidden_size = int(hf.hidden_size);
  s.seq_length = s.max_positions = int(hf.max_position_embeddings);
  s.vocab_size = int(hf.vocab_size);
  s.padded_vocab_size = padded_vocab_size(s.vocab_size, divisible_by, tp);
  s.num_token_types = int(hf.type_vocab_size);
  s.init_std = hf.initializer_range;
  s.hidden_dropout = hf.hidden_dropout_prob;
  s.attention_dropout = hf.attention_probs_dropout_prob;
  s.block.norm.epsilon = hf.layer_norm_eps;
  s.block.attention = AttentionSpec::multi_head(s.hidden_size, int(hf.num_attention_heads));
  s.block.attention.mask = AttentionMask::Padding;
  s.block.mlp.ffn_hidden_size = int(hf.intermediate_size);
  s.block.mlp.activation = Activation::Gelu;
  if (hf.layout == BertLayout::Google) {
    s.block.norm.placement = NormPlacement::Post;
    s.embedding_norm = true;
  }
  return s;
}

HfMegatronBertConfig hf_megatron_bert_config_from_spec(const ModelSpec& s) {
  const auto& a = s.block.attention;
  const BertLayout layout = bert_layout_of(s);
  // Megatron's layout: pre-LN blocks, a final norm, no embedding norm;
  // Google's: post-LN blocks, the embedding norm, no final norm.
  const bool norms = layout == BertLayout::Megatron ? !s.embedding_norm : s.embedding_norm;
  MESH_REQUIRE(s.model_class == ModelClass::BertPretraining && s.tie_word_embeddings &&
                   s.block.norm.kind == NormKind::LayerNorm && s.block.norm.bias && norms &&
                   a.mask == AttentionMask::Padding &&
                   a.position == PositionEmbedding::LearnedAbsolute &&
                   a.num_query_groups == a.num_heads && a.head_dim * a.num_heads == s.hidden_size &&
                   a.bias && s.block.mlp.activation == Activation::Gelu && s.block.mlp.bias &&
                   !s.parallel_residual,
               "Hugging Face " << architecture_of(layout) << " config: the model is not its "
               "layout (LayerNorm " << (layout == BertLayout::Megatron
                                            ? "before each branch and at the end"
                                            : "after the embedding and after each residual add")
               << ", learned positions, multi-head padded attention, exact GeLU, biases, tied "
                  "head)");
  HfMegatronBertConfig hf;
  hf.layout = layout;
  hf.vocab_size = s.vocab_size;
  hf.hidden_size = s.hidden_size;
  hf.num_hidden_layers = s.num_layers;
  hf.num_attention_heads = a.num_heads;
  hf.intermediate_size = s.block.mlp.ffn_hidden_size;
  hf.max_position_embeddings = s.max_positions;
  hf.type_vocab_size = s.num_token_types;
  hf.layer_norm_eps = s.block.norm.epsilon;
  hf.initializer_range = s.init_std;
  hf.hidden_dropout_prob = s.hidden_dropout;
  hf.attention_probs_dropout_prob = s.attention_dropout;
  return hf;
}

namespace {
/// Google BERT files without the pre-training heads (BertForMaskedLM has no
/// pooler nor binary head, BertModel no head at all): those keep their
/// initialisation.
bool head_may_be_absent(BertLayout layout, const std::string& hf_name) {
  return layout == BertLayout::Google &&
         (hf_name.rfind("cls.", 0) == 0 || hf_name.rfind("bert.pooler.", 0) == 0);
}
}  // namespace

std::vector<std::string> import_hf_megatron_bert(const std::string& model_dir,
                                                 const ModelSpec& spec,
                                                 const ParameterList& params, int tp_rank,
                                                 int tp_size) {
  const HfWeights weights(model_dir);
  const BertLayout layout = bert_layout_of(spec);
  std::vector<std::string> initialised;
  for (Parameter* p : params) {
    const BertMapping m = mapping_of(p->name, layout);
    std::vector<Tensor> parts;
    for (const std::string& hf : m.hf_names) {
      const std::string stored = megatron_bert_stored_name(hf, weights);
      if (!weights.contains(stored) && head_may_be_absent(layout, hf)) break;
      parts.push_back(weights.load(stored, p->name));
    }
    if (parts.size() != m.hf_names.size()) {
      initialised.push_back(p->name);
      continue;
    }
    const Tensor rows = parts.size() == 1 ? parts[0] : stacked(parts);
    load_shard(*p, m.transposed ? transposed(rows) : rows, tp_rank, tp_size);
  }
  return initialised;
}

std::vector<std::pair<std::string, Tensor>> hf_megatron_bert_tensors(const ModelSpec& spec,
                                                                     const ParameterList& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (Parameter* p : params) {
    const BertMapping m = mapping_of(p->name, bert_layout_of(spec));
    const Tensor value = p->value.is_host() ? p->value : p->value.to_host();
    const Tensor rows = m.transposed ? transposed(value) : value;
    const index_t part = rows.dim(0) / index_t(m.hf_names.size());  // q, k, v: equal parts
    for (std::size_t k = 0; k < m.hf_names.size(); ++k)
      out.push_back({m.hf_names[k], m.hf_names.size() == 1
                                        ? rows
                                        : leading_slice(rows, index_t(k) * part,
                                                        index_t(k + 1) * part)});
  }
  return out;
}

namespace {
/// The family of one layout: the same mapping, its model_type and
/// architectures, owning the BERT specs of its norm placement.
HfFamily bert_family(BertLayout layout) {
  HfFamily f;
  const bool megatron = layout == BertLayout::Megatron;
  f.name = megatron ? "megatron_bert" : "bert";
  f.model_types = {megatron ? "megatron-bert" : "bert"};
  f.architectures = {architecture_of(layout)};
  if (!megatron) f.architectures.insert(f.architectures.end(), {"BertForMaskedLM", "BertModel"});
  f.read_spec = [](const std::string& dir) {
    return model_spec_from_hf(read_hf_megatron_bert_config(dir), 1, 1);
  };
  f.import_weights = [](const std::string& dir, const ModelSpec& spec,
                        const ParameterList& params) {
    return import_hf_megatron_bert(dir, spec, params, 0, 1);
  };
  f.owns = [layout](const ModelSpec& s) {
    return s.model_class == ModelClass::BertPretraining && bert_layout_of(s) == layout;
  };
  f.export_model = [](const std::string& dir, const ModelSpec& spec, const ParameterList& params) {
    const auto tensors = hf_megatron_bert_tensors(spec, params);
    write_hf_weights(dir, tensors);
    write_hf_megatron_bert_config(dir + "/config.json", hf_megatron_bert_config_from_spec(spec));
    return tensors.size();
  };
  return f;
}
}  // namespace

HfFamily hf_family_megatron_bert() { return bert_family(BertLayout::Megatron); }
HfFamily hf_family_bert() { return bert_family(BertLayout::Google); }

}  // namespace meshtron::io
