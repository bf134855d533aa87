// Activation recompute changes what the forward keeps, never the numbers:
// the check every model family's test runs.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "model/layer_context.hpp"
#include "model/parameter.hpp"

namespace meshtron::testing_util {

/// `step()` (a forward and backward that returns the loss and leaves the
/// gradients of `params`) gives, under selective and under full recompute
/// set on `ctx`, the loss and every gradient bit-equal to its run without.
inline void expect_recompute_bit_equal(const std::function<double()>& step,
                                       const ParameterList& params, LayerContext& ctx) {
  const double loss = step();
  std::vector<std::vector<double>> grads;
  for (Parameter* p : params) grads.push_back(p->grad.to_doubles());
  for (Recompute mode : {Recompute::Selective, Recompute::Full}) {
    ctx.recompute = mode;
    EXPECT_EQ(step(), loss);
    for (std::size_t k = 0; k < params.size(); ++k)
      EXPECT_EQ(params[k]->grad.to_doubles(), grads[k]) << params[k]->name;
  }
}

}  // namespace meshtron::testing_util
