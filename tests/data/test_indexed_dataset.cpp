// Indexed dataset reader/writer: round trips, Megatron-LM golden files (read
// identically, rewritten byte for byte), shard merging, corrupt files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "common/error.hpp"
#include "data/indexed_dataset.hpp"
#include "data_test_util.hpp"

namespace meshtron::data {
namespace {

using testing::Documents;
using testing::ScratchDir;

/// Every sequence and document boundary of `data` equals `docs`.
void expect_dataset_equals(const IndexedDataset& data, const Documents& docs) {
  ASSERT_EQ(data.num_documents(), std::int64_t(docs.size()));
  std::int64_t seq = 0, tokens = 0;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    const auto [first, end] = data.document_sequences(std::int64_t(d));
    ASSERT_EQ(first, seq) << "document " << d;
    ASSERT_EQ(end - first, std::int64_t(docs[d].size())) << "document " << d;
    for (const auto& expected : docs[d]) {
      EXPECT_EQ(data.get_int32(seq), expected) << "sequence " << seq;
      EXPECT_EQ(data.sequence_length(seq), std::int32_t(expected.size()));
      tokens += std::int64_t(expected.size());
      ++seq;
    }
  }
  EXPECT_EQ(data.num_sequences(), seq);
  EXPECT_EQ(data.num_tokens(), tokens);
}

/// Calls f and returns the UserError message it throws ("" if none).
template <class F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------- round trip ---

class RoundTrip : public ::testing::TestWithParam<TokenDType> {};

TEST_P(RoundTrip, WriterThenReaderGivesTheSameDocuments) {
  ScratchDir dir("round_trip");
  const TokenDType dtype = GetParam();
  // Vocabulary reaching the top of uint16; int32 also gets large ids.
  const int vocab = dtype == TokenDType::U16 ? 65536 : 2'000'000'000;
  Documents docs = testing::random_documents(40, 0, 300, vocab, 11);
  docs[39].push_back({1, 2, 3});  // a document of several sequences
  docs[39].push_back({});         // and an empty sequence inside it
  docs[5][0].push_back(vocab - 1);
  testing::write_documents(dir / "rt", dtype, docs);

  const IndexedDataset data(dir / "rt");
  EXPECT_EQ(data.dtype(), dtype);
  expect_dataset_equals(data, docs);
  if (dtype == TokenDType::U16) {
    const auto raw = data.get<std::uint16_t>(5);
    EXPECT_EQ(raw.back(), 65535);
  } else {
    const auto raw = data.get<std::int32_t>(5);
    EXPECT_EQ(raw.back(), vocab - 1);
  }
  // Partial reads with an offset.
  std::vector<std::int32_t> part(5);
  ASSERT_GE(data.sequence_length(7), 12);
  EXPECT_EQ(data.read(7, 7, 5, part.data()), 5);
  EXPECT_EQ(part, std::vector<std::int32_t>(docs[7][0].begin() + 7, docs[7][0].begin() + 12));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RoundTrip,
                         ::testing::Values(TokenDType::U16, TokenDType::I32));

TEST(IndexedDatasetWriter, AddDocumentWithSentenceLengthsSplitsSequences) {
  ScratchDir dir("sentences");
  {
    IndexedDatasetWriter writer(dir / "s", TokenDType::U16);
    writer.add_document(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6},
                        std::vector<std::int64_t>{2, 0, 4});
    writer.add_document(std::vector<std::int32_t>{9});
    writer.finalize();
  }
  testing::Documents expected{{{1, 2}, {}, {3, 4, 5, 6}}, {{9}}};
  expect_dataset_equals(IndexedDataset(dir / "s"), expected);
}

TEST(IndexedDatasetWriter, RejectsTokensThatDoNotFitTheDtype) {
  ScratchDir dir("range");
  IndexedDatasetWriter writer(dir / "r", TokenDType::U16);
  const std::string msg = user_error_of(
      [&] { writer.add_document(std::vector<std::int32_t>{5, 65536}); });
  EXPECT_NE(msg.find("65536"), std::string::npos) << msg;
  EXPECT_NE(msg.find("uint16"), std::string::npos) << msg;
  EXPECT_THROW(writer.add_document(std::vector<std::int32_t>{-1}), UserError);
}

TEST(IndexedDatasetWriter, UnfinalizedWriterLeavesNoFiles) {
  ScratchDir dir("unfinalized");
  {
    IndexedDatasetWriter writer(dir / "u", TokenDType::I32);
    writer.add_document(std::vector<std::int32_t>{1, 2, 3});
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(IndexedDatasetWriter, OptimalDtypeFollowsMegatron) {
  EXPECT_EQ(optimal_token_dtype(50257), TokenDType::U16);
  EXPECT_EQ(optimal_token_dtype(65499), TokenDType::U16);
  EXPECT_EQ(optimal_token_dtype(65500), TokenDType::I32);
  EXPECT_EQ(optimal_token_dtype(250000), TokenDType::I32);
}

// ------------------------------------------------ Megatron golden files ---

class Golden : public ::testing::TestWithParam<std::pair<std::string, TokenDType>> {};

TEST_P(Golden, MegatronFilesReadAsTheirDocuments) {
  const auto& [name, dtype] = GetParam();
  const IndexedDataset data((testing::golden_dir() / name).string());
  EXPECT_EQ(data.dtype(), dtype);
  EXPECT_EQ(data.num_sequences(), 45);
  EXPECT_EQ(data.num_documents(), 23);
  expect_dataset_equals(data, testing::load_golden_documents());
}

TEST_P(Golden, WriterReproducesMegatronBytes) {
  const auto& [name, dtype] = GetParam();
  ScratchDir dir("golden_" + name);
  testing::write_documents(dir / "ours", dtype, testing::load_golden_documents());
  const std::string golden = (testing::golden_dir() / name).string();
  for (const char* ext : {".bin", ".idx"}) {
    const auto ours = testing::file_bytes(dir / ("ours" + std::string(ext)));
    const auto theirs = testing::file_bytes(golden + ext);
    ASSERT_FALSE(theirs.empty());
    EXPECT_EQ(ours, theirs) << ext << " differs from Megatron-LM's";
  }
}

INSTANTIATE_TEST_SUITE_P(
    MegatronLM, Golden,
    ::testing::Values(std::make_pair(std::string("golden_uint16"), TokenDType::U16),
                      std::make_pair(std::string("golden_int32"), TokenDType::I32)),
    [](const auto& info) { return info.param.first; });

// --------------------------------------------------------------- merge ---

TEST(MergeIndexedDatasets, ShardsMergeToTheSingleWriterBytes) {
  ScratchDir dir("merge");
  const Documents docs = testing::load_golden_documents();
  // Shards of 0, 10, 1 and 12 documents (an empty shard included).
  const std::vector<std::pair<std::size_t, std::size_t>> ranges{{0, 0}, {0, 10}, {10, 11}, {11, 23}};
  std::vector<std::string> shards;
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    shards.push_back(dir / ("shard" + std::to_string(k)));
    testing::write_documents(shards.back(), TokenDType::U16,
                             Documents(docs.begin() + long(ranges[k].first),
                                       docs.begin() + long(ranges[k].second)));
  }
  merge_indexed_datasets(shards, dir / "merged");
  const std::string golden = (testing::golden_dir() / "golden_uint16").string();
  for (const char* ext : {".bin", ".idx"})
    EXPECT_EQ(testing::file_bytes(dir / ("merged" + std::string(ext))),
              testing::file_bytes(golden + ext)) << ext;
}

TEST(MergeIndexedDatasets, RefusesMixedDtypes) {
  ScratchDir dir("merge_dtypes");
  testing::write_documents(dir / "a", TokenDType::U16, {{{1, 2}}});
  testing::write_documents(dir / "b", TokenDType::I32, {{{3}}});
  const std::string msg = user_error_of([&] { merge_indexed_datasets({dir / "a", dir / "b"}, dir / "m"); });
  EXPECT_NE(msg.find("dtypes differ"), std::string::npos) << msg;
}

// ------------------------------------------------------- corrupt files ---

class CorruptFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_documents(prefix_, TokenDType::U16, testing::load_golden_documents());
    idx_ = testing::file_bytes(prefix_ + ".idx");
    bin_ = testing::file_bytes(prefix_ + ".bin");
  }
  /// The message of the UserError that opening the dataset throws.
  std::string open_error() { return user_error_of([&] { IndexedDataset data(prefix_); }); }
  void expect_error_mentions(const std::string& file, const std::string& what) {
    const std::string msg = open_error();
    ASSERT_FALSE(msg.empty()) << "opening did not throw";
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  }
  template <class T>
  void patch_idx(std::size_t offset, T value) {
    std::memcpy(idx_.data() + offset, &value, sizeof value);
    testing::write_bytes(prefix_ + ".idx", idx_);
  }

  ScratchDir dir_{"corrupt"};
  std::string prefix_ = dir_ / "c";
  std::vector<char> idx_, bin_;
};

TEST_F(CorruptFiles, IntactFileOpens) { EXPECT_EQ(open_error(), ""); }

TEST_F(CorruptFiles, MissingBin) {
  std::filesystem::remove(prefix_ + ".bin");
  expect_error_mentions("c.bin", "cannot open");
}

TEST_F(CorruptFiles, MissingIdx) {
  std::filesystem::remove(prefix_ + ".idx");
  expect_error_mentions("c.idx", "cannot open");
}

TEST_F(CorruptFiles, TruncatedBin) {
  bin_.resize(bin_.size() - 2);
  testing::write_bytes(prefix_ + ".bin", bin_);
  expect_error_mentions("c.bin", "is 8538 bytes but");
}

TEST_F(CorruptFiles, BinTooLong) {
  bin_.push_back(0);
  testing::write_bytes(prefix_ + ".bin", bin_);
  expect_error_mentions("c.bin", "4270 uint16 tokens (8540 bytes)");
}

TEST_F(CorruptFiles, BadMagic) {
  patch_idx<char>(0, 'X');
  expect_error_mentions("c.idx", "bad magic");
}

TEST_F(CorruptFiles, WrongVersion) {
  patch_idx<std::uint64_t>(9, 2);
  expect_error_mentions("c.idx", "version 2");
}

TEST_F(CorruptFiles, UnknownDtype) {
  patch_idx<std::uint8_t>(17, 9);
  expect_error_mentions("c.idx", "dtype code 9");
}

TEST_F(CorruptFiles, SequenceCountDisagreesWithSize) {
  patch_idx<std::uint64_t>(18, 46);
  expect_error_mentions("c.idx", "46 sequences");
}

TEST_F(CorruptFiles, DocumentCountDisagreesWithSize) {
  patch_idx<std::uint64_t>(26, 1'000'000'000'000ull);
  expect_error_mentions("c.idx", "1000000000000 document-index entries");
}

TEST_F(CorruptFiles, TruncatedIdx) {
  idx_.resize(idx_.size() - 8);
  testing::write_bytes(prefix_ + ".idx", idx_);
  expect_error_mentions("c.idx", "truncated or corrupt");
}

TEST_F(CorruptFiles, IdxShorterThanHeader) {
  idx_.resize(20);
  testing::write_bytes(prefix_ + ".idx", idx_);
  expect_error_mentions("c.idx", "less than the 34-byte header");
}

TEST_F(CorruptFiles, WrongSequenceLengthChangesTheExpectedBinSize) {
  patch_idx<std::int32_t>(34, 126);  // sequence 0 has 125 tokens
  // The pointer of sequence 1 no longer follows from the lengths.
  expect_error_mentions("c.idx", "sequence 1 starts at byte 250, expected 252");
}

TEST_F(CorruptFiles, DocumentIndicesMustEndAtTheSequenceCount) {
  const std::size_t last_doc_entry = idx_.size() - 8;
  patch_idx<std::int64_t>(last_doc_entry, 44);
  expect_error_mentions("c.idx", "documents end at sequence 44 but there are 45");
}

TEST_F(CorruptFiles, DocumentIndicesMustNotDecrease) {
  const std::size_t doc_entry_2 = 34 + 45 * 12 + 2 * 8;
  patch_idx<std::int64_t>(doc_entry_2, 0);
  expect_error_mentions("c.idx", "decreases at entry 2");
}

}  // namespace
}  // namespace meshtron::data
