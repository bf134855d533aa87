#include "train/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "common/error.hpp"

namespace meshtron {

DynamicLossScaler::DynamicLossScaler(const LossScalerConfig& config)
    : config_(config), scale_(config.initial_scale) {
  MESH_REQUIRE(config.initial_scale > 0 && std::isfinite(config.initial_scale),
               "loss scaler: initial scale must be positive and finite, got "
                   << config.initial_scale);
  MESH_REQUIRE(config.min_scale > 0, "loss scaler: min scale must be positive");
  MESH_REQUIRE(config.growth_factor > 1, "loss scaler: growth factor must exceed 1");
  MESH_REQUIRE(config.backoff_factor > 0 && config.backoff_factor < 1,
               "loss scaler: backoff factor must lie in (0, 1)");
  MESH_REQUIRE(config.growth_interval > 0, "loss scaler: growth interval must be positive");
}

void DynamicLossScaler::update(bool found_overflow) {
  if (found_overflow) {
    ++skipped_;
    good_steps_ = 0;
    scale_ = std::max(scale_ * config_.backoff_factor, config_.min_scale);
    return;
  }
  if (++good_steps_ == config_.growth_interval) {
    good_steps_ = 0;
    scale_ *= config_.growth_factor;
  }
}

void DynamicLossScaler::set_scale(double scale) {
  MESH_REQUIRE(scale > 0 && std::isfinite(scale),
               "loss scaler: cannot restore scale " << scale);
  scale_ = scale;
  good_steps_ = 0;
}

void DynamicLossScaler::restore(double scale, long good_steps_in_a_row) {
  set_scale(scale);
  MESH_REQUIRE(good_steps_in_a_row >= 0 && good_steps_in_a_row < config_.growth_interval,
               "loss scaler: cannot restore " << good_steps_in_a_row
                                              << " good steps (growth interval "
                                              << config_.growth_interval << ")");
  good_steps_ = good_steps_in_a_row;
}

}  // namespace meshtron
