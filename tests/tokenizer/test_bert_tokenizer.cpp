// BERT WordPiece (data.tokenizer = bert_wordpiece_lowercase | _cased) on a
// small hand-made vocabulary: the basic tokenizer's steps, WordPiece, the
// special ids, decode, and the one-line errors of a bad vocab.txt. The last
// case checks bert-base-uncased's ids when tools/fetch-corpus.sh has run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "data/bert_tokenizer.hpp"
#include "tokenizer_test_data.hpp"

namespace fs = std::filesystem;
using meshtron::UserError;
using meshtron::data::BertWordPieceTokenizer;
using Ids = std::vector<int32_t>;
using Words = std::vector<std::string>;

namespace {

// Ids are line numbers: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, ...
const std::vector<std::string> kVocab = {
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "hello", "world",
    ",",     "!",     "cafe",  "café",  "中",      "文",  "a",     "##b",    "Hello", "σος"};

class BertTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("meshtron_bert_tok_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_vocab(const std::vector<std::string>& lines, const std::string& name = "v.txt") {
    const fs::path path = dir_ / name;
    std::ofstream out(path, std::ios::binary);
    for (const std::string& line : lines) out << line << "\n";
    return path.string();
  }
  /// The message of the UserError that loading `path` throws.
  static std::string load_error(const std::string& path) {
    try {
      BertWordPieceTokenizer tok(path, true);
    } catch (const UserError& e) {
      return e.what();
    }
    return "(no error)";
  }

  fs::path dir_;
};

TEST_F(BertTokenizerTest, BasicTokenizerLowercase) {
  BertWordPieceTokenizer tok(write_vocab(kVocab), true);
  EXPECT_EQ(tok.basic_tokens(" Héllo,WORLD!\t中文x  "),
            (Words{"hello", ",", "world", "!", "中", "文", "x"}));
  // Control characters vanish, other white space separates.
  EXPECT_EQ(tok.basic_tokens(std::string("a\x01") + "b\xc2\xa0" + "c\xe2\x80\xa8" + "d"),
            (Words{"ab", "c", "d"}));
  // Decomposed accents are stripped like composed ones; final sigma.
  EXPECT_EQ(tok.basic_tokens("Cafe\xcc\x81 ΣΟΣ"), (Words{"cafe", "σος"}));
}

TEST_F(BertTokenizerTest, BasicTokenizerCasedKeepsCaseAndAccents) {
  BertWordPieceTokenizer tok(write_vocab(kVocab), false);
  EXPECT_EQ(tok.basic_tokens("Héllo,WORLD! $5"), (Words{"Héllo", ",", "WORLD", "!", "$", "5"}));
}

TEST_F(BertTokenizerTest, GreedyLongestMatchWordPiece) {
  BertWordPieceTokenizer tok(write_vocab(kVocab), true);
  EXPECT_EQ(tok.encode("unaffable"), (Ids{5, 6, 7}));
  EXPECT_EQ(tok.encode("Hello, world!"), (Ids{8, 10, 9, 11}));
  EXPECT_EQ(tok.encode("café CAFÉ"), (Ids{12, 12}));  // accents stripped
  EXPECT_EQ(tok.encode("abb unaffx"), (Ids{16, 17, 17, 1}));  // no ##x: the whole word is [UNK]
  EXPECT_EQ(tok.encode(std::string(100, 'a')), Ids{1});   // a ##a... : no ##a in the vocab
  EXPECT_EQ(tok.encode("a" + std::string(100, 'b')), Ids{1});  // 101 characters: [UNK]
  EXPECT_EQ(tok.encode("a" + std::string(99, 'b')).size(), 100u);
  BertWordPieceTokenizer cased(write_vocab(kVocab), false);
  EXPECT_EQ(cased.encode("Hello café"), (Ids{18, 13}));
}

TEST_F(BertTokenizerTest, SpecialIdsEodAndVocabularySize) {
  BertWordPieceTokenizer tok(write_vocab(kVocab), true);
  const auto& s = meshtron::data::bert_special_ids(tok);
  EXPECT_EQ(s.pad, 0);
  EXPECT_EQ(s.unk, 1);
  EXPECT_EQ(s.cls, 2);
  EXPECT_EQ(s.sep, 3);
  EXPECT_EQ(s.mask, 4);
  // As Megatron: [BOS] and [EOS] appended, [EOS] is the EOD, no BOS is used.
  EXPECT_EQ(s.bos, int32_t(kVocab.size()));
  EXPECT_EQ(s.eos, int32_t(kVocab.size()) + 1);
  EXPECT_EQ(tok.vocab_size(), int32_t(kVocab.size()) + 2);
  EXPECT_EQ(tok.eod_id(), s.eos);
  EXPECT_EQ(tok.bos_id(), -1);

  std::vector<std::string> with_eos = kVocab;
  with_eos.push_back("[EOS]");
  BertWordPieceTokenizer own(write_vocab(with_eos, "eos.txt"), true);
  EXPECT_EQ(own.eod_id(), int32_t(kVocab.size()));
  EXPECT_EQ(own.vocab_size(), int32_t(kVocab.size()) + 2);  // [BOS] only appended
}

TEST_F(BertTokenizerTest, FactoryAndMegatronAliases) {
  const std::string vocab = write_vocab(kVocab);
  for (const char* type : {"bert_wordpiece_lowercase", "BertWordPieceLowerCase"}) {
    auto tok = meshtron::data::load_tokenizer({.type = type, .vocab_file = vocab});
    EXPECT_EQ(tok->name(), "bert_wordpiece_lowercase");
    EXPECT_EQ(tok->encode("HELLO"), Ids{8});
  }
  for (const char* type : {"bert_wordpiece_cased", "BertWordPieceCase"}) {
    auto tok = meshtron::data::load_tokenizer({.type = type, .vocab_file = vocab});
    EXPECT_EQ(tok->name(), "bert_wordpiece_cased");
    EXPECT_EQ(tok->encode("HELLO"), Ids{1});
  }
  EXPECT_TRUE(meshtron::data::tokenizer_files_exist({.type = "BertWordPieceCase", .vocab_file = vocab}));
  EXPECT_FALSE(meshtron::data::tokenizer_files_exist(
      {.type = "bert_wordpiece_cased", .vocab_file = (dir_ / "none.txt").string()}));
}

TEST_F(BertTokenizerTest, DecodeGluesContinuations) {
  BertWordPieceTokenizer tok(write_vocab(kVocab), true);
  EXPECT_EQ(tok.decode(tok.encode("Unaffable, hello!")), "unaffable , hello !");
  EXPECT_THROW(tok.decode(Ids{tok.vocab_size()}), UserError);
}

TEST_F(BertTokenizerTest, BadVocabularyIsOneLineNamingTheFile) {
  const std::string missing = (dir_ / "missing.txt").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {missing, "cannot open BERT vocabulary"},
      {write_vocab({}, "empty.txt"), "is empty"},
      {write_vocab({"[PAD]", "", "[UNK]"}, "blank.txt"), "line 2 is empty"},
      {write_vocab({"[PAD]", "a", "a"}, "dup.txt"), "line 3 repeats the token 'a'"},
      {write_vocab({"[PAD]", "[UNK]", "[CLS]", "[SEP]"}, "nomask.txt"), "has no [MASK] token"},
      {write_vocab({"[PAD]", "\xff\xfe"}, "latin1.txt"), "line 2 is not UTF-8"},
  };
  for (const auto& [path, expected] : cases) {
    const std::string message = load_error(path);
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST_F(BertTokenizerTest, BertBaseUncasedIds) {
  const fs::path vocab = meshtron::data::testing_data::data_dir() / "bert-base-uncased-vocab.txt";
  if (!fs::exists(vocab)) GTEST_SKIP() << "no " << vocab << " (run tools/fetch-corpus.sh)";
  BertWordPieceTokenizer tok(vocab.string(), true);
  EXPECT_EQ(tok.vocab_size(), 30524);  // Megatron's "padded vocab (size: 30524)"
  const auto& s = tok.special_ids();
  EXPECT_EQ((Ids{s.pad, s.unk, s.cls, s.sep, s.mask, s.bos, s.eos}),
            (Ids{0, 100, 101, 102, 103, 30522, 30523}));
  EXPECT_EQ(tok.encode("Hello, World! I like strawberries."),
            (Ids{7592, 1010, 2088, 999, 1045, 2066, 13137, 20968, 1012}));
}

}  // namespace
