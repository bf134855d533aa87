// The CUDA kernels of the Llama / GPT-NeoX / GPT-J family ops against fp64
// references written here (the formulas of transformers and Megatron-LM):
//
//  * RMSNorm (kernels/cuda/rmsnorm.cu): y, rstd, dx (with and without the
//    residual branch's gradient), dgamma written and accumulated into fp32;
//    H = 4096, 768, 100, 7, 2. The reference rounds n = x rstd to the
//    dtype before the product with gamma, as LlamaRMSNorm does.
//  * Rotary embedding (kernels/cuda/rotary.cu) on q|k rows inside wider
//    token-major qkv rows: half-split and interleaved pairs, full and
//    partial rotary_dim, position offsets up to 5000, bases 1e4, 5e5, 1e6;
//    in place (the values past rotary_dim and the v columns must keep their
//    bits) and out of place (they must be copied); forward and backward,
//    and (fp32) backward(forward(x)) = x.
//  * SwiGLU, GeGLU (tanh, erf) and ReGLU (kernels/cuda/glu.cu), forward and
//    backward, on packed and element-by-element shapes (F = 768, 4096, 100,
//    11, and a misaligned view).
//  * The plain MLP's exact GeLU (GPT-NeoX) and ReLU (kernels/cuda/glu.cu's
//    activation_forward / activation_backward), the same shapes.
//
// Every dtype (fp32, bf16, fp16); inputs are rounded to the dtype first, so
// the reference sees the device's values. Outputs start as NaN (an unwritten
// element fails). Tolerance: max |dev - ref| <= tol max |ref| over the
// tensor, tol = 2e-6..2e-5 for fp32 (by the length of the fp32 sums),
// 1e-2 for bf16, 2e-3 for fp16 (2-4 ulp at the tensor's largest value).
//
// Run: ctest -R gpu_model_ops --output-on-failure   (skips, exit 0, without a GPU)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "ops/ops.hpp"
#include "ops/ops_cuda.hpp"

namespace meshtron {
namespace {

using gpu_test::poisoned;
using gpu_test::random_rounded;

const std::vector<DType> kDtypes = {DType::F32, DType::BF16, DType::F16};

/// fp32_tol for fp32 outputs, else the 16-bit dtype's.
double tolerance(DType t, double fp32_tol) {
  return t == DType::F32 ? fp32_tol : t == DType::BF16 ? 1e-2 : 2e-3;
}

/// v rounded to a 16-bit dtype through fp32 (as the kernels round their
/// fp32 values); fp32 values are not rounded (the kernels keep fp32 there).
double round_to(DType t, double v) {
  if (t == DType::BF16) return double(float(bf16(float(v))));
  if (t == DType::F16) return double(float(fp16(float(v))));
  return v;
}

/// A random input: its values (rounded to t) and a device copy of dtype t.
struct Operand {
  std::vector<double> values;
  Tensor dev;
};
Operand operand(const Shape& shape, DType t, std::uint64_t seed, double lo, double hi) {
  const Tensor host = random_rounded(shape, t, seed, lo, hi);
  return {host.to_doubles(), host.to(t).to_device()};
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  std::size_t worst = 0;
  double worst_err = -1.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::isfinite(got[i]) ? std::abs(got[i] - want[i]) : INFINITY;
    if (err > worst_err) {
      worst_err = err;
      worst = i;
    }
  }
  EXPECT_LE(worst_err, tol * scale) << what << ": worst element " << worst << " is "
                                    << got[worst] << ", want " << want[worst] << " (scale "
                                    << scale << ")";
}

std::string shape_name(DType t, index_t rows, index_t cols) {
  return std::string(dtype_name(t)) + " [" + std::to_string(rows) + ", " + std::to_string(cols) +
         "]";
}

// =============================================================== RMSNorm ==

struct RmsNormReference {
  std::vector<double> y, rstd, dx, dgamma;
};

/// LlamaRMSNorm's forward and its autograd backward in fp64, n rounded to t
/// before the product with gamma and in dgamma's terms (the device's fp32
/// rounding points).
RmsNormReference rmsnorm_reference(DType t, const std::vector<double>& x,
                                   const std::vector<double>& gamma,
                                   const std::vector<double>& dy,
                                   const std::vector<double>& residual,
                                   const std::vector<double>& dgamma0, index_t N, index_t H,
                                   double eps) {
  RmsNormReference r{std::vector<double>(N * H), std::vector<double>(N),
                     std::vector<double>(N * H), dgamma0};
  for (index_t i = 0; i < N; ++i) {
    double sq = 0.0;
    for (index_t h = 0; h < H; ++h) sq += x[i * H + h] * x[i * H + h];
    const double rs = 1.0 / std::sqrt(sq / double(H) + eps);
    r.rstd[i] = rs;
    double sum_g_n = 0.0;
    for (index_t h = 0; h < H; ++h) sum_g_n += dy[i * H + h] * gamma[h] * x[i * H + h] * rs;
    for (index_t h = 0; h < H; ++h) {
      const index_t k = i * H + h;
      const double n = x[k] * rs, n_stored = round_to(t, n);
      r.y[k] = gamma[h] * n_stored;
      const double dx = rs * (dy[k] * gamma[h] - n * sum_g_n / double(H));
      r.dx[k] = residual.empty() ? dx : round_to(t, dx) + residual[k];
      r.dgamma[h] += dy[k] * n_stored;
    }
  }
  return r;
}

TEST(GpuModelOps, RmsNormMatchesReference) {
  REQUIRE_GPU();
  struct Case {
    index_t N, H;
    double eps;
  };
  // Not H = 1: there dx = rstd g (1 - n^2) with n^2 = 1 - O(eps), all
  // cancellation, a test of fp32 rounding rather than of the kernel.
  const std::vector<Case> cases = {{9, 4096, 1e-6}, {33, 768, 1e-5}, {64, 100, 1e-6},
                                   {3, 7, 1e-5},    {5, 2, 1e-6}};
  std::uint64_t seed = 1;
  for (DType t : kDtypes)
    for (const Case& c : cases)
      for (bool with_residual : {false, true}) {
        const index_t N = c.N, H = c.H;
        const std::string what = "rmsnorm " + shape_name(t, N, H) +
                                 (with_residual ? " + residual" : "");
        const Operand x = operand({N, H}, t, ++seed, -2.0, 2.0);
        const Operand gamma = operand({H}, t, ++seed, 0.5, 1.5);
        const Operand dy = operand({N, H}, t, ++seed, -1.0, 1.0);
        const Operand residual = operand({N, H}, t, ++seed, -1.0, 1.0);
        // Accumulated into with the residual case, written without.
        const Operand dgamma0 = operand({H}, DType::F32, ++seed, -1.0, 1.0);
        Tensor y = poisoned({N, H}, t), dx = poisoned({N, H}, t);
        Tensor rstd = poisoned({N}, DType::F32);
        Tensor dgamma = with_residual ? dgamma0.dev.clone() : poisoned({H}, DType::F32);

        cuda::rmsnorm_forward(t, x.dev.raw(), gamma.dev.raw(), N, H, c.eps, y.raw(),
                              rstd.data<float>());
        cuda::rmsnorm_backward(t, DType::F32, dy.dev.raw(), x.dev.raw(), gamma.dev.raw(),
                               rstd.data<float>(), N, H, dx.raw(), dgamma.raw(),
                               with_residual ? residual.dev.raw() : nullptr, with_residual);

        const RmsNormReference ref = rmsnorm_reference(
            t, x.values, gamma.values, dy.values,
            with_residual ? residual.values : std::vector<double>{},
            with_residual ? dgamma0.values : std::vector<double>(H, 0.0), N, H, c.eps);
        expect_close(y.to_doubles(), ref.y, tolerance(t, 2e-6), what + " y");
        expect_close(rstd.to_doubles(), ref.rstd, 2e-6, what + " rstd");
        expect_close(dx.to_doubles(), ref.dx, tolerance(t, 5e-6), what + " dx");
        expect_close(dgamma.to_doubles(), ref.dgamma, tolerance(t, 2e-5), what + " dgamma");
      }
}

TEST(GpuModelOps, RmsNormGradientsInTheInputDtype) {
  REQUIRE_GPU();
  const index_t N = 17, H = 768;
  for (DType t : {DType::BF16, DType::F16}) {
    const Operand x = operand({N, H}, t, 101, -2.0, 2.0), gamma = operand({H}, t, 102, 0.5, 1.5);
    const Operand dy = operand({N, H}, t, 103, -1.0, 1.0), dgamma0 = operand({H}, t, 104, -1, 1);
    Tensor y = poisoned({N, H}, t), dx = poisoned({N, H}, t), rstd = poisoned({N}, DType::F32);
    Tensor dgamma = dgamma0.dev.clone();
    cuda::rmsnorm_forward(t, x.dev.raw(), gamma.dev.raw(), N, H, 1e-6, y.raw(), rstd.data<float>());
    cuda::rmsnorm_backward(t, t, dy.dev.raw(), x.dev.raw(), gamma.dev.raw(), rstd.data<float>(), N,
                           H, dx.raw(), dgamma.raw(), nullptr, /*accumulate=*/true);
    const RmsNormReference ref = rmsnorm_reference(t, x.values, gamma.values, dy.values, {},
                                                   dgamma0.values, N, H, 1e-6);
    expect_close(dgamma.to_doubles(), ref.dgamma, tolerance(t, 0), shape_name(t, N, H) +
                                                                       " dgamma in " +
                                                                       std::string(dtype_name(t)));
  }
}

// ====================================================== Rotary embedding ==

struct RotaryCase {
  index_t s, b, heads, head_dim, rotary_dim;
  cuda::RotaryLayout layout;
  int offset;
  double base;
};

std::string rotary_name(DType t, const RotaryCase& c) {
  return std::string(dtype_name(t)) + " heads " + std::to_string(c.heads) + " x " +
         std::to_string(c.head_dim) + " rotary " + std::to_string(c.rotary_dim) +
         (c.layout == cuda::RotaryLayout::Interleaved ? " interleaved" : " half-split") +
         " offset " + std::to_string(c.offset) + " base " + std::to_string(c.base);
}

/// Token t = (sequence index) b + sample, as the [s, b] rows of the
/// activations: its position is offset + t / b.
std::vector<std::int32_t> rotary_positions(const RotaryCase& c) {
  std::vector<std::int32_t> p(c.s * c.b);
  for (index_t t = 0; t < c.s * c.b; ++t) p[t] = std::int32_t(c.offset + t / c.b);
  return p;
}

/// The angle of pair i at `position` as transformers computes it in fp32.
float rotary_angle(const RotaryCase& c, index_t i, std::int32_t position) {
  const float exponent = float(2 * i) / float(c.rotary_dim);
  const float inv_freq = 1.f / float(std::pow(double(float(c.base)), double(exponent)));
  return float(position) * inv_freq;
}

/// Rows [tokens, ld_out] of the reference: x's q|k heads (rows ld_in apart)
/// rotated by sigma angle; the values past rotary_dim copied, as are (when
/// ld_out == ld_in, in place) the columns past the heads.
std::vector<double> rotary_reference(const RotaryCase& c, const std::vector<double>& x,
                                     index_t ld_in, index_t ld_out, double sigma) {
  const index_t tokens = c.s * c.b, half = c.rotary_dim / 2;
  const bool interleaved = c.layout == cuda::RotaryLayout::Interleaved;
  const std::vector<std::int32_t> positions = rotary_positions(c);
  std::vector<double> y(tokens * ld_out);
  for (index_t t = 0; t < tokens; ++t) {
    for (index_t j = 0; j < ld_out; ++j) y[t * ld_out + j] = x[t * ld_in + j];
    for (index_t i = 0; i < half; ++i) {
      const double angle = rotary_angle(c, i, positions[t]);
      const double cs = std::cos(angle), sn = sigma * std::sin(angle);
      const index_t first = interleaved ? 2 * i : i, stride = interleaved ? 1 : half;
      for (index_t h = 0; h < c.heads; ++h) {
        const index_t ia = h * c.head_dim + first, ib = ia + stride;
        const double a = x[t * ld_in + ia], b = x[t * ld_in + ib];
        y[t * ld_out + ia] = a * cs - b * sn;
        y[t * ld_out + ib] = b * cs + a * sn;
      }
    }
  }
  return y;
}

/// Elements of `got` and `want` that must hold the same bits: every column
/// of a row but the rotated ones (in place: the unrotated values and v).
void expect_unrotated_bits_kept(const RotaryCase& c, const std::vector<double>& got,
                                const std::vector<double>& x, index_t ld,
                                const std::string& what) {
  const index_t tokens = c.s * c.b;
  index_t changed = 0;
  for (index_t t = 0; t < tokens; ++t)
    for (index_t j = 0; j < ld; ++j) {
      const bool rotated = j < c.heads * c.head_dim && j % c.head_dim < c.rotary_dim;
      if (!rotated && !(got[t * ld + j] == x[t * ld + j])) ++changed;
    }
  EXPECT_EQ(changed, 0) << what << ": values that do not rotate changed";
}

TEST(GpuModelOps, RotaryMatchesReference) {
  REQUIRE_GPU();
  using L = cuda::RotaryLayout;
  const std::vector<RotaryCase> cases = {
      {7, 3, 4, 64, 64, L::HalfSplit, 0, 1e4},       // Llama-style, q|k of 2 heads
      {5, 2, 6, 128, 32, L::HalfSplit, 1000, 1e4},   // Pythia: rotary_pct 0.25
      {9, 1, 3, 96, 24, L::HalfSplit, 37, 1e4},      // GPT-NeoX-20B: 96 x 0.25
      {3, 2, 5, 80, 80, L::HalfSplit, 4090, 1e6},    // 40 pairs (not a warp multiple)
      {6, 2, 4, 64, 64, L::Interleaved, 4090, 5e5},  // interleaved, full
      {4, 3, 2, 256, 64, L::Interleaved, 5000, 1e4}, // GPT-J: 256 x rotary 64
  };
  std::uint64_t seed = 1000;
  for (DType t : kDtypes)
    for (const RotaryCase& c : cases) {
      const std::string what = rotary_name(t, c);
      const index_t tokens = c.s * c.b, width = c.heads * c.head_dim;
      const index_t ld = width + 2 * c.head_dim + 1;  // v columns after q|k, an odd stride
      const std::vector<std::int32_t> pos = rotary_positions(c);
      Tensor positions_host = Tensor::empty({tokens}, DType::I32);
      std::copy(pos.begin(), pos.end(), positions_host.data<std::int32_t>());
      const Tensor positions = positions_host.to_device();
      const auto* p = static_cast<const std::int32_t*>(positions.raw());

      for (bool backward : {false, true}) {
        const double sigma = backward ? -1.0 : 1.0;
        const auto run = backward ? cuda::rotary_backward : cuda::rotary_forward;
        const std::string pass = what + (backward ? " backward" : " forward");
        const Operand x = operand({tokens, ld}, t, ++seed, -2.0, 2.0);
        const double tol = tolerance(t, 2e-6);

        Tensor in_place = x.dev.clone();
        run(t, in_place.raw(), ld, in_place.raw(), ld, p, tokens, c.heads, c.head_dim,
            c.rotary_dim, c.base, c.layout);
        const std::vector<double> got = in_place.to_doubles();
        expect_close(got, rotary_reference(c, x.values, ld, ld, sigma), tol, pass + " in place");
        expect_unrotated_bits_kept(c, got, x.values, ld, pass + " in place");

        Tensor out = poisoned({tokens, width}, t);
        run(t, x.dev.raw(), ld, out.raw(), width, p, tokens, c.heads, c.head_dim, c.rotary_dim,
            c.base, c.layout);
        expect_close(out.to_doubles(), rotary_reference(c, x.values, ld, width, sigma), tol,
                     pass + " out of place");
      }
    }
}

TEST(GpuModelOps, RotaryBackwardUndoesForward) {
  REQUIRE_GPU();
  for (cuda::RotaryLayout layout : {cuda::RotaryLayout::HalfSplit, cuda::RotaryLayout::Interleaved}) {
    const RotaryCase c{16, 2, 8, 128, 96, layout, 3000, 1e4};
    const index_t tokens = c.s * c.b, ld = c.heads * c.head_dim;
    const std::vector<std::int32_t> pos = rotary_positions(c);
    Tensor positions_host = Tensor::empty({tokens}, DType::I32);
    std::copy(pos.begin(), pos.end(), positions_host.data<std::int32_t>());
    const Tensor positions = positions_host.to_device();
    const auto* p = static_cast<const std::int32_t*>(positions.raw());
    const Operand x = operand({tokens, ld}, DType::F32, 77, -2.0, 2.0);
    Tensor y = x.dev.clone();
    cuda::rotary_forward(DType::F32, y.raw(), ld, y.raw(), ld, p, tokens, c.heads, c.head_dim,
                         c.rotary_dim, c.base, layout);
    const std::vector<double> rotated = y.to_doubles();
    cuda::rotary_backward(DType::F32, y.raw(), ld, y.raw(), ld, p, tokens, c.heads, c.head_dim,
                          c.rotary_dim, c.base, layout);
    // The rotation moved the values (a no-op kernel would pass the round trip).
    double moved = 0.0;
    for (std::size_t i = 0; i < rotated.size(); ++i)
      moved = std::max(moved, std::abs(rotated[i] - x.values[i]));
    EXPECT_GT(moved, 0.5) << rotary_name(DType::F32, c);
    expect_close(y.to_doubles(), x.values, 1e-6, rotary_name(DType::F32, c) + " round trip");
  }
}

// ========================================================= SwiGLU, GeGLU ==

struct Activation {
  cuda::GluActivation kind;
  const char* name;
  double (*value)(double);
  double (*grad)(double);
};

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double silu_grad(double v) {
  const double s = 1.0 / (1.0 + std::exp(-v));
  return s * (1.0 + v * (1.0 - s));
}
constexpr double kSqrt2OverPi = 0.79788456080286535588, kGeluCubic = 0.044715,
                 kSqrt2Pi = 2.50662827463100050242;
double gelu_tanh(double v) {
  return 0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
}
double gelu_tanh_grad(double v) {
  const double th = std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
  return 0.5 * (1.0 + th) +
         0.5 * v * (1.0 - th * th) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * v * v);
}
double gelu_erf(double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); }
double gelu_erf_grad(double v) {
  return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) +
         v * std::exp(-0.5 * v * v) / kSqrt2Pi;
}

double relu(double v) { return v > 0 ? v : 0.0; }
double relu_grad(double v) { return v > 0 ? 1.0 : 0.0; }

const std::vector<Activation> kActivations = {
    {cuda::GluActivation::Silu, "swiglu", silu, silu_grad},
    {cuda::GluActivation::GeluTanh, "geglu tanh", gelu_tanh, gelu_tanh_grad},
    {cuda::GluActivation::GeluErf, "geglu erf", gelu_erf, gelu_erf_grad},
    {cuda::GluActivation::Relu, "reglu", relu, relu_grad},
};

/// y [N, F] and dx [N, 2 F] of the gated activation in fp64.
void glu_reference(const Activation& act, const std::vector<double>& x,
                   const std::vector<double>& dy, index_t N, index_t F, std::vector<double>& y,
                   std::vector<double>& dx) {
  y.assign(N * F, 0.0);
  dx.assign(N * 2 * F, 0.0);
  for (index_t i = 0; i < N; ++i)
    for (index_t j = 0; j < F; ++j) {
      const double gate = x[i * 2 * F + j], up = x[i * 2 * F + F + j], d = dy[i * F + j];
      y[i * F + j] = act.value(gate) * up;
      dx[i * 2 * F + j] = d * up * act.grad(gate);
      dx[i * 2 * F + F + j] = d * act.value(gate);
    }
}

/// A device tensor of `shape` starting one element into a larger block: not
/// 16-byte aligned, so the kernels take their element-by-element path.
struct Misaligned {
  Tensor block, view;
};
Misaligned misaligned_copy(const Tensor& dev) {
  Misaligned m{poisoned({dev.numel() + 1}, dev.dtype()), {}};
  m.view = Tensor::view(static_cast<char*>(m.block.raw()) + dtype_size(dev.dtype()), dev.shape(),
                        dev.dtype(), MemorySpace::Cuda);
  m.view.copy_from(dev);
  return m;
}

TEST(GpuModelOps, GatedActivationsMatchReference) {
  REQUIRE_GPU();
  struct Case {
    index_t N, F;
    bool misaligned;
  };
  const std::vector<Case> cases = {
      {33, 768, false}, {3, 4096, false}, {5, 100, false}, {7, 11, false}, {9, 768, true}};
  std::uint64_t seed = 5000;
  for (DType t : kDtypes)
    for (const Activation& act : kActivations)
      for (const Case& c : cases) {
        const std::string what = std::string(act.name) + " " + shape_name(t, c.N, c.F) +
                                 (c.misaligned ? " misaligned" : "");
        const index_t N = c.N, F = c.F;
        // Gates over the activations' curved part and both tails.
        const Operand x = operand({N, 2 * F}, t, ++seed, -6.0, 6.0);
        const Operand dy = operand({N, F}, t, ++seed, -1.0, 1.0);
        Tensor y = poisoned({N, F}, t), dx = poisoned({N, 2 * F}, t);
        Misaligned mx, my, mdx;
        const void* x_in = x.dev.raw();
        void *y_out = y.raw(), *dx_out = dx.raw();
        if (c.misaligned) {
          mx = misaligned_copy(x.dev);
          my = misaligned_copy(y);
          mdx = misaligned_copy(dx);
          x_in = mx.view.raw();
          y_out = my.view.raw();
          dx_out = mdx.view.raw();
        }
        cuda::glu_forward(t, act.kind, x_in, N, F, y_out);
        cuda::glu_backward(t, act.kind, dy.dev.raw(), x_in, N, F, dx_out);
        std::vector<double> want_y, want_dx;
        glu_reference(act, x.values, dy.values, N, F, want_y, want_dx);
        const double tol = tolerance(t, 2e-6);
        expect_close((c.misaligned ? my.view : y).to_doubles(), want_y, tol, what + " forward");
        expect_close((c.misaligned ? mdx.view : dx).to_doubles(), want_dx, tol,
                     what + " backward");
      }
}

// The plain MLP's activation elementwise over [N, F]: y = act(x), dx = dy act'(x).
TEST(GpuModelOps, PlainActivationsMatchReference) {
  REQUIRE_GPU();
  struct Case {
    index_t N, F;
    bool misaligned;
  };
  const std::vector<Case> cases = {
      {33, 768, false}, {3, 4096, false}, {5, 100, false}, {7, 11, false}, {9, 768, true}};
  const std::vector<Activation> plain = {kActivations[2], kActivations[3]};  // erf GeLU, ReLU
  std::uint64_t seed = 7000;
  for (DType t : kDtypes)
    for (const Activation& act : plain)
      for (const Case& c : cases) {
        const std::string what = std::string(act.name) + " plain " + shape_name(t, c.N, c.F) +
                                 (c.misaligned ? " misaligned" : "");
        const index_t N = c.N, F = c.F;
        const Operand x = operand({N, F}, t, ++seed, -6.0, 6.0);
        const Operand dy = operand({N, F}, t, ++seed, -1.0, 1.0);
        Tensor y = poisoned({N, F}, t), dx = poisoned({N, F}, t);
        Misaligned mx, my, mdx;
        const void* x_in = x.dev.raw();
        void *y_out = y.raw(), *dx_out = dx.raw();
        if (c.misaligned) {
          mx = misaligned_copy(x.dev);
          my = misaligned_copy(y);
          mdx = misaligned_copy(dx);
          x_in = mx.view.raw();
          y_out = my.view.raw();
          dx_out = mdx.view.raw();
        }
        cuda::activation_forward(t, act.kind, x_in, N * F, y_out);
        cuda::activation_backward(t, act.kind, dy.dev.raw(), x_in, N * F, dx_out);
        std::vector<double> want_y(std::size_t(N * F)), want_dx(std::size_t(N * F));
        for (std::size_t i = 0; i < want_y.size(); ++i) {
          want_y[i] = act.value(x.values[i]);
          want_dx[i] = dy.values[i] * act.grad(x.values[i]);
        }
        const double tol = tolerance(t, 2e-6);
        expect_close((c.misaligned ? my.view : y).to_doubles(), want_y, tol, what + " forward");
        expect_close((c.misaligned ? mdx.view : dx).to_doubles(), want_dx, tol,
                     what + " backward");
      }
}

}  // namespace
}  // namespace meshtron

// The op table sends device tensors to these kernels: ops:: on the device
// equals ops:: on the host in fp32 (rotary: some heads rotated, out of place).
namespace meshtron {
namespace {

Tensor device_copy(const Tensor& host) { return host.to_space(MemorySpace::Cuda); }

double max_rel_diff(const Tensor& device, const Tensor& host) {
  const Tensor a = device.to_host().to(DType::F64), b = host.to(DType::F64);
  double diff = 0, scale = 1e-30;
  for (index_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::abs(a.data<double>()[i] - b.data<double>()[i]));
    scale = std::max(scale, std::abs(b.data<double>()[i]));
  }
  return diff / scale;
}

TEST(GpuModelOps, OpTableDispatchesToTheKernels) {
  REQUIRE_GPU();
  const Tensor x = gpu_test::random_rounded({6, 4, 32}, DType::F32, 11, -2, 2).to(DType::F32);
  const Tensor x2 = x.reshape({24, 32});
  const Tensor gamma = gpu_test::random_rounded({32}, DType::F32, 12, 0.5, 1.5).to(DType::F32);
  Tensor y = Tensor::empty({24, 32}), rstd = Tensor::empty({24});
  ops::rmsnorm_forward(x2, gamma, 1e-5, y, rstd);
  Tensor yd = Tensor::empty({24, 32}, DType::F32, MemorySpace::Cuda);
  Tensor rd = Tensor::empty({24}, DType::F32, MemorySpace::Cuda);
  ops::rmsnorm_forward(device_copy(x2), device_copy(gamma), 1e-5, yd, rd);
  EXPECT_LT(max_rel_diff(yd, y), 1e-6);

  Tensor positions = Tensor::empty({6}, DType::I32);
  for (int t = 0; t < 6; ++t) positions.data<std::int32_t>()[t] = 100 + t;
  const ops::RotarySpec rope{16, 10000.0, ops::RotaryLayout::HalfSplit};
  Tensor r = Tensor::empty({6, 4, 32});
  ops::rotary_forward(x, positions, rope, r, /*rotated_heads=*/3);
  Tensor rdev = gpu_test::poisoned({6, 4, 32}, DType::F32);
  ops::rotary_forward(device_copy(x), device_copy(positions), rope, rdev, 3);
  EXPECT_LT(max_rel_diff(rdev, r), 1e-6);

  Tensor g = Tensor::empty({24, 16});
  ops::gated_activation_forward(x2, ops::GatedActivation::SiLU, g);
  Tensor gd = Tensor::empty({24, 16}, DType::F32, MemorySpace::Cuda);
  ops::gated_activation_forward(device_copy(x2), ops::GatedActivation::SiLU, gd);
  EXPECT_LT(max_rel_diff(gd, g), 1e-6);

  for (ops::GatedActivation act : {ops::GatedActivation::GeLUErf, ops::GatedActivation::ReLU}) {
    Tensor a = Tensor::empty({24, 32}), da = Tensor::empty({24, 32});
    ops::activation_forward(x2, act, a);
    ops::activation_backward(x2, x2, act, da);
    Tensor ad = Tensor::empty({24, 32}, DType::F32, MemorySpace::Cuda);
    Tensor dad = Tensor::empty({24, 32}, DType::F32, MemorySpace::Cuda);
    const Tensor x2d = device_copy(x2);
    ops::activation_forward(x2d, act, ad);
    ops::activation_backward(x2d, x2d, act, dad);
    EXPECT_LT(max_rel_diff(ad, a), 1e-6) << int(act);
    EXPECT_LT(max_rel_diff(dad, da), 1e-6) << int(act);
  }
}

}  // namespace
}  // namespace meshtron
