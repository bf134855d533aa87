// Reading Hugging Face config.json files: the helpers every family's config
// reader shares (file resolution, parsing, typed optional keys whose errors
// name the file and key).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tensor/types.hpp"

namespace meshtron::io {

/// `path` itself, or `path`/config.json when `path` is a folder.
std::string config_file_of(const std::string& path);

/// The JSON object in `file`; UserError naming the file when it cannot be
/// opened, is not valid JSON, or is not an object.
nlohmann::json parse_json_file(const std::string& file);

/// Writes `j` to `path` (two-space indent, trailing newline); UserError when
/// the file cannot be written.
void write_json_file(const std::string& path, const nlohmann::json& j);

/// Reads optional keys of one config file, keeping the default when a key
/// is absent and naming file and key when a value has the wrong type.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string file) : j_(j), file_(std::move(file)) {}

  /// A positive integer; with allow_null, null keeps the default too.
  void size(const char* key, index_t& out, bool allow_null = false) const;
  void number(const char* key, double& out) const;
  void text(const char* key, std::string& out) const;
  void flag(const char* key, bool& out) const;
  /// A UserError "<file>: <key> = <value> is not <what>" unless `ok`.
  void require(bool ok, const char* key, const char* what) const;
  const std::string& file() const { return file_; }

 private:
  const nlohmann::json& j_;
  std::string file_;
};

}  // namespace meshtron::io
