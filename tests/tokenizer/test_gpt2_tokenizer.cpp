// Unit tests of the GPT-2 tokenizer.
//
// Without data: bytes_to_unicode, the UTF-8 replacement (Unicode table 3-8),
// the pre-tokenizer split, BPE round order and loader errors on a small
// hand-made vocabulary whose answers are worked out by hand below.
// With the real GPT-2 vocabulary (tools/fetch-corpus.sh; skipped otherwise):
// well-known ids and decode(encode(x)) == x on hard strings.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "tokenizer_test_data.hpp"

namespace fs = std::filesystem;
using meshtron::UserError;
using meshtron::data::bytes_to_unicode;
using meshtron::data::Gpt2Pretokenizer;
using meshtron::data::Gpt2Tokenizer;
using meshtron::data::is_valid_utf8;
using meshtron::data::replace_invalid_utf8;
using Ids = std::vector<int32_t>;
using Words = std::vector<std::string_view>;

namespace {

using meshtron::data::testing_data::data_dir;

/// A scratch folder removed at the end of the test.
struct ScratchDir {
  fs::path path = fs::temp_directory_path() /
                  ("meshtron_tokenizer_" + std::to_string(::getpid()) + "_" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  ScratchDir() { fs::create_directories(path); }
  ~ScratchDir() { fs::remove_all(path); }
  fs::path write(const std::string& name, const std::string& contents) const {
    std::ofstream(path / name, std::ios::binary) << contents;
    return path / name;
  }
};

std::string utf8_of(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

/// encoder.json text with the 256 byte tokens (ids 0..255, in byte order),
/// then `extra` tokens (raw bytes, ASCII here) and <|endoftext|>.
std::string tiny_vocab_json(const std::vector<std::string>& extra) {
  const auto map = bytes_to_unicode();
  std::string json = "{";
  int id = 0;
  auto add = [&](const std::string& token) {
    json += (id ? "," : "") + std::string("\"");
    for (char c : token) {
      if (c == '"' || c == '\\') json += '\\';
      json += c;
    }
    json += "\":" + std::to_string(id++);
  };
  for (int b = 0; b < 256; ++b) add(utf8_of(map[b]));
  for (const auto& token : extra) add(token);
  add("<|endoftext|>");
  return json + "}";
}

}  // namespace

// ------------------------------------------------------------ no data ---

TEST(Gpt2BytesToUnicode, MatchesGpt2Table) {
  const auto map = bytes_to_unicode();
  EXPECT_EQ(map['!'], U'!');
  EXPECT_EQ(map['~'], U'~');
  EXPECT_EQ(map[0xA1], U'\u00A1');
  EXPECT_EQ(map[0xFF], U'\u00FF');
  EXPECT_EQ(map[0x00], U'\u0100');   // first byte that is not printable
  EXPECT_EQ(map[' '], U'\u0120');    // the 'Ġ' of " the" in vocab.bpe
  EXPECT_EQ(map['\n'], U'\u010A');   // 'Ċ'
  EXPECT_EQ(map[0xAD], U'\u0143');   // soft hyphen: the 68th and last extra
  std::vector<char32_t> sorted(map.begin(), map.end());
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end()) << "not a bijection";
}

TEST(Gpt2Utf8, ReplacesMaximalSubpartsAsUnicodeTable3_8) {
  // The example of Unicode 15, section 3.9, table 3-8.
  const std::string bad = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_FALSE(is_valid_utf8(bad));
  EXPECT_EQ(replace_invalid_utf8(bad),
            "a" + fffd + fffd + fffd + "b" + fffd + "c" + fffd + fffd + "d");
}

TEST(Gpt2Utf8, RejectsSurrogatesOverlongsAndOutOfRange) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), fffd + fffd + fffd);  // U+D800
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), fffd + fffd);             // overlong '/'
  EXPECT_EQ(replace_invalid_utf8("\xE0\x80\xAF"), fffd + fffd + fffd);  // overlong
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);
  EXPECT_EQ(replace_invalid_utf8("x\xF0\x9F\x98"), "x" + fffd);          // cut emoji
  EXPECT_EQ(replace_invalid_utf8("\xFF\xFE"), fffd + fffd);
  const std::string good = "a\xC2\xA0\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF";
  EXPECT_TRUE(is_valid_utf8(good));
  EXPECT_EQ(replace_invalid_utf8(good), good);
}

TEST(Gpt2Pretokenizer, SplitsLikeGpt2Regex) {
  Gpt2Pretokenizer pre;
  EXPECT_EQ(pre.split("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(pre.split("I'm  here"), (Words{"I", "'m", " ", " here"}));
  EXPECT_EQ(pre.split("they'll 'LL"), (Words{"they", "'ll", " '", "LL"}));
  EXPECT_EQ(pre.split("abc123 4.5!?"), (Words{"abc", "123", " 4", ".", "5", "!?"}));
  // \s+(?!\S) leaves the last space to start the next word.
  EXPECT_EQ(pre.split("a  \n b"), (Words{"a", "  \n", " b"}));
  EXPECT_EQ(pre.split("end   "), (Words{"end", "   "}));
  EXPECT_EQ(pre.split(""), Words{});
}

TEST(Gpt2Pretokenizer, UsesEcmaScriptWhiteSpace) {
  Gpt2Pretokenizer pre;
  // U+FEFF is \s in JavaScript (so "\uFEFF!" is two words) but not in
  // PCRE2's UCP \s (where it would join "!" as one punctuation word).
  EXPECT_EQ(pre.split("a\xEF\xBB\xBF!"), (Words{"a", "\xEF\xBB\xBF", "!"}));
  // NBSP is white space in both, and not the ' ' that prefixes a word.
  EXPECT_EQ(pre.split("x\xC2\xA0y"), (Words{"x", "\xC2\xA0", "y"}));
  // U+0085 (NEL) is not white space in JavaScript: it is punctuation here.
  EXPECT_EQ(pre.split("x \xC2\x85y"), (Words{"x", " \xC2\x85", "y"}));
}

TEST(Gpt2Pretokenizer, LongRunsDoNotOverflowTheMatcher) {
  Gpt2Pretokenizer pre;
  const std::string text = std::string(1 << 20, ' ') + "x";
  const auto words = pre.split(text);  // views into text
  ASSERT_EQ(words.size(), 2u);
  EXPECT_EQ(words[0].size(), text.size() - 2);
  EXPECT_EQ(words[1], " x");
}

// A vocabulary small enough to work BPE out by hand. Ids: bytes 0..255 in
// byte order (so 'a' = 97), then the extra tokens from 256 on.
class TinyVocab : public ::testing::Test {
 protected:
  Gpt2Tokenizer load(const std::vector<std::string>& extra, const std::string& merges) {
    const auto vocab = scratch_.write("encoder.json", tiny_vocab_json(extra));
    const auto bpe = scratch_.write("vocab.bpe", "#version: 0.2\n" + merges);
    return Gpt2Tokenizer::from_openai(vocab.string(), bpe.string());
  }
  ScratchDir scratch_;
};

TEST_F(TinyVocab, MergesLowestRankFirst) {
  // ranks: (a,b)=0 -> ab(256), (b,c)=1 -> bc(257), (ab,c)=2 -> abc(258)
  auto tok = load({"ab", "bc", "abc"}, "a b\nb c\nab c\n");
  EXPECT_EQ(tok.vocab_size(), 256 + 3 + 1);
  EXPECT_EQ(tok.eod_id(), 259);
  EXPECT_EQ(tok.encode("abc"), (Ids{258}));        // ab first, then ab+c
  EXPECT_EQ(tok.encode("bcab"), (Ids{257, 256}));  // both pairs merge
  EXPECT_EQ(tok.encode("abab"), (Ids{256, 256}));
  EXPECT_EQ(tok.encode("x"), (Ids{'x'}));
  EXPECT_EQ(tok.encode("ab ab"), (Ids{256, ' ', 256}));  // words "ab" and " ab"
}

TEST_F(TinyVocab, MergesAllOccurrencesOfARankBeforeTheNext) {
  // (ab,a) has a lower rank than (a,b), which creates ab. encoder.py merges
  // every (a,b) of "abab" in one round, giving [ab, ab]; merging the
  // low-ranked (ab,a) as soon as it appears would give [aba, b] instead.
  auto tok = load({"ab", "aba"}, "ab a\na b\n");
  EXPECT_EQ(tok.encode("abab"), (Ids{256, 256}));
  EXPECT_EQ(tok.encode("aba"), (Ids{257}));  // round (a,b), then round (ab,a)
}

TEST_F(TinyVocab, OverlappingPairsMergeLeftToRight) {
  auto tok = load({"aa"}, "a a\n");
  EXPECT_EQ(tok.encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(tok.encode("aaaa"), (Ids{256, 256}));
}

TEST_F(TinyVocab, PairsAreComparedExactlyNotAsJoinedStrings) {
  // Symbols ["#,", "%"] must not match the merge ("#", ",%") although both
  // join to "#,,%" (the JavaScript reference's object key).
  auto tok = load({"#,", ",%", "#,%"}, "# ,\n# ,%\n");
  EXPECT_EQ(tok.encode("#,%"), (Ids{256, '%'}));
}

TEST_F(TinyVocab, InvalidUtf8IsEncodedAsReplacementCharacter) {
  auto tok = load({"ab"}, "a b\n");
  EXPECT_EQ(tok.encode("ab\xFF"), tok.encode("ab\xEF\xBF\xBD"));
  EXPECT_EQ(tok.decode(tok.encode("a\xC0\xAF")), "a\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_F(TinyVocab, DecodeRejectsIdsOutsideTheVocabulary) {
  auto tok = load({"ab"}, "a b\n");
  EXPECT_EQ(tok.decode(Ids{256, 'c'}), "abc");
  EXPECT_THROW(tok.decode(Ids{257 + 1}), UserError);
  EXPECT_THROW(tok.decode(Ids{-1}), UserError);
}

TEST_F(TinyVocab, CacheDoesNotChangeResults) {
  auto tok = load({"ab", "bc", "abc"}, "a b\nb c\nab c\n");
  const Ids first = tok.encode("abc bcab abc");
  EXPECT_GT(tok.cache_size(), 0u);
  EXPECT_EQ(tok.encode("abc bcab abc"), first);
  tok.set_cache_limit(1);
  EXPECT_EQ(tok.encode("abc bcab abc"), first);
  EXPECT_LE(tok.cache_size(), 1u);
  tok.clear_cache();
  EXPECT_EQ(tok.cache_size(), 0u);
  EXPECT_EQ(tok.encode("abc bcab abc"), first);
}

namespace {
/// Runs `load` and returns the UserError message ("" if none was thrown).
template <class Load>
std::string user_error_of(Load&& load) {
  try {
    load();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Gpt2TokenizerLoad, MissingOrCorruptFilesNameTheFile) {
  ScratchDir scratch;
  const std::string vocab = scratch.write("vocab.json", tiny_vocab_json({"ab"})).string();
  const std::string merges = scratch.write("merges.txt", "#version: 0.2\na b\n").string();
  EXPECT_NO_THROW(Gpt2Tokenizer::from_huggingface(vocab, merges));

  const std::string missing = (scratch.path / "nope.json").string();
  EXPECT_NE(user_error_of([&] { Gpt2Tokenizer::from_openai(missing, merges); }).find(missing),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { Gpt2Tokenizer::from_openai(vocab, missing); }).find(missing),
            std::string::npos);

  const std::string truncated = scratch.write("cut.json", "{\"a\": 1, \"b\"").string();
  const std::string message = user_error_of([&] { Gpt2Tokenizer::from_openai(truncated, merges); });
  EXPECT_NE(message.find(truncated), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;

  const std::string no_bytes = scratch.write("few.json", "{\"a\": 0, \"<|endoftext|>\": 1}").string();
  EXPECT_NE(user_error_of([&] { Gpt2Tokenizer::from_openai(no_bytes, merges); }).find(no_bytes),
            std::string::npos);

  const std::string three = scratch.write("bad.bpe", "#version: 0.2\na b\na b c\n").string();
  const std::string bad_line = user_error_of([&] { Gpt2Tokenizer::from_openai(vocab, three); });
  EXPECT_NE(bad_line.find(three + "' line 3"), std::string::npos) << bad_line;

  const std::string unknown = scratch.write("unknown.bpe", "#version: 0.2\nb c\n").string();
  EXPECT_NE(user_error_of([&] { Gpt2Tokenizer::from_openai(vocab, unknown); }).find(unknown),
            std::string::npos);
}

// ------------------------------------------------- real GPT-2 vocabulary ---

class Gpt2Vocab : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = meshtron::data::testing_data::load_gpt2_vocab().release(); }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (!tokenizer_)
      GTEST_SKIP() << "no GPT-2 vocabulary in " << data_dir() << " (run tools/fetch-corpus.sh)";
  }
  static Gpt2Tokenizer* tokenizer_;  // Owned.
};
Gpt2Tokenizer* Gpt2Vocab::tokenizer_ = nullptr;

TEST_F(Gpt2Vocab, KnownIds) {
  Gpt2Tokenizer& tok = *tokenizer_;
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eod_id(), 50256);
  EXPECT_EQ(tok.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok.encode("!"), (Ids{0}));
  EXPECT_EQ(tok.encode(" the"), (Ids{262}));
  EXPECT_EQ(tok.encode("The"), (Ids{464}));
  EXPECT_EQ(tok.encode(","), (Ids{11}));
  EXPECT_EQ(tok.encode("\n"), (Ids{198}));
  EXPECT_EQ(tok.encode(""), Ids{});
  // The separator is only an id; as text it is ordinary characters.
  EXPECT_EQ(tok.encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(tok.decode(Ids{tok.eod_id()}), "<|endoftext|>");
}

TEST_F(Gpt2Vocab, RoundTripsHardStrings) {
  Gpt2Tokenizer& tok = *tokenizer_;
  const std::vector<std::string> hard = {
      "I'm can't we've they'll she'd you're it's I'M CAN'T 'S 'T 'RE rock'n'roll",
      "3.14159 2,718 1e-10 007 12345678901234567890 \xC2\xBD \xD9\xA3\xD9\xA4",
      "\xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9"
      "\xE2\x80\x8D\xF0\x9F\x91\xA7 \xF0\x9F\x87\xBA\xF0\x9F\x87\xB3",  // emoji, ZWJ, flag
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xE4\xB8\xAD\xE6\x96\x87 "
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",                              // CJK, Hangul
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7"
      "\xD9\x84\xD9\x85",                                                 // Arabic
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80!",  // Cyrillic
      "   leading   and trailing   ",
      "tabs\t\tand\nnewlines\r\n\n\n \t \n",
      "<|endoftext|>",
      "<|endoftext|>text<|endoftext|>",
      "e\xCC\x81 \xC2\xA0nbsp \xE3\x80\x80ideographic \xEF\xBB\xBF bom",
      std::string(3000, ' ') + std::string(3000, '-') + std::string(3000, 'a'),
      std::string("nul\0byte", 8),
  };
  for (const std::string& text : hard) {
    const Ids ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text) << "text: " << text.substr(0, 80);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
  }
}

TEST_F(Gpt2Vocab, RoundTripsRandomValidUtf8) {
  Gpt2Tokenizer& tok = *tokenizer_;
  // Code points from several scripts, ASCII and white space, emoji.
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E}, {0xA0, 0x24F}, {0x400, 0x4FF}, {0x600, 0x6FF},
      {0x3040, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x2000, 0x206F}};
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    for (int i = 0; i < 200; ++i) {
      const auto [lo, hi] = ranges[rng() % ranges.size()];
      const int kind = rng() % 10;
      if (kind == 0) text += " \t\n"[rng() % 3];
      else if (kind == 1) text += "\xF0\x9F\x98\x80";  // U+1F600
      else text += utf8_of(lo + rng() % (hi - lo + 1));
    }
    ASSERT_TRUE(is_valid_utf8(text));
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
  }
}
