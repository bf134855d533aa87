// The fused causal attention kernels (kernels/cuda/flash_attention.cu) on ONE
// GPU, against the host op (kernels/kokkos/attention.hpp) in fp64.
//
//  * forward and backward on fresh random inputs at S in {64, 128, 300, 1000
//    (not multiples of the 128-row tiles), 1024}, head dims 64 and 128, batch x heads in
//    {1, 3, 12}, bf16 (and fp16 on some shapes): the inputs are rounded to
//    the storage type once and the host reference computes from the same
//    rounded values in fp64. out, lse, dq, dk, dv within 1e-2 norm-wise
//    relative; every output was poisoned with NaN before the run and every
//    element comes back finite. The unfused device path (bf16 GEMMs +
//    softmax) is measured against the same reference for comparison.
//  * the backward is deterministic: a second run gives the same bits.
//  * the tiny GPT with head dim 64 (hidden 128, 2 heads, seq 256, no
//    dropout) trained 4 steps in bf16 with model.attention_backend = fused
//    against unfused: losses within 1e-2 relative, and the fused run's
//    allocator peak is lower (no [b*heads, s, s] tensors).
//  * fused on an fp32 GPU model (unsupported) is a UserError.
//  * attention dropout (p = 0.2) inside the kernels: out, dq, dk, dv against
//    the host op with the same dropout site (the unfused path's mask) in
//    fp64, within 1e-2, at S = 1, 17 and 300 (S % 8 != 0: one Philox call
//    per element) and S = 128, 256, 1000, 1024 (one call per group of 8
//    keys, shared by lanes),
//    on a site placed at a sample and head offset inside more heads (as
//    under dp and tp); the dropped output is far from the undropped one. The
//    token-major entry points with dropout equal split + head-major + merge
//    bitwise, read from live device words (CUDA graphs) they equal the
//    plain step and offset, and the op's dispatcher runs them (not cuDNN).
//    With a keep_bits buffer the mask is drawn once (at S % 8 == 0 by its
//    own kernel ahead of the forward, else by the forward) and read by every
//    pass: forward and backward give the bits of the kernels that draw it
//    in each pass; ops::draw_attention_mask alone writes the forward's words.
//    The tiny GPT with attention_dropout 0.1 trained fused equals unfused
//    within 1e-2 and differs from the run without it; one forward +
//    backward of it gives fused = unfused gradients (within 2e-2 norm-wise,
//    every parameter), so each layer's backward read its own forward's mask
//    (another step's masks move each layer's qkv weight gradient 5x further).
//  * ALiBi (causal) and a key-padding mask (bidirectional) in the kernels:
//    forward and backward against the host op with the same scores in fp64,
//    bf16 and fp16, head dims 64 and 128, S from 1 to 1024 (not multiples of
//    the tiles too), with and without dropout (1e-2 norm-wise, all finite);
//    the token-major dispatcher (which routes them to meshtron's kernels)
//    gives the head-major kernels' bits; with dropout, the mask stored in
//    keep_bits gives the bits of the passes that draw it. A sample without a
//    real key: its rows 0, lse +inf, no gradient. A tiny BLOOM and a tiny BERT
//    (head dim 64) trained fused equal unfused within 1e-2, auto = fused.
//
// Skips (exit 0) without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "config/model_spec_from_deck.hpp"
#include "ops/head_layout.hpp"
#include "ops/ops.hpp"
#include "ops/ops_cuda.hpp"
#include "parallel/decomposition.hpp"
#include "tensor/device_allocator.hpp"
#include "tests/gpu/gpu_test_util.hpp"
#include "train/data_source.hpp"

namespace meshtron {
namespace {

using gpu_test::poisoned;
using gpu_test::random_rounded;

double norm_rel(const Tensor& device_result, const Tensor& reference) {
  return testing::norm_rel_error(device_result.to_doubles(), reference.to_doubles());
}

bool all_finite(const Tensor& t) {
  for (double x : t.to_doubles())
    if (!std::isfinite(x)) return false;
  return true;
}

/// The fused results' errors against the fp64 reference (each finite and
/// within 1e-2, as bf16/fp16 attention keeps).
struct FusedErrors {
  double out, lse, dq, dk, dv;
};
FusedErrors expect_near_reference(const Tensor& out, const Tensor& lse, const Tensor& gq,
                                  const Tensor& gk, const Tensor& gv, const Tensor& out_ref,
                                  const Tensor& lse_ref, const Tensor& dq_ref,
                                  const Tensor& dk_ref, const Tensor& dv_ref,
                                  const std::string& what) {
  for (const Tensor* t : {&out, &lse, &gq, &gk, &gv}) EXPECT_TRUE(all_finite(*t)) << what;
  const FusedErrors e{norm_rel(out, out_ref), norm_rel(lse, lse_ref), norm_rel(gq, dq_ref),
                      norm_rel(gk, dk_ref), norm_rel(gv, dv_ref)};
  for (double err : {e.out, e.lse, e.dq, e.dk, e.dv}) EXPECT_LE(err, 1e-2) << what;
  return e;
}

struct Case {
  index_t B, S, D;
  DType dt;
};

/// The unfused device path (Attention's GEMMs + softmax) on the same inputs.
struct UnfusedErrors {
  double out, dq, dk, dv;
};
UnfusedErrors unfused_errors(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                             double scale, const Tensor& out_ref, const Tensor& dq_ref,
                             const Tensor& dk_ref, const Tensor& dv_ref) {
  const index_t B = q.dim(0), S = q.dim(1);
  const DType dt = q.dtype();
  Tensor scores = Tensor::empty({B, S, S}, dt, MemorySpace::Cuda), probs = scores.clone();
  ops::gemm_batched(q, false, k, true, scores);
  ops::scaled_causal_softmax_forward(scores, scale, probs);
  Tensor out = Tensor::empty(q.shape(), dt, MemorySpace::Cuda);
  ops::gemm_batched(probs, false, v, false, out);
  Tensor dprobs = scores, dscores = Tensor::empty({B, S, S}, dt, MemorySpace::Cuda);
  Tensor dq = out.clone(), dk = out.clone(), dv = out.clone();
  ops::gemm_batched(dout, false, v, true, dprobs);
  ops::gemm_batched(probs, true, dout, false, dv);
  ops::scaled_causal_softmax_backward(dprobs, probs, scale, dscores);
  ops::gemm_batched(dscores, false, k, false, dq);
  ops::gemm_batched(dscores, true, q, false, dk);
  return {norm_rel(out, out_ref), norm_rel(dq, dq_ref), norm_rel(dk, dk_ref), norm_rel(dv, dv_ref)};
}

void check_case(const Case& c, std::uint64_t seed) {
  const Shape shape{c.B, c.S, c.D};
  const double scale = 1.0 / std::sqrt(double(c.D));
  // q, k in [-2, 2): scaled scores of a few units, so rows are far from uniform.
  const Tensor q = random_rounded(shape, c.dt, seed, -2, 2),
               k = random_rounded(shape, c.dt, seed + 1, -2, 2),
               v = random_rounded(shape, c.dt, seed + 2, -1, 1),
               dout = random_rounded(shape, c.dt, seed + 3, -1, 1);
  Tensor out_ref = Tensor::empty(shape, DType::F64),
         lse_ref = Tensor::empty({c.B, c.S}, DType::F64);
  ops::fused_attention_forward(q, k, v, scale, out_ref, lse_ref);
  Tensor dq_ref = Tensor::empty(shape, DType::F64), dk_ref = dq_ref.clone(),
         dv_ref = dq_ref.clone();
  ops::fused_attention_backward(dout, q, k, v, out_ref, lse_ref, scale, dq_ref, dk_ref, dv_ref);

  const Tensor dq_ = q.to(c.dt).to_device(), dk_ = k.to(c.dt).to_device(),
               dv_ = v.to(c.dt).to_device(), ddo = dout.to(c.dt).to_device();
  Tensor out = poisoned(shape, c.dt), lse = poisoned({c.B, c.S}, DType::F32);
  ops::fused_attention_forward(dq_, dk_, dv_, scale, out, lse);
  Tensor gq = poisoned(shape, c.dt), gk = poisoned(shape, c.dt), gv = poisoned(shape, c.dt);
  ops::fused_attention_backward(ddo, dq_, dk_, dv_, out, lse, scale, gq, gk, gv);

  const std::string what = std::string(dtype_name(c.dt)) + " B=" + std::to_string(c.B) +
                           " S=" + std::to_string(c.S) + " D=" + std::to_string(c.D);
  const FusedErrors e =
      expect_near_reference(out, lse, gq, gk, gv, out_ref, lse_ref, dq_ref, dk_ref, dv_ref, what);
  const UnfusedErrors u =
      unfused_errors(dq_, dk_, dv_, ddo, scale, out_ref, dq_ref, dk_ref, dv_ref);
  std::printf(
      "%-24s fused: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e | unfused: out %.2e "
      "dq %.2e dk %.2e dv %.2e\n",
      what.c_str(), e.out, e.lse, e.dq, e.dk, e.dv, u.out, u.dq, u.dk, u.dv);

  // Deterministic backward: the same bits again.
  Tensor gq2 = poisoned(shape, c.dt), gk2 = poisoned(shape, c.dt), gv2 = poisoned(shape, c.dt);
  ops::fused_attention_backward(ddo, dq_, dk_, dv_, out, lse, scale, gq2, gk2, gv2);
  EXPECT_EQ(gq2.to_doubles(), gq.to_doubles()) << what;
  EXPECT_EQ(gk2.to_doubles(), gk.to_doubles()) << what;
  EXPECT_EQ(gv2.to_doubles(), gv.to_doubles()) << what;
}

TEST(GpuFlashAttention, MatchesHostReferenceBf16) {
  REQUIRE_GPU();
  const Case cases[] = {
      {1, 64, 64, DType::BF16},    {3, 128, 64, DType::BF16},   {3, 1000, 64, DType::BF16},
      {12, 1024, 64, DType::BF16}, {1, 64, 128, DType::BF16},   {3, 128, 128, DType::BF16},
      {3, 1000, 128, DType::BF16}, {1, 1024, 128, DType::BF16}, {12, 200, 128, DType::BF16},
      {1, 1, 64, DType::BF16},     {2, 17, 128, DType::BF16},   {5, 300, 64, DType::BF16}};
  std::uint64_t seed = 100;
  for (const Case& c : cases) check_case(c, seed += 10);
}

// ------------------------------------------------------ attention dropout ---

struct DropoutCase {
  index_t batch, heads, S, D;
};

void check_dropout_case(const DropoutCase& c, double p, std::uint64_t seed) {
  const DType dt = DType::BF16;
  const index_t B = c.batch * c.heads;
  const Shape shape{B, c.S, c.D};
  const double scale = 1.0 / std::sqrt(double(c.D));
  const ops::AttentionDropout dropout{
      p, testing::attention_probs_site(c.batch, c.heads, c.S, /*sample_offset=*/3,
                                       /*head_offset=*/1, /*heads_global=*/c.heads + 2)};
  const Tensor q = random_rounded(shape, dt, seed, -2, 2),
               k = random_rounded(shape, dt, seed + 1, -2, 2),
               v = random_rounded(shape, dt, seed + 2, -1, 1),
               dout = random_rounded(shape, dt, seed + 3, -1, 1);
  Tensor out_ref = Tensor::empty(shape, DType::F64), lse_ref = Tensor::empty({B, c.S}, DType::F64);
  ops::fused_attention_forward(q, k, v, scale, out_ref, lse_ref, dropout);
  Tensor dq_ref = Tensor::empty(shape, DType::F64), dk_ref = dq_ref.clone(),
         dv_ref = dq_ref.clone();
  ops::fused_attention_backward(dout, q, k, v, out_ref, lse_ref, scale, dq_ref, dk_ref, dv_ref,
                                dropout);
  Tensor undropped = Tensor::empty(shape, DType::F64), lse_undropped = lse_ref.clone();
  ops::fused_attention_forward(q, k, v, scale, undropped, lse_undropped);

  const Tensor gq_in = q.to(dt).to_device(), gk_in = k.to(dt).to_device(),
               gv_in = v.to(dt).to_device(), gdo = dout.to(dt).to_device();
  Tensor out = poisoned(shape, dt), lse = poisoned({B, c.S}, DType::F32);
  ops::fused_attention_forward(gq_in, gk_in, gv_in, scale, out, lse, dropout);
  Tensor gq = poisoned(shape, dt), gk = poisoned(shape, dt), gv = poisoned(shape, dt);
  ops::fused_attention_backward(gdo, gq_in, gk_in, gv_in, out, lse, scale, gq, gk, gv, dropout);

  const std::string what = "dropout b=" + std::to_string(c.batch) + " heads=" +
                           std::to_string(c.heads) + " S=" + std::to_string(c.S) +
                           " D=" + std::to_string(c.D);
  const FusedErrors e =
      expect_near_reference(out, lse, gq, gk, gv, out_ref, lse_ref, dq_ref, dk_ref, dv_ref, what);
  const double dropped = norm_rel(out, undropped);
  EXPECT_GT(dropped, 0.05) << what;  // the mask was applied
  std::printf("%-36s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e | from undropped %.2e\n",
              what.c_str(), e.out, e.lse, e.dq, e.dk, e.dv, dropped);
  Tensor gq2 = poisoned(shape, dt), gk2 = poisoned(shape, dt), gv2 = poisoned(shape, dt);
  ops::fused_attention_backward(gdo, gq_in, gk_in, gv_in, out, lse, scale, gq2, gk2, gv2, dropout);
  EXPECT_EQ(gq2.to_doubles(), gq.to_doubles()) << what;
  EXPECT_EQ(gk2.to_doubles(), gk.to_doubles()) << what;
  EXPECT_EQ(gv2.to_doubles(), gv.to_doubles()) << what;

  // The mask drawn once into keep_bits (by its own kernel where S % 8 == 0,
  // else by the forward) and read by the passes instead of drawn in each:
  // the same decisions, so the same bits.
  ops::AttentionDropout stored = dropout;
  stored.keep_bits = Tensor::empty(ops::attention_keep_bits_shape(B, c.S), DType::I32,
                                   MemorySpace::Cuda);
  stored.keep_bits.fill(0.0);
  Tensor out3 = poisoned(shape, dt), lse3 = poisoned({B, c.S}, DType::F32);
  ops::fused_attention_forward(gq_in, gk_in, gv_in, scale, out3, lse3, stored);
  EXPECT_EQ(out3.to_doubles(), out.to_doubles()) << what << " (stored mask)";
  Tensor gq3 = poisoned(shape, dt), gk3 = poisoned(shape, dt), gv3 = poisoned(shape, dt);
  ops::fused_attention_backward(gdo, gq_in, gk_in, gv_in, out3, lse3, scale, gq3, gk3, gv3, stored);
  EXPECT_EQ(gq3.to_doubles(), gq.to_doubles()) << what << " (stored mask)";
  EXPECT_EQ(gk3.to_doubles(), gk.to_doubles()) << what << " (stored mask)";
  EXPECT_EQ(gv3.to_doubles(), gv.to_doubles()) << what << " (stored mask)";

  // Drawn alone (ops::draw_attention_mask, S % 8 == 0): the forward's words
  // of every row's visible keys (w <= i / 32; the forward may leave others).
  if (c.S % 8 != 0) return;
  ops::AttentionDropout alone = dropout;
  alone.keep_bits = Tensor::empty(stored.keep_bits.shape(), DType::I32, MemorySpace::Cuda);
  alone.keep_bits.fill(-1.0);
  ops::draw_attention_mask(alone, B, c.S);
  const std::vector<double> a = alone.keep_bits.to_doubles(), f = stored.keep_bits.to_doubles();
  const index_t words = stored.keep_bits.dim(2);
  index_t compared = 0, differ = 0;
  for (index_t e = 0; e < B; ++e)
    for (index_t i = 0; i < c.S; ++i)
      for (index_t w = 0; w <= i / 32; ++w) {
        const std::size_t at = std::size_t((e * c.S + i) * words + w);
        differ += a[at] != f[at];
        ++compared;
      }
  EXPECT_EQ(differ, 0) << what << " (mask drawn alone, " << compared << " words)";
}

TEST(GpuFlashAttention, DropoutMatchesHostReference) {
  REQUIRE_GPU();
  const DropoutCase cases[] = {{1, 1, 1, 64},    {2, 1, 17, 128},  {1, 3, 128, 64},
                               {2, 2, 300, 64},  {1, 2, 1000, 128}, {2, 3, 1024, 64},
                               {1, 2, 256, 128}};
  std::uint64_t seed = 7000;
  for (const DropoutCase& c : cases) check_dropout_case(c, 0.2, seed += 10);
}

TEST(GpuFlashAttention, MatchesHostReferenceFp16) {
  REQUIRE_GPU();
  const Case cases[] = {
      {3, 1000, 64, DType::F16}, {3, 1000, 128, DType::F16}, {12, 128, 64, DType::F16}};
  std::uint64_t seed = 900;
  for (const Case& c : cases) check_case(c, seed += 10);
}

// ------------------------------------------- ALiBi and key-padding mask ---

enum class ScoresKind { Alibi, KeyMask };

struct ScoresCase {
  index_t batch, heads, S, D;
  DType dt;
  ScoresKind kind;
};

/// The host scores of a case (ALiBi slopes of its heads, or a padding mask
/// with sample s's first S - 5 s (at least 1) keys real and key 2 masked in
/// the odd samples; `empty_last`: the last sample has none).
ops::FusedAttentionScores host_scores(const ScoresCase& c, bool empty_last = false) {
  ops::FusedAttentionScores sc;
  if (c.kind == ScoresKind::Alibi) {
    sc.alibi_slopes = Tensor::empty({c.heads}, DType::F32);
    const std::vector<double> slopes = ops::alibi_slopes(c.heads);
    for (index_t h = 0; h < c.heads; ++h)
      sc.alibi_slopes.data<float>()[h] = float(slopes[std::size_t(h)]);
    return sc;
  }
  sc.key_mask = Tensor::zeros({c.batch, c.S}, DType::I32);
  for (index_t b = 0; b < c.batch; ++b) {
    const index_t real = std::max<index_t>(1, c.S - 5 * b);
    for (index_t j = 0; j < real; ++j)
      sc.key_mask.data<std::int32_t>()[b * c.S + j] = (b % 2 == 1 && j == 2) ? 0 : 1;
  }
  if (empty_last)
    for (index_t j = 0; j < c.S; ++j) sc.key_mask.data<std::int32_t>()[(c.batch - 1) * c.S + j] = 0;
  return sc;
}

ops::FusedAttentionScores to_device(const ops::FusedAttentionScores& sc) {
  ops::FusedAttentionScores d;
  if (sc.alibi_slopes.defined()) d.alibi_slopes = sc.alibi_slopes.to_device();
  if (sc.key_mask.defined()) d.key_mask = sc.key_mask.to_device();
  return d;
}

std::string describe(const ScoresCase& c, double p) {
  return std::string(c.kind == ScoresKind::Alibi ? "alibi" : "key mask") + " " +
         std::string(dtype_name(c.dt)) + " b=" + std::to_string(c.batch) + " heads=" +
         std::to_string(c.heads) + " S=" + std::to_string(c.S) + " D=" + std::to_string(c.D) +
         " p=" + std::to_string(p);
}

void check_scores_case(const ScoresCase& c, double p, std::uint64_t seed) {
  const index_t B = c.batch * c.heads;
  const Shape shape{B, c.S, c.D};
  const double scale = 1.0 / std::sqrt(double(c.D));
  ops::AttentionDropout dropout;
  if (p > 0) dropout = {p, testing::attention_probs_site(c.batch, c.heads, c.S)};
  const ops::FusedAttentionScores sc = host_scores(c), dsc = to_device(sc);
  const Tensor q = random_rounded(shape, c.dt, seed, -2, 2),
               k = random_rounded(shape, c.dt, seed + 1, -2, 2),
               v = random_rounded(shape, c.dt, seed + 2, -1, 1),
               dout = random_rounded(shape, c.dt, seed + 3, -1, 1);
  Tensor out_ref = Tensor::empty(shape, DType::F64), lse_ref = Tensor::empty({B, c.S}, DType::F64);
  ops::fused_attention_forward(q, k, v, scale, out_ref, lse_ref, dropout, sc);
  Tensor dq_ref = Tensor::empty(shape, DType::F64), dk_ref = dq_ref.clone(),
         dv_ref = dq_ref.clone();
  ops::fused_attention_backward(dout, q, k, v, out_ref, lse_ref, scale, dq_ref, dk_ref, dv_ref,
                                dropout, sc);

  const Tensor gq_in = q.to(c.dt).to_device(), gk_in = k.to(c.dt).to_device(),
               gv_in = v.to(c.dt).to_device(), gdo = dout.to(c.dt).to_device();
  Tensor out = poisoned(shape, c.dt), lse = poisoned({B, c.S}, DType::F32);
  ops::fused_attention_forward(gq_in, gk_in, gv_in, scale, out, lse, dropout, dsc);
  Tensor gq = poisoned(shape, c.dt), gk = poisoned(shape, c.dt), gv = poisoned(shape, c.dt);
  ops::fused_attention_backward(gdo, gq_in, gk_in, gv_in, out, lse, scale, gq, gk, gv, dropout,
                                dsc);
  const std::string what = describe(c, p);
  const FusedErrors e =
      expect_near_reference(out, lse, gq, gk, gv, out_ref, lse_ref, dq_ref, dk_ref, dv_ref, what);
  std::printf("%-52s out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", what.c_str(), e.out, e.lse,
              e.dq, e.dk, e.dv);

  // The token-major dispatcher (the model's entry; meshtron's kernels for
  // these scores, never cuDNN's) on the same rows: the head-major bits.
  Tensor qkv;
  const Tensor parts[3] = {gq_in, gk_in, gv_in};
  ops::merge_heads(parts, 3, c.S, c.batch, c.heads, qkv);
  Tensor dctx;
  ops::merge_heads(&gdo, 1, c.S, c.batch, c.heads, dctx);
  Tensor ctx = poisoned({c.S * c.batch, c.heads * c.D}, c.dt),
         tlse = poisoned({B, c.S}, DType::F32), dqkv = poisoned(qkv.shape(), c.dt);
  ops::fused_attention_forward_token_major(qkv, c.S, c.batch, c.heads, scale, ctx, tlse, dropout,
                                           dsc);
  ops::fused_attention_backward_token_major(dctx, qkv, ctx, tlse, c.S, c.batch, c.heads, scale,
                                            dqkv, dropout, dsc);
  Tensor merged_out, merged_grads;
  ops::merge_heads(&out, 1, c.S, c.batch, c.heads, merged_out);
  const Tensor grads[3] = {gq, gk, gv};
  ops::merge_heads(grads, 3, c.S, c.batch, c.heads, merged_grads);
  EXPECT_EQ(ctx.to_doubles(), merged_out.to_doubles()) << what << " (token-major)";
  EXPECT_EQ(tlse.to_doubles(), lse.to_doubles()) << what << " (token-major)";
  EXPECT_EQ(dqkv.to_doubles(), merged_grads.to_doubles()) << what << " (token-major)";

  if (p == 0) return;
  // The mask stored by the forward (or drawn ahead of it, causal S % 8 == 0)
  // and read by the backward: the bits of the passes that draw it.
  ops::AttentionDropout stored = dropout;
  stored.keep_bits = Tensor::empty(ops::attention_keep_bits_shape(B, c.S), DType::I32,
                                   MemorySpace::Cuda);
  stored.keep_bits.fill(0.0);
  Tensor out3 = poisoned(shape, c.dt), lse3 = poisoned({B, c.S}, DType::F32);
  ops::fused_attention_forward(gq_in, gk_in, gv_in, scale, out3, lse3, stored, dsc);
  Tensor gq3 = poisoned(shape, c.dt), gk3 = poisoned(shape, c.dt), gv3 = poisoned(shape, c.dt);
  ops::fused_attention_backward(gdo, gq_in, gk_in, gv_in, out3, lse3, scale, gq3, gk3, gv3, stored,
                                dsc);
  EXPECT_EQ(out3.to_doubles(), out.to_doubles()) << what << " (stored mask)";
  EXPECT_EQ(gq3.to_doubles(), gq.to_doubles()) << what << " (stored mask)";
  EXPECT_EQ(gk3.to_doubles(), gk.to_doubles()) << what << " (stored mask)";
  EXPECT_EQ(gv3.to_doubles(), gv.to_doubles()) << what << " (stored mask)";
}

const ScoresCase kScoresCases[] = {
    {1, 1, 1, 64, DType::BF16, ScoresKind::Alibi},      {2, 3, 17, 128, DType::BF16, ScoresKind::Alibi},
    {2, 4, 300, 64, DType::BF16, ScoresKind::Alibi},    {1, 8, 1024, 64, DType::BF16, ScoresKind::Alibi},
    {1, 6, 1000, 128, DType::BF16, ScoresKind::Alibi},  {2, 3, 256, 64, DType::F16, ScoresKind::Alibi},
    {1, 2, 1, 64, DType::BF16, ScoresKind::KeyMask},    {3, 2, 17, 128, DType::BF16, ScoresKind::KeyMask},
    {4, 3, 300, 64, DType::BF16, ScoresKind::KeyMask},  {2, 4, 1024, 64, DType::BF16, ScoresKind::KeyMask},
    {2, 2, 1000, 128, DType::BF16, ScoresKind::KeyMask}, {3, 2, 256, 64, DType::F16, ScoresKind::KeyMask},
    {2, 2, 128, 128, DType::F16, ScoresKind::KeyMask}};

TEST(GpuFlashAttention, AlibiAndKeyMaskMatchHostReference) {
  REQUIRE_GPU();
  std::uint64_t seed = 9000;
  for (const ScoresCase& c : kScoresCases) check_scores_case(c, 0.0, seed += 10);
}

TEST(GpuFlashAttention, AlibiAndKeyMaskWithDropoutMatchHostReference) {
  REQUIRE_GPU();
  std::uint64_t seed = 9500;
  for (const ScoresCase& c : kScoresCases) check_scores_case(c, 0.2, seed += 10);
}

TEST(GpuFlashAttention, KeyMaskSampleWithoutRealKeysIsZero) {
  REQUIRE_GPU();
  for (index_t D : {64, 128}) {
    const ScoresCase c{3, 2, 40, D, DType::BF16, ScoresKind::KeyMask};
    const index_t B = c.batch * c.heads;
    const Shape shape{B, c.S, c.D};
    const ops::FusedAttentionScores dsc = to_device(host_scores(c, /*empty_last=*/true));
    const Tensor q = random_rounded(shape, c.dt, 77, -2, 2).to(c.dt).to_device(),
                 k = random_rounded(shape, c.dt, 78, -2, 2).to(c.dt).to_device(),
                 v = random_rounded(shape, c.dt, 79, -1, 1).to(c.dt).to_device(),
                 dout = random_rounded(shape, c.dt, 80, -1, 1).to(c.dt).to_device();
    Tensor out = poisoned(shape, c.dt), lse = poisoned({B, c.S}, DType::F32);
    ops::fused_attention_forward(q, k, v, 0.125, out, lse, {}, dsc);
    Tensor gq = poisoned(shape, c.dt), gk = poisoned(shape, c.dt), gv = poisoned(shape, c.dt);
    ops::fused_attention_backward(dout, q, k, v, out, lse, 0.125, gq, gk, gv, {}, dsc);
    const std::vector<double> o = out.to_doubles(), l = lse.to_doubles(), dq = gq.to_doubles(),
                              dk = gk.to_doubles(), dv = gv.to_doubles();
    const std::size_t entry = std::size_t(c.S * c.D), first = std::size_t(B - c.heads);
    for (std::size_t i = 0; i < o.size(); ++i) {
      const bool empty = i / entry >= first;
      ASSERT_TRUE(std::isfinite(o[i]) && std::isfinite(dq[i]) && std::isfinite(dk[i]) &&
                  std::isfinite(dv[i]))
          << "D " << D << " element " << i;
      if (empty) {
        EXPECT_EQ(o[i], 0.0) << "D " << D << " element " << i;
        EXPECT_EQ(dq[i], 0.0) << "D " << D << " element " << i;
        EXPECT_EQ(dk[i], 0.0) << "D " << D << " element " << i;
        EXPECT_EQ(dv[i], 0.0) << "D " << D << " element " << i;
      }
    }
    for (std::size_t r = 0; r < l.size(); ++r)
      EXPECT_EQ(std::isinf(l[r]), r / std::size_t(c.S) >= first) << "D " << D << " row " << r;
  }
}

// ---------------------------------------------------------- model level ---

struct ModelRun {
  std::vector<double> losses;
  std::size_t peak_bytes = 0;
  bool masks_drawn_ahead = false;            ///< at the last step
  std::vector<std::vector<double>> params;   ///< after the last step
};

/// The tiny GPT with head dim 64 (2 layers, hidden 128, 2 heads, seq 256,
/// micro-batch 4) on the GPU, no hidden dropout.
RunConfig tiny_gpt_deck(const std::string& backend, const std::string& precision, int steps,
                        double attention_dropout, const std::vector<std::string>& extra = {}) {
  testing::Layout layout;
  layout.overrides = {"run.device=cuda",
                      "training.precision=" + precision,
                      "model.attention_backend=" + backend,
                      "model.num_layers=2",
                      "model.hidden_size=128",
                      "model.num_attention_heads=2",
                      "model.seq_length=256",
                      "model.hidden_dropout=0",
                      "model.attention_dropout=" + std::to_string(attention_dropout),
                      "training.micro_batch_size=4",
                      "training.global_batch_size=8",
                      "training.train_iters=" + std::to_string(steps)};
  for (const std::string& kv : extra) {  // replaces the key's value (each key once)
    const std::string key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(layout.overrides, [&](const std::string& o) { return o.rfind(key, 0) == 0; });
    layout.overrides.push_back(kv);
  }
  return testing::tiny_config(layout, 1);
}

/// The tiny GPT trained `steps` steps in `precision` on the GPU (or the
/// family `extra` names: model.arch=bert trains on the synthetic BERT data).
ModelRun train_gpt(const std::string& backend, const std::string& precision, DType dtype,
                   int steps, double attention_dropout = 0,
                   const std::vector<std::string>& extra = {}) {
  const RunConfig config = tiny_gpt_deck(backend, precision, steps, attention_dropout, extra);
  ParallelRuntime rt(MPI_COMM_SELF, config.parallel.degrees(), MemorySpace::Cuda);
  const ModelSpec model = model_spec_from_deck(config, 100, 1);
  device::synchronize();
  device::reset_peak();
  ModelRun run;
  {
    Trainer trainer(config, model, rt, dtype);
    DataLayout data{model.seq_length,
                    config.training.micro_batch_size,
                    config.training.global_batch_size,
                    0,
                    1,
                    steps,
                    1,
                    config.run.seed};
    auto source = model.model_class == ModelClass::BertPretraining
                      ? make_synthetic_bert_data(data, 100)
                      : make_synthetic_data(data, 100);
    for (long step = 1; step <= steps; ++step)
      run.losses.push_back(trainer.train_step(step, source->train_step(step)).loss);
    run.masks_drawn_ahead = trainer.masks_drawn_ahead();
    for (Parameter* p : trainer.parameters()) run.params.push_back(p->value.to_doubles());
    device::synchronize();
  }
  run.peak_bytes = device::allocator_stats().peak_bytes;
  return run;
}

// The token-major entry points (what the attention layer calls: q, k, v read
// from the qkv projection's [s*b, 3*heads*d] output, the context written in
// proj's [s*b, heads*d] input layout) address the same rows as split_heads +
// the head-major kernels + merge_heads, so they must give the same bits; the
// host path of the op is that composition.
#ifdef MESHTRON_HAVE_CUDA  // calls the CUDA kernels directly
/// The CUDA kernels' view of an ops dropout (ops_attention.cpp builds the same).
cuda::AttentionDropoutSite device_dropout(const ops::AttentionDropout& d) {
  const ops::DropoutSite& s = d.site;
  return {d.p, {s.seed, s.step, s.stream, s.b, s.c, s.a_offset, s.b_offset, s.c_offset,
                s.b_global, s.c_global, s.live, s.sample_axis}};
}

TEST(GpuFlashAttention, TokenMajorEqualsSplitHeadMajorMerge) {
  REQUIRE_GPU();
  struct Shape4 {
    index_t s, b, heads, d;
  };
  std::uint64_t seed = 5000;
  for (const Shape4 c : {Shape4{1024, 2, 3, 64}, Shape4{300, 3, 2, 64}, Shape4{200, 2, 2, 128},
                         Shape4{17, 1, 1, 64}})
    for (DType dt : {DType::BF16, DType::F16})
      for (double p : {0.0, 0.2}) {
        const std::string what = "s " + std::to_string(c.s) + " b " + std::to_string(c.b) +
                                 " heads " + std::to_string(c.heads) + " d " +
                                 std::to_string(c.d) + " " + std::string(dtype_name(dt)) +
                                 " dropout " + std::to_string(p);
        const index_t rows = c.s * c.b, width = c.heads * c.d;
        const double scale = 1.0 / std::sqrt(double(c.d));
        const ops::AttentionDropout dropout =
            p == 0.0 ? ops::AttentionDropout{}
                     : ops::AttentionDropout{
                           p, testing::attention_probs_site(c.b, c.heads, c.s, 2, 1, c.heads + 1)};
        const Tensor qkv = random_rounded({rows, 3 * width}, dt, seed++, -2, 2).to(dt).to_device();
        const Tensor dctx = random_rounded({rows, width}, dt, seed++, -1, 1).to(dt).to_device();

        Tensor ctx = poisoned({rows, width}, dt);
        Tensor lse = Tensor::empty({c.b * c.heads, c.s}, DType::F32, MemorySpace::Cuda);
        // meshtron's own kernels (the op may pick cuDNN's, whose bits differ;
        // tests/gpu/test_gpu_cudnn_attention.cpp checks that choice).
        cuda::flash_attention_forward_token_major(dt, qkv.raw(), c.s, c.b, c.heads, c.d, scale,
                                                  ctx.raw(), lse.data<float>(),
                                                  device_dropout(dropout));
        Tensor dqkv = poisoned({rows, 3 * width}, dt);
        Tensor delta = Tensor::empty({c.b * c.heads, c.s}, DType::F32, MemorySpace::Cuda);
        cuda::flash_attention_backward_token_major(dt, dctx.raw(), qkv.raw(), ctx.raw(),
                                                   lse.data<float>(), c.s, c.b, c.heads, c.d,
                                                   scale, delta.data<float>(), dqkv.raw(),
                                                   device_dropout(dropout));

        Tensor parts[3], dout;
        ops::split_heads(qkv, c.s, c.b, c.heads, 3, parts);
        ops::split_heads(dctx, c.s, c.b, c.heads, 1, &dout);
        Tensor out = poisoned(parts[0].shape(), dt);
        Tensor lse_hm = Tensor::empty({c.b * c.heads, c.s}, DType::F32, MemorySpace::Cuda);
        ops::fused_attention_forward(parts[0], parts[1], parts[2], scale, out, lse_hm, dropout);
        Tensor grads[3];
        for (Tensor& g : grads) g = poisoned(parts[0].shape(), dt);
        ops::fused_attention_backward(dout, parts[0], parts[1], parts[2], out, lse_hm, scale,
                                      grads[0], grads[1], grads[2], dropout);
        Tensor ctx_ref, dqkv_ref;
        ops::merge_heads(&out, 1, c.s, c.b, c.heads, ctx_ref);
        ops::merge_heads(grads, 3, c.s, c.b, c.heads, dqkv_ref);

        EXPECT_TRUE(all_finite(ctx) && all_finite(dqkv)) << what;
        EXPECT_EQ(ctx.to_doubles(), ctx_ref.to_doubles()) << what;
        EXPECT_EQ(lse.to_doubles(), lse_hm.to_doubles()) << what;
        EXPECT_EQ(dqkv.to_doubles(), dqkv_ref.to_doubles()) << what;
        if (p == 0.0) continue;

        // CUDA graphs: the step and the sample offset read from device words
        // {step, sample lo, sample hi} at run time give the same bits.
        Tensor words = Tensor::empty({3}, DType::I32);
        words.data<std::int32_t>()[0] = std::int32_t(dropout.site.step);
        words.data<std::int32_t>()[1] = std::int32_t(dropout.site.a_offset);
        words.data<std::int32_t>()[2] = 0;
        const Tensor live = words.to_device();
        ops::AttentionDropout from_words = dropout;
        from_words.site.step = 0;
        from_words.site.a_offset = 0;
        from_words.site.live = static_cast<const std::uint32_t*>(live.raw());
        Tensor ctx_live = poisoned({rows, width}, dt), dqkv_live = poisoned({rows, 3 * width}, dt);
        cuda::flash_attention_forward_token_major(dt, qkv.raw(), c.s, c.b, c.heads, c.d, scale,
                                                  ctx_live.raw(), lse.data<float>(),
                                                  device_dropout(from_words));
        cuda::flash_attention_backward_token_major(dt, dctx.raw(), qkv.raw(), ctx_live.raw(),
                                                   lse.data<float>(), c.s, c.b, c.heads, c.d,
                                                   scale, delta.data<float>(), dqkv_live.raw(),
                                                   device_dropout(from_words));
        EXPECT_EQ(ctx_live.to_doubles(), ctx.to_doubles()) << what;
        EXPECT_EQ(dqkv_live.to_doubles(), dqkv.to_doubles()) << what;
        // The op's dispatcher runs these kernels whenever attention dropout
        // is on, cuDNN or not (cuDNN's dropout draws other bits); here with
        // the mask stored by the forward for the backward (as the model
        // does): the same decisions, the same bits.
        ops::AttentionDropout stored = dropout;
        stored.keep_bits = Tensor::empty(
            ops::attention_keep_bits_shape(c.b * c.heads, c.s), DType::I32,
            MemorySpace::Cuda);
        Tensor ctx_op = poisoned({rows, width}, dt), dqkv_op = poisoned({rows, 3 * width}, dt);
        Tensor lse_op = Tensor::empty({c.b * c.heads, c.s}, DType::F32, MemorySpace::Cuda);
        ops::fused_attention_forward_token_major(qkv, c.s, c.b, c.heads, scale, ctx_op, lse_op,
                                                 stored);
        ops::fused_attention_backward_token_major(dctx, qkv, ctx_op, lse_op, c.s, c.b, c.heads,
                                                  scale, dqkv_op, stored);
        EXPECT_EQ(ctx_op.to_doubles(), ctx.to_doubles()) << what;
        EXPECT_EQ(dqkv_op.to_doubles(), dqkv.to_doubles()) << what;
      }
}
#endif

TEST(GpuFlashAttention, GptBf16FusedLossMatchesUnfused) {
  REQUIRE_GPU();
  const int steps = 4;
  const ModelRun fused = train_gpt("fused", "bf16", DType::BF16, steps);
  const ModelRun unfused = train_gpt("unfused", "bf16", DType::BF16, steps);
  for (int i = 0; i < steps; ++i) {
    EXPECT_TRUE(std::isfinite(fused.losses[i]));
    EXPECT_LE(std::fabs(fused.losses[i] - unfused.losses[i]) / unfused.losses[i], 1e-2)
        << "step " << i + 1;
    std::printf("step %d bf16 loss fused %.6f unfused %.6f\n", i + 1, fused.losses[i],
                unfused.losses[i]);
  }
  std::printf("allocator peak: fused %zu bytes, unfused %zu bytes\n", fused.peak_bytes,
              unfused.peak_bytes);
  EXPECT_LT(fused.peak_bytes, unfused.peak_bytes);
  // auto picks the fused kernel here: the same losses, bit for bit.
  EXPECT_EQ(train_gpt("auto", "bf16", DType::BF16, steps).losses, fused.losses);
}

/// The family of `extra` trained fused and unfused in bf16: losses within
/// 1e-2 relative; auto is the fused run bit for bit.
void expect_family_fused_matches_unfused(const std::vector<std::string>& extra, double p) {
  const int steps = 4;
  const ModelRun fused = train_gpt("fused", "bf16", DType::BF16, steps, p, extra);
  const ModelRun unfused = train_gpt("unfused", "bf16", DType::BF16, steps, p, extra);
  for (int i = 0; i < steps; ++i) {
    EXPECT_TRUE(std::isfinite(fused.losses[i]));
    EXPECT_LE(std::fabs(fused.losses[i] - unfused.losses[i]) / unfused.losses[i], 1e-2)
        << extra.front() << " p " << p << " step " << i + 1;
    std::printf("%s p %.1f step %d bf16 loss fused %.6f unfused %.6f\n", extra.front().c_str(),
                p, i + 1, fused.losses[i], unfused.losses[i]);
  }
  EXPECT_LT(fused.peak_bytes, unfused.peak_bytes) << extra.front();
  EXPECT_EQ(train_gpt("auto", "bf16", DType::BF16, steps, p, extra).losses, fused.losses)
      << extra.front() << " p " << p;
}

TEST(GpuFlashAttention, BloomBf16FusedLossMatchesUnfused) {
  REQUIRE_GPU();
  for (double p : {0.0, 0.1})
    expect_family_fused_matches_unfused(
        {"model.arch=bloom", "model.position_embedding_type=alibi", "model.embedding_norm=true"},
        p);
}

TEST(GpuFlashAttention, BertBf16FusedLossMatchesUnfused) {
  REQUIRE_GPU();
  for (double p : {0.0, 0.1}) expect_family_fused_matches_unfused({"model.arch=bert"}, p);
}

TEST(GpuFlashAttention, GptBf16FusedWithAttentionDropoutMatchesUnfused) {
  REQUIRE_GPU();
  const int steps = 4;
  const ModelRun fused = train_gpt("fused", "bf16", DType::BF16, steps, 0.1);
  const ModelRun unfused = train_gpt("unfused", "bf16", DType::BF16, steps, 0.1);
  for (int i = 0; i < steps; ++i) {
    EXPECT_TRUE(std::isfinite(fused.losses[i]));
    EXPECT_LE(std::fabs(fused.losses[i] - unfused.losses[i]) / unfused.losses[i], 1e-2)
        << "step " << i + 1;
    std::printf("step %d bf16 attention_dropout 0.1 loss fused %.6f unfused %.6f\n", i + 1,
                fused.losses[i], unfused.losses[i]);
  }
  // The dropout was on: not the run without it.
  EXPECT_NE(fused.losses, train_gpt("fused", "bf16", DType::BF16, steps, 0.0).losses);
  // auto now takes the fused kernels with attention dropout: the same bits.
  EXPECT_EQ(train_gpt("auto", "bf16", DType::BF16, steps, 0.1).losses, fused.losses);
}

/// Every parameter gradient of the tiny bf16 GPT (attention dropout p, the
/// masks of dropout step `step`) after one forward + backward of a fixed
/// micro-batch.
struct NamedGradients {
  std::vector<std::string> names;
  std::vector<std::vector<double>> values;
};
NamedGradients gpt_gradients(const std::string& backend, double p, std::uint32_t step) {
  const RunConfig run = tiny_gpt_deck(backend, "bf16", 1, p);
  const ModelSpec config = model_spec_from_deck(run, 100, 1);
  MpiCommunicator self(MPI_COMM_SELF);
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  ctx.seq_length = config.seq_length;
  ctx.micro_batch = run.training.micro_batch_size;
  ctx.global_batch = run.training.micro_batch_size;
  ctx.space = MemorySpace::Cuda;
  ctx.seed = 1234;
  ctx.step = step;
  GptModel model(config, StagePlacement::whole_model(config.num_layers), ctx, DType::BF16, 77);
  const index_t tokens = ctx.seq_length * ctx.micro_batch;
  Tensor ids = Tensor::empty({tokens}, DType::I32);
  Tensor targets = Tensor::empty({tokens}, DType::I32);
  std::mt19937 gen(3);
  for (index_t t = 0; t < tokens; ++t) {
    ids.data<std::int32_t>()[t] = std::int32_t(gen() % 100);
    targets.data<std::int32_t>()[t] = std::int32_t(gen() % 100);
  }
  GptModel::Cache cache;
  const Tensor loss = model.forward(ids, targets, ctx, cache);
  Tensor dloss = Tensor::empty(loss.shape(), DType::F32, MemorySpace::Cuda);
  dloss.fill(1.0 / double(loss.numel()));
  model.backward(dloss, ctx, cache);
  NamedGradients grads;
  for (Parameter* q : model.parameters()) {
    grads.names.push_back(q->name);
    grads.values.push_back(q->grad.to_doubles());
  }
  return grads;
}

// Each layer's backward must read the mask its own forward stored: with
// another layer's bits (or bits a later forward overwrote) every gradient
// below that layer would follow a different mask. The unfused path keeps
// [b*heads, s, s] masks per layer, so fused = unfused gradient by gradient
// (within bf16) says each layer got its own; the same model with another
// step's masks shows how far a wrong mask moves them.
TEST(GpuFlashAttention, GptBf16AttentionDropoutGradientsFollowEachLayersMask) {
  REQUIRE_GPU();
  const double p = 0.1;
  const auto fused = gpt_gradients("fused", p, 1);
  const auto unfused = gpt_gradients("unfused", p, 1);
  const auto other_masks = gpt_gradients("unfused", p, 2);
  ASSERT_EQ(fused.names, unfused.names);
  const double tolerance = 2e-2;
  double worst = 0;
  int qkv_weights = 0;
  for (std::size_t i = 0; i < fused.names.size(); ++i) {
    const std::string& name = fused.names[i];
    const double e = testing::norm_rel_error(fused.values[i], unfused.values[i]);
    const double other = testing::norm_rel_error(other_masks.values[i], unfused.values[i]);
    worst = std::max(worst, e);
    EXPECT_LE(e, tolerance) << name;
    std::printf("%-40s fused vs unfused %.2e, another step's masks %.2e\n", name.c_str(), e,
                other);
    // The gradient a layer's own backward mask enters first: a wrong mask
    // moves it well past the tolerance, so the check above can fail.
    if (name.find(".qkv.weight") != std::string::npos) {
      ++qkv_weights;
      EXPECT_GE(other, 5 * tolerance) << name;
    }
  }
  EXPECT_EQ(qkv_weights, 2);
  std::printf("attention dropout %.1f: fused vs unfused gradients, worst norm-wise %.2e\n", p,
              worst);
}

// training.attention_masks_ahead (the default): the first micro-batch's
// masks drawn at the start of the step on a high-priority stream give the
// bits of the masks drawn ahead of each layer's attention: losses and
// parameters after 4 steps bitwise equal, eager with 2 micro-batches per
// step (the second draws its own) and replayed from CUDA graphs with one;
// where it cannot apply (graphs with 2 micro-batches, no dropout) nothing
// is drawn ahead.
TEST(GpuFlashAttention, AttentionMasksDrawnAheadGiveTheSameBits) {
  REQUIRE_GPU();
  const int steps = 4;
  const std::vector<std::vector<std::string>> layouts = {
      {}, {"training.global_batch_size=4", "training.cuda_graphs=true"}};
  for (const auto& layout : layouts) {
    auto with = [&](const std::string& ahead) {
      std::vector<std::string> extra = layout;
      extra.push_back("training.attention_masks_ahead=" + ahead);
      return train_gpt("fused", "bf16", DType::BF16, steps, 0.1, extra);
    };
    const ModelRun ahead = with("true"), inline_ = with("false");
    const std::string what = layout.empty() ? "eager, 2 micro-batches" : "graphs, 1 micro-batch";
    EXPECT_TRUE(ahead.masks_drawn_ahead) << what;
    EXPECT_FALSE(inline_.masks_drawn_ahead) << what;
    EXPECT_EQ(ahead.losses, inline_.losses) << what;
    EXPECT_EQ(ahead.params, inline_.params) << what;
    std::printf("%s: last loss %.6f, masks drawn ahead\n", what.c_str(), ahead.losses.back());
  }
  EXPECT_FALSE(train_gpt("fused", "bf16", DType::BF16, 2, 0.1, {"training.cuda_graphs=true"})
                   .masks_drawn_ahead);
  EXPECT_FALSE(train_gpt("fused", "bf16", DType::BF16, 2, 0.0).masks_drawn_ahead);
}

// training.attention_dropout_rng = cudnn: cuDNN's fused attention draws the
// attention-dropout mask with its own generator. Not meshtron's bits (the
// losses differ from the default's, within the noise of another mask), but
// still a function of the run: a second run gives the same bits, and so do
// CUDA graphs with two micro-batches (each call's seed is drawn on the
// device from the step and sample offset the graph reads at replay). No mask
// is stored or drawn ahead; the unfused core refuses it.
TEST(GpuFlashAttention, CudnnDropoutRngIsReproducibleAndTracksOurs) {
  REQUIRE_GPU();
  const cuda::CudnnAttentionSupport support =
      cuda::cudnn_attention_support(DType::BF16, 256, 4, 2, 64, 0.1);
  if (!support.forward || !support.backward)
    GTEST_SKIP() << "cuDNN cannot run the tiny GPT's attention with dropout: " << support.why_not;
  const int steps = 6;
  const std::string cudnn_rng = "training.attention_dropout_rng=cudnn";
  const ModelRun ours = train_gpt("fused", "bf16", DType::BF16, steps, 0.1);
  const ModelRun dnn = train_gpt("fused", "bf16", DType::BF16, steps, 0.1, {cudnn_rng});
  const ModelRun again = train_gpt("fused", "bf16", DType::BF16, steps, 0.1, {cudnn_rng});
  const ModelRun graphs = train_gpt("fused", "bf16", DType::BF16, steps, 0.1,
                                    {cudnn_rng, "training.cuda_graphs=true"});
  EXPECT_EQ(dnn.losses, again.losses);
  EXPECT_EQ(dnn.params, again.params);
  EXPECT_EQ(graphs.losses, dnn.losses) << "CUDA graphs, 2 micro-batches";
  EXPECT_EQ(graphs.params, dnn.params) << "CUDA graphs, 2 micro-batches";
  EXPECT_FALSE(dnn.masks_drawn_ahead);
  EXPECT_NE(dnn.losses, ours.losses) << "cuDNN drew meshtron's mask?";
  for (int i = 0; i < steps; ++i) {
    EXPECT_TRUE(std::isfinite(dnn.losses[i]));
    EXPECT_NEAR(dnn.losses[i], ours.losses[i], 5e-2) << "step " << i + 1;
  }
  std::printf("losses, cuDNN's dropout / meshtron's: first %.6f / %.6f, last %.6f / %.6f\n",
              dnn.losses.front(), ours.losses.front(), dnn.losses.back(), ours.losses.back());
  EXPECT_THROW(train_gpt("unfused", "bf16", DType::BF16, 1, 0.1, {cudnn_rng}), UserError);
}

TEST(GpuFlashAttention, FusedOnFp32GpuModelIsAUserError) {
  REQUIRE_GPU();
  EXPECT_THROW(train_gpt("fused", "fp32", DType::F32, 1), UserError);
}

}  // namespace
}  // namespace meshtron
