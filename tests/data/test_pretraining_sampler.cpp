// Pretraining sampler: the dp ranks together read exactly the dp=1 global
// batch, resuming from consumed samples continues exactly.
#include <gtest/gtest.h>

#include <numeric>

#include "common/error.hpp"
#include "data/gpt_dataset.hpp"
#include "data/pretraining_sampler.hpp"
#include "data_test_util.hpp"

namespace meshtron::data {
namespace {

using Step = std::vector<std::vector<std::int64_t>>;

/// The dp=1 global batch rebuilt from what `dp` ranks read in one step:
/// Megatron's order is micro-batch m of rank 0, of rank 1, ..., then m+1.
std::vector<std::int64_t> gather(const std::vector<Step>& per_rank) {
  std::vector<std::int64_t> all;
  for (std::size_t m = 0; m < per_rank[0].size(); ++m)
    for (const Step& rank : per_rank) all.insert(all.end(), rank[m].begin(), rank[m].end());
  return all;
}

std::vector<std::int64_t> flatten(const Step& step) { return gather({step}); }

TEST(PretrainingSampler, OneRankReadsConsecutiveGlobalBatches) {
  PretrainingSampler sampler(1000, 0, 32, 4, 0, 1);
  EXPECT_EQ(sampler.num_micro_batches(), 8);
  for (std::int64_t step = 0; step < 3; ++step) {
    std::vector<std::int64_t> expected(32);
    std::iota(expected.begin(), expected.end(), step * 32);
    EXPECT_EQ(flatten(sampler.next_step()), expected);
  }
  EXPECT_EQ(sampler.consumed_samples(), 96);
}

TEST(PretrainingSampler, FourRanksTogetherReadTheOneRankBatch) {
  const std::int64_t gbs = 48, mbs = 3;
  PretrainingSampler single(1000, 0, gbs, mbs, 0, 1);
  std::vector<PretrainingSampler> ranks;
  for (int r = 0; r < 4; ++r) ranks.emplace_back(1000, 0, gbs, mbs, r, 4);
  EXPECT_EQ(ranks[0].num_micro_batches(), 4);
  for (int step = 0; step < 6; ++step) {
    std::vector<Step> per_rank;
    for (auto& s : ranks) per_rank.push_back(s.next_step());
    EXPECT_EQ(gather(per_rank), flatten(single.next_step())) << "step " << step;
    // Megatron's layout: rank 1's first micro-batch follows rank 0's.
    EXPECT_EQ(per_rank[1][0][0], step * gbs + mbs);
  }
}

TEST(PretrainingSampler, SameTokensOnOneAndFourRanks) {
  const GptDataset ds(
      std::make_shared<IndexedDataset>((testing::golden_dir() / "golden_uint16").string()),
      Split::Train, 0, 44, 120, [] {
        GptDatasetConfig c;
        c.seq_length = 16;
        c.use_cache = false;
        return c;
      }());
  PretrainingSampler single(ds.size(), 0, 16, 2, 0, 1);
  std::vector<PretrainingSampler> ranks;
  for (int r = 0; r < 4; ++r) ranks.emplace_back(ds.size(), 0, 16, 2, r, 4);
  for (int step = 0; step < 5; ++step) {
    std::vector<std::int32_t> one_rank, four_ranks;
    for (const auto& mb : single.next_step()) {
      const auto batch = ds.micro_batch(mb);
      const auto* t = batch.tokens.data<std::int32_t>();
      one_rank.insert(one_rank.end(), t, t + batch.tokens.numel());
    }
    std::vector<Step> per_rank;
    for (auto& s : ranks) per_rank.push_back(s.next_step());
    for (std::size_t m = 0; m < per_rank[0].size(); ++m)
      for (const Step& rank : per_rank) {
        const auto batch = ds.micro_batch(rank[m]);
        const auto* t = batch.tokens.data<std::int32_t>();
        four_ranks.insert(four_ranks.end(), t, t + batch.tokens.numel());
      }
    EXPECT_EQ(four_ranks, one_rank) << "step " << step;
  }
}

TEST(PretrainingSampler, ResumeFromConsumedSamplesContinuesExactly) {
  for (int dp : {1, 2, 4}) {
    for (int rank = 0; rank < dp; ++rank) {
      PretrainingSampler uninterrupted(500, 0, 40, 5, rank, dp);
      for (int step = 0; step < 3; ++step) uninterrupted.next_step();
      PretrainingSampler resumed(500, uninterrupted.consumed_samples(), 40, 5, rank, dp);
      for (int step = 3; step < 8; ++step)
        ASSERT_EQ(resumed.next_step(), uninterrupted.next_step())
            << "dp " << dp << " rank " << rank << " step " << step;
    }
  }
}

TEST(PretrainingSampler, DropsThePartialLastBatch) {
  PretrainingSampler sampler(100, 0, 32, 4, 1, 2);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(sampler.has_next_step());
    sampler.next_step();
  }
  EXPECT_FALSE(sampler.has_next_step());
  EXPECT_THROW(sampler.next_step(), UserError);
}

TEST(PretrainingSampler, RejectsInconsistentSizes) {
  EXPECT_THROW(PretrainingSampler(100, 0, 30, 4, 0, 2), UserError);  // 30 % 8
  EXPECT_THROW(PretrainingSampler(100, 0, 32, 4, 2, 2), UserError);  // rank >= dp
  EXPECT_THROW(PretrainingSampler(100, 101, 32, 4, 0, 2), UserError);
  EXPECT_THROW(PretrainingSampler(100, 0, 32, 0, 0, 2), UserError);
}

}  // namespace
}  // namespace meshtron::data
