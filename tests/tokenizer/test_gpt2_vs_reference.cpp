// Compares meshtron's GPT-2 token ids with the reference JavaScript encoder
// (npm gpt-3-encoder, run under node by reference_encode.js) on:
//   - the whole Brown corpus (data/brown.jsonl, one document per line),
//   - tests/tokenizer/hard_strings.txt, as one text and line by line,
//   - random bytes, a third of them invalid UTF-8 (both sides replace
//     maximal ill-formed subparts with U+FFFD).
// Every case skips when tools/fetch-corpus.sh has not been run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.hpp"
#include "tokenizer_test_data.hpp"

namespace fs = std::filesystem;
using meshtron::data::Gpt2Tokenizer;
using Ids = std::vector<int32_t>;

namespace {

const fs::path kSourceDir = MESHTRON_SOURCE_DIR;

using meshtron::data::testing_data::data_dir;

using namespace meshtron::data::testing_data;

class ReferenceEncoder : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = meshtron::data::testing_data::load_gpt2_vocab().release(); }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }

  void SetUp() override {
    if (!tokenizer_ || !fs::exists(encoder_dir_ / "Encoder.js"))
      GTEST_SKIP() << "no GPT-2 vocabulary or gpt-3-encoder in " << data_dir()
                   << " (run tools/fetch-corpus.sh)";
    scratch_ = fs::temp_directory_path() /
               ("meshtron_tokenizer_vs_js_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(scratch_);
  }
  void TearDown() override {
    if (!scratch_.empty()) fs::remove_all(scratch_);
  }

  /// Ids of the JavaScript encoder for `input` in mode "text" or "jsonl".
  std::vector<Ids> reference_ids(const std::string& mode, const fs::path& input) const {
    const fs::path output = scratch_ / "reference.ids";
    const std::string command =
        shell_quote(MESHTRON_NODE_EXECUTABLE) + " " +
        shell_quote((kSourceDir / "tests/tokenizer/reference_encode.js").string()) + " " +
        shell_quote(encoder_dir_.string()) + " " + mode + " " + shell_quote(input.string()) +
        " " + shell_quote(output.string());
    const int status = std::system(command.c_str());
    EXPECT_EQ(status, 0) << "failed: " << command;
    return read_id_lines(output);
  }

  /// Encodes each text and compares with the reference, reporting the first
  /// differing position of each of the first few differing documents.
  void expect_same_ids(const std::vector<std::string>& texts,
                       const std::vector<Ids>& reference) const {
    ASSERT_EQ(texts.size(), reference.size());
    int reported = 0;
    for (std::size_t d = 0; d < texts.size() && reported < 5; ++d) {
      const Ids ours = tokenizer_->encode(texts[d]);
      if (ours == reference[d]) continue;
      ++reported;
      std::size_t at = 0;
      while (at < ours.size() && at < reference[d].size() && ours[at] == reference[d][at]) ++at;
      const std::size_t from = at >= 3 ? at - 3 : 0;
      const auto window = [&](const Ids& ids) {
        std::ostringstream s;
        for (std::size_t i = from; i < std::min(ids.size(), at + 4); ++i)
          s << ids[i] << "(" << nlohmann::json(tokenizer_->token_bytes(ids[i])).dump(
                                    -1, ' ', false, nlohmann::json::error_handler_t::replace)
            << ") ";
        return s.str();
      };
      ADD_FAILURE() << "document " << d << ": ids differ at token " << at << " of "
                    << ours.size() << " (reference has " << reference[d].size() << ")\n"
                    << "  ours:      " << window(ours) << "\n  reference: "
                    << window(reference[d]);
    }
  }

  static Gpt2Tokenizer* tokenizer_;  // Owned.
  const fs::path encoder_dir_ = data_dir() / "gpt-3-encoder";
  fs::path scratch_;
};
Gpt2Tokenizer* ReferenceEncoder::tokenizer_ = nullptr;

}  // namespace

TEST_F(ReferenceEncoder, BrownCorpus) {
  const fs::path corpus = data_dir() / "brown.jsonl";
  if (!fs::exists(corpus)) GTEST_SKIP() << "no " << corpus << " (run tools/fetch-corpus.sh)";
  const std::vector<std::string> texts = jsonl_texts(corpus);
  EXPECT_EQ(texts.size(), 500u);
  expect_same_ids(texts, reference_ids("jsonl", corpus));
}

TEST_F(ReferenceEncoder, HardStringsAsOneText) {
  const fs::path hard = kSourceDir / "tests/tokenizer/hard_strings.txt";
  expect_same_ids({read_bytes(hard)}, reference_ids("text", hard));
}

TEST_F(ReferenceEncoder, HardStringsLineByLine) {
  std::vector<std::string> lines;
  std::istringstream in(read_bytes(kSourceDir / "tests/tokenizer/hard_strings.txt"));
  std::ofstream jsonl(scratch_ / "hard.jsonl", std::ios::binary);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    lines.push_back(line);
    jsonl << nlohmann::json{{"text", line}}.dump() << "\n";
  }
  jsonl.close();
  expect_same_ids(lines, reference_ids("jsonl", scratch_ / "hard.jsonl"));
}

TEST_F(ReferenceEncoder, RandomBytesWithInvalidUtf8) {
  // Words, spaces, multi-byte characters and stray bytes, in chunks, so that
  // invalid sequences appear inside and between words.
  const std::vector<std::string> pieces = {
      "the", " cat", "'s", " ", "  ", "\n", "\t", "123", ",", "\xC3\xA9", "\xE6\x97\xA5",
      "\xF0\x9F\x98\x80", "\xD0\x96", "\xE2\x80\x83"};
  std::mt19937 rng(20240601);
  std::string text;
  while (text.size() < (1u << 14)) {
    if (rng() % 3 == 0) {
      text += static_cast<char>(0x80 + rng() % 0x80);  // continuation or lead byte
    } else {
      text += pieces[rng() % pieces.size()];
    }
  }
  const fs::path input = scratch_ / "random.txt";
  std::ofstream(input, std::ios::binary) << text;
  ASSERT_FALSE(meshtron::data::is_valid_utf8(text));
  expect_same_ids({text}, reference_ids("text", input));
}
