// meshtron's BERT WordPiece ids equal transformers' BertTokenizer's:
// validation/bert-tokenizer-golden/ids.json, made by
// validation/make_bert_tokenizer_golden.py on bert-base-uncased's vocab.txt
// (data/, tools/fetch-corpus.sh; skips without it, and fails if the file
// differs from the one the golden ids were made with).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/bert_tokenizer.hpp"
#include "tokenizer_test_data.hpp"

namespace fs = std::filesystem;
using namespace meshtron::data::testing_data;
using Ids = std::vector<int32_t>;

namespace {

const fs::path kSourceDir = MESHTRON_SOURCE_DIR;

void expect_golden(bool lower_case) {
  const fs::path vocab = data_dir() / "bert-base-uncased-vocab.txt";
  if (!fs::exists(vocab)) GTEST_SKIP() << "no " << vocab << " (run tools/fetch-corpus.sh)";
  const nlohmann::json golden = nlohmann::json::parse(
      read_bytes(kSourceDir / "validation/bert-tokenizer-golden/ids.json"));
  const nlohmann::json& g = golden.at(lower_case ? "lowercase" : "cased");
  ASSERT_GT(g.at("strings").size(), 20u);
  meshtron::data::BertWordPieceTokenizer tok(vocab.string(), lower_case);
  int reported = 0;
  for (std::size_t i = 0; i < g.at("strings").size() && reported < 5; ++i) {
    const std::string text = g.at("strings")[i].get<std::string>();
    const Ids expected = g.at("ids")[i].get<Ids>();
    // A capital sigma ending a word lowercases to the final sigma in Python's
    // str.lower() (Megatron's tokenizer, meshtron's, tokenizer_bert_vs_js);
    // transformers 5's BertTokenizer (the Rust tokenizers) maps each
    // character alone, to the medial one.
    if (lower_case && text.find("\xCE\xA3") != std::string::npos) continue;
    if (tok.encode(text) == expected) continue;
    ++reported;
    ADD_FAILURE() << "string " << i << " " << nlohmann::json(text).dump() << " differs";
  }
}

TEST(BertGolden, Lowercase) { expect_golden(true); }
TEST(BertGolden, Cased) { expect_golden(false); }

}  // namespace
