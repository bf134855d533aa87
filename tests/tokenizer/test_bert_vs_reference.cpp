// Compares meshtron's BERT WordPiece ids (bert-base-uncased's vocab.txt from
// tools/fetch-corpus.sh) in both variants with the JavaScript runtime of npm
// @lenml/tokenizers (transformers.js' BertNormalizer, BertPreTokenizer and
// WordPiece), run under node by reference_encode_bert.js, on
// hard_strings.txt, bert_hard_strings.jsonl (accents, CJK, punctuation,
// long words, control characters) and the first 50 Brown documents. Every
// case skips when the data has not been fetched.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/bert_tokenizer.hpp"
#include "js_reference.hpp"

namespace fs = std::filesystem;
using meshtron::data::BertWordPieceTokenizer;
using namespace meshtron::data::testing_data;

namespace {

const fs::path kSourceDir = MESHTRON_SOURCE_DIR;

fs::path vocab_file() { return data_dir() / "bert-base-uncased-vocab.txt"; }

class BertReference : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!fs::exists(vocab_file()) || !fs::exists(data_dir() / "lenml-tokenizers" / "dist" / "main.js"))
      GTEST_SKIP() << "no bert-base-uncased-vocab.txt or @lenml/tokenizers in " << data_dir()
                   << " (run tools/fetch-corpus.sh)";
    tokenizer_ = std::make_unique<BertWordPieceTokenizer>(vocab_file().string(), GetParam());
    scratch_ = fs::temp_directory_path() /
               ("meshtron_tokenizer_bert_vs_js_" + std::to_string(::getpid()) + "_" +
                std::to_string(GetParam()));
    fs::create_directories(scratch_);
  }
  void TearDown() override {
    if (!scratch_.empty()) fs::remove_all(scratch_);
  }

  void expect_same_ids(const std::vector<std::string>& texts) const {
    const std::string args = shell_quote(data_dir().string()) + " " +
                             shell_quote(vocab_file().string()) + " " +
                             (GetParam() ? "lowercase" : "cased");
    expect_same_ids_as_js([this](const std::string& text) { return tokenizer_->encode(text); },
                          "reference_encode_bert.js", args, texts, scratch_);
  }

  std::unique_ptr<BertWordPieceTokenizer> tokenizer_;
  fs::path scratch_;
};

TEST_P(BertReference, HardStrings) {
  const std::vector<std::string> texts = hard_string_lines();
  ASSERT_GT(texts.size(), 20u);
  expect_same_ids(texts);
}

TEST_P(BertReference, BertHardStrings) {
  const std::vector<std::string> texts =
      jsonl_texts(kSourceDir / "tests/tokenizer/bert_hard_strings.jsonl");
  ASSERT_GT(texts.size(), 20u);
  expect_same_ids(texts);
}

TEST_P(BertReference, BrownCorpusSlice) {
  const fs::path corpus = data_dir() / "brown.jsonl";
  if (!fs::exists(corpus)) GTEST_SKIP() << "no " << corpus << " (run tools/fetch-corpus.sh)";
  std::vector<std::string> texts = jsonl_texts(corpus);
  texts.resize(std::min<std::size_t>(texts.size(), 50));
  expect_same_ids(texts);
}

INSTANTIATE_TEST_SUITE_P(Variants, BertReference, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "lowercase" : "cased"; });

}  // namespace
