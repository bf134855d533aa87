// BERT and T5 samples on 1, 2 and 4 ranks: each rank builds the samples of
// its data-parallel share (PretrainingSampler) and the shares gathered equal
// what one rank builds alone.
#include <gtest/gtest.h>

#include <mpi.h>

#include "data/bert_samples.hpp"
#include "data/pretraining_sampler.hpp"
#include "data/t5_samples.hpp"
#include "data_mpi_test_util.hpp"
#include "masked_samples_test_util.hpp"

namespace meshtron::data {
namespace {

using testing_util::world_rank;
using testing_util::world_size;

class SentenceDataset : public testing::SharedDataset {
 protected:
  testing::Documents documents() const override { return testing::sentence_documents(); }
};

void append(std::vector<std::int32_t>& out, const std::vector<std::int32_t>& v) {
  out.insert(out.end(), v.begin(), v.end());
}

/// Every field of a sample, one after the other (a fixed length per builder).
std::vector<std::int32_t> flatten(const BertSample& s) {
  std::vector<std::int32_t> out{s.is_random};
  for (const auto* v : {&s.tokens, &s.token_types, &s.labels, &s.loss_mask, &s.padding_mask})
    append(out, *v);
  return out;
}
std::vector<std::int32_t> flatten(const T5Sample& s) {
  std::vector<std::int32_t> out;
  for (const auto* v :
       {&s.enc_tokens, &s.dec_in, &s.labels, &s.loss_mask, &s.enc_mask, &s.dec_mask})
    append(out, *v);
  return out;
}

/// Three steps of samples read through the sampler of this rank (gathered
/// over the ranks micro-batch by micro-batch) and of a single rank.
template <class Samples>
void expect_shares_gather_to_single_rank(const Samples& samples) {
  const int dp = world_size(), rank = world_rank();
  const std::int64_t mbs = 2, gbs = 4 * mbs * 4;  // divisible by dp in {1, 2, 4}
  PretrainingSampler mine(samples.size(), 0, gbs, mbs, rank, dp);
  PretrainingSampler single(samples.size(), 0, gbs, mbs, 0, 1);
  for (int step = 0; step < 3; ++step) {
    std::vector<std::int32_t> gathered, expected;
    for (const auto& mb : mine.next_step()) {
      std::vector<std::int32_t> local;
      for (const std::int64_t i : mb) append(local, flatten(samples.sample(i)));
      std::vector<std::int32_t> all(local.size() * std::size_t(dp));
      MPI_Allgather(local.data(), int(local.size()), MPI_INT, all.data(), int(local.size()),
                    MPI_INT, MPI_COMM_WORLD);
      append(gathered, all);
    }
    for (const auto& mb : single.next_step())
      for (const std::int64_t i : mb) append(expected, flatten(samples.sample(i)));
    ASSERT_EQ(gathered.size(), expected.size());
    EXPECT_TRUE(gathered == expected) << "step " << step << " on " << dp << " ranks";
  }
}

std::vector<std::int64_t> run_bounds(const std::vector<SentenceRun>& runs) {
  std::vector<std::int64_t> out;
  for (const auto& r : runs) out.insert(out.end(), {r.first, r.end, r.target_length});
  return out;
}

TEST_F(SentenceDataset, BertSharesGatherToTheSingleRankSamples) {
  BertSamplesConfig config;
  config.seq_length = 64;
  const BertSamples samples(data_, 0, data_->num_documents(), 500, config,
                            testing::test_special_tokens());
  EXPECT_TRUE(testing::same_on_all_ranks(run_bounds(samples.runs())));
  expect_shares_gather_to_single_rank(samples);
}

TEST_F(SentenceDataset, T5SharesGatherToTheSingleRankSamples) {
  T5SamplesConfig config;
  config.encoder_seq_length = 96;
  config.decoder_seq_length = 40;
  const T5Samples samples(data_, 0, data_->num_documents(), 500, config,
                          testing::test_special_tokens());
  EXPECT_TRUE(testing::same_on_all_ranks(run_bounds(samples.runs())));
  expect_shares_gather_to_single_rank(samples);
}

}  // namespace
}  // namespace meshtron::data
