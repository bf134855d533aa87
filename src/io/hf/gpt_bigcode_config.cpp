#include "io/hf/gpt_bigcode_config.hpp"

#include "common/error.hpp"
#include "io/hf/gpt2_config.hpp"
#include "io/hf/hf_json.hpp"

namespace meshtron::io {

using nlohmann::json;

HfGptBigCodeConfig read_hf_gpt_bigcode_config(const std::string& path) {
  const std::string file = config_file_of(path);
  const json j = parse_json_file(file);
  std::string model_type = "gpt_bigcode";
  Fields f(j, file);
  f.text("model_type", model_type);
  MESH_REQUIRE(model_type == "gpt_bigcode", "Hugging Face config '" << file << "': model_type '"
                                            << model_type << "' is not gpt_bigcode");

  HfGptBigCodeConfig c;
  bool multi_query = true, scale_attn_weights = true;
  read_gpt2_keys(f, file, c);
  f.flag("multi_query", multi_query);
  f.flag("scale_attn_weights", scale_attn_weights);
  MESH_REQUIRE(multi_query, "Hugging Face config '" << file
                            << "': multi_query false (per-head interleaved c_attn) is not "
                               "supported, only multi-query GPTBigCode");
  MESH_REQUIRE(scale_attn_weights, "Hugging Face config '" << file
                                   << "': scale_attn_weights false (no 1/sqrt(head_dim) "
                                      "scaling) is not supported");
  MESH_REQUIRE(c.activation_function == "gelu_pytorch_tanh" ||
                   c.activation_function == "gelu_new",
               "Hugging Face config '" << file << "': activation_function '"
                   << c.activation_function << "' is not gelu_pytorch_tanh | gelu_new");
  return c;
}

void write_hf_gpt_bigcode_config(const std::string& path, const HfGptBigCodeConfig& c) {
  json j = gpt2_keys_json(c);
  j["architectures"] = json::array({"GPTBigCodeForCausalLM"});
  j["model_type"] = "gpt_bigcode";
  j["multi_query"] = true;
  j["scale_attn_weights"] = true;
  write_json_file(path, j);
}

ModelSpec model_spec_from_hf(const HfGptBigCodeConfig& hf, int seq_length, int divisible_by,
                             int tp) {
  ModelSpec c = model_spec_from_hf(static_cast<const HfGpt2Config&>(hf), seq_length,
                                   divisible_by, tp);
  c.block.attention.num_query_groups = 1;
  return c;
}

bool is_gpt_bigcode_family(const ModelSpec& spec) {
  const auto& a = spec.block.attention;
  return a.num_query_groups == 1 && a.num_heads > 1 &&
         a.position == PositionEmbedding::LearnedAbsolute;
}

HfGptBigCodeConfig hf_gpt_bigcode_config_from_spec(const ModelSpec& c) {
  require_gpt2_block(c, "GPTBigCode");
  const auto& a = c.block.attention;
  MESH_REQUIRE(a.num_query_groups == 1, "Hugging Face GPTBigCode config: the model has "
                                            << a.num_query_groups
                                            << " query groups, GPTBigCode one (multi-query)");
  HfGptBigCodeConfig hf;
  set_gpt2_keys(c, hf);
  return hf;
}

}  // namespace meshtron::io
