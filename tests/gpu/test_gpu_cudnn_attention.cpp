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
//    exactly the bits of the backend cuda::attention_backend() names
//    (MESHTRON_ATTENTION=own forces ours).
//  * with cuDNN built in and loaded, GPT-2 124M's shape (bf16, s 1024, b 8,
//    12 heads, d 64) must plan both directions.
//
// Skips (exit 0) without a GPU, or when cuDNN is not built in / not loaded.
#include <gtest/gtest.h>

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

/// Runs `fwd` then `bwd` (on fwd's outputs) on poisoned outputs.
Result run(const Inputs& in, Forward fwd, Backward bwd) {
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
        run(in, cuda::cudnn_attention_forward_token_major, own_backward);
    expect_finite(mixed, c.name() + " cudnn fwd + own bwd");
    expect_close(mixed, ref ? *ref : own, 1e-2,
                 c.name() + " cudnn fwd + own bwd vs " + (ref ? "host" : "own"));
  }
  if (support.forward && !support.backward)
    std::printf("%s: cuDNN declined the backward: %s\n", c.name().c_str(), support.why_not.c_str());
  if (support.forward) std::printf("%s plans: %s\n", c.name().c_str(), support.plans.c_str());
  if (support.forward && support.backward) {
    const Result cudnn = run(in, cuda::cudnn_attention_forward_token_major,
                             cuda::cudnn_attention_backward_token_major);
    expect_finite(cudnn, c.name() + " cudnn");
    if (ref) expect_close(cudnn, *ref, 1e-2, c.name() + " cudnn vs host");
    expect_close(cudnn, own, 1e-2, c.name() + " cudnn vs own");
    // Deterministic: the same bits from a second forward and backward.
    expect_same_bits(run(in, cuda::cudnn_attention_forward_token_major,
                         cuda::cudnn_attention_backward_token_major),
                     cudnn, c.name() + " cudnn second run");
  }
  // The dispatcher runs exactly the backend it reports.
  const std::string backend = cuda::attention_backend(c.dt, c.s, c.b, c.heads, c.d);
  const char* env = std::getenv("MESHTRON_ATTENTION");
  if (env && std::string(env) == "own") EXPECT_EQ(backend, "own") << c.name();
  Result expected = own;
  if (backend == "cudnn")
    expected = run(in, cuda::cudnn_attention_forward_token_major,
                   cuda::cudnn_attention_backward_token_major);
  else if (backend != "own")
    expected = run(in, cuda::cudnn_attention_forward_token_major,
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

}  // namespace
}  // namespace meshtron
