#include "io/hf_config.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace meshtron::io {

namespace {

using nlohmann::json;

std::string config_file_of(const std::string& path) {
  if (std::filesystem::is_directory(path))
    return (std::filesystem::path(path) / "config.json").string();
  return path;
}

json parse_json_file(const std::string& file) {
  std::ifstream in(file);
  MESH_REQUIRE(in, "cannot open Hugging Face config '" << file << "'");
  try {
    json j = json::parse(in);
    MESH_REQUIRE(j.is_object(), "Hugging Face config '" << file << "' is not a JSON object");
    return j;
  } catch (const json::parse_error& err) {
    throw UserError(MESH_MSG("Hugging Face config '" << file
                             << "' is not valid JSON (byte " << err.byte << ")"));
  }
}

/// Reads optional keys of one config file, keeping the default when a key
/// is absent and naming file and key when a value has the wrong type.
class Fields {
 public:
  Fields(const json& j, std::string file) : j_(j), file_(std::move(file)) {}

  void size(const char* key, index_t& out, bool allow_null = false) const {
    if (!j_.contains(key) || (allow_null && j_[key].is_null())) return;
    require(j_[key].is_number_integer() && j_[key].get<index_t>() > 0, key,
            "a positive integer");
    out = j_[key].get<index_t>();
  }
  void number(const char* key, double& out) const {
    if (!j_.contains(key)) return;
    require(j_[key].is_number(), key, "a number");
    out = j_[key].get<double>();
  }
  void text(const char* key, std::string& out) const {
    if (!j_.contains(key)) return;
    require(j_[key].is_string(), key, "a string");
    out = j_[key].get<std::string>();
  }
  void flag(const char* key, bool& out) const {
    if (!j_.contains(key)) return;
    require(j_[key].is_boolean(), key, "true or false");
    out = j_[key].get<bool>();
  }

 private:
  void require(bool ok, const char* key, const char* what) const {
    MESH_REQUIRE(ok, "Hugging Face config '" << file_ << "': " << key << " = "
                     << j_[key].dump() << " is not " << what);
  }
  const json& j_;
  std::string file_;
};

}  // namespace

HfGpt2Config read_hf_gpt2_config(const std::string& path) {
  const std::string file = config_file_of(path);
  const json j = parse_json_file(file);
  std::string model_type = "gpt2";
  Fields f(j, file);
  f.text("model_type", model_type);
  MESH_REQUIRE(model_type == "gpt2", "Hugging Face config '" << file << "': model_type '"
                                     << model_type << "' is not gpt2");

  HfGpt2Config c;
  f.size("vocab_size", c.vocab_size);
  f.size("n_positions", c.n_positions);
  f.size("n_embd", c.n_embd);
  f.size("n_layer", c.n_layer);
  f.size("n_head", c.n_head);
  f.size("n_inner", c.n_inner, /*allow_null=*/true);
  f.number("layer_norm_epsilon", c.layer_norm_epsilon);
  f.text("activation_function", c.activation_function);
  f.flag("tie_word_embeddings", c.tie_word_embeddings);
  f.number("initializer_range", c.initializer_range);
  c.n_inner = c.mlp_width();
  MESH_REQUIRE(c.n_embd % c.n_head == 0, "Hugging Face config '" << file << "': n_embd "
                                         << c.n_embd << " is not divisible by n_head "
                                         << c.n_head);
  return c;
}

void write_hf_gpt2_config(const std::string& path, const HfGpt2Config& c) {
  const json j = {
      {"architectures", json::array({"GPT2LMHeadModel"})},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.n_positions},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_inner", c.mlp_width()},
      {"layer_norm_epsilon", c.layer_norm_epsilon},
      {"activation_function", c.activation_function},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"initializer_range", c.initializer_range},
  };
  std::ofstream out(path, std::ios::trunc);
  MESH_REQUIRE(out, "cannot create Hugging Face config '" << path << "'");
  out << j.dump(2) << '\n';
  out.close();
  MESH_REQUIRE(out, "writing Hugging Face config '" << path << "' failed");
}

}  // namespace meshtron::io
