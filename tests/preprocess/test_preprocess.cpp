// meshtron preprocess, run in process (run_preprocess) on every rank of the
// test job: the dataset read back and decoded equals the input documents,
// the plain-text and JSON-lines rules hold, and bad input throws the same
// one-line UserError on every rank with nothing left on disk.
//
// The references are independent of the code under test: documents come from
// parsing the fixture with nlohmann::json (or are written out by hand), and
// the check decodes the stored ids back to text.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/indexed_dataset.hpp"

namespace fs = std::filesystem;
using meshtron::UserError;
using meshtron::data::Gpt2Tokenizer;
using meshtron::data::IndexedDataset;

namespace {

const std::string kEod = "<|endoftext|>";
constexpr std::int32_t kEodId = 50256;

fs::path data_dir() {
  const char* env = std::getenv("MESHTRON_DATA_DIR");
  return env && *env ? fs::path(env) : fs::path(MESHTRON_SOURCE_DIR) / "data";
}

fs::path fixture_dir() { return fs::path(MESHTRON_SOURCE_DIR) / "tests" / "preprocess"; }

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// The text under "text" of every line of a JSON-lines file.
std::vector<std::string> texts_of_jsonl(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> texts;
  for (std::string line; std::getline(in, line);)
    texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return texts;
}

/// Each document of the dataset decoded to text (documents of one sequence;
/// an empty document decodes to "").
std::vector<std::string> decoded_documents(const IndexedDataset& ds, const Gpt2Tokenizer& tok) {
  std::vector<std::string> docs;
  for (std::int64_t d = 0; d < ds.num_documents(); ++d) {
    std::string text;
    const auto [first, end] = ds.document_sequences(d);
    for (std::int64_t s = first; s < end; ++s) text += tok.decode(ds.get_int32(s));
    docs.push_back(text);
  }
  return docs;
}

class Preprocess : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(data_dir() / "encoder.json") || !fs::exists(data_dir() / "vocab.bpe"))
      GTEST_SKIP() << "no GPT-2 vocabulary in " << data_dir() << " (run tools/fetch-corpus.sh)";
    // One scratch folder for the whole job, named by rank 0.
    std::string dir;
    if (rank() == 0) {
      static int counter = 0;
      dir = (fs::temp_directory_path() /
             ("meshtron_preprocess_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                .string();
      fs::remove_all(dir);
      fs::create_directories(dir);
    }
    std::uint64_t size = dir.size();
    MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    dir.resize(size);
    MPI_Bcast(dir.data(), int(size), MPI_CHAR, 0, MPI_COMM_WORLD);
    dir_ = dir;
    if (!tokenizer_)
      tokenizer_.emplace(Gpt2Tokenizer::from_openai((data_dir() / "encoder.json").string(),
                                                    (data_dir() / "vocab.bpe").string()));
  }

  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0 && !dir_.empty()) fs::remove_all(dir_);
  }

  /// Rank 0 writes `bytes` to dir/name; every rank waits for it.
  fs::path write_input(const std::string& name, const std::string& bytes) {
    const fs::path path = dir_ / name;
    if (rank() == 0) std::ofstream(path, std::ios::binary) << bytes;
    MPI_Barrier(MPI_COMM_WORLD);
    return path;
  }

  std::vector<std::string> args(const std::vector<fs::path>& inputs, const fs::path& prefix) {
    std::vector<std::string> a{"--input"};
    for (const auto& in : inputs) a.push_back(in.string());
    for (const std::string& s :
         {std::string("--output-prefix"), prefix.string(), std::string("--tokenizer"),
          std::string("gpt2"), std::string("--vocab-file"), (data_dir() / "encoder.json").string(),
          std::string("--merge-file"), (data_dir() / "vocab.bpe").string()})
      a.push_back(s);
    return a;
  }

  /// Files in the scratch folder other than `keep`.
  std::vector<std::string> files_except(const std::vector<fs::path>& keep) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      bool kept = false;
      for (const auto& k : keep) kept = kept || entry.path() == k;
      if (!kept) names.push_back(entry.path().filename().string());
    }
    return names;
  }

  /// The UserError message of run_preprocess(a), or "" if it succeeded.
  static std::string error_of(const std::vector<std::string>& a) {
    try {
      meshtron::app::run_preprocess(a);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  static std::optional<Gpt2Tokenizer> tokenizer_;
};

std::optional<Gpt2Tokenizer> Preprocess::tokenizer_;

// (b) Fixture read back: one uint16 sequence per document, decoding to the
// document's text followed by exactly one EOD, both input formats.
TEST_F(Preprocess, FixtureDecodesToItsDocumentsPlusEod) {
  const std::vector<std::string> texts = texts_of_jsonl(fixture_dir() / "fixture.jsonl");
  ASSERT_EQ(texts.size(), 20u);
  for (const char* name : {"fixture.jsonl", "fixture.txt"}) {
    SCOPED_TRACE(name);
    const fs::path prefix = dir_ / (std::string(name) + "_out");
    auto a = args({fixture_dir() / name}, prefix);
    a.push_back("--append-eod");
    meshtron::app::run_preprocess(a);

    const IndexedDataset ds(prefix.string());
    EXPECT_EQ(ds.dtype(), meshtron::data::TokenDType::U16);
    ASSERT_EQ(ds.num_documents(), 20);
    ASSERT_EQ(ds.num_sequences(), 20);
    for (std::int64_t i = 0; i < ds.num_sequences(); ++i) {
      const std::vector<std::int32_t> ids = ds.get_int32(i);
      EXPECT_EQ(tokenizer_->decode(ids), texts[i] + kEod) << "document " << i;
      EXPECT_EQ(std::count(ids.begin(), ids.end(), kEodId), 1) << "document " << i;
      EXPECT_EQ(ids.back(), kEodId);
    }
  }
}

// Plain text: blank or white-space-only lines separate documents, leading and
// trailing blank lines make none, a trailing CR of the last line is dropped.
TEST_F(Preprocess, PlainTextDocumentsAreSeparatedByBlankLines) {
  const fs::path input = write_input(
      "rules.txt",
      "\n\n  \nfirst line\nsecond line\n \t \nthird doc\n\n\n\ncrlf one\r\ncrlf two\r\n\r\n"
      "no newline at end");
  const fs::path prefix = dir_ / "out";
  meshtron::app::run_preprocess(args({input}, prefix));
  const IndexedDataset ds(prefix.string());
  const std::vector<std::string> expected{"first line\nsecond line", "third doc",
                                          "crlf one\r\ncrlf two", "no newline at end"};
  EXPECT_EQ(decoded_documents(ds, *tokenizer_), expected);
}

// JSON lines: blank lines ignored, other keys ignored, escapes decoded, an
// empty text is an empty document without EOD (as Megatron writes it).
TEST_F(Preprocess, JsonLinesKeysEscapesAndEmptyDocuments) {
  const fs::path input = write_input(
      "rules.jsonl",
      "{\"body\": \"\", \"n\": 1}\n"
      "\n"
      "{\"body\": \"caf\\u00e9 \\ud83d\\ude42\", \"text\": 3}\r\n"
      "   \n"
      "{\"extra\": [1, {\"a\": null}], \"body\": \"tab\\there\"}");
  const fs::path prefix = dir_ / "out";
  auto a = args({input}, prefix);
  for (const char* s : {"--json-key", "body", "--append-eod"}) a.push_back(s);
  meshtron::app::run_preprocess(a);
  const IndexedDataset ds(prefix.string());
  const std::vector<std::string> expected{"", "caf\u00e9 \U0001F642" + kEod, "tab\there" + kEod};
  EXPECT_EQ(decoded_documents(ds, *tokenizer_), expected);
  EXPECT_EQ(ds.num_sequences(), 2);  // the empty document has none
  EXPECT_EQ(ds.document_index(1), 0);
}

// Two input files make one dataset, as if concatenated; no document spans them.
TEST_F(Preprocess, SeveralInputsAreReadInOrder) {
  const fs::path a_txt = write_input("a.txt", "alpha\nstill alpha");  // no final newline
  const fs::path b_jsonl = write_input("b.jsonl", "{\"text\": \"beta\"}\n{\"text\": \"gamma\"}\n");
  const fs::path c_txt = write_input("c.txt", "delta\n\nepsilon\n");
  const fs::path prefix = dir_ / "out";
  meshtron::app::run_preprocess(args({a_txt, b_jsonl, c_txt}, prefix));
  const std::vector<std::string> expected{"alpha\nstill alpha", "beta", "gamma", "delta", "epsilon"};
  EXPECT_EQ(decoded_documents(IndexedDataset(prefix.string()), *tokenizer_), expected);
}

// More ranks than documents (and than bytes): some shards are empty.
TEST_F(Preprocess, FewerDocumentsThanRanks) {
  const fs::path input = write_input("one.txt", "x");
  const fs::path prefix = dir_ / "out";
  auto a = args({input}, prefix);
  a.push_back("--append-eod");
  meshtron::app::run_preprocess(a);
  const IndexedDataset ds(prefix.string());
  EXPECT_EQ(decoded_documents(ds, *tokenizer_), std::vector<std::string>{"x" + kEod});
  EXPECT_TRUE(files_except({input, prefix.string() + ".bin", prefix.string() + ".idx"}).empty());
}

// (c) A bad line that only the last rank reads: every rank throws the same
// one-line error naming file:line, and no output, shard or temporary remains.
TEST_F(Preprocess, BadInputIsOneErrorOnEveryRankAndLeavesNoFiles) {
  std::string lines;
  for (int i = 0; i < 40; ++i) lines += "{\"text\": \"document number " + std::to_string(i) + "\"}\n";
  struct Case {
    std::string bad_line, reason;
  };
  const std::vector<Case> cases{
      {"{\"text\": \"bad \xC3\x28 byte\"}", "invalid UTF-8"},
      {"{\"text\": \"no end", "not valid JSON: column"},
      {"{\"txt\": \"typo\"}", "no key \"text\" in the JSON object"},
      {"{\"text\": null}", "the value of \"text\" is null, not a string"},
      {"[\"text\"]", "expected a JSON object, found array"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.reason);
    const fs::path input = write_input("bad.jsonl", lines + c.bad_line + "\n{\"text\": \"after\"}\n");
    const fs::path prefix = dir_ / "out";
    const std::string message = error_of(args({input}, prefix));
    const std::string where = input.string() + ":41: ";
    EXPECT_EQ(message.substr(0, where.size() + c.reason.size()), where + c.reason);
    EXPECT_EQ(message.find('\n'), std::string::npos);
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ(files_except({input}), std::vector<std::string>{});
  }
}

// Invalid UTF-8 in plain text names the line that holds it, not the
// document's first line.
TEST_F(Preprocess, PlainTextErrorNamesTheLineOfTheBadByte) {
  const fs::path input = write_input("bad.txt", "doc one\n\ndoc two\nfine\nbad \xFF\nfine\n");
  const std::string message = error_of(args({input}, dir_ / "out"));
  EXPECT_EQ(message, input.string() + ":5: invalid UTF-8");
}

// (d) An existing dataset is refused without --overwrite and left as it was.
TEST_F(Preprocess, RefusesToOverwriteUnlessAsked) {
  const fs::path first = write_input("first.txt", "first");
  const fs::path second = write_input("second.txt", "second document");
  const fs::path prefix = dir_ / "out";
  meshtron::app::run_preprocess(args({first}, prefix));
  EXPECT_NE(error_of(args({second}, prefix)).find("already exists (pass --overwrite"),
            std::string::npos);
  EXPECT_EQ(decoded_documents(IndexedDataset(prefix.string()), *tokenizer_),
            std::vector<std::string>{"first"});
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has read the old files
  // A lone PREFIX.idx counts as an existing dataset too.
  if (rank() == 0) fs::rename(prefix.string() + ".bin", dir_ / "kept.bin");
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_NE(error_of(args({second}, prefix)).find("already exists"), std::string::npos);
  EXPECT_FALSE(fs::exists(prefix.string() + ".bin"));
  MPI_Barrier(MPI_COMM_WORLD);
  auto a = args({second}, prefix);
  a.push_back("--overwrite");
  meshtron::app::run_preprocess(a);
  EXPECT_EQ(decoded_documents(IndexedDataset(prefix.string()), *tokenizer_),
            std::vector<std::string>{"second document"});
}

TEST_F(Preprocess, BadOptionsAreUserErrors) {
  const fs::path input = write_input("in.txt", "text");
  auto a = args({input}, dir_ / "out");
  auto with = [&](std::vector<std::string> extra) {
    auto b = a;
    b.insert(b.end(), extra.begin(), extra.end());
    return error_of(b);
  };
  auto tokenizer_named = [&](const std::string& name) {
    auto b = a;
    *(std::find(b.begin(), b.end(), "--tokenizer") + 1) = name;
    return error_of(b);
  };
  EXPECT_NE(tokenizer_named("wordpiece").find("unknown --tokenizer 'wordpiece'"),
            std::string::npos);
  EXPECT_NE(with({"--workers-per-rank", "0"}).find("--workers-per-rank"), std::string::npos);
  EXPECT_NE(with({"--bogus"}).find("bogus"), std::string::npos);
  EXPECT_NE(error_of(args({dir_ / "missing.txt"}, dir_ / "out")).find("missing.txt"),
            std::string::npos);
  EXPECT_NE(error_of(args({input}, dir_ / "no_such_dir" / "out")).find("does not exist"),
            std::string::npos);
  EXPECT_EQ(files_except({input}), std::vector<std::string>{});
}

}  // namespace

// --split-sentences: one sequence per sentence, documents in the .idx, the
// EOD at the end of each document's last sentence (Megatron's layout).
TEST_F(Preprocess, SplitSentencesKeepsDocumentsAndEndsThemWithEod) {
  const fs::path input = write_input(
      "split.jsonl",
      "{\"text\": \"Dr. Smith came home. He sat down! Was he tired? Yes.\"}\n"
      "{\"text\": \"\"}\n"
      "{\"text\": \"One sentence only, e.g. this one.\"}\n");
  const fs::path prefix = dir_ / "split_out";
  auto a = args({input}, prefix);
  a.push_back("--split-sentences");
  a.push_back("--append-eod");
  meshtron::app::run_preprocess(a);
  const IndexedDataset ds(prefix.string());
  ASSERT_EQ(ds.num_documents(), 3);
  ASSERT_EQ(ds.num_sequences(), 5);
  const std::vector<std::string> expected = {"Dr. Smith came home.", "He sat down!",
                                             "Was he tired?", "Yes." + std::string(kEod),
                                             "One sentence only, e.g. this one." + std::string(kEod)};
  for (std::int64_t s = 0; s < 5; ++s)
    EXPECT_EQ(tokenizer_->decode(ds.get_int32(s)), expected[std::size_t(s)]) << "sequence " << s;
  EXPECT_EQ(ds.document_sequences(0), (std::pair<std::int64_t, std::int64_t>{0, 4}));
  EXPECT_EQ(ds.document_sequences(1), (std::pair<std::int64_t, std::int64_t>{4, 4}));
  EXPECT_EQ(ds.document_sequences(2), (std::pair<std::int64_t, std::int64_t>{4, 5}));
}
