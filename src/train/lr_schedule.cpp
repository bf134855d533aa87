#include "train/lr_schedule.hpp"

#include <cmath>
#include <numbers>

namespace meshtron {

double LrSchedule::at(long i) const {
  if (warmup_iters > 0 && i <= warmup_iters) return lr * double(i) / warmup_iters;
  if (decay_style == "constant") return lr;
  if (i >= decay_iters) return min_lr;
  const double r = double(i - warmup_iters) / double(decay_iters - warmup_iters);
  const double f = decay_style == "linear" ? 1.0 - r : 0.5 * (1.0 + std::cos(std::numbers::pi * r));
  return min_lr + (lr - min_lr) * f;
}

}  // namespace meshtron
