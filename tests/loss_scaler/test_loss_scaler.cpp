// DynamicLossScaler against the rules written out here (Megatron's
// DynamicGradScaler, hysteresis 1): start 2^16; overflow -> skip, halve,
// floor at min_scale, restart the good-step count; growth_interval good
// steps in a row -> double.
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.hpp"
#include "train/loss_scaler.hpp"

namespace meshtron {
namespace {

TEST(LossScaler, StartsAt2To16WithInverse) {
  DynamicLossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.inverse_scale(), 1.0 / 65536.0);
  EXPECT_EQ(s.skipped_steps(), 0);
}

TEST(LossScaler, DoublesAfterGrowthIntervalGoodSteps) {
  DynamicLossScaler s;  // default interval 1000
  for (int k = 0; k < 999; ++k) s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.good_steps_in_a_row(), 0);
  for (int k = 0; k < 1000; ++k) s.update(false);
  EXPECT_EQ(s.scale(), 262144.0);
  EXPECT_EQ(s.skipped_steps(), 0);
}

TEST(LossScaler, OverflowHalvesSkipsAndRestartsGrowthCount) {
  LossScalerConfig c;
  c.growth_interval = 3;
  DynamicLossScaler s(c);
  s.update(false);
  s.update(false);
  s.update(true);  // the count of good steps restarts here
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.skipped_steps(), 1);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 32768.0);  // only 2 good steps since the overflow
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);
}

TEST(LossScaler, BacksOffToMinScaleAndStaysThere) {
  LossScalerConfig c;
  c.initial_scale = 8.0;
  c.min_scale = 1.0;
  DynamicLossScaler s(c);
  const double expected[] = {4, 2, 1, 1, 1};
  for (double e : expected) {
    s.update(true);
    EXPECT_EQ(s.scale(), e);
  }
  EXPECT_EQ(s.skipped_steps(), 5);
}

TEST(LossScaler, HugeInitialScaleBacksOffUntilStepsSucceed) {
  // A step overflows while scale > 2^20 (stand-in for the real gradients):
  // from 2^40 it takes 20 skipped steps to reach 2^20.
  LossScalerConfig c;
  c.initial_scale = std::ldexp(1.0, 40);
  DynamicLossScaler s(c);
  int steps = 0;
  while (s.scale() > std::ldexp(1.0, 20)) {
    s.update(true);
    ++steps;
  }
  EXPECT_EQ(steps, 20);
  s.update(false);
  EXPECT_EQ(s.skipped_steps(), 20);
  EXPECT_EQ(s.scale(), std::ldexp(1.0, 20));
}

TEST(LossScaler, SetScaleRestoresAndRestartsGrowthCount) {
  LossScalerConfig c;
  c.growth_interval = 2;
  DynamicLossScaler s(c);
  s.update(false);
  s.set_scale(512.0);
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.good_steps_in_a_row(), 0);
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_THROW(s.set_scale(0.0), UserError);
}

TEST(LossScaler, RestoreResumesTheGrowthCountWhereItStopped) {
  LossScalerConfig c;
  c.growth_interval = 4;
  DynamicLossScaler straight(c), resumed(c);
  for (int k = 0; k < 3; ++k) straight.update(false);  // 3 good steps, then "save"
  resumed.restore(straight.scale(), straight.good_steps_in_a_row());
  for (int k = 0; k < 6; ++k) {
    straight.update(false);
    resumed.update(false);
    EXPECT_EQ(resumed.scale(), straight.scale()) << k;
    EXPECT_EQ(resumed.good_steps_in_a_row(), straight.good_steps_in_a_row()) << k;
  }
  EXPECT_EQ(straight.scale(), 2.0 * 65536.0 * 2.0);  // grew at steps 4 and 8
  EXPECT_THROW(resumed.restore(1024.0, 4), UserError);
  EXPECT_THROW(resumed.restore(1024.0, -1), UserError);
}

TEST(LossScaler, RejectsBadConfig) {
  LossScalerConfig c;
  c.growth_interval = 0;
  EXPECT_THROW(DynamicLossScaler{c}, UserError);
  c = {};
  c.backoff_factor = 1.0;
  EXPECT_THROW(DynamicLossScaler{c}, UserError);
}

}  // namespace
}  // namespace meshtron
