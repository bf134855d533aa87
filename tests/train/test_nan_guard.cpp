// check_for_nan: a NaN in the loss skips the step (no update, optimizer
// state untouched, gradients cleared), counts it, and training continues.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "config/model_spec_from_deck.hpp"
#include "train/tiny_train_config.hpp"
#include "train/trainer.hpp"

namespace meshtron {
namespace {

TEST(NanGuard, NonFiniteLossSkipsTheStepAndTrainingContinues) {
  const RunConfig c = testing::tiny_train_config();
  ParallelRuntime rt(MPI_COMM_SELF, c.parallel.degrees());
  Trainer trainer(c, model_spec_from_deck(c, 50, 1), rt, DType::F32);
  DataLayout layout{8, 2, 4, 0, 1, 10, 1, 1};
  auto data = make_synthetic_data(layout, 50);

  ASSERT_FALSE(trainer.train_step(1, data->train_step(1)).skipped);
  ASSERT_EQ(trainer.optimizer().step_count(), 1);

  // Poison one weight: the step-2 loss is NaN.
  Parameter& poisoned = *trainer.parameters()[2];
  const double saved = element_as_double(poisoned.value, 0);
  std::vector<Tensor> before;
  for (Parameter* p : trainer.parameters()) before.push_back(p->value.clone());
  set_element_from_double(poisoned.value, 0, std::nan(""));
  const StepReport bad = trainer.train_step(2, data->train_step(2));
  EXPECT_TRUE(bad.skipped);
  EXPECT_FALSE(std::isfinite(bad.loss));
  EXPECT_EQ(trainer.optimizer().step_count(), 1) << "a skipped step must not count";
  const ParameterList params = trainer.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i] == &poisoned) continue;
    EXPECT_EQ(std::memcmp(params[i]->value.raw(), before[i].raw(), before[i].bytes()), 0)
        << params[i]->name << " changed in a skipped step";
    // Cleared: zeros, or (the trainer's deferred zero_grad) stale, so that
    // the next step's first writer overwrites the NaN.
    EXPECT_TRUE(params[i]->grad_stale || ops::sum_of_squares(params[i]->grad) == 0.0)
        << params[i]->name;
  }

  set_element_from_double(poisoned.value, 0, saved);
  const StepReport good = trainer.train_step(3, data->train_step(3));
  EXPECT_FALSE(good.skipped);
  EXPECT_TRUE(std::isfinite(good.loss));
  EXPECT_TRUE(std::isfinite(good.grad_norm)) << "the skipped step's NaN gradients leaked";
  EXPECT_EQ(trainer.optimizer().step_count(), 2);
}

}  // namespace
}  // namespace meshtron
