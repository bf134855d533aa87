#include "io/hf/gpt_bigcode.hpp"

#include <regex>

#include "common/error.hpp"
#include "io/hf/gpt2.hpp"
#include "io/hf/hf_weights.hpp"

#include "io/hf/gpt_bigcode_config.hpp"
#include "io/hf/hf_family.hpp"

namespace meshtron::io {

bool gpt_bigcode_transposed(const std::string& name) {
  static const std::regex linear_weight(
      R"(^layers\.\d+\.(attention\.(qkv|proj)|mlp\.(fc|proj))\.weight$)");
  return std::regex_match(name, linear_weight);
}

void import_hf_gpt_bigcode(const std::string& model_dir, const ParameterList& params,
                           int tp_rank, int tp_size) {
  const HfWeights weights(model_dir);
  for (Parameter* p : params) {
    const std::string hf = hf_name_of(p->name);
    Tensor t = weights.load(hf, p->name);
    if (gpt_bigcode_transposed(p->name)) {
      MESH_REQUIRE(t.rank() == 2 && t.dim(0) == p->global_shape[1] &&
                       t.dim(1) == p->global_shape[0],
                   "tensor '" << hf << "' has shape " << shape_string(t.shape())
                              << ", the model expects [" << p->global_shape[1] << ", "
                              << p->global_shape[0] << "] (nn.Linear [out, in])");
      t = transposed(t);
    }
    load_shard(*p, t, tp_rank, tp_size);
  }
}

std::vector<std::pair<std::string, Tensor>> hf_gpt_bigcode_tensors(const ParameterList& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (Parameter* p : params) {
    const Tensor value = p->value.is_host() ? p->value : p->value.to_host();
    out.push_back({hf_name_of(p->name), gpt_bigcode_transposed(p->name) ? transposed(value)
                                                                         : value});
  }
  return out;
}

HfFamily hf_family_gpt_bigcode() {
  HfFamily f;
  f.name = "gpt_bigcode";
  f.model_types = {"gpt_bigcode"};
  f.architectures = {"GPTBigCodeForCausalLM"};
  f.read_spec = [](const std::string& dir) {
    const HfGptBigCodeConfig hf = read_hf_gpt_bigcode_config(dir);
    return model_spec_from_hf(hf, int(hf.n_positions), 1, 1);
  };
  f.import_weights = [](const std::string& dir, const ModelSpec&,
                        const ParameterList& params) -> std::vector<std::string> {
    import_hf_gpt_bigcode(dir, params, 0, 1);
    return {};
  };
  f.owns = is_gpt_bigcode_family;
  f.export_model = [](const std::string& dir, const ModelSpec& spec, const ParameterList& params) {
    const auto tensors = hf_gpt_bigcode_tensors(params);
    write_hf_weights(dir, tensors);
    write_hf_gpt_bigcode_config(dir + "/config.json", hf_gpt_bigcode_config_from_spec(spec));
    return tensors.size();
  };
  return f;
}

}  // namespace meshtron::io
