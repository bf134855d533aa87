// Where the tokenizer tests find the fetched GPT-2 vocabulary and corpus
// (tools/fetch-corpus.sh), shared by both tokenizer test binaries.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>

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

}  // namespace meshtron::data::testing_data
