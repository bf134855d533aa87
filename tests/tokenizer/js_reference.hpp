// The comparison of meshtron's ids with a JavaScript reference encoder run
// under node (reference_encode_bert.js, reference_encode_hf.js), shared by
// the test binaries that define MESHTRON_NODE_EXECUTABLE.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer_test_data.hpp"

namespace meshtron::data::testing_data {

using Ids = std::vector<int32_t>;

/// The non-empty lines of tests/tokenizer/hard_strings.txt.
inline std::vector<std::string> hard_string_lines() {
  std::vector<std::string> lines;
  std::istringstream in(
      read_bytes(std::filesystem::path(MESHTRON_SOURCE_DIR) / "tests/tokenizer/hard_strings.txt"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

/// Writes `texts` as JSON lines in `scratch`, runs
///   node tests/tokenizer/<script> <args> INPUT OUTPUT
/// (`args` shell-quoted by the caller) and compares `encode`'s ids of each
/// text with the reference's, reporting the first differing token of each
/// of the first 5 differing texts.
inline void expect_same_ids_as_js(const std::function<Ids(const std::string&)>& encode,
                                  const std::string& script, const std::string& args,
                                  const std::vector<std::string>& texts,
                                  const std::filesystem::path& scratch) {
  const std::filesystem::path input = scratch / "input.jsonl", output = scratch / "reference.ids";
  {
    std::ofstream jsonl(input, std::ios::binary);
    for (const std::string& text : texts) jsonl << nlohmann::json{{"text", text}}.dump() << "\n";
  }
  const std::filesystem::path source_dir = MESHTRON_SOURCE_DIR;
  const std::string command =
      shell_quote(MESHTRON_NODE_EXECUTABLE) + " " +
      shell_quote((source_dir / "tests/tokenizer" / script).string()) + " " + args + " " +
      shell_quote(input.string()) + " " + shell_quote(output.string());
  ASSERT_EQ(std::system(command.c_str()), 0) << "failed: " << command;
  const std::vector<Ids> reference = read_id_lines(output);
  ASSERT_EQ(reference.size(), texts.size());
  int reported = 0;
  for (std::size_t d = 0; d < texts.size() && reported < 5; ++d) {
    const Ids ours = encode(texts[d]);
    if (ours == reference[d]) continue;
    ++reported;
    std::size_t at = 0;
    while (at < ours.size() && at < reference[d].size() && ours[at] == reference[d][at]) ++at;
    ADD_FAILURE() << "text " << d << " "
                  << nlohmann::json(texts[d]).dump(-1, ' ', false,
                                                   nlohmann::json::error_handler_t::replace)
                  << ": ids differ at token " << at << " (ours " << ours.size()
                  << " tokens, reference " << reference[d].size() << ")";
  }
}

}  // namespace meshtron::data::testing_data
