// Tests of the host RMSNorm, rotary position embedding and MLP activation
// ops (gated, and the plain erf GeLU and ReLU; src/ops/ops.hpp) in fp32,
// fp64, bf16 and fp16.
//
// Each op is compared with a reference written here in long double on the
// same (rounded) inputs: tolerance 1e-6 in fp32, 1e-12 in fp64, 1e-2 in
// bf16 and 2e-3 in fp16 (norm-wise, op_test_support.hpp). Backward ops are
// also compared with central finite differences of their forward in fp64,
// and the rotary layouts and activations with values worked out by hand.
//
// Run: ctest -R ops_host_rmsnorm_rotary_glu --output-on-failure
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.hpp"
#include "ops/ops.hpp"
#include "tests/ops/op_test_support.hpp"

namespace meshtron::ops {
namespace {

using namespace test_support;

template <class T>
constexpr double kTol = std::is_same_v<T, float>    ? 1e-6
                        : std::is_same_v<T, double> ? 1e-12
                        : std::is_same_v<T, bf16>   ? 1e-2
                                                    : 2e-3;
constexpr double kFiniteDiffTol = 1e-6;

struct StorageTypeNames {
  template <class T>
  static std::string GetName(int) {
    return std::string(dtype_name(dtype_v<T>));
  }
};
using StorageTypes = ::testing::Types<float, double, bf16, fp16>;

template <class T>
class HostStorage : public ::testing::Test {
 public:
  static constexpr DType dtype = dtype_v<T>;
  static constexpr double tol = kTol<T>;
  /// rstd's dtype, and that of a bf16/fp16 weight's gradient.
  static constexpr DType wide = std::is_same_v<T, double> ? DType::F64 : DType::F32;
  std::mt19937_64 rng{20240917};
};
TYPED_TEST_SUITE(HostStorage, StorageTypes, StorageTypeNames);

/// Rows x features not multiples of any vector width.
const std::vector<std::pair<index_t, index_t>> kShapes = {{1, 1}, {3, 5}, {17, 64}, {33, 130}};

// ================================================================ RMSNorm ==

struct RmsRef {
  Values y, rstd;
};

RmsRef reference_rmsnorm(const Values& x, const Values& gamma, index_t N, index_t H, double eps) {
  RmsRef r{Values(x.size()), Values(std::size_t(N))};
  for (index_t n = 0; n < N; ++n) {
    LD sq = 0;
    for (index_t h = 0; h < H; ++h) sq += LD(x[n * H + h]) * x[n * H + h];
    const LD rs = 1 / std::sqrt(sq / H + eps);
    for (index_t h = 0; h < H; ++h) r.y[n * H + h] = double(x[n * H + h] * rs * gamma[h]);
    r.rstd[n] = double(rs);
  }
  return r;
}

struct RmsGrads {
  Values dx, dgamma;
};

/// dx from the chain rule through rstd; dgamma added to `dgamma`.
RmsGrads reference_rmsnorm_backward(const Values& dy, const Values& x, const Values& gamma,
                                    Values dgamma, index_t N, index_t H, double eps) {
  const Values rstd = reference_rmsnorm(x, gamma, N, H, eps).rstd;
  RmsGrads g{Values(x.size()), std::move(dgamma)};
  for (index_t n = 0; n < N; ++n) {
    const LD rs = rstd[n];
    LD dot = 0;  // sum_h dy gamma x
    for (index_t h = 0; h < H; ++h) dot += LD(dy[n * H + h]) * gamma[h] * x[n * H + h];
    for (index_t h = 0; h < H; ++h) {
      const LD xh = x[n * H + h];
      g.dx[n * H + h] = double(rs * dy[n * H + h] * gamma[h] - rs * rs * rs * xh * dot / H);
    }
  }
  for (index_t h = 0; h < H; ++h) {
    LD sum = g.dgamma[h];
    for (index_t n = 0; n < N; ++n) sum += LD(dy[n * H + h]) * x[n * H + h] * rstd[n];
    g.dgamma[h] = double(sum);
  }
  return g;
}

TYPED_TEST(HostStorage, RmsNormForwardMatchesReference) {
  const double eps = 1e-5;
  for (auto [N, H] : kShapes) {
    const Tensor x = random_tensor({N, H}, this->dtype, this->rng, -2, 2);
    const Tensor gamma = random_tensor({H}, this->dtype, this->rng, 0.5, 1.5);
    Tensor y = Tensor::empty({N, H}, this->dtype), rstd = Tensor::empty({N}, this->wide);
    rmsnorm_forward(x, gamma, eps, y, rstd);
    const RmsRef want = reference_rmsnorm(x.to_doubles(), gamma.to_doubles(), N, H, eps);
    expect_close(y.to_doubles(), want.y, this->tol, where("rmsnorm y", {N, H}));
    expect_close(rstd.to_doubles(), want.rstd, kTol<float>, where("rmsnorm rstd", {N, H}));
  }
}

TYPED_TEST(HostStorage, RmsNormBackwardMatchesReferenceAndAccumulates) {
  const double eps = 1e-5;
  for (auto [N, H] : kShapes) {
    // H = 1: dx = rstd g (1 - xhat^2) cancels down to ~eps / x^2 of its
    // terms, below what the fp32 rstd the forward saves can resolve.
    if (H == 1) continue;
    const Tensor x = random_tensor({N, H}, this->dtype, this->rng, -2, 2);
    const Tensor gamma = random_tensor({H}, this->dtype, this->rng, 0.5, 1.5);
    const Tensor dy = random_tensor({N, H}, this->dtype, this->rng);
    Tensor y = Tensor::empty({N, H}, this->dtype), rstd = Tensor::empty({N}, this->wide);
    rmsnorm_forward(x, gamma, eps, y, rstd);
    Tensor dx = Tensor::empty({N, H}, this->dtype);
    Tensor dgamma = random_tensor({H}, this->wide, this->rng);  // accumulated into
    const RmsGrads want = reference_rmsnorm_backward(
        dy.to_doubles(), x.to_doubles(), gamma.to_doubles(), dgamma.to_doubles(), N, H, eps);
    rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma);
    expect_close(dx.to_doubles(), want.dx, this->tol, where("rmsnorm dx", {N, H}));
    expect_close(dgamma.to_doubles(), want.dgamma, this->tol, where("rmsnorm dgamma", {N, H}));

    rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma, GradStore::Overwrite);
    const RmsGrads fresh = reference_rmsnorm_backward(
        dy.to_doubles(), x.to_doubles(), gamma.to_doubles(), Values(H, 0.0), N, H, eps);
    expect_close(dgamma.to_doubles(), fresh.dgamma, this->tol,
                 where("rmsnorm dgamma overwritten", {N, H}));
  }
}

TEST(RmsNormHalfStorage, DgammaMayBeTheStorageDtype) {
  std::mt19937_64 rng(7);
  const index_t N = 9, H = 12;
  const Tensor x = random_tensor({N, H}, DType::BF16, rng),
               dy = random_tensor({N, H}, DType::BF16, rng);
  const Tensor gamma = random_tensor({H}, DType::BF16, rng, 0.5, 1.5);
  Tensor y = Tensor::empty({N, H}, DType::BF16), rstd = Tensor::empty({N}, DType::F32);
  rmsnorm_forward(x, gamma, 1e-6, y, rstd);
  Tensor dx = Tensor::empty({N, H}, DType::BF16), dgamma = Tensor::zeros({H}, DType::BF16);
  rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma);
  const RmsGrads want = reference_rmsnorm_backward(dy.to_doubles(), x.to_doubles(),
                                                   gamma.to_doubles(), Values(H, 0.0), N, H, 1e-6);
  expect_close(dgamma.to_doubles(), want.dgamma, kTol<bf16>, "bf16 dgamma");
}

TEST(RmsNormRounding, NormalisedRowIsRoundedBeforeTheWeightAsInTransformers) {
  // x = 1 + 2^-8 (exact in bf16) and x = 1 in one row: rstd ~ 0.99805, so
  // xhat_0 = 1.0019 rounds to 1.0 in bf16 (spacing 2^-7 above 1); times
  // gamma = 1 + 2^-7 that gives 1.0078125, whereas one rounding of
  // x * rstd * gamma (1.0097) gives 1.0078125 + 2^-7 = 1.015625.
  Tensor x = Tensor::empty({1, 2}, DType::BF16), gamma = Tensor::empty({2}, DType::BF16);
  set_element_from_double(x, 0, 1.0 + 1.0 / 256), set_element_from_double(x, 1, 1.0);
  gamma.fill(1.0 + 1.0 / 128);
  Tensor y = Tensor::empty({1, 2}, DType::BF16), rstd = Tensor::empty({1}, DType::F32);
  rmsnorm_forward(x, gamma, 1e-6, y, rstd);
  EXPECT_EQ(element_as_double(y, 0), 1.0078125);
}

TEST(OpsFiniteDifferences, RmsNormBackward) {
  std::mt19937_64 rng(11);
  const index_t N = 4, H = 7;
  const double eps = 1e-5;
  Tensor x = random_tensor({N, H}, DType::F64, rng, -2, 2);
  Tensor gamma = random_tensor({H}, DType::F64, rng, 0.5, 1.5);
  const Tensor w = random_tensor({N, H}, DType::F64, rng);
  Tensor y = Tensor::empty({N, H}, DType::F64), rstd = Tensor::empty({N}, DType::F64);
  const auto loss = [&] {
    rmsnorm_forward(x, gamma, eps, y, rstd);
    return weighted_sum(w, y);
  };
  loss();
  Tensor dx = Tensor::empty({N, H}, DType::F64), dgamma = Tensor::zeros({H}, DType::F64);
  rmsnorm_backward(w, x, gamma, rstd, dx, dgamma);
  expect_close(dx.to_doubles(), numeric_gradient(x, loss), kFiniteDiffTol,
               "rmsnorm dx vs finite differences");
  expect_close(dgamma.to_doubles(), numeric_gradient(gamma, loss), kFiniteDiffTol,
               "rmsnorm dgamma vs finite differences");
}

// ================================================================= Rotary ==

/// inv_freq and the angle in fp32 as transformers computes them (ops.hpp).
LD reference_angle(std::int32_t position, index_t i, index_t rotary_dim, double base) {
  const float inv_freq = 1.0f / std::pow(float(base), float(2 * i) / float(rotary_dim));
  return LD(float(position) * inv_freq);
}

/// transformers' q * cos + rotate_half(q) * sin (or rotate_every_two), by
/// `sign` times the angle, heads [0, rotated) only.
Values reference_rotary(const Values& x, const std::vector<std::int32_t>& positions, index_t heads,
                        index_t D, const RotarySpec& rope, index_t rotated, double sign) {
  Values y = x;
  const index_t R = rope.rotary_dim, half = R / 2;
  for (std::size_t t = 0; t < positions.size(); ++t)
    for (index_t h = 0; h < rotated; ++h) {
      const index_t base = (index_t(t) * heads + h) * D;
      for (index_t d = 0; d < R; ++d) {
        const bool split = rope.layout == RotaryLayout::HalfSplit;
        const index_t i = split ? d % half : d / 2;        // frequency index
        const bool first = split ? d < half : d % 2 == 0;  // x_i of the pair
        const index_t partner = split ? (first ? d + half : d - half) : (first ? d + 1 : d - 1);
        const LD a = sign * reference_angle(positions[t], i, R, rope.base);
        const LD rotated_half = first ? -LD(x[base + partner]) : LD(x[base + partner]);
        y[base + d] = double(x[base + d] * std::cos(a) + rotated_half * std::sin(a));
      }
    }
  return y;
}

Tensor positions_tensor(const std::vector<std::int32_t>& p) {
  Tensor t = Tensor::empty({index_t(p.size())}, DType::I32);
  for (std::size_t i = 0; i < p.size(); ++i) t.data<std::int32_t>()[i] = p[i];
  return t;
}

/// Decoding after a prefix of 37 tokens: batch 2, sequence 5, rows in
/// [s, b] order (attention.cpp's token-major layout).
std::vector<std::int32_t> offset_positions() {
  std::vector<std::int32_t> p;
  for (std::int32_t s = 0; s < 5; ++s)
    for (int b = 0; b < 2; ++b) p.push_back(37 + s);
  return p;
}

struct RotaryCase {
  index_t heads, head_dim, rotated_heads;
  double percent;
  RotaryLayout layout;
  double base;
};

const std::vector<RotaryCase> kRotaryCases = {
    {3, 8, 3, 1.0, RotaryLayout::HalfSplit, 10000.0},
    {3, 8, 3, 1.0, RotaryLayout::Interleaved, 10000.0},
    {2, 64, 2, 0.25, RotaryLayout::HalfSplit, 10000.0},    // GPT-NeoX's rotary_pct
    {2, 64, 2, 0.25, RotaryLayout::Interleaved, 10000.0},  // GPT-J's rotary_dim 64 of 256, scaled
    {6, 16, 4, 0.5, RotaryLayout::HalfSplit, 500000.0},    // q|k of a fused q|k|v, Llama 3 theta
};

std::string describe_case(const RotaryCase& c) {
  return std::string(c.layout == RotaryLayout::HalfSplit ? "half-split" : "interleaved") +
         " heads " + std::to_string(c.heads) + " rotated " + std::to_string(c.rotated_heads) +
         " head_dim " + std::to_string(c.head_dim) + " percent " + std::to_string(c.percent);
}

TYPED_TEST(HostStorage, RotaryForwardAndBackwardMatchReference) {
  const std::vector<std::int32_t> pos = offset_positions();
  const Tensor positions = positions_tensor(pos);
  const index_t T = index_t(pos.size());
  for (const RotaryCase& c : kRotaryCases) {
    const RotarySpec rope{rotary_dim_for(c.head_dim, c.percent), c.base, c.layout};
    const Tensor x = random_tensor({T, c.heads, c.head_dim}, this->dtype, this->rng);
    Tensor y = Tensor::empty(x.shape(), this->dtype), dx = Tensor::empty(x.shape(), this->dtype);
    rotary_forward(x, positions, rope, y, c.rotated_heads);
    rotary_backward(x, positions, rope, dx, c.rotated_heads);
    const Values xs = x.to_doubles();
    expect_close(y.to_doubles(),
                 reference_rotary(xs, pos, c.heads, c.head_dim, rope, c.rotated_heads, 1.0),
                 this->tol, "rotary forward, " + describe_case(c));
    expect_close(dx.to_doubles(),
                 reference_rotary(xs, pos, c.heads, c.head_dim, rope, c.rotated_heads, -1.0),
                 this->tol, "rotary backward, " + describe_case(c));

    Tensor in_place = x.clone();
    rotary_forward(in_place, positions, rope, in_place, c.rotated_heads);
    EXPECT_EQ(in_place.to_doubles(), y.to_doubles()) << "in place, " << describe_case(c);
  }
}

TEST(Rotary, LayoutsPairTheDimsAsTransformers) {
  // head_dim 4, base 10000: inv_freq = {1, 1/100}; position 1 rotates the
  // first pair by 1 rad. x = e_0: half-split pairs (0, 2), interleaved (0, 1).
  Tensor x = Tensor::zeros({1, 1, 4}, DType::F64);
  x.data<double>()[0] = 1;
  const Tensor positions = positions_tensor({1});
  const double c = std::cos(1.0), s = std::sin(1.0);
  Tensor y = Tensor::empty({1, 1, 4}, DType::F64);
  rotary_forward(x, positions, {4, 10000.0, RotaryLayout::HalfSplit}, y);
  expect_close(y.to_doubles(), {c, 0, s, 0}, 1e-7, "half-split e_0");
  rotary_forward(x, positions, {4, 10000.0, RotaryLayout::Interleaved}, y);
  expect_close(y.to_doubles(), {c, s, 0, 0}, 1e-7, "interleaved e_0");
  // The second frequency: x = e_1 (half-split pair (1, 3)) at position 100
  // turns by 1 rad.
  x.fill(0.0);
  x.data<double>()[1] = 1;
  rotary_forward(x, positions_tensor({100}), {4, 10000.0, RotaryLayout::HalfSplit}, y);
  expect_close(y.to_doubles(), {0, c, 0, s}, 1e-6, "half-split e_1 at 100");
}

TEST(Rotary, BackwardUndoesForwardAndLeavesTheRestAlone) {
  std::mt19937_64 rng(3);
  const std::vector<std::int32_t> pos = offset_positions();
  const Tensor positions = positions_tensor(pos);
  const Tensor x = random_tensor({index_t(pos.size()), 4, 12}, DType::F64, rng);
  const RotarySpec rope{rotary_dim_for(12, 0.5), 10000.0, RotaryLayout::HalfSplit};
  Tensor y = Tensor::empty(x.shape(), DType::F64), back = Tensor::empty(x.shape(), DType::F64);
  rotary_forward(x, positions, rope, y, 3);
  rotary_backward(y, positions, rope, back, 3);
  expect_close(back.to_doubles(), x.to_doubles(), 1e-14, "backward(forward(x))");
  for (index_t t = 0; t < index_t(pos.size()); ++t)
    for (index_t h = 0; h < 4; ++h)
      for (index_t d = 0; d < 12; ++d) {
        const index_t i = (t * 4 + h) * 12 + d;
        if (h == 3 || d >= 6) EXPECT_EQ(element_as_double(y, i), element_as_double(x, i)) << i;
      }
}

TEST(OpsFiniteDifferences, RotaryBackward) {
  std::mt19937_64 rng(5);
  const Tensor positions = positions_tensor({0, 3, 9});
  Tensor x = random_tensor({3, 2, 6}, DType::F64, rng);
  const Tensor w = random_tensor({3, 2, 6}, DType::F64, rng);
  for (RotaryLayout layout : {RotaryLayout::HalfSplit, RotaryLayout::Interleaved}) {
    const RotarySpec rope{4, 10000.0, layout};
    Tensor y = Tensor::empty(x.shape(), DType::F64), dx = Tensor::empty(x.shape(), DType::F64);
    const auto loss = [&] {
      rotary_forward(x, positions, rope, y);
      return weighted_sum(w, y);
    };
    rotary_backward(w, positions, rope, dx);
    expect_close(dx.to_doubles(), numeric_gradient(x, loss), kFiniteDiffTol,
                 "rotary dx vs finite differences");
  }
}

TEST(Rotary, RotaryDimForRejectsOddOrEmptyDims) {
  EXPECT_EQ(rotary_dim_for(64, 0.25), 16);
  EXPECT_EQ(rotary_dim_for(128, 1.0), 128);
  EXPECT_THROW(rotary_dim_for(10, 0.5), UserError);  // 5 dims
  EXPECT_THROW(rotary_dim_for(64, 0.0), UserError);
  EXPECT_THROW(rotary_dim_for(64, 1.5), UserError);
}

// ====================================================== Gated activations ==

const std::vector<GatedActivation> kGates = {GatedActivation::SiLU, GatedActivation::GeLUTanh,
                                             GatedActivation::GeLUErf, GatedActivation::ReLU};

const char* gate_name(GatedActivation act) {
  return act == GatedActivation::SiLU       ? "SwiGLU"
         : act == GatedActivation::GeLUTanh ? "GeGLU tanh"
         : act == GatedActivation::ReLU     ? "ReGLU"
                                            : "GeGLU erf";
}

LD reference_gate(GatedActivation act, LD a) {
  if (act == GatedActivation::SiLU) return a / (1 + std::exp(-a));
  if (act == GatedActivation::ReLU) return a > 0 ? a : 0;
  if (act == GatedActivation::GeLUErf) return 0.5L * a * (1 + std::erf(a / std::sqrt(2.0L)));
  const LD c = std::sqrt(2.0L / 3.14159265358979323846264338327950288L);
  return 0.5L * a * (1 + std::tanh(c * (a + 0.044715L * a * a * a)));
}

/// The derivative: analytic for the erf GeLU (Phi(a) + a phi(a)) and ReLU,
/// else by central differences in long double (step 1e-6: error ~1e-12
/// relative).
LD reference_gate_slope(GatedActivation act, LD a) {
  if (act == GatedActivation::ReLU) return a > 0 ? 1 : 0;
  if (act == GatedActivation::GeLUErf)
    return 0.5L * (1 + std::erf(a / std::sqrt(2.0L))) +
           a * std::exp(-a * a / 2) / std::sqrt(2 * 3.14159265358979323846264338327950288L);
  const LD h = 1e-6L;
  return (reference_gate(act, a + h) - reference_gate(act, a - h)) / (2 * h);
}

TYPED_TEST(HostStorage, GatedActivationsMatchReference) {
  for (auto [N, F] : kShapes)
    for (GatedActivation act : kGates) {
      const Tensor x = random_tensor({N, 2 * F}, this->dtype, this->rng, -5, 5);
      const Tensor dy = random_tensor({N, F}, this->dtype, this->rng);
      Tensor y = Tensor::empty({N, F}, this->dtype), dx = Tensor::empty({N, 2 * F}, this->dtype);
      gated_activation_forward(x, act, y);
      gated_activation_backward(dy, x, act, dx);
      const Values xs = x.to_doubles(), dys = dy.to_doubles();
      Values want_y(std::size_t(N * F)), want_dx(xs.size());
      for (index_t n = 0; n < N; ++n)
        for (index_t c = 0; c < F; ++c) {
          const LD a = xs[n * 2 * F + c], b = xs[n * 2 * F + F + c], d = dys[n * F + c];
          want_y[n * F + c] = double(reference_gate(act, a) * b);
          want_dx[n * 2 * F + c] = double(d * reference_gate_slope(act, a) * b);
          want_dx[n * 2 * F + F + c] = double(d * reference_gate(act, a));
        }
      const double slope_tol = std::max(this->tol, 1e-9);  // the reference slope's own error
      expect_close(y.to_doubles(), want_y, this->tol, where(gate_name(act), {N, 2 * F}));
      expect_close(dx.to_doubles(), want_dx, slope_tol, where(gate_name(act), {N, 2 * F}));
    }
}

TEST(GatedActivations, ValuesAtOneAsTransformers) {
  // x = (gate 1 | up 2): silu(1) = 0.7310585786, gelu(1) = 0.8413447461,
  // gelu_pytorch_tanh(1) = 0.8411919906.
  Tensor x = Tensor::empty({1, 2}, DType::F64);
  x.data<double>()[0] = 1, x.data<double>()[1] = 2;
  Tensor y = Tensor::empty({1, 1}, DType::F64);
  const std::vector<std::pair<GatedActivation, double>> want = {
      {GatedActivation::SiLU, 0.7310585786},
      {GatedActivation::GeLUErf, 0.8413447461},
      {GatedActivation::GeLUTanh, 0.8411919906}};
  for (auto [act, value] : want) {
    gated_activation_forward(x, act, y);
    EXPECT_NEAR(y.data<double>()[0], 2 * value, 1e-9) << gate_name(act);
  }
}

TEST(OpsFiniteDifferences, GatedActivationBackward) {
  std::mt19937_64 rng(13);
  Tensor x = random_tensor({3, 10}, DType::F64, rng, -4, 4);
  const Tensor w = random_tensor({3, 5}, DType::F64, rng);
  for (GatedActivation act : kGates) {
    Tensor y = Tensor::empty({3, 5}, DType::F64), dx = Tensor::empty({3, 10}, DType::F64);
    const auto loss = [&] {
      gated_activation_forward(x, act, y);
      return weighted_sum(w, y);
    };
    gated_activation_backward(w, x, act, dx);
    expect_close(dx.to_doubles(), numeric_gradient(x, loss), kFiniteDiffTol,
                 std::string(gate_name(act)) + " dx vs finite differences");
  }
}

// ===================================================== Plain activations ==

const std::vector<GatedActivation> kPlain = {GatedActivation::GeLUErf, GatedActivation::ReLU};

TYPED_TEST(HostStorage, PlainActivationsMatchReference) {
  for (auto [N, F] : kShapes)
    for (GatedActivation act : kPlain) {
      const Tensor x = random_tensor({N, F}, this->dtype, this->rng, -6, 6);
      const Tensor dy = random_tensor({N, F}, this->dtype, this->rng);
      Tensor y = Tensor::empty({N, F}, this->dtype), dx = Tensor::empty({N, F}, this->dtype);
      activation_forward(x, act, y);
      activation_backward(dy, x, act, dx);
      const Values xs = x.to_doubles(), dys = dy.to_doubles();
      Values want_y(xs.size()), want_dx(xs.size());
      for (std::size_t i = 0; i < xs.size(); ++i) {
        want_y[i] = double(reference_gate(act, xs[i]));
        want_dx[i] = double(dys[i] * reference_gate_slope(act, xs[i]));
      }
      const std::string what = act == GatedActivation::ReLU ? "ReLU" : "GeLU erf";
      expect_close(y.to_doubles(), want_y, this->tol, where(what.c_str(), {N, F}));
      expect_close(dx.to_doubles(), want_dx, this->tol, where(what.c_str(), {N, F}));
    }
}

TEST(PlainActivations, ValuesAsTorch) {
  // torch.nn.functional.gelu (exact) at -3, -1, 0, 1: -0.0040496941,
  // -0.1586552539, 0, 0.8413447461; relu at the same: 0, 0, 0, 1 and its
  // slope 0 at 0 (threshold_backward).
  const double xs[] = {-3, -1, 0, 1};
  const double gelu[] = {-0.0040496941, -0.1586552539, 0, 0.8413447461};
  Tensor x = Tensor::empty({4}, DType::F64), y = Tensor::empty({4}, DType::F64);
  Tensor dx = Tensor::empty({4}, DType::F64), ones = Tensor::empty({4}, DType::F64);
  for (int i = 0; i < 4; ++i) x.data<double>()[i] = xs[i], ones.data<double>()[i] = 1;
  activation_forward(x, GatedActivation::GeLUErf, y);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y.data<double>()[i], gelu[i], 1e-9) << xs[i];
  activation_forward(x, GatedActivation::ReLU, y);
  activation_backward(ones, x, GatedActivation::ReLU, dx);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(y.data<double>()[i], std::max(xs[i], 0.0)) << xs[i];
    EXPECT_EQ(dx.data<double>()[i], xs[i] > 0 ? 1.0 : 0.0) << xs[i];
  }
}

TEST(OpsFiniteDifferences, PlainActivationBackward) {
  std::mt19937_64 rng(17);
  Tensor x = random_tensor({3, 7}, DType::F64, rng, -4, 4);
  const Tensor w = random_tensor({3, 7}, DType::F64, rng);
  for (GatedActivation act : kPlain) {
    Tensor y = Tensor::empty({3, 7}, DType::F64), dx = Tensor::empty({3, 7}, DType::F64);
    const auto loss = [&] {
      activation_forward(x, act, y);
      return weighted_sum(w, y);
    };
    activation_backward(w, x, act, dx);
    expect_close(dx.to_doubles(), numeric_gradient(x, loss), kFiniteDiffTol,
                 std::string(gate_name(act)) + " plain dx vs finite differences");
  }
}

TEST(PlainActivationsDeathTest, RejectMismatchedShapes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // MPI's helper threads: re-execute, not fork
  const Tensor x = Tensor::zeros({2, 3}, DType::F32);
  Tensor y = Tensor::empty({3, 2}, DType::F32);
  EXPECT_DEATH(activation_forward(x, GatedActivation::GeLUErf, y), "must match");
}

}  // namespace
}  // namespace meshtron::ops
