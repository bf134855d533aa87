// Learning-rate schedule: linear warmup to the peak, then constant, linear or
// cosine decay to min_lr at decay_iters, min_lr after.
//
//   lr(i) = lr * i / warmup                                  i <= warmup
//   lr(i) = min_lr + (lr - min_lr) * f((i - warmup) / (decay - warmup))
//           f(r) = 1 (constant), 1 - r (linear), (1 + cos(pi r)) / 2 (cosine)
//
// i is the 1-based step being taken, so the first step already learns
// (Megatron's counter starts at 0 and spends its first step at lr = 0).
#pragma once

#include <string>

namespace meshtron {

struct LrSchedule {
  double lr = 1e-3, min_lr = 0.0;
  int warmup_iters = 0, decay_iters = 0;
  std::string decay_style = "cosine";

  double at(long step) const;
};

}  // namespace meshtron
