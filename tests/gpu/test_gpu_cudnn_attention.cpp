// cuDNN's fused causal attention (kernels/cuda/cudnn_attention.cu) on ONE
// GPU, on the token-major layout the model uses (qkv [s*b, 3*heads*d],
// context [s*b, heads*d], lse [b*heads, s]), against meshtron's own flash
// kernels (flash_attention_*_token_major) and the host op in fp64.
//
//  * forward and backward at S in {128, 1000 (no multiple of the tiles),
//    1024}, heads 1..12, b 1..8, d 64 and 128, bf16 and fp16. The inputs are
//    rounded to the storage type once; the host reference computes from the
//    same rounded values in fp64 (all shapes but the largest, GPT-2 124M's
//    b 8 x 12 heads, which is checked against our kernel only). out, lse,
//    dq, dk, dv within 1e-2 norm-wise relative of the reference and of our
//    kernel; every output is poisoned with NaN first and comes back finite.
//  * determinism: a second forward and a second backward give the same bits.
//  * cuDNN forward + our backward (the mixed choice, when cuDNN has no
//    deterministic backward for a shape) against the same reference.
//  * the dispatching entry points (ops::fused_attention_*_token_major) give
//    exactly the bits of the backend cuda::attention_backend() names, and
//    ours under set_fused_attention_kernels(Own)
//    (training.fused_attention_kernels = own).
//  * with cuDNN built in and loaded, GPT-2 124M's shape (bf16, s 1024, b 8,
//    12 heads, d 64) must plan both directions.
//  * attention dropout from cuDNN's own generator (CudnnDropout): against
//    the host in fp64 with the mask the forward writes out; keep rate,
//    reproducibility, another mask for another seed.
//  * the per-call seed of training.attention_dropout_rng = cudnn (the
//    dispatching cuda:: entry points) follows the call's site: same site,
//    same bits; another sample offset (micro-batch, dp rank), first head (tp
//    rank), step, layer stream or run seed, another mask.
//
// Skips (exit 0) without a GPU, or when cuDNN is not built in / not loaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ops/ops.hpp"
#include "ops/ops_cuda.hpp"
#include "tensor/device_allocator.hpp"
#include "tests/gpu/gpu_test_util.hpp"

namespace meshtron {
namespace {

using gpu_test::poisoned;
using gpu_test::random_rounded;

double norm_rel(const std::vector<double>& got, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

bool all_finite(const std::vector<double>& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

/// Part p (0 = q, 1 = k, 2 = v) of a token-major [rows, 3 * width] tensor.
std::vector<double> part(const std::vector<double>& qkv, index_t rows, index_t width, int p) {
  std::vector<double> out;
  out.reserve(std::size_t(rows * width));
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < width; ++c) out.push_back(qkv[std::size_t(r * 3 * width + p * width + c)]);
  return out;
}

struct Case {
  index_t s, b, heads, d;
  DType dt;
  bool host_reference;
  std::string name() const {
    return std::string(dtype_name(dt)) + " s " + std::to_string(s) + " b " + std::to_string(b) +
           " heads " + std::to_string(heads) + " d " + std::to_string(d);
  }
};

/// out, lse and dqkv of one backend, as doubles.
struct Result {
  std::vector<double> out, lse, dq, dk, dv;
};

struct Inputs {
  Case c;
  double scale;
  Tensor qkv, dctx;  // on the device
  index_t rows() const { return c.s * c.b; }
  index_t width() const { return c.heads * c.d; }
};

using Forward = void (*)(DType, const void*, index_t, index_t, index_t, index_t, double, void*,
                         float*);
using Backward = void (*)(DType, const void*, const void*, const void*, const float*, index_t,
                          index_t, index_t, index_t, double, float*, void*);

/// cuDNN's entry points (no attention dropout) as a Forward and a Backward.
void cudnn_forward(DType t, const void* qkv, index_t s, index_t b, index_t heads, index_t d,
                   double scale, void* context, float* lse) {
  cuda::cudnn_attention_forward_token_major(t, qkv, s, b, heads, d, scale, context, lse);
}
void cudnn_backward(DType t, const void* dcontext, const void* qkv, const void* context,
                    const float* lse, index_t s, index_t b, index_t heads, index_t d,
                    double scale, float* delta, void* dqkv) {
  cuda::cudnn_attention_backward_token_major(t, dcontext, qkv, context, lse, s, b, heads, d,
                                             scale, delta, dqkv);
}

/// meshtron's kernels (no attention dropout) as a Forward and a Backward.
void own_forward(DType t, const void* qkv, index_t s, index_t b, index_t heads, index_t d,
                 double scale, void* context, float* lse) {
  cuda::flash_attention_forward_token_major(t, qkv, s, b, heads, d, scale, context, lse);
}
void own_backward(DType t, const void* dcontext, const void* qkv, const void* context,
                  const float* lse, index_t s, index_t b, index_t heads, index_t d, double scale,
                  float* delta, void* dqkv) {
  cuda::flash_attention_backward_token_major(t, dcontext, qkv, context, lse, s, b, heads, d, scale,
                                             delta, dqkv);
}

/// Runs `fwd` then `bwd` (on fwd's outputs) on poisoned outputs: a Forward
/// and a Backward, or callables with their parameters.
template <class Fwd, class Bwd>
Result run(const Inputs& in, Fwd fwd, Bwd bwd) {
  const Case& c = in.c;
  Tensor ctx = poisoned({in.rows(), in.width()}, c.dt);
  Tensor lse = poisoned({c.b * c.heads, c.s}, DType::F32);
  fwd(c.dt, in.qkv.raw(), c.s, c.b, c.heads, c.d, in.scale, ctx.raw(), lse.data<float>());
  Tensor dqkv = poisoned(in.qkv.shape(), c.dt), delta = poisoned({c.b * c.heads, c.s}, DType::F32);
  bwd(c.dt, in.dctx.raw(), in.qkv.raw(), ctx.raw(), lse.data<float>(), c.s, c.b, c.heads, c.d,
      in.scale, delta.data<float>(), dqkv.raw());
  const std::vector<double> g = dqkv.to_doubles();
  return {ctx.to_doubles(), lse.to_doubles(), part(g, in.rows(), in.width(), 0),
          part(g, in.rows(), in.width(), 1), part(g, in.rows(), in.width(), 2)};
}

/// The dispatching op-table entry points.
Result run_dispatch(const Inputs& in) {
  const Case& c = in.c;
  Tensor ctx = poisoned({in.rows(), in.width()}, c.dt);
  Tensor lse = poisoned({c.b * c.heads, c.s}, DType::F32);
  ops::fused_attention_forward_token_major(in.qkv, c.s, c.b, c.heads, in.scale, ctx, lse);
  Tensor dqkv = poisoned(in.qkv.shape(), c.dt);
  ops::fused_attention_backward_token_major(in.dctx, in.qkv, ctx, lse, c.s, c.b, c.heads,
                                            in.scale, dqkv);
  const std::vector<double> g = dqkv.to_doubles();
  return {ctx.to_doubles(), lse.to_doubles(), part(g, in.rows(), in.width(), 0),
          part(g, in.rows(), in.width(), 1), part(g, in.rows(), in.width(), 2)};
}

/// The host op in fp64 on the same rounded inputs.
Result host_reference(const Tensor& qkv, const Tensor& dctx, const Case& c, double scale) {
  const index_t rows = c.s * c.b, width = c.heads * c.d;
  Tensor ctx = Tensor::empty({rows, width}, DType::F64),
         lse = Tensor::empty({c.b * c.heads, c.s}, DType::F64);
  ops::fused_attention_forward_token_major(qkv, c.s, c.b, c.heads, scale, ctx, lse);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::F64);
  ops::fused_attention_backward_token_major(dctx, qkv, ctx, lse, c.s, c.b, c.heads, scale, dqkv);
  const std::vector<double> g = dqkv.to_doubles();
  return {ctx.to_doubles(), lse.to_doubles(), part(g, rows, width, 0), part(g, rows, width, 1),
          part(g, rows, width, 2)};
}

/// Every field of `got` within `tol` of `ref`; prints the errors.
void expect_close(const Result& got, const Result& ref, double tol, const std::string& what) {
  const double e[] = {norm_rel(got.out, ref.out), norm_rel(got.lse, ref.lse),
                      norm_rel(got.dq, ref.dq), norm_rel(got.dk, ref.dk),
                      norm_rel(got.dv, ref.dv)};
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; ++i) EXPECT_LE(e[i], tol) << what << ": " << names[i];
  std::printf("%-58s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", what.c_str(), e[0], e[1], e[2],
              e[3], e[4]);
}

void expect_finite(const Result& r, const std::string& what) {
  for (const std::vector<double>* v : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv})
    EXPECT_TRUE(all_finite(*v)) << what;
}

void expect_same_bits(const Result& a, const Result& b, const std::string& what) {
  EXPECT_EQ(a.out, b.out) << what << ": out";
  EXPECT_EQ(a.lse, b.lse) << what << ": lse";
  EXPECT_EQ(a.dq, b.dq) << what << ": dq";
  EXPECT_EQ(a.dk, b.dk) << what << ": dk";
  EXPECT_EQ(a.dv, b.dv) << what << ": dv";
}

void check_case(const Case& c, std::uint64_t seed) {
  const index_t rows = c.s * c.b, width = c.heads * c.d;
  const double scale = 1.0 / std::sqrt(double(c.d));
  // q, k in [-2, 2): scaled scores of a few units, so rows are far from uniform.
  const Tensor qkv_h = random_rounded({rows, 3 * width}, c.dt, seed, -2, 2);
  const Tensor dctx_h = random_rounded({rows, width}, c.dt, seed + 1, -1, 1);
  const Inputs in{c, scale, qkv_h.to(c.dt).to_device(), dctx_h.to(c.dt).to_device()};

  const cuda::CudnnAttentionSupport support =
      cuda::cudnn_attention_support(c.dt, c.s, c.b, c.heads, c.d);
  const Result own =
      run(in, own_forward, own_backward);
  expect_finite(own, c.name() + " own");
  std::optional<Result> ref;
  if (c.host_reference) {
    ref = host_reference(qkv_h, dctx_h, c, scale);
    expect_close(own, *ref, 1e-2, c.name() + " own vs host");
  }
  if (!support.forward) {
    std::printf("%s: cuDNN declined the forward: %s\n", c.name().c_str(), support.why_not.c_str());
  } else {
    // cuDNN forward + our backward (what a shape without a deterministic cuDNN backward runs).
    const Result mixed =
        run(in, cudnn_forward, own_backward);
    expect_finite(mixed, c.name() + " cudnn fwd + own bwd");
    expect_close(mixed, ref ? *ref : own, 1e-2,
                 c.name() + " cudnn fwd + own bwd vs " + (ref ? "host" : "own"));
  }
  if (support.forward && !support.backward)
    std::printf("%s: cuDNN declined the backward: %s\n", c.name().c_str(), support.why_not.c_str());
  if (support.forward) std::printf("%s plans: %s\n", c.name().c_str(), support.plans.c_str());
  if (support.forward && support.backward) {
    const Result cudnn = run(in, cudnn_forward,
                             cudnn_backward);
    expect_finite(cudnn, c.name() + " cudnn");
    if (ref) expect_close(cudnn, *ref, 1e-2, c.name() + " cudnn vs host");
    expect_close(cudnn, own, 1e-2, c.name() + " cudnn vs own");
    // Deterministic: the same bits from a second forward and backward.
    expect_same_bits(run(in, cudnn_forward,
                         cudnn_backward),
                     cudnn, c.name() + " cudnn second run");
  }
  // The dispatcher runs exactly the backend it reports; with
  // training.fused_attention_kernels = own it is ours.
  cuda::set_fused_attention_kernels(cuda::FusedAttentionKernels::Own);
  EXPECT_EQ(cuda::attention_backend(c.dt, c.s, c.b, c.heads, c.d), "own") << c.name();
  expect_same_bits(run_dispatch(in), own, c.name() + " dispatch (kernels own)");
  cuda::set_fused_attention_kernels(cuda::FusedAttentionKernels::Auto);
  const std::string backend = cuda::attention_backend(c.dt, c.s, c.b, c.heads, c.d);
  if (support.forward) EXPECT_NE(backend, "own") << c.name() << ": auto ignored cuDNN";
  Result expected = own;
  if (backend == "cudnn")
    expected = run(in, cudnn_forward,
                   cudnn_backward);
  else if (backend != "own")
    expected = run(in, cudnn_forward,
                   own_backward);
  expect_same_bits(run_dispatch(in), expected, c.name() + " dispatch (" + backend + ")");
}

TEST(GpuCudnnAttention, MatchesOwnKernelAndHostReference) {
  REQUIRE_GPU();
  const cuda::CudnnAttentionSupport gpt2 =
      cuda::cudnn_attention_support(DType::BF16, 1024, 8, 12, 64);
  if (gpt2.library.empty()) GTEST_SKIP() << "cuDNN is not available: " << gpt2.why_not;
  std::printf("%s; GPT-2 124M shape: forward %s, backward %s%s%s\n  plans: %s\n",
              gpt2.library.c_str(), gpt2.forward ? "planned" : "declined",
              gpt2.backward ? "planned" : "declined", gpt2.why_not.empty() ? "" : ": ",
              gpt2.why_not.c_str(), gpt2.plans.c_str());
  EXPECT_TRUE(gpt2.forward && gpt2.backward) << gpt2.why_not;
  const Case cases[] = {
      {128, 1, 1, 64, DType::BF16, true},    {1000, 2, 3, 64, DType::BF16, true},
      {1024, 1, 12, 64, DType::BF16, true},  {1000, 2, 2, 128, DType::BF16, true},
      {128, 8, 2, 64, DType::F16, true},     {1024, 2, 4, 128, DType::F16, true},
      {1000, 1, 3, 64, DType::F16, true},    {1024, 8, 12, 64, DType::BF16, false},
  };
  std::uint64_t seed = 7000;
  for (const Case& c : cases) check_case(c, seed += 10);
}


// ------------------------------------ attention dropout from cuDNN's generator ---

/// Host fp64 attention with a given keep mask [b, heads, s, s] (1 kept, 0
/// dropped): out = (P o M / (1 - p)) V, lse of the undropped softmax, and
/// the gradients dS = P o (M o dP / (1 - p) - delta), delta = dO . out.
Result host_with_mask(const std::vector<double>& qkv, const std::vector<double>& dctx,
                      const std::vector<double>& mask, const Case& c, double scale, double p) {
  const index_t S = c.s, B = c.b, H = c.heads, D = c.d, width = H * D;
  const std::size_t rows = std::size_t(S * B);
  Result r;
  r.out.assign(rows * width, 0.0);
  r.lse.assign(std::size_t(B * H * S), 0.0);
  r.dq.assign(rows * width, 0.0);
  r.dk.assign(rows * width, 0.0);
  r.dv.assign(rows * width, 0.0);
  auto at = [&](index_t i, index_t bi, int part, index_t h, index_t k) {
    return std::size_t((i * B + bi) * 3 * width + part * width + h * D + k);
  };
  auto ctx_at = [&](index_t i, index_t bi, index_t h, index_t k) {
    return std::size_t((i * B + bi) * width + h * D + k);
  };
  std::vector<double> P(std::size_t(S * S)), dP(std::size_t(S * S));
  for (index_t bi = 0; bi < B; ++bi)
    for (index_t h = 0; h < H; ++h) {
      const double* m = &mask[std::size_t(((bi * H + h) * S) * S)];
      for (index_t i = 0; i < S; ++i) {
        double mx = -1e300;
        for (index_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (index_t k = 0; k < D; ++k) dot += qkv[at(i, bi, 0, h, k)] * qkv[at(j, bi, 1, h, k)];
          P[std::size_t(i * S + j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (index_t j = 0; j <= i; ++j) sum += std::exp(P[std::size_t(i * S + j)] - mx);
        r.lse[std::size_t((bi * H + h) * S + i)] = mx + std::log(sum);
        for (index_t j = 0; j <= i; ++j) {
          P[std::size_t(i * S + j)] = std::exp(P[std::size_t(i * S + j)] - mx) / sum;
          const double pd = P[std::size_t(i * S + j)] * m[i * S + j] / (1 - p);
          for (index_t k = 0; k < D; ++k) r.out[ctx_at(i, bi, h, k)] += pd * qkv[at(j, bi, 2, h, k)];
        }
      }
      for (index_t i = 0; i < S; ++i) {
        double delta = 0;
        for (index_t k = 0; k < D; ++k) delta += dctx[ctx_at(i, bi, h, k)] * r.out[ctx_at(i, bi, h, k)];
        for (index_t j = 0; j <= i; ++j) {
          double dp = 0;
          for (index_t k = 0; k < D; ++k) dp += dctx[ctx_at(i, bi, h, k)] * qkv[at(j, bi, 2, h, k)];
          const double keep = m[i * S + j] / (1 - p), pij = P[std::size_t(i * S + j)];
          const double ds = pij * (keep * dp - delta) * scale;
          for (index_t k = 0; k < D; ++k) {
            r.dv[ctx_at(j, bi, h, k)] += pij * keep * dctx[ctx_at(i, bi, h, k)];
            r.dq[ctx_at(i, bi, h, k)] += ds * qkv[at(j, bi, 1, h, k)];
            r.dk[ctx_at(j, bi, h, k)] += ds * qkv[at(i, bi, 0, h, k)];
          }
        }
      }
    }
  return r;
}

/// cuDNN's forward (optionally writing its mask) then backward, with its dropout.
Result run_cudnn_dropout(const Inputs& in, const cuda::CudnnDropout& dropout) {
  cuda::CudnnDropout backward = dropout;
  backward.mask_out = nullptr;  // the forward's output only
  return run(
      in, [&](auto... args) { cuda::cudnn_attention_forward_token_major(args..., dropout); },
      [&](auto... args) { cuda::cudnn_attention_backward_token_major(args..., backward); });
}

// training.attention_dropout_rng = cudnn: cuDNN draws the mask with its own
// generator. Its bits cannot be predicted, so the forward is asked to write
// them out, and everything is checked against the host in fp64 with that
// mask: out, lse and the gradients (the backward redraws the mask from the
// same seed and offset), the keep rate, the same result without writing the
// mask, the same bits on a second run, another mask for another seed.
TEST(GpuCudnnAttention, DropoutFromItsGeneratorMatchesHostWithItsMask) {
  REQUIRE_GPU();
  const double p = 0.1;
  const Case cases[] = {{128, 2, 2, 64, DType::BF16, true},
                        {256, 1, 3, 128, DType::BF16, true},
                        {200, 2, 1, 64, DType::F16, true}};
  std::uint64_t seed = 9100;
  for (const Case& c : cases) {
    const cuda::CudnnAttentionSupport support =
        cuda::cudnn_attention_support(c.dt, c.s, c.b, c.heads, c.d, p);
    if (support.library.empty()) GTEST_SKIP() << "cuDNN is not available: " << support.why_not;
    ASSERT_TRUE(support.forward && support.backward) << c.name() << ": " << support.why_not;
    std::printf("%s dropout %.1f plans: %s\n", c.name().c_str(), p, support.plans.c_str());
    const double scale = 1.0 / std::sqrt(double(c.d));
    const index_t rows = c.s * c.b, width = c.heads * c.d;
    const Tensor qkv_h = random_rounded({rows, 3 * width}, c.dt, seed += 10, -2, 2);
    const Tensor dctx_h = random_rounded({rows, width}, c.dt, seed + 1, -1, 1);
    const Inputs in{c, scale, qkv_h.to(c.dt).to_device(), dctx_h.to(c.dt).to_device()};

    // {seed, offset, another seed}: meshtron varies the seed per call, not
    // the offset (a counter offset: offset 8 redraws most of offset 7's mask).
    std::vector<std::int64_t> words{424242 + std::int64_t(seed), 0, 424243 + std::int64_t(seed)};
    const Tensor seed_offset =
        Tensor::view(words.data(), {3}, DType::I64).to_space(MemorySpace::Cuda);
    const std::int64_t* dev = seed_offset.data<std::int64_t>();
    Tensor mask = poisoned({c.b, c.heads, c.s, c.s}, DType::F32);
    cuda::CudnnDropout dropout;
    dropout.p = p;
    dropout.seed = dev;
    dropout.offset = dev + 1;
    dropout.mask_out = mask.data<float>();
    const Result with_mask = run_cudnn_dropout(in, dropout);
    const std::vector<double> m = mask.to_doubles();

    // The mask: zeros and ones, kept at rate 1 - p on the visible entries.
    double kept = 0, visible = 0;
    bool binary = true;
    for (index_t e = 0; e < c.b * c.heads; ++e)
      for (index_t i = 0; i < c.s; ++i)
        for (index_t j = 0; j <= i; ++j) {
          const double v = m[std::size_t((e * c.s + i) * c.s + j)];
          binary = binary && (v == 0.0 || v == 1.0);
          kept += v;
          visible += 1;
        }
    EXPECT_TRUE(binary) << c.name();
    const double sigma = std::sqrt(p * (1 - p) / visible);
    EXPECT_NEAR(kept / visible, 1 - p, 5 * sigma) << c.name();

    const Result ref = host_with_mask(qkv_h.to_doubles(), dctx_h.to_doubles(), m, c, scale, p);
    expect_finite(with_mask, c.name() + " cudnn dropout");
    expect_close(with_mask, ref, 1e-2, c.name() + " cudnn dropout vs host with its mask");

    // Without writing the mask out (the training graph): the same mask.
    dropout.mask_out = nullptr;
    const Result plain = run_cudnn_dropout(in, dropout);
    expect_close(plain, ref, 1e-2, c.name() + " cudnn dropout (mask not written) vs host");
    expect_same_bits(run_cudnn_dropout(in, dropout), plain, c.name() + " cudnn dropout second run");

    // Another seed (read from device memory at run time): another mask.
    dropout.seed = dev + 2;
    dropout.mask_out = mask.data<float>();
    run_cudnn_dropout(in, dropout);
    const std::vector<double> m2 = mask.to_doubles();
    double differ = 0;  // expected 2 p (1 - p) of the visible entries
    for (index_t e = 0; e < c.b * c.heads; ++e)
      for (index_t i = 0; i < c.s; ++i)
        for (index_t j = 0; j <= i; ++j) {
          const std::size_t at = std::size_t((e * c.s + i) * c.s + j);
          differ += m[at] != m2[at];
        }
    EXPECT_GT(differ / visible, p) << c.name() << ": another seed drew the same mask";
  }
}

/// The dispatching entry points with training.attention_dropout_rng = cudnn
/// (the seed drawn on the device from `site`, as the model calls them).
Result run_cudnn_rng(const Inputs& in, const cuda::AttentionDropoutSite& site) {
  return run(
      in, [&](auto... args) { cuda::fused_attention_forward_token_major(args..., site); },
      [&](auto... args) { cuda::fused_attention_backward_token_major(args..., site); });
}

// What tells two attention calls apart must reach cuDNN's seed: the sample
// offset (micro-batches and dp ranks), the first local head (tp ranks), the
// step, the layer's stream and the run seed. Each changed alone draws another
// mask (another output and gradients); the same site gives the same bits,
// which is what lets a backward redraw its forward's mask. A seed that missed
// one of them would give every dp (or tp) rank the same masks.
TEST(GpuCudnnAttention, DropoutSeedFollowsTheCallSite) {
  REQUIRE_GPU();
  const double p = 0.1;
  const Case c{128, 2, 2, 64, DType::BF16, false};
  const cuda::CudnnAttentionSupport support =
      cuda::cudnn_attention_support(c.dt, c.s, c.b, c.heads, c.d, p);
  if (support.library.empty()) GTEST_SKIP() << "cuDNN is not available: " << support.why_not;
  ASSERT_TRUE(support.forward && support.backward) << c.name() << ": " << support.why_not;
  const index_t rows = c.s * c.b, width = c.heads * c.d;
  const Tensor qkv_h = random_rounded({rows, 3 * width}, c.dt, 9500, -2, 2);
  const Tensor dctx_h = random_rounded({rows, width}, c.dt, 9501, -1, 1);
  const Inputs in{c, 1.0 / std::sqrt(double(c.d)), qkv_h.to(c.dt).to_device(),
                  dctx_h.to(c.dt).to_device()};

  // The model's site (Attention::probs_site): [b, heads, s*s] of [?, 4, s*s].
  cuda::AttentionDropoutSite base;
  base.p = p;
  base.cudnn_rng = true;
  base.site = {1234, 3, 7 * 16 + 2, c.heads, c.s * c.s, 16, 2, 0, 4, c.s * c.s, nullptr, 0};
  const Result ref = run_cudnn_rng(in, base);
  expect_finite(ref, "cudnn rng");
  expect_same_bits(run_cudnn_rng(in, base), ref, "the same site again");

  using Site = cuda::DropoutPlacement;
  const std::pair<const char*, void (*)(Site&)> changes[] = {
      {"next micro-batch / dp rank (sample offset)", [](Site& s) { s.a_offset += 2; }},
      {"tp rank (first local head)", [](Site& s) { s.b_offset = 0; }},
      {"step", [](Site& s) { s.step += 1; }},
      {"layer stream", [](Site& s) { s.stream += 16; }},
      {"run seed", [](Site& s) { s.seed += 1; }}};
  for (const auto& [what, change] : changes) {
    cuda::AttentionDropoutSite other = base;
    change(other.site);
    const Result got = run_cudnn_rng(in, other);
    expect_finite(got, what);
    // Other decisions on ~2 p (1 - p) of the visible entries: out moves by
    // several percent, far above a rerun's 0.
    EXPECT_GT(norm_rel(got.out, ref.out), 1e-2) << what << ": the same mask?";
    EXPECT_GT(norm_rel(got.dv, ref.dv), 1e-2) << what << ": the same mask?";
  }
}
}  // namespace
}  // namespace meshtron
