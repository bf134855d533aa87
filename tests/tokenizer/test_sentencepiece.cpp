// SentencePiece tokenizer (data.tokenizer = sentencepiece) on the Brown model
// validation/sentencepiece-brown/tokenizer.model (tools/train-sentencepiece.sh):
// ids equal those of the reference `spm_encode --output_format=id` on
// tests/tokenizer/hard_strings.txt, decode gives every string back,
// preprocess writes documents <s> ids </s> that decode to the input, and
// missing or corrupt models and decks without a model are one-line errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "common/expect_user_error.hpp"
#include "config/run_config.hpp"
#include "data/indexed_dataset.hpp"
#include "data/sentencepiece_tokenizer.hpp"
#include "data/t5_vocabulary.hpp"
#include "tokenizer_test_data.hpp"

namespace fs = std::filesystem;
using meshtron::data::SentencePieceTokenizer;
using meshtron::testing_util::expect_user_error;
using namespace meshtron::data::testing_data;
using Ids = std::vector<int32_t>;

namespace {

const fs::path kSourceDir = MESHTRON_SOURCE_DIR;
const std::string kModel = (kSourceDir / "validation/sentencepiece-brown/tokenizer.model").string();

/// Non-empty lines of hard_strings.txt, split on '\n' only.
std::vector<std::string> hard_strings() {
  std::vector<std::string> lines;
  std::istringstream in(read_bytes(kSourceDir / "tests/tokenizer/hard_strings.txt"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  return lines;
}

/// A scratch folder removed at the end of the test.
class Scratch {
 public:
  Scratch()
      : path_(fs::temp_directory_path() /
              ("meshtron_sentencepiece_" + std::to_string(::getpid()) + "_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    fs::create_directories(path_);
  }
  ~Scratch() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

TEST(SentencePiece, LoadsTheModelsVocabularyAndSpecialIds) {
  SentencePieceTokenizer tok(kModel);
  EXPECT_EQ(tok.vocab_size(), 3000);
  EXPECT_EQ(tok.bos_id(), 1);  // <s>, as Llama 2
  EXPECT_EQ(tok.eod_id(), 2);  // </s>
  EXPECT_EQ(tok.name(), "sentencepiece");
  EXPECT_EQ(tok.decode(Ids{tok.bos_id(), tok.eod_id()}), "");
}

TEST(SentencePiece, DecodeGivesEveryHardStringBack) {
  SentencePieceTokenizer tok(kModel);
  for (const std::string& text : hard_strings()) {
    Ids ids{tok.bos_id()};
    tok.encode_append(text, ids);
    ids.push_back(tok.eod_id());
    EXPECT_EQ(tok.decode(ids), text);
  }
  // All lines as one text: newlines and the pieces around them survive too.
  const std::string all = read_bytes(kSourceDir / "tests/tokenizer/hard_strings.txt");
  EXPECT_EQ(tok.decode(tok.encode(all)), all);
}

TEST(SentencePiece, UnknownCharactersFallBackToBytes) {
  // U+1F916 (robot face) is not a piece of a Brown-corpus model: four bytes.
  SentencePieceTokenizer tok(kModel);
  const Ids ids = tok.encode("\xF0\x9F\xA4\x96");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(tok.decode(ids), "\xF0\x9F\xA4\x96");
}

TEST(SentencePiece, IdsEqualThoseOfSpmEncode) {
  Scratch scratch;
  const std::vector<std::string> texts = hard_strings();
  const fs::path input = scratch.path() / "input.txt", output = scratch.path() / "ids.txt";
  {
    std::ofstream out(input, std::ios::binary);
    for (const std::string& text : texts) out << text << "\n";
  }
  const std::string command = shell_quote(MESHTRON_SPM_ENCODE) + " --model=" +
                              shell_quote(kModel) + " --output_format=id --input=" +
                              shell_quote(input.string()) + " --output=" +
                              shell_quote(output.string());
  ASSERT_EQ(std::system(command.c_str()), 0) << "failed: " << command;
  const std::vector<Ids> reference = read_id_lines(output);
  ASSERT_EQ(reference.size(), texts.size());
  SentencePieceTokenizer tok(kModel);
  for (std::size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(tok.encode(texts[i]), reference[i]) << "line " << i << ": " << texts[i];
}

TEST(SentencePiece, DecodeRejectsIdsOutsideTheVocabulary) {
  SentencePieceTokenizer tok(kModel);
  expect_user_error([&] { tok.decode(Ids{5, 3000}); }, {"3000", "outside the vocabulary"});
  expect_user_error([&] { tok.decode(Ids{-1}); }, {"-1", "outside the vocabulary"});
}

TEST(SentencePiece, MissingOrCorruptModelIsOneLine) {
  Scratch scratch;
  const std::string missing = (scratch.path() / "nope.model").string();
  expect_user_error([&] { SentencePieceTokenizer tok(missing); }, {"cannot open", missing});
  const std::string corrupt = (scratch.path() / "corrupt.model").string();
  std::ofstream(corrupt) << "not a protobuf\n\x01\x02";
  expect_user_error([&] { SentencePieceTokenizer tok(corrupt); },
                    {corrupt, "is not a SentencePiece model"});
}

TEST(TokenizerFactory, NamesAndMegatronAliases) {
  using meshtron::data::canonical_tokenizer_type;
  EXPECT_EQ(canonical_tokenizer_type("sentencepiece"), "sentencepiece");
  EXPECT_EQ(canonical_tokenizer_type("Llama2Tokenizer"), "sentencepiece");
  EXPECT_EQ(canonical_tokenizer_type("GPT2BPETokenizer"), "gpt2");
  EXPECT_EQ(canonical_tokenizer_type("hf"), "hf");
  EXPECT_EQ(canonical_tokenizer_type("SentencePieceTokenizer"), "");
  const auto tok = meshtron::data::load_tokenizer({.type = "Llama2Tokenizer", .tokenizer_model = kModel});
  EXPECT_EQ(tok->name(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 3000);
  expect_user_error(
      [&] { meshtron::data::load_tokenizer({.type = "SentencePieceTokenizer", .tokenizer_model = kModel}); },
      {"SentencePieceTokenizer", "not supported", "Llama2Tokenizer"});
  expect_user_error([&] { meshtron::data::load_tokenizer({.type = "wordpiece"}); },
                    {"unknown tokenizer 'wordpiece'"});
}

// ------------------------------------------------------------- the deck ---

TEST(SentencePieceDeck, WithoutAModelIsOneLine) {
  auto config = meshtron::RunConfig::from_text("[data]\ntokenizer = sentencepiece\n");
  expect_user_error([&] { config.validate(1); },
                    {"data.tokenizer = sentencepiece needs data.tokenizer_model"});
}

TEST(SentencePieceDeck, MissingModelFileIsOneLine) {
  auto config = meshtron::RunConfig::from_text(
      "[data]\ntokenizer = sentencepiece\ntokenizer_model = /nonexistent/tokenizer.model\n");
  config.validate(1);
  expect_user_error([&] { meshtron::app::resolve_vocab(config); },
                    {"cannot open SentencePiece model '/nonexistent/tokenizer.model'"});
}

TEST(SentencePieceDeck, VocabularyIsTheModels) {
  auto config = meshtron::RunConfig::from_text("[data]\ntokenizer = sentencepiece\ntokenizer_model = " +
                                               kModel + "\n");
  config.validate(1);
  EXPECT_EQ(meshtron::app::resolve_vocab(config), 3000);
  EXPECT_EQ(meshtron::app::load_tokenizer(config.data)->bos_id(), 1);
}

// ------------------------------------------------ T5's special ids ---

// The Brown model has no <extra_id_N> and no <pad>: the sentinels follow its
// 3000 pieces as transformers' T5Tokenizer appends them, <extra_id_0> last;
// the pad (and decoder start) is its <unk>, id 0.
TEST(SentencePieceT5, AppendsSentinelsAfterTheVocabulary) {
  SentencePieceTokenizer tok(kModel);
  const meshtron::data::SpecialTokens s = meshtron::data::t5_special_tokens(tok, 100);
  EXPECT_EQ(s.vocab_size, 3100);
  ASSERT_EQ(s.sentinels.size(), 100u);
  EXPECT_EQ(s.sentinels.front(), 3099);
  EXPECT_EQ(s.sentinels.back(), 3000);
  EXPECT_EQ(s.pad, 0);
  EXPECT_EQ(s.bos, s.pad);
  EXPECT_EQ(s.eos, 2);
  EXPECT_TRUE(s.word_continuation.empty());
  auto config = meshtron::RunConfig::from_text(
      "[model]\narch = t5\ndecoder_seq_length = 8\n[data]\ntokenizer = sentencepiece\n"
      "vocab_extra_ids = 10\ntokenizer_model = " + kModel + "\n");
  config.validate(1);
  EXPECT_EQ(meshtron::app::resolve_vocab(config), 3010);
  expect_user_error([&] { meshtron::data::t5_special_tokens(tok, 0); },
                    {"data.vocab_extra_ids > 0"});
}

// Generated ids may hold the appended sentinels: T5Tokenizer spells them as
// added tokens between the decoded pieces.
TEST(SentencePieceT5, DecodeSpellsAppendedSentinels) {
  SentencePieceTokenizer tok(kModel);
  const meshtron::data::SpecialTokens s = meshtron::data::t5_special_tokens(tok, 100);
  const Ids jury = tok.encode("The jury said");
  Ids ids{3099};
  ids.insert(ids.end(), jury.begin(), jury.end());
  ids.push_back(3000);
  EXPECT_EQ(meshtron::data::t5_decode(tok, s, ids),
            "<extra_id_0>" + tok.decode(jury) + "<extra_id_99>");
  EXPECT_EQ(meshtron::data::t5_decode(tok, s, jury), tok.decode(jury));
  EXPECT_EQ(meshtron::data::t5_decode(tok, s, Ids{}), "");
  expect_user_error([&] { meshtron::data::t5_decode(tok, s, Ids{3100}); },
                    {"token id 3100 is outside the vocabulary"});
}

// A model trained with T5's pieces (<pad>=0 </s>=1 <unk>=2 and the
// <extra_id_N> as user-defined symbols) keeps its own ids.
TEST(SentencePieceT5, UsesTheModelsOwnSentinels) {
  const std::string spm_encode = MESHTRON_SPM_ENCODE;
  if (spm_encode.empty()) GTEST_SKIP() << "no spm_train (apt-get install sentencepiece)";
  const fs::path spm_train = fs::path(spm_encode).parent_path() / "spm_train";
  Scratch scratch;
  const fs::path text = scratch.path() / "text.txt", prefix = scratch.path() / "t5";
  {
    std::ofstream out(text);
    for (int i = 0; i < 200; ++i) out << "the quick brown fox " << i << " jumps over the dog\n";
  }
  const std::string command =
      shell_quote(spm_train.string()) + " --input=" + shell_quote(text.string()) +
      " --model_prefix=" + shell_quote(prefix.string()) +
      " --vocab_size=60 --model_type=bpe --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1"
      " --user_defined_symbols=" + shell_quote("<extra_id_0>,<extra_id_1>,<extra_id_2>") +
      " --minloglevel=2";
  ASSERT_EQ(std::system(command.c_str()), 0) << "failed: " << command;
  SentencePieceTokenizer tok(prefix.string() + ".model");
  const meshtron::data::SpecialTokens s = meshtron::data::t5_special_tokens(tok, 3);
  EXPECT_EQ(s.vocab_size, tok.vocab_size());
  EXPECT_EQ(s.sentinels, (Ids{tok.piece_id("<extra_id_0>"), tok.piece_id("<extra_id_1>"),
                              tok.piece_id("<extra_id_2>")}));
  EXPECT_EQ(s.sentinels.front(), 3);  // the user-defined symbols follow the control pieces
  EXPECT_EQ(s.pad, 0);
  EXPECT_EQ(s.eos, 1);
  EXPECT_EQ(tok.piece_id("<extra_id_3>"), -1);
  expect_user_error([&] { meshtron::data::t5_special_tokens(tok, 4); },
                    {"has <extra_id_0> but not <extra_id_3>"});
}

// ----------------------------------------------------------- preprocess ---

TEST(SentencePiecePreprocess, DocumentsAreBosIdsEosAndDecodeToTheInput) {
  Scratch scratch;
  std::vector<std::string> texts = hard_strings();
  texts.push_back("");  // an empty text: <s> </s>, as Megatron's Llama2Tokenizer
  const fs::path input = scratch.path() / "input.jsonl";
  {
    std::ofstream out(input, std::ios::binary);
    for (const std::string& text : texts) out << nlohmann::json{{"text", text}}.dump() << "\n";
  }
  const std::string prefix = (scratch.path() / "out").string();
  ASSERT_EQ(meshtron::app::run_preprocess({"--input", input.string(), "--output-prefix", prefix,
                                           "--tokenizer", "sentencepiece", "--tokenizer-model",
                                           kModel, "--append-eod", "--workers-per-rank", "2"}),
            0);
  const meshtron::data::IndexedDataset dataset(prefix);
  ASSERT_EQ(dataset.num_documents(), static_cast<int64_t>(texts.size()));
  SentencePieceTokenizer tok(kModel);
  for (std::size_t d = 0; d < texts.size(); ++d) {
    const auto [first, end] = dataset.document_sequences(static_cast<int64_t>(d));
    ASSERT_EQ(end - first, 1);
    const Ids ids = dataset.get_int32(first);
    Ids expected{1};
    tok.encode_append(texts[d], expected);
    expected.push_back(2);
    EXPECT_EQ(ids, expected) << "document " << d;
    EXPECT_EQ(tok.decode(ids), texts[d]) << "document " << d;
  }
}

TEST(SentencePiecePreprocess, MissingModelOptionIsOneLine) {
  expect_user_error(
      [&] {
        meshtron::app::run_preprocess({"--input", kModel, "--output-prefix", "/tmp/x",
                                       "--tokenizer", "sentencepiece"});
      },
      {"--tokenizer-model is required for sentencepiece"});
}

}  // namespace
