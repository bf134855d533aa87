// One JSON value per line (JSON Lines), as preprocess and evaluate read them.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtron::data {

/// The JSON value of `line`, or nullopt with `why` set to a short one-line
/// reason ("not valid JSON: column 7: ... (near '{\"ids\": [1,')").
std::optional<nlohmann::json> parse_json_line(std::string_view line, std::string& why);

/// Calls `row(value, where, n)` for each non-blank line n (from 1) of the
/// JSON Lines file `path`, where = "path:n"; an unreadable file or a line
/// that is not JSON is a UserError (`key` names the setting).
void for_each_json_line(
    const std::string& path, const std::string& key,
    const std::function<void(const nlohmann::json&, const std::string&, long)>& row);

/// How an integer-array field of a JSON row (evaluate.inputs) is read.
struct IntField {
  const char* key;
  std::int64_t lo, hi;  ///< its values in [lo, hi)
  bool ignore_index;    ///< -100 also allowed (labels)
  bool required;
};

/// Field `f` of `row`, `length` integers, into `out`; absent and not
/// required: `out` keeps its values. Returns why it cannot, or "".
std::string read_int_field(const nlohmann::json& row, const IntField& f, std::size_t length,
                           std::vector<std::int32_t>& out);

}  // namespace meshtron::data
