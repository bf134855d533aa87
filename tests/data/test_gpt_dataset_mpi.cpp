// Several ranks: every rank builds the same GPT index cache at the same time
// in one shared folder, then reads its dp shard; the shards gathered equal
// what one rank reads alone.
#include <gtest/gtest.h>

#include <mpi.h>

#include <filesystem>

#include "data/gpt_dataset.hpp"
#include "data/pretraining_sampler.hpp"
#include "data_mpi_test_util.hpp"

namespace meshtron::data {
namespace {

using testing::SharedDataset;
using testing::same_on_all_ranks;
using testing_util::world_rank;
using testing_util::world_size;

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
