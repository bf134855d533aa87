#include "data/json_line.hpp"

#include <algorithm>
#include <fstream>

#include "common/error.hpp"

namespace meshtron::data {

namespace {

/// A short, one-line reason for a JSON parse error: nlohmann's description
/// without its prefix and with "last read" cut to the bytes before the error
/// (it quotes the whole line otherwise).
std::string describe_json_error(std::string_view line, const nlohmann::json::parse_error& e) {
  std::string what = e.what();
  const std::size_t column = what.find("column ");
  if (column != std::string::npos) what.erase(0, column);
  const std::size_t last_read = what.find("; last read:");
  const std::size_t expected = what.find("; expected", last_read == std::string::npos ? 0 : last_read);
  if (last_read != std::string::npos)
    what.erase(last_read, expected == std::string::npos ? std::string::npos : expected - last_read);
  // Up to 24 bytes before the error, not starting inside a UTF-8 character.
  std::size_t end = std::min(line.size(), std::size_t(e.byte));
  std::size_t begin = end > 24 ? end - 24 : 0;
  while (begin < end && (static_cast<unsigned char>(line[begin]) & 0xC0) == 0x80) ++begin;
  return "not valid JSON: " + what + " (near '" + std::string(line.substr(begin, end - begin)) + "')";
}

}  // namespace

std::optional<nlohmann::json> parse_json_line(std::string_view line, std::string& why) {
  nlohmann::json value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!value.is_discarded()) return value;
  // Parse again for nlohmann's description of where it went wrong.
  try {
    const nlohmann::json unreachable = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    why = describe_json_error(line, e);
  }
  return std::nullopt;
}

std::string read_int_field(const nlohmann::json& row, const IntField& f, std::size_t length,
                           std::vector<std::int32_t>& out) {
  const auto it = row.find(f.key);
  if (it == row.end()) return f.required ? MESH_MSG("no \"" << f.key << "\"") : "";
  if (!it->is_array() || it->size() != length)
    return MESH_MSG("\"" << f.key << "\" must be an array of " << length << " integers");
  for (std::size_t i = 0; i < length; ++i) {
    const nlohmann::json& v = (*it)[i];
    const std::int64_t x = v.is_number_integer() ? v.get<std::int64_t>() : f.lo - 1;
    if (!((x >= f.lo && x < f.hi) || (f.ignore_index && x == -100)))
      return MESH_MSG(f.key << "[" << i << "] = " << v.dump() << " is outside [" << f.lo << ", "
                            << f.hi << ")" << (f.ignore_index ? " and not -100" : ""));
    out[i] = std::int32_t(x);
  }
  return "";
}

void for_each_json_line(
    const std::string& path, const std::string& key,
    const std::function<void(const nlohmann::json&, const std::string&, long)>& row) {
  std::ifstream in(path);
  MESH_REQUIRE(in.good(), key << ": cannot read '" << path << "'");
  std::string line, why;
  for (long n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    const auto value = parse_json_line(line, why);
    MESH_REQUIRE(value, where << ": " << why);
    row(*value, where, n);
  }
}

}  // namespace meshtron::data
