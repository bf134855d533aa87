// GradZeroing::Deferred (the trainer's): zero_grad() marks the gradients
// stale and their first writer of the next step overwrites them. Training
// must give the same bits as zeroing them with a memset, with one
// micro-batch per step (every gradient overwritten) and with two (the
// second accumulates onto the first's writes).
#include <gtest/gtest.h>

#include <cstring>

#include "config/model_spec_from_deck.hpp"
#include "train/tiny_train_config.hpp"
#include "train/trainer.hpp"

namespace meshtron {
namespace {

class GradZeroingTest : public ::testing::TestWithParam<int> {};

TEST_P(GradZeroingTest, DeferredZeroingTrainsBitForBitAsTheMemset) {
  const int micro_batches = GetParam();
  const RunConfig c = testing::tiny_train_config(2 * micro_batches);
  ParallelRuntime rt(MPI_COMM_SELF, c.parallel.degrees());
  Trainer deferred(c, model_spec_from_deck(c, 50, 1), rt, DType::F32);
  Trainer memset(c, model_spec_from_deck(c, 50, 1), rt, DType::F32);
  ASSERT_EQ(deferred.optimizer().grad_zeroing(), GradZeroing::Deferred) << "the trainer's default";
  memset.optimizer().set_grad_zeroing(GradZeroing::Memset);
  DataLayout layout{8, 2, 2 * micro_batches, 0, 1, 10, 1, 1};
  auto data = make_synthetic_data(layout, 50);

  for (long step = 1; step <= 3; ++step) {
    const StepReport a = deferred.train_step(step, data->train_step(step));
    const StepReport b = memset.train_step(step, data->train_step(step));
    EXPECT_EQ(a.loss, b.loss) << "step " << step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
  }
  const ParameterList pa = deferred.parameters(), pb = memset.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(std::memcmp(pa[i]->value.raw(), pb[i]->value.raw(), pa[i]->value.bytes()), 0)
        << pa[i]->name;
    // The deferred trainer's gradients were never memset: stale after the
    // step, still holding its values; the memset trainer's are zeros.
    EXPECT_TRUE(pa[i]->grad_stale) << pa[i]->name;
    EXPECT_FALSE(pb[i]->grad_stale) << pb[i]->name;
    EXPECT_EQ(ops::sum_of_squares(pb[i]->grad), 0.0) << pb[i]->name;
  }
  EXPECT_GT(ops::sum_of_squares(pa[2]->grad), 0.0) << "a stale gradient keeps its old values";
}

INSTANTIATE_TEST_SUITE_P(MicroBatchesPerStep, GradZeroingTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace meshtron
