// ops::MultiTensorAdamW on the host (a loop over the per-tensor kernel):
//
//  * bit for bit ops::adamw_step + ops::cast per tensor, fp32 and fp64
//    masters, over several steps with a new lr each, weight decay on and off,
//    bf16/fp16 compute copies on some tensors and none on others;
//  * the decay flag means what it says: against torch.optim.AdamW written
//    out in long double, a decayed tensor follows weight_decay and an
//    undecayed one follows weight_decay = 0;
//  * adamw_step with a compute copy equals adamw_step then cast;
//  * clipping given as a sum of squares (read where the update runs) equals
//    clipping given as a factor, and a non-finite norm can skip the update.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/cast.hpp"
#include "ops/clip_factor.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {
namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 engine(99);
  return engine;
}

Tensor random_tensor(index_t n, DType dtype, double lo, double hi) {
  Tensor t = Tensor::empty({n}, DType::F64);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t i = 0; i < n; ++i) t.data<double>()[i] = dist(rng());
  return t.to(dtype);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.bytes() == b.bytes() &&
         std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

struct State {
  std::vector<AdamWTensor> tensors;
  State clone() const {
    State s;
    for (const AdamWTensor& t : tensors)
      s.tensors.push_back({t.param.clone(), t.grad.clone(), t.m.clone(), t.v.clone(),
                           t.compute_copy.defined() ? t.compute_copy.clone() : Tensor(),
                           t.decay});
    return s;
  }
};

State random_state(DType dtype) {
  const std::vector<index_t> sizes = {1, 7, 1000, 3, 130, 4099, 2, 17, 64, 513, 1, 100003};
  State s;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const index_t n = sizes[i];
    Tensor copy;
    if (i % 3 == 1) copy = Tensor::zeros({n}, DType::BF16);
    if (i % 3 == 2) copy = Tensor::zeros({n}, DType::F16);
    s.tensors.push_back({random_tensor(n, dtype, -1, 1), random_tensor(n, dtype, -1, 1),
                         random_tensor(n, dtype, -0.1, 0.1), random_tensor(n, dtype, 0, 0.01),
                         copy, i % 2 == 0});
  }
  return s;
}

void expect_bitwise(const State& got, const State& want, const std::string& what) {
  for (std::size_t i = 0; i < got.tensors.size(); ++i) {
    const AdamWTensor &g = got.tensors[i], &w = want.tensors[i];
    const std::string at = what + " tensor " + std::to_string(i);
    EXPECT_TRUE(bitwise_equal(g.param, w.param)) << at << " param";
    EXPECT_TRUE(bitwise_equal(g.m, w.m)) << at << " m";
    EXPECT_TRUE(bitwise_equal(g.v, w.v)) << at << " v";
    if (w.compute_copy.defined())
      EXPECT_TRUE(bitwise_equal(g.compute_copy, w.compute_copy)) << at << " compute copy";
  }
}

TEST(MultiTensorAdamWHost, EqualsPerTensorAdamWAndCastBitwise) {
  for (DType dtype : {DType::F32, DType::F64}) {
    State fused = random_state(dtype);
    State reference = fused.clone();
    MultiTensorAdamW update;
    AdamWParams hp;
    hp.weight_decay = 0.1, hp.beta2 = 0.95;
    for (hp.step = 1; hp.step <= 4; ++hp.step) {
      hp.lr = 1e-3 * double(hp.step);
      for (std::size_t i = 0; i < fused.tensors.size(); ++i) {  // fresh, equal gradients
        fused.tensors[i].grad.copy_from(random_tensor(fused.tensors[i].grad.numel(), dtype, -1, 1));
        reference.tensors[i].grad.copy_from(fused.tensors[i].grad);
      }
      update.step(fused.tensors, hp);
      for (AdamWTensor& t : reference.tensors) {
        AdamWParams one = hp;
        one.weight_decay = t.decay ? hp.weight_decay : 0.0;
        adamw_step(t.param, t.grad, t.m, t.v, one);
        if (t.compute_copy.defined()) cast(t.param, t.compute_copy);
      }
      expect_bitwise(fused, reference,
                     std::string(dtype_name(dtype)) + " step " + std::to_string(hp.step));
    }
    EXPECT_EQ(update.table_uploads(), 0);  // no device table on the host
    // The copies really were written (they started as zeros).
    const std::vector<double> copy = fused.tensors[1].compute_copy.to_doubles();
    const std::vector<double> master = fused.tensors[1].param.to_doubles();
    for (std::size_t j = 0; j < copy.size(); ++j)
      ASSERT_NEAR(copy[j], master[j], 1e-2 * std::abs(master[j])) << "bf16 copy element " << j;
  }
}

/// One torch.optim.AdamW step in long double (written from its docs).
std::vector<long double> torch_adamw(const std::vector<double>& p0, const std::vector<double>& g,
                                     const AdamWParams& hp) {
  std::vector<long double> p(p0.begin(), p0.end());
  const long double bc1 = 1 - std::pow((long double)hp.beta1, (long double)hp.step);
  const long double bc2 = 1 - std::pow((long double)hp.beta2, (long double)hp.step);
  for (std::size_t i = 0; i < p.size(); ++i) {  // m = v = 0 before the first step
    p[i] *= 1 - (long double)hp.lr * hp.weight_decay;
    const long double m = (1 - (long double)hp.beta1) * g[i];
    const long double v = (1 - (long double)hp.beta2) * g[i] * g[i];
    p[i] -= (long double)hp.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + hp.eps);
  }
  return p;
}

TEST(MultiTensorAdamWHost, DecayFlagSelectsTheWeightDecay) {
  const index_t n = 257;
  AdamWParams hp;
  hp.lr = 0.05, hp.weight_decay = 0.5, hp.step = 1;  // decay large enough to see
  for (bool decay : {true, false}) {
    AdamWTensor t{random_tensor(n, DType::F64, 1, 2), random_tensor(n, DType::F64, -1, 1),
                  Tensor::zeros({n}, DType::F64), Tensor::zeros({n}, DType::F64), Tensor(), decay};
    const std::vector<double> p0 = t.param.to_doubles(), g = t.grad.to_doubles();
    MultiTensorAdamW update;
    update.step({t}, hp);
    AdamWParams expected_hp = hp;
    expected_hp.weight_decay = decay ? hp.weight_decay : 0.0;
    const std::vector<long double> want = torch_adamw(p0, g, expected_hp);
    const std::vector<double> got = t.param.to_doubles();
    for (index_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[std::size_t(i)], double(want[std::size_t(i)]), 1e-12)
          << "decay=" << decay << " element " << i;
  }
}

TEST(MultiTensorAdamWHost, SingleStepWithCopyEqualsStepThenCast) {
  for (DType copy_dtype : {DType::BF16, DType::F16})
    for (index_t n : {index_t(1), index_t(7), index_t(4099)}) {
      Tensor p = random_tensor(n, DType::F32, -3, 3), g = random_tensor(n, DType::F32, -1, 1),
             m = random_tensor(n, DType::F32, -0.1, 0.1), v = random_tensor(n, DType::F32, 0, 0.01);
      Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
      Tensor copy = Tensor::zeros({n}, copy_dtype), copy2 = Tensor::zeros({n}, copy_dtype);
      AdamWParams hp;
      hp.lr = 1e-2, hp.weight_decay = 0.1, hp.step = 3;
      adamw_step(p, g, m, v, hp, &copy);
      adamw_step(p2, g, m2, v2, hp);
      cast(p2, copy2);
      const std::string what = std::string(dtype_name(copy_dtype)) + " n=" + std::to_string(n);
      EXPECT_TRUE(bitwise_equal(p, p2)) << what;
      EXPECT_TRUE(bitwise_equal(m, m2)) << what;
      EXPECT_TRUE(bitwise_equal(v, v2)) << what;
      EXPECT_TRUE(bitwise_equal(copy, copy2)) << what;
    }
}

// Clipping from a sum of squares the host has not read (the device path's
// AdamWParams::grad_sum_of_squares, here in host memory): the update equals
// the one with grad_scale = clip_factor(sqrt(sum), clip) given directly, bit
// for bit; a sum below the clip leaves the gradients unscaled; a non-finite
// norm under skip_nonfinite changes nothing (without it NaN updates
// unclipped and inf with a factor of 0, as torch's clip_grad_norm_ would).
TEST(MultiTensorAdamWHost, ClipFromASumOfSquaresTensorEqualsTheGivenFactor) {
  ops::AdamWParams hp;
  hp.lr = 1e-3, hp.weight_decay = 0.1, hp.step = 5;
  const double clip = 1.0;
  Tensor sum = Tensor::zeros({1}, DType::F64);
  for (const double squares : {25.0, 0.25, std::nan(""), HUGE_VAL}) {
    for (const bool skip : {true, false}) {
      const std::string what = "sum " + std::to_string(squares) + (skip ? " skip" : "");
      const State before = random_state(DType::F32);
      State fused = before.clone(), given = before.clone();
      sum.data<double>()[0] = squares;
      ops::AdamWParams from_norm = hp;
      from_norm.grad_sum_of_squares = &sum;
      from_norm.clip_grad = clip;
      from_norm.skip_nonfinite = skip;
      MultiTensorAdamW a, b;
      a.step(fused.tensors, from_norm);
      const double norm = std::sqrt(squares);
      if (skip && !std::isfinite(norm)) {
        expect_bitwise(fused, before, what + " (skipped: unchanged)");
        continue;
      }
      ops::AdamWParams scaled = hp;
      scaled.grad_scale = clip_factor(norm, clip);
      if (squares == 25.0) EXPECT_EQ(scaled.grad_scale, clip / (5.0 + 1e-6));
      if (squares == 0.25) EXPECT_EQ(scaled.grad_scale, 1.0);
      b.step(given.tensors, scaled);
      expect_bitwise(fused, given, what);
      EXPECT_FALSE(bitwise_equal(fused.tensors[0].param, before.tensors[0].param)) << what;
    }
  }
}

}  // namespace
}  // namespace meshtron::ops

namespace meshtron::ops {
namespace {

// Clipping folded into the update: grad_scale equals scaling the gradient
// with ops::scale first, bit for bit, and the gradient is not modified.
TEST(MultiTensorAdamWHost, GradScaleEqualsScalingTheGradientFirst) {
  for (DType dtype : {DType::F32, DType::F64}) {
    const index_t n = 1001;
    Tensor p = random_tensor(n, dtype, -1, 1), g = random_tensor(n, dtype, -3, 3),
           m = random_tensor(n, dtype, -0.1, 0.1), v = random_tensor(n, dtype, 0, 0.01);
    Tensor p2 = p.clone(), g2 = g.clone(), m2 = m.clone(), v2 = v.clone();
    const Tensor g_before = g.clone();
    ops::AdamWParams hp;
    hp.lr = 1e-3, hp.weight_decay = 0.1, hp.step = 3;
    ops::AdamWParams scaled = hp;
    scaled.grad_scale = 0.4375;
    ops::adamw_step(p, g, m, v, scaled);
    ops::scale(g2, 0.4375);
    ops::adamw_step(p2, g2, m2, v2, hp);
    EXPECT_TRUE(bitwise_equal(p, p2)) << dtype_name(dtype);
    EXPECT_TRUE(bitwise_equal(m, m2)) << dtype_name(dtype);
    EXPECT_TRUE(bitwise_equal(v, v2)) << dtype_name(dtype);
    EXPECT_TRUE(bitwise_equal(g, g_before)) << dtype_name(dtype) << ": grad modified";
    EXPECT_FALSE(bitwise_equal(p, random_tensor(n, dtype, -1, 1)));
  }
}

}  // namespace
}  // namespace meshtron::ops
