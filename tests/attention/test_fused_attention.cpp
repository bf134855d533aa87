// The host fused attention op (kernels/kokkos/attention.hpp via
// ops::fused_attention_*) against independent references, in fp64:
//
//  * forward: out equals the unfused composition (gemm_batched, then
//    scaled_causal_softmax_forward, then gemm_batched) and lse equals a
//    log-sum-exp computed here from the scores, to 1e-12 (relative to the
//    largest value), at shapes with S not a multiple of anything;
//  * backward: dq, dk, dv equal the unfused backward (dP = dO V^T, dV = P^T dO,
//    softmax backward, dQ = dS K, dK = dS^T Q) to 1e-12;
//  * backward against central differences of L = sum(w * out) for every
//    element of q, k and v (h = 1e-6, error <= 1e-7 of the largest gradient);
//  * with attention dropout: forward and backward equal the unfused
//    composition with dropout_forward / dropout_backward on the
//    probabilities at the same site (so the same mask), to 1e-12; a call on
//    a shard of the heads and samples (the site's offsets, as under tp and
//    dp) equals the same rows of the whole call bit for bit;
//  * with ALiBi slopes (causal) and with a key-padding mask (bidirectional,
//    one sample without a real key): forward, lse and backward equal the
//    unfused composition (scaled_causal_softmax with the slopes,
//    scaled_masked_softmax with the mask), without and with attention
//    dropout, to 1e-12; the rows without a real key are 0 with lse +inf;
//  * fused_attention_supported's rules, and model.attention_backend's
//    deck validation;
//  * the CUDA mask kernel's numbering (ops/attention_mask_layout.hpp): its
//    words are every visible word (w <= i / 32 of row i) once, in row
//    order, and its block search is exact at block boundaries up to the
//    largest count it takes;
//  * the tiny GPT, a tiny BLOOM (ALiBi) and a tiny BERT (padding mask), head
//    dim 4, trained 3 steps in fp64 with attention_backend = fused: losses
//    and parameters equal the unfused run to 1e-10, with attention dropout
//    off and on.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/expect_user_error.hpp"
#include "../parallel/decomposition.hpp"
#include "ops/attention_mask_layout.hpp"
#include "ops/head_layout.hpp"
#include "common/error.hpp"
#include "ops/ops.hpp"

namespace meshtron {
namespace {

Tensor random_tensor(const Shape& shape, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(shape, DType::F64);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(rng);
  return t;
}

/// max_i |a_i - b_i| / max_i |b_i|.
double max_rel(const Tensor& a, const Tensor& b) {
  double err = 0, scale = 0;
  for (index_t i = 0; i < a.numel(); ++i) {
    err = std::max(err, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
    scale = std::max(scale, std::fabs(b.data<double>()[i]));
  }
  return err / std::max(scale, 1e-300);
}

struct Unfused {
  Tensor scores, probs, out;
};

Unfused unfused_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  const index_t B = q.dim(0), S = q.dim(1);
  Unfused u;
  u.scores = Tensor::empty({B, S, S}, DType::F64);
  ops::gemm_batched(q, false, k, true, u.scores);
  u.probs = Tensor::empty({B, S, S}, DType::F64);
  ops::scaled_causal_softmax_forward(u.scores, scale, u.probs);
  u.out = Tensor::empty(q.shape(), DType::F64);
  ops::gemm_batched(u.probs, false, v, false, u.out);
  return u;
}

/// log sum_{j<=i} exp(scale s_ij), with the max subtracted in long double.
Tensor reference_lse(const Tensor& scores, double scale) {
  const index_t B = scores.dim(0), S = scores.dim(1);
  Tensor lse = Tensor::empty({B, S}, DType::F64);
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < S; ++i) {
      const double* row = scores.data<double>() + (b * S + i) * S;
      long double m = -INFINITY, sum = 0;
      for (index_t j = 0; j <= i; ++j) m = std::max<long double>(m, scale * row[j]);
      for (index_t j = 0; j <= i; ++j) sum += std::exp((long double)(scale * row[j]) - m);
      lse.data<double>()[b * S + i] = double(m + std::log(sum));
    }
  return lse;
}

struct Shape3 {
  index_t B, S, D;
};
const Shape3 kShapes[] = {{1, 1, 4}, {3, 17, 8}, {2, 64, 16}, {1, 100, 64}};

TEST(FusedAttentionHost, ForwardEqualsUnfusedComposition) {
  for (const Shape3& s : kShapes) {
    const double scale = 1.0 / std::sqrt(double(s.D));
    const Tensor q = random_tensor({s.B, s.S, s.D}, 1, -2, 2),
                 k = random_tensor(q.shape(), 2, -2, 2), v = random_tensor(q.shape(), 3);
    Tensor out = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({s.B, s.S}, DType::F64);
    ops::fused_attention_forward(q, k, v, scale, out, lse);
    const Unfused u = unfused_forward(q, k, v, scale);
    EXPECT_LE(max_rel(out, u.out), 1e-12) << "B=" << s.B << " S=" << s.S << " D=" << s.D;
    EXPECT_LE(max_rel(lse, reference_lse(u.scores, scale)), 1e-12) << "S=" << s.S;
  }
}

TEST(FusedAttentionHost, BackwardEqualsUnfusedBackward) {
  for (const Shape3& s : kShapes) {
    const double scale = 1.0 / std::sqrt(double(s.D));
    const Tensor q = random_tensor({s.B, s.S, s.D}, 4, -2, 2),
                 k = random_tensor(q.shape(), 5, -2, 2), v = random_tensor(q.shape(), 6),
                 dout = random_tensor(q.shape(), 7);
    Tensor out = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({s.B, s.S}, DType::F64);
    ops::fused_attention_forward(q, k, v, scale, out, lse);
    Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = dq.clone(), dv = dq.clone();
    ops::fused_attention_backward(dout, q, k, v, out, lse, scale, dq, dk, dv);

    const Unfused u = unfused_forward(q, k, v, scale);
    Tensor dprobs = Tensor::empty(u.probs.shape(), DType::F64), dscores = dprobs.clone();
    Tensor rq = Tensor::empty(q.shape(), DType::F64), rk = rq.clone(), rv = rq.clone();
    ops::gemm_batched(dout, false, v, true, dprobs);
    ops::gemm_batched(u.probs, true, dout, false, rv);
    ops::scaled_causal_softmax_backward(dprobs, u.probs, scale, dscores);
    ops::gemm_batched(dscores, false, k, false, rq);
    ops::gemm_batched(dscores, true, q, false, rk);
    EXPECT_LE(max_rel(dq, rq), 1e-12) << "dq, S=" << s.S << " D=" << s.D;
    EXPECT_LE(max_rel(dk, rk), 1e-12) << "dk, S=" << s.S << " D=" << s.D;
    EXPECT_LE(max_rel(dv, rv), 1e-12) << "dv, S=" << s.S << " D=" << s.D;
  }
}

TEST(FusedAttentionHost, BackwardMatchesFiniteDifferences) {
  const index_t B = 2, S = 5, D = 4;
  const double scale = 0.7, h = 1e-6;
  Tensor q = random_tensor({B, S, D}, 8, -2, 2), k = random_tensor(q.shape(), 9, -2, 2),
         v = random_tensor(q.shape(), 10), w = random_tensor(q.shape(), 11);
  Tensor out = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({B, S}, DType::F64);
  auto objective = [&] {
    ops::fused_attention_forward(q, k, v, scale, out, lse);
    double sum = 0;
    for (index_t i = 0; i < out.numel(); ++i) sum += w.data<double>()[i] * out.data<double>()[i];
    return sum;
  };
  objective();
  Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = dq.clone(), dv = dq.clone();
  ops::fused_attention_backward(w, q, k, v, out, lse, scale, dq, dk, dv);
  const std::pair<Tensor*, const Tensor*> checks[] = {{&q, &dq}, {&k, &dk}, {&v, &dv}};
  for (const auto& [x, dx] : checks) {
    double err = 0, largest = 0;
    for (index_t i = 0; i < x->numel(); ++i) {
      double& xi = x->data<double>()[i];
      const double keep = xi;
      xi = keep + h;
      const double plus = objective();
      xi = keep - h;
      const double minus = objective();
      xi = keep;
      const double numeric = (plus - minus) / (2 * h);
      err = std::max(err, std::fabs(numeric - dx->data<double>()[i]));
      largest = std::max(largest, std::fabs(numeric));
    }
    EXPECT_GT(largest, 1e-3);  // the gradient is not trivially zero
    EXPECT_LE(err / largest, 1e-7);
  }
}

TEST(FusedAttentionHost, DropoutEqualsUnfusedCompositionWithTheSameMask) {
  const index_t batch = 2, heads = 3, S = 19, D = 8, B = batch * heads;
  const double scale = 1.0 / std::sqrt(double(D)), p = 0.3;
  const ops::AttentionDropout dropout{p, testing::attention_probs_site(batch, heads, S)};
  const Tensor q = random_tensor({B, S, D}, 21, -2, 2), k = random_tensor(q.shape(), 22, -2, 2),
               v = random_tensor(q.shape(), 23), dout = random_tensor(q.shape(), 24);
  Tensor out = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({B, S}, DType::F64);
  ops::fused_attention_forward(q, k, v, scale, out, lse, dropout);
  Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = dq.clone(), dv = dq.clone();
  ops::fused_attention_backward(dout, q, k, v, out, lse, scale, dq, dk, dv, dropout);

  // The unfused path: probabilities, dropout at the same site, then P V.
  const Unfused u = unfused_forward(q, k, v, scale);
  Tensor kept = Tensor::empty(u.probs.shape(), DType::F64);
  ops::dropout_forward(u.probs, p, dropout.site, kept);
  Tensor ref_out = Tensor::empty(q.shape(), DType::F64);
  ops::gemm_batched(kept, false, v, false, ref_out);
  EXPECT_LE(max_rel(out, ref_out), 1e-12);
  EXPECT_LE(max_rel(lse, reference_lse(u.scores, scale)), 1e-12);  // undropped
  EXPECT_GT(max_rel(out, u.out), 0.05);  // the mask dropped something

  Tensor dkept = Tensor::empty(u.probs.shape(), DType::F64), dprobs = dkept.clone(),
         dscores = dkept.clone();
  Tensor rq = Tensor::empty(q.shape(), DType::F64), rk = rq.clone(), rv = rq.clone();
  ops::gemm_batched(dout, false, v, true, dkept);
  ops::gemm_batched(kept, true, dout, false, rv);
  ops::dropout_backward(dkept, p, dropout.site, dprobs);
  ops::scaled_causal_softmax_backward(dprobs, u.probs, scale, dscores);
  ops::gemm_batched(dscores, false, k, false, rq);
  ops::gemm_batched(dscores, true, q, false, rk);
  EXPECT_LE(max_rel(dq, rq), 1e-12);
  EXPECT_LE(max_rel(dk, rk), 1e-12);
  EXPECT_LE(max_rel(dv, rv), 1e-12);
}

/// Rows [entry S, entry S + S) of x [B, S, D] for each listed batch entry.
Tensor gather_entries(const Tensor& x, const std::vector<index_t>& entries) {
  const index_t S = x.dim(1), D = x.dim(2);
  Tensor out = Tensor::empty({index_t(entries.size()), S, D}, DType::F64);
  for (std::size_t e = 0; e < entries.size(); ++e)
    std::copy_n(x.data<double>() + entries[e] * S * D, S * D, out.data<double>() + e * S * D);
  return out;
}

TEST(FusedAttentionHost, DropoutOnAShardEqualsTheSameRowsOfTheWholeCall) {
  // 3 samples x 4 heads; the shard: sample 2, heads 2..3 (as tp 2 rank 1 of
  // a dp rank holding the third sample).
  const index_t batch = 3, heads = 4, S = 11, D = 4, B = batch * heads;
  const double scale = 0.5, p = 0.25;
  const Tensor q = random_tensor({B, S, D}, 31, -2, 2), k = random_tensor(q.shape(), 32, -2, 2),
               v = random_tensor(q.shape(), 33), dout = random_tensor(q.shape(), 34);
  const ops::AttentionDropout whole{p, testing::attention_probs_site(batch, heads, S)};
  Tensor out = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({B, S}, DType::F64);
  ops::fused_attention_forward(q, k, v, scale, out, lse, whole);
  Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = dq.clone(), dv = dq.clone();
  ops::fused_attention_backward(dout, q, k, v, out, lse, scale, dq, dk, dv, whole);

  const std::vector<index_t> entries = {2 * heads + 2, 2 * heads + 3};
  const ops::AttentionDropout shard{
      p, testing::attention_probs_site(1, 2, S, /*sample_offset=*/2, /*head_offset=*/2,
                                       /*heads_global=*/heads)};
  const Tensor sq = gather_entries(q, entries), sk = gather_entries(k, entries),
               sv = gather_entries(v, entries), sdout = gather_entries(dout, entries);
  Tensor sout = Tensor::empty(sq.shape(), DType::F64), slse = Tensor::empty({2, S}, DType::F64);
  ops::fused_attention_forward(sq, sk, sv, scale, sout, slse, shard);
  Tensor sdq = Tensor::empty(sq.shape(), DType::F64), sdk = sdq.clone(), sdv = sdq.clone();
  ops::fused_attention_backward(sdout, sq, sk, sv, sout, slse, scale, sdq, sdk, sdv, shard);
  const std::pair<const Tensor*, const Tensor*> pairs[] = {
      {&sout, &out}, {&sdq, &dq}, {&sdk, &dk}, {&sdv, &dv}};
  for (const auto& [part, full] : pairs)
    EXPECT_EQ(max_rel(*part, gather_entries(*full, entries)), 0.0);
  // A wrong offset is a different mask.
  const ops::AttentionDropout misplaced{p,
                                        testing::attention_probs_site(1, 2, S, 2, 0, heads)};
  ops::fused_attention_forward(sq, sk, sv, scale, sout, slse, misplaced);
  EXPECT_GT(max_rel(sout, gather_entries(out, entries)), 0.01);
}

// ------------------------------------------- ALiBi and key-padding mask ---

/// The unfused composition the fused op must equal: scores, the softmax of
/// the scores' kind (causal with the slopes, or masked), dropout at the
/// site, P V; and its backward.
struct MaskedReference {
  Tensor probs, out, lse, dq, dk, dv;
};

MaskedReference masked_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& dout, double scale,
                                 const ops::FusedAttentionScores& sc,
                                 const ops::AttentionDropout& dropout) {
  const index_t B = q.dim(0), S = q.dim(1);
  MaskedReference r;
  Tensor scores = Tensor::empty({B, S, S}, DType::F64);
  ops::gemm_batched(q, false, k, true, scores);
  r.probs = Tensor::empty(scores.shape(), DType::F64);
  const bool masked = sc.key_mask.defined();
  if (masked)
    ops::scaled_masked_softmax_forward(scores, sc.key_mask, scale, r.probs);
  else
    ops::scaled_causal_softmax_forward(scores, scale, r.probs, sc.alibi_slopes);
  Tensor kept = r.probs;
  if (dropout.p > 0) {
    kept = Tensor::empty(r.probs.shape(), DType::F64);
    ops::dropout_forward(r.probs, dropout.p, dropout.site, kept);
  }
  r.out = Tensor::empty(q.shape(), DType::F64);
  ops::gemm_batched(kept, false, v, false, r.out);

  // lse over the visible keys, in long double; +inf where none is visible.
  r.lse = Tensor::empty({B, S}, DType::F64);
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < S; ++i) {
      const double* row = scores.data<double>() + (b * S + i) * S;
      std::vector<long double> x;
      for (index_t j = 0; j < S; ++j) {
        if (masked) {
          const index_t sample = b / (B / sc.key_mask.dim(0));
          if (sc.key_mask.data<std::int32_t>()[sample * S + j] != 0)
            x.push_back((long double)(scale * row[j]));
        } else if (j <= i) {
          const index_t heads = sc.alibi_slopes.defined() ? sc.alibi_slopes.numel() : 1;
          const double slope =
              sc.alibi_slopes.defined() ? sc.alibi_slopes.data<float>()[b % heads] : 0.0;
          x.push_back((long double)(scale * row[j] + slope * double(j - i)));
        }
      }
      long double m = -INFINITY, sum = 0;
      for (long double xi : x) m = std::max(m, xi);
      for (long double xi : x) sum += std::exp(xi - m);
      r.lse.data<double>()[b * S + i] = x.empty() ? INFINITY : double(m + std::log(sum));
    }

  Tensor dkept = Tensor::empty(r.probs.shape(), DType::F64), dprobs = dkept,
         dscores = Tensor::empty(r.probs.shape(), DType::F64);
  r.dq = Tensor::empty(q.shape(), DType::F64), r.dk = r.dq.clone(), r.dv = r.dq.clone();
  ops::gemm_batched(dout, false, v, true, dkept);
  ops::gemm_batched(kept, true, dout, false, r.dv);
  if (dropout.p > 0) {
    dprobs = Tensor::empty(r.probs.shape(), DType::F64);
    ops::dropout_backward(dkept, dropout.p, dropout.site, dprobs);
  }
  if (masked)
    ops::scaled_masked_softmax_backward(dprobs, r.probs, scale, dscores);
  else
    ops::scaled_causal_softmax_backward(dprobs, r.probs, scale, dscores);
  ops::gemm_batched(dscores, false, k, false, r.dq);
  ops::gemm_batched(dscores, true, q, false, r.dk);
  return r;
}

/// max |a - b| / max |b| over the finite entries of b; 1 where one of a
/// pair is infinite and the other is not (or they differ in sign).
double max_rel_lse(const Tensor& a, const Tensor& b) {
  double err = 0, scale = 0;
  for (index_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<double>()[i], y = b.data<double>()[i];
    if (std::isinf(y) || std::isinf(x)) {
      if (x != y) return 1.0;
      continue;
    }
    err = std::max(err, std::fabs(x - y));
    scale = std::max(scale, std::fabs(y));
  }
  return err / std::max(scale, 1e-300);
}

/// The fused op (head-major and token-major) against masked_reference, to 1e-12.
void expect_fused_equals_unfused(index_t batch, index_t heads, index_t S, index_t D,
                                 const ops::FusedAttentionScores& sc, double p) {
  const index_t B = batch * heads;
  const double scale = 1.0 / std::sqrt(double(D));
  const Tensor q = random_tensor({B, S, D}, 41, -2, 2), k = random_tensor(q.shape(), 42, -2, 2),
               v = random_tensor(q.shape(), 43), dout = random_tensor(q.shape(), 44);
  ops::AttentionDropout dropout;
  if (p > 0) dropout = {p, testing::attention_probs_site(batch, heads, S)};
  Tensor out = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({B, S}, DType::F64);
  ops::fused_attention_forward(q, k, v, scale, out, lse, dropout, sc);
  Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = dq.clone(), dv = dq.clone();
  ops::fused_attention_backward(dout, q, k, v, out, lse, scale, dq, dk, dv, dropout, sc);

  const MaskedReference r = masked_reference(q, k, v, dout, scale, sc, dropout);
  EXPECT_LE(max_rel(out, r.out), 1e-12) << "out, S=" << S << " p=" << p;
  EXPECT_LE(max_rel_lse(lse, r.lse), 1e-12) << "lse, S=" << S;
  EXPECT_LE(max_rel(dq, r.dq), 1e-12) << "dq, S=" << S << " p=" << p;
  EXPECT_LE(max_rel(dk, r.dk), 1e-12) << "dk, S=" << S << " p=" << p;
  EXPECT_LE(max_rel(dv, r.dv), 1e-12) << "dv, S=" << S << " p=" << p;

  // The same call in the token-major layout (the model's).
  Tensor qkv;
  const Tensor parts[3] = {q, k, v};
  ops::merge_heads(parts, 3, S, batch, heads, qkv);
  Tensor dcontext;
  ops::merge_heads(&dout, 1, S, batch, heads, dcontext);
  Tensor context = Tensor::empty({S * batch, heads * D}, DType::F64),
         tlse = Tensor::empty({B, S}, DType::F64), dqkv = Tensor::empty(qkv.shape(), DType::F64);
  ops::fused_attention_forward_token_major(qkv, S, batch, heads, scale, context, tlse, dropout,
                                           sc);
  ops::fused_attention_backward_token_major(dcontext, qkv, context, tlse, S, batch, heads, scale,
                                            dqkv, dropout, sc);
  Tensor ref_context, ref_dqkv;
  ops::merge_heads(&r.out, 1, S, batch, heads, ref_context);
  const Tensor dparts[3] = {r.dq, r.dk, r.dv};
  ops::merge_heads(dparts, 3, S, batch, heads, ref_dqkv);
  EXPECT_LE(max_rel(context, ref_context), 1e-12) << "token-major context, p=" << p;
  EXPECT_LE(max_rel(dqkv, ref_dqkv), 1e-12) << "token-major dqkv, p=" << p;
}

Tensor alibi_slopes_tensor(index_t heads) {
  Tensor t = Tensor::empty({heads}, DType::F32);
  const std::vector<double> slopes = ops::alibi_slopes(heads);
  for (index_t h = 0; h < heads; ++h) t.data<float>()[h] = float(slopes[std::size_t(h)]);
  return t;
}

/// [batch, S] flags: sample 0 all real, sample 1 its first S/2 keys, sample
/// 2 every third key, sample 3 (if any) none.
Tensor padding_mask(index_t batch, index_t S) {
  Tensor m = Tensor::zeros({batch, S}, DType::I32);
  std::int32_t* f = m.data<std::int32_t>();
  for (index_t j = 0; j < S; ++j) {
    f[j] = 1;
    if (batch > 1) f[S + j] = j < S / 2;
    if (batch > 2) f[2 * S + j] = j % 3 == 1;
  }
  return m;
}

TEST(FusedAttentionHost, AlibiEqualsUnfusedComposition) {
  // 6 heads: slopes of a power of two (4) and the interleaved rest.
  for (const Shape3& s : {Shape3{1, 1, 4}, Shape3{2, 19, 8}, Shape3{1, 70, 16}}) {
    ops::FusedAttentionScores sc;
    sc.alibi_slopes = alibi_slopes_tensor(6);
    expect_fused_equals_unfused(s.B, 6, s.S, s.D, sc, 0.0);
  }
  // The bias changed the result: not the plain causal attention.
  const index_t B = 6, S = 19, D = 8;
  const Tensor q = random_tensor({B, S, D}, 41, -2, 2), k = random_tensor(q.shape(), 42, -2, 2),
               v = random_tensor(q.shape(), 43);
  ops::FusedAttentionScores sc;
  sc.alibi_slopes = alibi_slopes_tensor(6);
  Tensor out = Tensor::empty(q.shape(), DType::F64), plain = out.clone(),
         lse = Tensor::empty({B, S}, DType::F64);
  ops::fused_attention_forward(q, k, v, 0.35, out, lse, {}, sc);
  ops::fused_attention_forward(q, k, v, 0.35, plain, lse);
  EXPECT_GT(max_rel(out, plain), 1e-3);
}

TEST(FusedAttentionHost, AlibiWithDropoutEqualsUnfusedComposition) {
  ops::FusedAttentionScores sc;
  sc.alibi_slopes = alibi_slopes_tensor(3);
  expect_fused_equals_unfused(2, 3, 19, 8, sc, 0.3);
}

TEST(FusedAttentionHost, KeyPaddingMaskEqualsUnfusedComposition) {
  for (const Shape3& s : {Shape3{1, 1, 4}, Shape3{4, 13, 8}, Shape3{3, 64, 16}}) {
    ops::FusedAttentionScores sc;
    sc.key_mask = padding_mask(s.B, s.S);
    expect_fused_equals_unfused(s.B, 2, s.S, s.D, sc, 0.0);
  }
  // The fourth sample has no real key: its rows are 0, lse +inf, no gradient.
  const index_t batch = 4, heads = 2, S = 13, D = 8, B = batch * heads;
  ops::FusedAttentionScores sc;
  sc.key_mask = padding_mask(batch, S);
  const Tensor q = random_tensor({B, S, D}, 51, -2, 2), k = random_tensor(q.shape(), 52, -2, 2),
               v = random_tensor(q.shape(), 53), dout = random_tensor(q.shape(), 54);
  Tensor out = Tensor::empty(q.shape(), DType::F64), lse = Tensor::empty({B, S}, DType::F64);
  ops::fused_attention_forward(q, k, v, 0.35, out, lse, {}, sc);
  Tensor dq = Tensor::empty(q.shape(), DType::F64), dk = dq.clone(), dv = dq.clone();
  ops::fused_attention_backward(dout, q, k, v, out, lse, 0.35, dq, dk, dv, {}, sc);
  for (index_t e = 3 * heads; e < B; ++e) {
    for (index_t i = 0; i < S * D; ++i) {
      EXPECT_EQ(out.data<double>()[e * S * D + i], 0.0);
      EXPECT_EQ(dq.data<double>()[e * S * D + i], 0.0);
      EXPECT_EQ(dk.data<double>()[e * S * D + i], 0.0);
      EXPECT_EQ(dv.data<double>()[e * S * D + i], 0.0);
    }
    for (index_t i = 0; i < S; ++i) EXPECT_EQ(lse.data<double>()[e * S + i], INFINITY);
  }
}

TEST(FusedAttentionHost, KeyPaddingMaskWithDropoutEqualsUnfusedComposition) {
  ops::FusedAttentionScores sc;
  sc.key_mask = padding_mask(4, 17);
  expect_fused_equals_unfused(4, 3, 17, 8, sc, 0.25);
}

TEST(FusedAttentionHost, SupportedRules) {
  using ops::fused_attention_supported;
  EXPECT_TRUE(fused_attention_supported(DType::F64, MemorySpace::Host, 4));
  EXPECT_TRUE(fused_attention_supported(DType::F32, MemorySpace::Host, 64));
  EXPECT_FALSE(fused_attention_supported(DType::BF16, MemorySpace::Host, 64));
  EXPECT_FALSE(fused_attention_supported(DType::F32, MemorySpace::Cuda, 64));
  EXPECT_FALSE(fused_attention_supported(DType::BF16, MemorySpace::Cuda, 96));
#ifdef MESHTRON_HAVE_CUDA
  EXPECT_TRUE(fused_attention_supported(DType::BF16, MemorySpace::Cuda, 64));
  EXPECT_TRUE(fused_attention_supported(DType::F16, MemorySpace::Cuda, 128));
#else
  EXPECT_FALSE(fused_attention_supported(DType::BF16, MemorySpace::Cuda, 64));
#endif
}

TEST(FusedAttentionHost, DeckRejectsUnknownBackend) {
  testing::Layout layout;
  layout.overrides = {"model.attention_backend=flash"};
  EXPECT_THROW(testing::tiny_config(layout, 1), UserError);
}

testing::RunResult train_with(const std::string& backend, double attention_dropout) {
  testing::Layout layout;
  layout.overrides = {"model.attention_backend=" + backend,
                      "model.attention_dropout=" + std::to_string(attention_dropout)};
  return testing::train_layout(MPI_COMM_SELF, layout, DType::F64, 3);
}

/// Losses and parameters of the fused run equal the unfused run's to 1e-10.
void expect_same_training(const testing::RunResult& fused, const testing::RunResult& unfused) {
  ASSERT_EQ(fused.losses.size(), unfused.losses.size());
  for (std::size_t i = 0; i < fused.losses.size(); ++i)
    EXPECT_NEAR(fused.losses[i], unfused.losses[i], 1e-10 * unfused.losses[i]) << "step " << i + 1;
  for (const auto& [name, values] : unfused.params)
    EXPECT_LE(testing::norm_rel_error(fused.params.at(name), values), 1e-10) << name;
}

TEST(FusedAttentionHost, TinyGptFusedBackendEqualsUnfused) {
  const testing::RunResult unfused = train_with("unfused", 0.0);
  expect_same_training(train_with("fused", 0.0), unfused);
  // auto on the host is the unfused path: bitwise the same run.
  EXPECT_EQ(train_with("auto", 0.0).losses, unfused.losses);
}

TEST(FusedAttentionHost, TinyGptFusedBackendWithAttentionDropoutEqualsUnfused) {
  const testing::RunResult unfused = train_with("unfused", 0.1);
  expect_same_training(train_with("fused", 0.1), unfused);
  // and the dropout was on: not the run without it
  const testing::RunResult plain = train_with("unfused", 0.0);
  EXPECT_GT(std::fabs(plain.losses.back() - unfused.losses.back()), 1e-8);
}


testing::RunResult train_family(const std::vector<std::string>& family, const std::string& backend,
                                double attention_dropout) {
  testing::Layout layout;
  layout.overrides = family;
  layout.overrides.push_back("model.attention_backend=" + backend);
  layout.overrides.push_back("model.attention_dropout=" + std::to_string(attention_dropout));
  return testing::train_layout(MPI_COMM_SELF, layout, DType::F64, 3);
}

const std::vector<std::string> kBloom = {"model.arch=bloom", "model.position_embedding_type=alibi",
                                         "model.embedding_norm=true"};
const std::vector<std::string> kBert = {"model.arch=bert"};

TEST(FusedAttentionHost, TinyBloomFusedBackendEqualsUnfused) {
  for (double p : {0.0, 0.1}) {
    const testing::RunResult unfused = train_family(kBloom, "unfused", p);
    expect_same_training(train_family(kBloom, "fused", p), unfused);
    // auto on the host is the unfused path: bitwise the same run.
    EXPECT_EQ(train_family(kBloom, "auto", p).losses, unfused.losses);
  }
  // ALiBi was on: not the run with learned positions.
  const testing::RunResult learned = train_with("unfused", 0.0);
  EXPECT_GT(std::fabs(learned.losses.back() - train_family(kBloom, "unfused", 0.0).losses.back()),
            1e-8);
}

TEST(FusedAttentionHost, TinyBertFusedBackendEqualsUnfused) {
  for (double p : {0.0, 0.1}) {
    const testing::RunResult unfused = train_family(kBert, "unfused", p);
    expect_same_training(train_family(kBert, "fused", p), unfused);
  }
}

// ------------------------------------------------ the CUDA mask numbering ---

TEST(AttentionMaskLayout, EveryVisibleWordOnceInRowOrder) {
  for (std::int64_t S : {1, 8, 31, 32, 33, 40, 300, 1000, 1024, 2048, 8200}) {
    const std::int64_t n = ops::attention_mask_words_drawn(S);
    std::int64_t expected_n = 0;
    for (std::int64_t i = 0; i < S; ++i) expected_n += i / 32 + 1;
    ASSERT_EQ(n, expected_n) << "S " << S;
    // Word r is the r-th of (row, word) in row-major order over the
    // visible words: the walk below visits them in that order.
    std::uint32_t row = 0, word = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      const ops::MaskWord at = ops::attention_mask_word(std::uint32_t(r));
      ASSERT_EQ(at.row, row) << "S " << S << " r " << r;
      ASSERT_EQ(at.word, word) << "S " << S << " r " << r;
      if (++word > row / 32) word = 0, ++row;
    }
    EXPECT_EQ(row, std::uint32_t(S)) << "S " << S;
  }
}

TEST(AttentionMaskLayout, BlockSearchIsExactUpToTheLargestCount) {
  // Block b starts at word 16 b (b + 1); around every start up to the
  // largest r the kernel takes (< 2^31), where the float root is coarsest.
  for (std::uint64_t b = 1; 16 * b * (b + 1) < std::uint64_t(ops::kMaxMaskWordsDrawn);
       b += 1 + b / 64) {
    const std::uint64_t start = 16 * b * (b + 1);
    for (std::uint64_t r : {start - 1, start, start + 1, start + b}) {
      if (r >= std::uint64_t(ops::kMaxMaskWordsDrawn)) continue;
      const std::uint64_t block = r < start ? b - 1 : b;
      const std::uint64_t first = 16 * block * (block + 1);
      const ops::MaskWord at = ops::attention_mask_word(std::uint32_t(r));
      ASSERT_EQ(at.row, block * 32 + (r - first) / (block + 1)) << "r " << r;
      ASSERT_EQ(at.word, (r - first) % (block + 1)) << "r " << r;
    }
  }
}

}  // namespace
}  // namespace meshtron
