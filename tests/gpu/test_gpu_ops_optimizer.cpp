// AdamW on the device against the host (src/ops/ops_optimizer.cpp).
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include "gpu_ops_test_util.hpp"

namespace meshtron::ops {
namespace {

using namespace gpu_ops_test;

// ================================================================ AdamW ==

TEST_F(GpuOps, AdamWStepMatchesHost) {
  for (index_t n : {index_t(1), index_t(3), index_t(257), index_t(100003)})
    for (std::int64_t step : {1, 5}) {
      Pair param = input({n}, DType::F32), m = input({n}, DType::F32, -0.1, 0.1),
           v = input({n}, DType::F32, 0.0, 0.01);
      const Pair grad = input({n}, DType::F32);
      AdamWParams hp;
      hp.lr = 3e-4, hp.weight_decay = 0.1, hp.step = step;
      adamw_step(param.host, grad.host, m.host, v.host, hp);
      adamw_step(param.dev, grad.dev, m.dev, v.dev, hp);
      const std::string what = "adamw n=" + std::to_string(n) + " step=" + std::to_string(step);
      expect_close(param, DType::F32, what + " param");
      expect_close(m, DType::F32, what + " m");
      expect_close(v, DType::F32, what + " v");
    }
}

}  // namespace
}  // namespace meshtron::ops
