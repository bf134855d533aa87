#include "io/hf/hf_json.hpp"

#include <filesystem>
#include <fstream>

#include "common/error.hpp"

namespace meshtron::io {

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

void write_json_file(const std::string& path, const json& j) {
  std::ofstream out(path, std::ios::trunc);
  MESH_REQUIRE(out, "cannot create Hugging Face config '" << path << "'");
  out << j.dump(2) << '\n';
  out.close();
  MESH_REQUIRE(out, "writing Hugging Face config '" << path << "' failed");
}

void Fields::size(const char* key, index_t& out, bool allow_null) const {
  if (!j_.contains(key) || (allow_null && j_[key].is_null())) return;
  require(j_[key].is_number_integer() && j_[key].get<index_t>() > 0, key, "a positive integer");
  out = j_[key].get<index_t>();
}

void Fields::number(const char* key, double& out) const {
  if (!j_.contains(key)) return;
  require(j_[key].is_number(), key, "a number");
  out = j_[key].get<double>();
}

void Fields::text(const char* key, std::string& out) const {
  if (!j_.contains(key)) return;
  require(j_[key].is_string(), key, "a string");
  out = j_[key].get<std::string>();
}

void Fields::flag(const char* key, bool& out) const {
  if (!j_.contains(key)) return;
  require(j_[key].is_boolean(), key, "true or false");
  out = j_[key].get<bool>();
}

void Fields::require(bool ok, const char* key, const char* what) const {
  MESH_REQUIRE(ok, "Hugging Face config '" << file_ << "': " << key << " = "
                   << j_[key].dump() << " is not " << what);
}

}  // namespace meshtron::io
