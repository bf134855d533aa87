// Several ranks: every rank builds the same GPT index cache at the same time
// in one shared folder, then reads its dp shard; the shards gathered equal
// what one rank reads alone.
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include <mpi.h>

#include <filesystem>

#include "data/gpt_dataset.hpp"
#include "data/pretraining_sampler.hpp"
#include "data_test_util.hpp"

namespace meshtron::data {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
using testing_util::world_size;

/// A folder every rank sees (one host): named after rank 0's pid, created by
/// rank 0 with a dataset in it, removed by rank 0 at the end.
class SharedDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    long pid = long(::getpid());
    MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    dir_ = std::filesystem::temp_directory_path() / ("meshtron_data_mpi_" + std::to_string(pid));
    prefix_ = (dir_ / "data").string();
    if (world_rank() == 0) {
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
      testing::write_documents(prefix_, TokenDType::U16,
                               testing::random_documents(80, 1, 300, 50000, 8));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    data_ = std::make_shared<IndexedDataset>(prefix_);
  }
  void TearDown() override {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  std::string prefix_;
  std::shared_ptr<const IndexedDataset> data_;
};

/// True on every rank iff `values` is the same on every rank.
template <class T>
bool same_on_all_ranks(const std::vector<T>& values) {
  long long hash[2] = {0, 0};
  for (T v : values) hash[0] = hash[0] * 1000003 + (long long)v;
  hash[1] = -hash[0];
  long long max[2];
  MPI_Allreduce(hash, max, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return max[0] == hash[0] && max[1] == hash[1];  // max == min
}

TEST_F(SharedDataset, ConcurrentCacheBuildsAgreeAndAreReused) {
  GptDatasetConfig config;
  config.seq_length = 48;
  const GptDataset built(data_, Split::Train, 0, 75, 500, config);
  EXPECT_TRUE(same_on_all_ranks(built.doc_idx()));
  EXPECT_TRUE(same_on_all_ranks(built.shuffle_idx()));
  EXPECT_TRUE(same_on_all_ranks(built.sample_idx()));
  MPI_Barrier(MPI_COMM_WORLD);
  const GptDataset reused(data_, Split::Train, 0, 75, 500, config);
  EXPECT_TRUE(reused.loaded_from_cache());
  EXPECT_EQ(reused.shuffle_idx(), built.shuffle_idx());
  // No temporary files left behind by the concurrent writers.
  MPI_Barrier(MPI_COMM_WORLD);
  for (const auto& entry : std::filesystem::directory_iterator(dir_))
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
}

TEST_F(SharedDataset, DpShardsGatherToTheSingleRankBatch) {
  GptDatasetConfig config;
  config.seq_length = 20;
  const GptDataset ds(data_, Split::Train, 0, 75, 400, config);
  const int dp = world_size(), rank = world_rank();
  const std::int64_t mbs = 2, gbs = 4 * mbs * dp;
  PretrainingSampler mine(ds.size(), 0, gbs, mbs, rank, dp);
  PretrainingSampler single(ds.size(), 0, gbs, mbs, 0, 1);
  const int per_micro = int(mbs * config.seq_length);
  for (int step = 0; step < 4; ++step) {
    std::vector<std::int32_t> gathered;
    for (const auto& mb : mine.next_step()) {
      const GptMicroBatch batch = ds.micro_batch(mb);
      std::vector<std::int32_t> all(std::size_t(per_micro * dp));
      MPI_Allgather(batch.tokens.data<std::int32_t>(), per_micro, MPI_INT, all.data(),
                    per_micro, MPI_INT, MPI_COMM_WORLD);
      gathered.insert(gathered.end(), all.begin(), all.end());
    }
    std::vector<std::int32_t> expected;
    for (const auto& mb : single.next_step()) {
      const GptMicroBatch batch = ds.micro_batch(mb);
      const auto* t = batch.tokens.data<std::int32_t>();
      expected.insert(expected.end(), t, t + batch.tokens.numel());
    }
    EXPECT_EQ(gathered, expected) << "step " << step;
  }
}

}  // namespace
}  // namespace meshtron::data
