// GPT sample indices: numpy/Megatron golden arrays, split arithmetic, sample
// windows against a concatenated token stream, the index cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "common/error.hpp"
#include "data/gpt_dataset.hpp"
#include "data_test_util.hpp"

namespace meshtron::data {
namespace {

using testing::ScratchDir;

std::shared_ptr<const IndexedDataset> golden_data() {
  return std::make_shared<IndexedDataset>((testing::golden_dir() / "golden_uint16").string());
}

GptDatasetConfig no_cache(std::int64_t seq_length, std::uint32_t seed) {
  GptDatasetConfig config;
  config.seq_length = seq_length;
  config.seed = seed;
  config.use_cache = false;
  return config;
}

// ------------------------------------------------------ golden indices ---

TEST(GptDatasetGolden, IndicesEqualNumpyMegatronArrays) {
  std::ifstream in(testing::golden_dir() / "gpt_index_golden.json");
  const auto golden = nlohmann::json::parse(in);
  const auto data = golden_data();
  ASSERT_GE(golden["cases"].size(), 5u);
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const GptDataset ds(data, Split::Train, c["first_document"], c["end_document"],
                        c["num_samples"], no_cache(c["seq_length"], c["seed"]));
    EXPECT_EQ(ds.doc_idx(), c["doc_idx"].get<std::vector<std::int32_t>>());
    std::vector<std::int32_t> flat;
    for (const auto& row : c["sample_idx"]) {
      flat.push_back(row[0]);
      flat.push_back(row[1]);
    }
    EXPECT_EQ(ds.sample_idx(), flat);
    EXPECT_EQ(ds.shuffle_idx(), c["shuffle_idx"].get<std::vector<std::uint32_t>>());
    EXPECT_GE(ds.size(), c["num_samples"].get<std::int64_t>());
  }
}

// ---------------------------------------------------------------- split ---

TEST(SplitBoundaries, MatchMegatronArithmetic) {
  // Expected values from Megatron's get_train_valid_test_split_ in Python.
  using B = std::array<std::int64_t, 4>;
  EXPECT_EQ(split_boundaries("969,30,1", 45), (B{0, 44, 45, 45}));
  EXPECT_EQ(split_boundaries("1,1", 5), (B{0, 3, 5, 5}));  // round half to even
  EXPECT_EQ(split_boundaries("98/2", 1000), (B{0, 980, 1000, 1000}));
  EXPECT_EQ(split_boundaries("100", 7), (B{0, 7, 7, 7}));
  EXPECT_EQ(split_boundaries("1,1,1", 4), (B{0, 2, 3, 4}));
  EXPECT_EQ(split_boundaries("8,1,1", 25), (B{0, 21, 23, 25}));
  EXPECT_EQ(split_boundaries("969, 30, 1", 1000), (B{0, 969, 999, 1000}));
  EXPECT_EQ(split_boundaries("949,50,1", 8013769), (B{0, 7605067, 8005755, 8013769}));
}

TEST(SplitBoundaries, RejectsBadStrings) {
  for (const char* bad : {"a,b", "-1,2", "1,2,3,4", "0,0", "", "1,,2", "1e400"})
    EXPECT_THROW(split_boundaries(bad, 10), UserError) << "'" << bad << "'";
}

TEST(BuildGptDatasets, SplitsDocumentsAndSkipsEmptySplits) {
  GptDatasetConfig config = no_cache(16, 3);
  const auto sets = build_gpt_datasets(golden_data(), {40, 5, 5}, config);
  ASSERT_TRUE(sets[0] && sets[1]);
  EXPECT_FALSE(sets[2]);  // "969,30,1" of 45 gives the test split nothing
  for (std::int32_t d : sets[0]->doc_idx()) EXPECT_LT(d, 44);
  for (std::int32_t d : sets[1]->doc_idx()) EXPECT_EQ(d, 44);
  EXPECT_GE(sets[0]->size(), 40);
  EXPECT_GE(sets[1]->size(), 5);
}

// -------------------------------------------------------------- samples ---

/// The tokens of the documents in doc_idx order: the stream the samples are
/// windows of.
std::vector<std::int32_t> token_stream(const IndexedDataset& data, const GptDataset& ds) {
  std::vector<std::int32_t> stream;
  for (std::int32_t d : ds.doc_idx()) {
    const auto tokens = data.get_int32(d);
    stream.insert(stream.end(), tokens.begin(), tokens.end());
  }
  return stream;
}

TEST(GptDatasetSamples, AreOverlappingWindowsOfTheDocumentStream) {
  const auto data = golden_data();
  const std::int64_t s = 40;
  const GptDataset ds(data, Split::Train, 2, 41, 300, no_cache(s, 77));
  const auto stream = token_stream(*data, ds);
  std::int64_t crossing = 0;
  for (std::int64_t i = 0; i < ds.size(); ++i) {
    const std::int64_t j = ds.shuffle_idx()[std::size_t(i)];
    const std::vector<std::int32_t> window(stream.begin() + j * s, stream.begin() + j * s + s + 1);
    ASSERT_EQ(ds.sample(i), window) << "sample " << i << " (unshuffled " << j << ")";
    crossing += ds.sample_idx()[2 * j] != ds.sample_idx()[2 * j + 2];
  }
  EXPECT_GT(crossing, ds.size() / 4) << "few samples cross document boundaries";
}

TEST(GptDatasetSamples, ShuffleIsAPermutationAndEpochsCoverEveryDocument) {
  const GptDataset ds(golden_data(), Split::Train, 0, 44, 200, no_cache(64, 1));
  std::vector<std::uint32_t> sorted = ds.shuffle_idx();
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::uint32_t> iota(sorted.size());
  std::iota(iota.begin(), iota.end(), 0u);
  EXPECT_EQ(sorted, iota);
  ASSERT_EQ(ds.doc_idx().size() % 44, 0u);
  for (std::int32_t d = 0; d < 44; ++d)
    EXPECT_EQ(std::count(ds.doc_idx().begin(), ds.doc_idx().end(), d),
              std::int64_t(ds.doc_idx().size() / 44));
}

TEST(GptDatasetSamples, SameSeedSameSamplesOtherSeedOtherOrder) {
  const auto data = golden_data();
  const GptDataset a(data, Split::Train, 0, 44, 100, no_cache(32, 5));
  const GptDataset b(data, Split::Train, 0, 44, 100, no_cache(32, 5));
  const GptDataset c(data, Split::Train, 0, 44, 100, no_cache(32, 6));
  EXPECT_EQ(a.shuffle_idx(), b.shuffle_idx());
  EXPECT_EQ(a.doc_idx(), b.doc_idx());
  EXPECT_NE(a.doc_idx(), c.doc_idx());
  for (std::int64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.sample(i), b.sample(i));
}

TEST(GptDatasetSamples, MicroBatchLabelsAreInputsShiftedByOne) {
  const GptDataset ds(golden_data(), Split::Train, 0, 44, 50, no_cache(24, 9));
  const std::vector<std::int64_t> rows{7, 0, 31};
  const GptMicroBatch batch = ds.micro_batch(rows);
  ASSERT_EQ(batch.tokens.shape(), (Shape{3, 24}));
  ASSERT_EQ(batch.labels.shape(), (Shape{3, 24}));
  const std::int32_t* tokens = batch.tokens.data<std::int32_t>();
  const std::int32_t* labels = batch.labels.data<std::int32_t>();
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto sample = ds.sample(rows[r]);
    EXPECT_EQ(std::vector<std::int32_t>(tokens + r * 24, tokens + r * 24 + 24),
              std::vector<std::int32_t>(sample.begin(), sample.end() - 1));
    EXPECT_EQ(std::vector<std::int32_t>(labels + r * 24, labels + r * 24 + 24),
              std::vector<std::int32_t>(sample.begin() + 1, sample.end()));
  }
}

TEST(GptDatasetSamples, SamplesFromASplitWithoutTokensAreRefused) {
  ScratchDir dir("empty_split");
  testing::write_documents(dir / "e", TokenDType::U16, {{{}}, {{}}, {{1, 2, 3}}});
  const auto data = std::make_shared<IndexedDataset>(dir / "e");
  EXPECT_THROW(GptDataset(data, Split::Valid, 0, 2, 1, no_cache(4, 1)), UserError);
  const GptDataset none(data, Split::Valid, 0, 2, 0, no_cache(4, 1));
  EXPECT_EQ(none.size(), 0);
}

TEST(GptDatasetSamples, ZeroLengthDocumentsAreSkipped) {
  ScratchDir dir("zero_docs");
  testing::Documents docs = testing::random_documents(30, 0, 6, 1000, 4);
  testing::write_documents(dir / "z", TokenDType::I32, docs);
  const auto data = std::make_shared<IndexedDataset>(dir / "z");
  const GptDataset ds(data, Split::Train, 0, 30, 64, no_cache(5, 12));
  const auto stream = token_stream(*data, ds);
  for (std::int64_t i = 0; i < ds.size(); ++i) {
    const std::int64_t j = ds.shuffle_idx()[std::size_t(i)];
    ASSERT_EQ(ds.sample(i), std::vector<std::int32_t>(stream.begin() + j * 5,
                                                      stream.begin() + j * 5 + 6));
  }
}

// ---------------------------------------------------------------- cache ---

class GptIndexCache : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_documents(prefix_, TokenDType::U16,
                             testing::random_documents(60, 1, 200, 50000, 21));
    data_ = std::make_shared<IndexedDataset>(prefix_);
    config_.seq_length = 32;
    config_.seed = 1234;
  }
  GptDataset make(std::int64_t num_samples = 150) const {
    return GptDataset(data_, Split::Train, 0, 57, num_samples, config_);
  }
  static std::vector<std::string> cache_files(const GptDataset& ds) {
    std::vector<std::string> files;
    for (const char* suffix : {"_description.txt", "_doc_idx.npy", "_sample_idx.npy",
                               "_shuffle_idx.npy"})
      files.push_back(ds.cache_stem() + suffix);
    return files;
  }
  static void expect_same_indices(const GptDataset& a, const GptDataset& b) {
    EXPECT_EQ(a.doc_idx(), b.doc_idx());
    EXPECT_EQ(a.sample_idx(), b.sample_idx());
    EXPECT_EQ(a.shuffle_idx(), b.shuffle_idx());
  }

  ScratchDir dir_{"cache"};
  std::string prefix_ = dir_ / "data";
  std::shared_ptr<const IndexedDataset> data_;
  GptDatasetConfig config_;
};

TEST_F(GptIndexCache, FirstBuildWritesNextToThePrefixSecondReuses) {
  const GptDataset first = make();
  EXPECT_FALSE(first.loaded_from_cache());
  EXPECT_TRUE(first.wrote_cache());
  EXPECT_EQ(first.cache_stem().rfind(prefix_ + "_gpt_train_", 0), 0u) << first.cache_stem();
  for (const auto& f : cache_files(first)) EXPECT_TRUE(std::filesystem::exists(f)) << f;
  const GptDataset second = make();
  EXPECT_TRUE(second.loaded_from_cache());
  EXPECT_EQ(second.cache_stem(), first.cache_stem());
  expect_same_indices(first, second);
  config_.use_cache = false;
  expect_same_indices(first, make());
}

TEST_F(GptIndexCache, CachedArraysAreNumpyFiles) {
  const GptDataset ds = make();
  const auto bytes = testing::file_bytes(ds.cache_stem() + "_sample_idx.npy");
  ASSERT_GT(bytes.size(), 64u);
  EXPECT_EQ(std::string(bytes.begin() + 1, bytes.begin() + 6), "NUMPY");
  const std::size_t header = std::uint8_t(bytes[8]) | (std::uint8_t(bytes[9]) << 8);
  EXPECT_EQ((10 + header) % 64, 0u);
  const std::string dict(bytes.begin() + 10, bytes.begin() + 10 + long(header));
  EXPECT_NE(dict.find("'descr': '<i4'"), std::string::npos) << dict;
  EXPECT_NE(dict.find("'shape': (" + std::to_string(ds.size() + 1) + ", 2)"), std::string::npos)
      << dict;
  EXPECT_EQ(bytes.size(), 10 + header + std::size_t(ds.size() + 1) * 2 * 4);
}

TEST_F(GptIndexCache, OtherParametersGetTheirOwnCache) {
  const GptDataset base = make();
  config_.seed = 4321;
  const GptDataset reseeded = make();
  EXPECT_FALSE(reseeded.loaded_from_cache());
  EXPECT_NE(reseeded.cache_stem(), base.cache_stem());
  EXPECT_NE(reseeded.doc_idx(), base.doc_idx());
  config_.seed = 1234;
  const GptDataset more_samples = make(400);
  EXPECT_FALSE(more_samples.loaded_from_cache());
  EXPECT_NE(more_samples.cache_stem(), base.cache_stem());
  config_.seq_length = 64;
  EXPECT_FALSE(make().loaded_from_cache());
  config_.seq_length = 32;
  EXPECT_TRUE(make().loaded_from_cache());  // the first is still valid
}

TEST_F(GptIndexCache, RewrittenDataInvalidatesTheCache) {
  const GptDataset before = make();
  testing::write_documents(prefix_, TokenDType::U16,
                           testing::random_documents(60, 1, 200, 50000, 22));
  data_ = std::make_shared<IndexedDataset>(prefix_);
  const GptDataset after = make();
  EXPECT_FALSE(after.loaded_from_cache());
  EXPECT_NE(after.cache_stem(), before.cache_stem());
}

TEST_F(GptIndexCache, CorruptOrMismatchedCacheIsRebuilt) {
  const GptDataset reference = make();
  // Truncated array.
  std::filesystem::resize_file(reference.cache_stem() + "_shuffle_idx.npy", 100);
  const GptDataset after_truncation = make();
  EXPECT_FALSE(after_truncation.loaded_from_cache());
  expect_same_indices(reference, after_truncation);
  EXPECT_TRUE(make().loaded_from_cache());
  // Description that does not match (as after a hash collision).
  testing::write_bytes(reference.cache_stem() + "_description.txt", {'x'});
  EXPECT_FALSE(make().loaded_from_cache());
  EXPECT_TRUE(make().loaded_from_cache());
  // Out-of-range entries with a well-formed header.
  auto bytes = testing::file_bytes(reference.cache_stem() + "_doc_idx.npy");
  std::fill(bytes.end() - 4, bytes.end(), char(0x7f));
  testing::write_bytes(reference.cache_stem() + "_doc_idx.npy", bytes);
  const GptDataset after_garbage = make();
  EXPECT_FALSE(after_garbage.loaded_from_cache());
  expect_same_indices(reference, after_garbage);
  // A missing array.
  std::filesystem::remove(reference.cache_stem() + "_sample_idx.npy");
  EXPECT_FALSE(make().loaded_from_cache());
}

TEST_F(GptIndexCache, CacheDirOptionAndUnwritableDir) {
  config_.cache_dir = dir_ / "elsewhere";
  std::filesystem::create_directories(config_.cache_dir);
  const GptDataset placed = make();
  EXPECT_EQ(placed.cache_stem().rfind(config_.cache_dir + "/data_gpt_train_", 0), 0u)
      << placed.cache_stem();
  EXPECT_TRUE(make().loaded_from_cache());
  config_.cache_dir = dir_ / "does/not/exist";
  const GptDataset in_memory = make();
  EXPECT_FALSE(in_memory.wrote_cache());
  expect_same_indices(placed, in_memory);
}

}  // namespace
}  // namespace meshtron::data
