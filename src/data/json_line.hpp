// One JSON value per line (JSON Lines), as preprocess and evaluate read them.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace meshtron::data {

/// The JSON value of `line`, or nullopt with `why` set to a short one-line
/// reason ("not valid JSON: column 7: ... (near '{\"ids\": [1,')").
std::optional<nlohmann::json> parse_json_line(std::string_view line, std::string& why);

}  // namespace meshtron::data
