// Where the tokenizer tests find the fetched GPT-2 vocabulary and corpus
// (tools/fetch-corpus.sh), shared by the tokenizer test binaries.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.hpp"

namespace meshtron::data::testing_data {

/// $MESHTRON_DATA_DIR, or <repo>/data.
inline std::filesystem::path data_dir() {
  const char* env = std::getenv("MESHTRON_DATA_DIR");
  return env && *env ? std::filesystem::path(env)
                     : std::filesystem::path(MESHTRON_SOURCE_DIR) / "data";
}

/// GPT-2's tokenizer from data_dir(), or null when the files were not fetched.
inline std::unique_ptr<Gpt2Tokenizer> load_gpt2_vocab() {
  const std::filesystem::path dir = data_dir();
  if (!std::filesystem::exists(dir / "encoder.json") || !std::filesystem::exists(dir / "vocab.bpe"))
    return nullptr;
  return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::from_openai(
      (dir / "encoder.json").string(), (dir / "vocab.bpe").string()));
}

// Helpers of the comparisons with the JavaScript references.

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return std::move(contents).str();
}

inline std::string shell_quote(const std::string& s) {
  std::string quoted = "'";
  for (char c : s) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

/// One line of ids per document, as reference_encode.js writes them.
inline std::vector<std::vector<int32_t>> read_id_lines(const std::filesystem::path& path) {
  std::vector<std::vector<int32_t>> documents;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::vector<int32_t> ids;
    for (int32_t id; fields >> id;) ids.push_back(id);
    documents.push_back(std::move(ids));
  }
  return documents;
}

inline std::vector<std::string> jsonl_texts(const std::filesystem::path& path) {
  std::vector<std::string> texts;
  std::ifstream in(path, std::ios::binary);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return texts;
}

}  // namespace meshtron::data::testing_data
