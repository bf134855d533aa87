#include "io/hf/gpt_bigcode.hpp"

#include <regex>

#include "common/error.hpp"
#include "io/hf/gpt2.hpp"
#include "io/hf/hf_weights.hpp"

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

}  // namespace meshtron::io
