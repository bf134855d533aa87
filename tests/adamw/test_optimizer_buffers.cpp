// The optimizers' flat buffers on the host: AdamW keeps every gradient in one
// buffer and DistributedAdamW with overlap makes the gradients (and values)
// views of its bucket buffers. The parameters' contents survive the move,
// zero_grad clears every gradient, and the gradient norm over the merged
// runs equals the norm computed per tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "common/parameter_set.hpp"

#include "parallel/communicator.hpp"
#include "train/optimizer.hpp"

namespace meshtron {
namespace {

using Model = testing_util::ParameterSet;

Model make_model() {
  Model m;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> dist(-1, 1);
  const Shape shapes[] = {{7, 3}, {5}, {4, 4}, {1}, {13}};
  for (const Shape& s : shapes) {
    Parameter& p = m.params.emplace_back();
    p.name = "p" + std::to_string(m.params.size());
    p.global_shape = s;
    p.value = Tensor::empty(s);
    p.grad = Tensor::empty(s);
    for (index_t i = 0; i < p.value.numel(); ++i) {
      p.value.data<float>()[i] = float(dist(rng));
      p.grad.data<float>()[i] = float(dist(rng));
    }
  }
  return m;
}

std::vector<std::vector<double>> contents(const Model& m, Tensor Parameter::*field) {
  std::vector<std::vector<double>> out;
  for (const Parameter& p : m.params) out.push_back((p.*field).to_doubles());
  return out;
}

double norm_of(const Model& m) {
  double s = 0;
  for (const Parameter& p : m.params)
    for (double g : p.grad.to_doubles()) s += g * g;
  return std::sqrt(s);
}

/// Whether each parameter's `field` starts where the previous one ends.
bool back_to_back(const Model& m, Tensor Parameter::*field) {
  for (std::size_t i = 1; i < m.params.size(); ++i) {
    const Tensor &a = m.params[i - 1].*field, &b = m.params[i].*field;
    if (static_cast<const char*>(a.raw()) + a.bytes() != b.raw()) return false;
  }
  return true;
}

struct Groups {
  MpiCommunicator tp{MPI_COMM_SELF}, dp{MPI_COMM_SELF}, model{MPI_COMM_SELF};
  OptimizerGroups get() { return {tp, dp, model, nullptr}; }
};

TEST(OptimizerBuffers, AdamWKeepsEveryGradientInOneBuffer) {
  Model m = make_model();
  ASSERT_FALSE(back_to_back(m, &Parameter::grad));
  const auto grads = contents(m, &Parameter::grad);
  const double norm = norm_of(m);
  AdamW adam(m.list(), AdamWConfig{0.9, 0.95, 1e-8, 0.1, /*clip_grad=*/1.0}, nullptr);
  EXPECT_TRUE(back_to_back(m, &Parameter::grad));
  EXPECT_EQ(contents(m, &Parameter::grad), grads);
  Groups g;
  OptimizerGroups groups = g.get();
  const StepStats stats = adam.step(1e-3, groups, true);
  EXPECT_NEAR(stats.grad_norm, norm, 1e-6 * norm);
  for (const auto& t : contents(m, &Parameter::grad))
    for (double v : t) EXPECT_EQ(v, 0.0);  // zero_grad after the step
}

TEST(OptimizerBuffers, DistributedAdamWWithOverlapAliasesGradientsAndValues) {
  Model m = make_model();
  const auto grads = contents(m, &Parameter::grad), values = contents(m, &Parameter::value);
  const double norm = norm_of(m);
  Groups g;
  BucketOverlap overlap;
  overlap.bucket_elements = 20, overlap.grad_reduce = true, overlap.param_gather = true;
  DistributedAdamW adam(m.list(), AdamWConfig{0.9, 0.95, 1e-8, 0.1, 1.0}, nullptr, g.dp, overlap);
  EXPECT_TRUE(back_to_back(m, &Parameter::grad));
  EXPECT_TRUE(back_to_back(m, &Parameter::value));
  EXPECT_EQ(contents(m, &Parameter::grad), grads);
  EXPECT_EQ(contents(m, &Parameter::value), values);
  OptimizerGroups groups = g.get();
  const StepStats stats = adam.step(1e-3, groups, true);
  adam.finish_param_gather();
  EXPECT_NEAR(stats.grad_norm, norm, 1e-6 * norm);
  for (const auto& t : contents(m, &Parameter::grad))
    for (double v : t) EXPECT_EQ(v, 0.0);
  // The update reached the values through the gathered buffer.
  EXPECT_NE(contents(m, &Parameter::value), values);
}

// Parameter::trailing_padding (a ColumnParallelLinear's bias row pads its
// weight block): every flat buffer leaves that many zeros after the
// parameter, so the pair stays adjacent with room for its padding rows, and
// the step reads and writes the parameters as without the padding.
Model make_padded_model(index_t padding) {
  Model m = make_model();
  m.params[1].trailing_padding = padding;  // after p2 [5], before p3
  return m;
}

/// Whether p3's `field` starts `padding` elements after p2's end.
bool padded_after_p2(const Model& m, Tensor Parameter::*field, index_t padding) {
  const Tensor &a = m.params[1].*field, &b = m.params[2].*field;
  return static_cast<const char*>(a.raw()) + a.bytes() + padding * dtype_size(a.dtype()) ==
         b.raw();
}

/// The `padding` elements after p2's `field`.
std::vector<float> padding_of(const Model& m, Tensor Parameter::*field, index_t padding) {
  const Tensor& a = m.params[1].*field;
  const float* end = a.data<float>() + a.numel();
  return std::vector<float>(end, end + padding);
}

TEST(OptimizerBuffers, TrailingPaddingStaysZeroAfterItsParameter) {
  constexpr index_t padding = 6;
  Groups g;
  for (const bool distributed : {false, true}) {
    SCOPED_TRACE(distributed ? "DistributedAdamW" : "AdamW");
    Model plain = make_model(), padded = make_padded_model(padding);
    // No clipping: the norms may differ in their last bit (the zeros change
    // how the sum is split), the updates may not.
    const AdamWConfig config{0.9, 0.95, 1e-8, 0.1, /*clip_grad=*/0.0};
    BucketOverlap overlap;
    overlap.bucket_elements = 8, overlap.grad_reduce = true, overlap.param_gather = true;
    auto make = [&](Model& m) -> std::unique_ptr<Optimizer> {
      if (distributed)
        return std::make_unique<DistributedAdamW>(m.list(), config, nullptr, g.dp, overlap);
      return std::make_unique<AdamW>(m.list(), config, nullptr);
    };
    auto reference = make(plain), optimizer = make(padded);
    EXPECT_TRUE(padded_after_p2(padded, &Parameter::grad, padding));
    if (distributed) EXPECT_TRUE(padded_after_p2(padded, &Parameter::value, padding));
    EXPECT_EQ(contents(padded, &Parameter::grad), contents(plain, &Parameter::grad));
    EXPECT_EQ(padding_of(padded, &Parameter::grad, padding), std::vector<float>(padding, 0.f));
    for (int step = 0; step < 2; ++step) {
      OptimizerGroups groups = g.get();
      const StepStats want = reference->step(1e-2, groups, true);
      const StepStats got = optimizer->step(1e-2, groups, true);
      reference->finish_param_gather();
      optimizer->finish_param_gather();
      EXPECT_NEAR(got.grad_norm, want.grad_norm, 1e-12 * want.grad_norm);
      EXPECT_EQ(contents(padded, &Parameter::value), contents(plain, &Parameter::value));
      if (distributed)
        EXPECT_EQ(padding_of(padded, &Parameter::value, padding),
                  std::vector<float>(padding, 0.f));
      for (Model* m : {&padded, &plain})  // the next step's gradients
        for (Parameter& p : m->params) {
          p.grad.fill(0.5);
          p.grad_stale = false;
        }
    }
  }
}

}  // namespace
}  // namespace meshtron
