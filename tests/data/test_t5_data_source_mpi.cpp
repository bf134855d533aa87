// T5 micro-batches through the data source (make_indexed_t5_data) on 1, 2
// and 4 data-parallel ranks: micro-batch m of dp rank r is micro-batch
// m * dp + r of one rank, field by field, for training steps and evaluation
// batches; and each is a T5 batch (decoder from the decoder start, labels
// ending with eos, -100 exactly on the decoder's padding).
#include <gtest/gtest.h>

#include <mpi.h>

#include "config/run_config.hpp"
#include "data_mpi_test_util.hpp"
#include "masked_samples_test_util.hpp"
#include "train/data_source.hpp"

namespace meshtron {
namespace {

using testing_util::world_rank;
using testing_util::world_size;

class T5DataSource : public data::testing::SharedDataset {
 protected:
  data::testing::Documents documents() const override {
    return data::testing::sentence_documents();
  }
  std::unique_ptr<DataSource> source(int rank, int dp) const {
    const RunConfig run = RunConfig::from_text(
        "[model]\narch = t5\nseq_length = 64\ndecoder_seq_length = 32\n[data]\nsource = indexed\n"
        "split = 90,10,0\npath = " + prefix_ + "\n");
    const DataLayout layout{64, 2, 16, rank, dp, 3, 2, 1234, 32};
    return make_indexed_t5_data(run, layout, data::testing::test_special_tokens());
  }
};

std::vector<std::int32_t> values(const Tensor& t) {
  const auto* p = t.data<std::int32_t>();
  return {p, p + t.numel()};
}

void expect_same(const MicroBatch& a, const MicroBatch& b) {
  EXPECT_EQ(a.sample_offset, b.sample_offset);
  EXPECT_EQ(values(a.ids), values(b.ids));
  EXPECT_EQ(values(a.padding_mask), values(b.padding_mask));
  EXPECT_EQ(values(a.decoder_ids), values(b.decoder_ids));
  EXPECT_EQ(values(a.decoder_padding_mask), values(b.decoder_padding_mask));
  EXPECT_EQ(values(a.targets), values(b.targets));
}

/// Sample j of `mb` ([s, b] rows): decoder row 0 is bos, the last real
/// label is eos, labels are -100 exactly where the decoder pads.
void expect_t5_shape(const MicroBatch& mb, const data::SpecialTokens& special) {
  const index_t b = mb.padding_mask.dim(0), sd = mb.decoder_padding_mask.dim(1);
  ASSERT_EQ(mb.ids.numel(), 64 * b);
  ASSERT_EQ(mb.decoder_ids.numel(), sd * b);
  for (index_t j = 0; j < b; ++j) {
    EXPECT_EQ(mb.decoder_ids.data<std::int32_t>()[j], special.bos);
    index_t real = 0;
    for (index_t i = 0; i < sd; ++i) {
      const bool live = mb.decoder_padding_mask.data<std::int32_t>()[j * sd + i] == 1;
      real += live ? 1 : 0;
      EXPECT_EQ(mb.targets.data<std::int32_t>()[i * b + j] == -100, !live);
    }
    ASSERT_GT(real, 1);
    EXPECT_EQ(mb.targets.data<std::int32_t>()[(real - 1) * b + j], special.eos);
  }
}

TEST_F(T5DataSource, SamplesAreTheSameOnAnyDataParallelDegree) {
  const int dp = world_size(), rank = world_rank();
  const auto mine = source(rank, dp), single = source(0, 1);
  const data::SpecialTokens special = data::testing::test_special_tokens();
  for (long step = 1; step <= 3; ++step) {
    const auto local = mine->train_step(step), whole = single->train_step(step);
    ASSERT_EQ(local.size() * std::size_t(dp), whole.size());
    for (std::size_t m = 0; m < local.size(); ++m) {
      expect_same(local[m], whole[m * std::size_t(dp) + std::size_t(rank)]);
      expect_t5_shape(local[m], special);
    }
  }
  for (long k = 0; k < 2; ++k) {
    const auto local = mine->eval_batch(k), whole = single->eval_batch(k);
    for (std::size_t m = 0; m < local.size(); ++m)
      expect_same(local[m], whole[m * std::size_t(dp) + std::size_t(rank)]);
  }
  // Steps differ from each other (the data moves on).
  EXPECT_NE(values(single->train_step(1)[0].ids), values(single->train_step(2)[0].ids));
}

}  // namespace
}  // namespace meshtron
