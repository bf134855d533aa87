// The attention ops (ops.hpp: Softmax, Attention softmax, Fused attention):
// the causal and masked softmax, the general one (bias, key mask, causal
// with Sq != Sk), the fused attention (causal with optional ALiBi, or over a
// key mask) in the head-major and token-major layouts, and its dropout.
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "kernels/kokkos/attention.hpp"
#include "kernels/kokkos/softmax.hpp"
#include "ops/head_layout.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

// --------------------------------------------------------------- Softmax ---

namespace {
/// scores [..., S, S]: returns the number of S x S matrices.
index_t softmax_batch(const char* op, const Arg& scores) {
  const Tensor& s = scores.t;
  MESH_VERIFY(s.rank() >= 2 && s.dim(-1) == s.dim(-2) && s.dim(-1) > 0,
              op << ": " << describe(scores) << " must be [B, S, S] with S > 0");
  return s.numel() / (s.dim(-1) * s.dim(-1));
}
}  // namespace

void scaled_causal_softmax_forward(const Tensor& scores, double scale, Tensor& probs,
                                   const Tensor& alibi_slopes) {
  const char* op = "scaled_causal_softmax_forward";
  const Arg as{"scores", scores}, ap{"probs", probs};
  const bool device = require_float_args(op, {as, ap});
  const index_t B = softmax_batch(op, as), S = scores.dim(-1);
  MESH_VERIFY(probs.shape() == scores.shape(),
              op << ": " << describe(ap) << " must match " << describe(as));
  const bool alibi = alibi_slopes.defined();
  const index_t heads = alibi ? alibi_slopes.numel() : 1;
  MESH_VERIFY(!alibi || (alibi_slopes.dtype() == DType::F32 && alibi_slopes.rank() == 1 &&
                         heads > 0 && B % heads == 0 && alibi_slopes.space() == scores.space()),
              op << ": alibi_slopes " << describe({"alibi_slopes", alibi_slopes})
                 << " must be fp32 [heads] beside the scores, heads dividing " << B);
  const float* slopes = alibi ? alibi_slopes.data<float>() : nullptr;
  if (device) {
    ON_CUDA(cuda::scaled_causal_softmax_forward(scores.dtype(), scores.raw(), B, S, scale,
                                               probs.raw(), slopes, heads));
    return;
  }
  with_float_type(scores.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scaled_causal_softmax_forward<Host>(scores.data<T>(), B, S, scale, probs.data<T>(),
                                                 slopes, heads);
  });
}

std::vector<double> alibi_slopes(index_t heads) {
  MESH_VERIFY(heads > 0, "alibi_slopes: heads = " << heads << " must be positive");
  index_t n = 1;  // the largest power of two <= heads
  while (2 * n <= heads) n *= 2;
  std::vector<double> slopes;
  for (index_t k = 1; k <= n; ++k) slopes.push_back(std::exp2(-8.0 * double(k) / double(n)));
  for (index_t k = 1; index_t(slopes.size()) < heads; k += 2)
    slopes.push_back(std::exp2(-4.0 * double(k) / double(n)));
  return slopes;
}

void scaled_causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale,
                                    Tensor& dscores) {
  const char* op = "scaled_causal_softmax_backward";
  const Arg adp{"dprobs", dprobs}, ap{"probs", probs}, ads{"dscores", dscores};
  const bool device = require_float_args(op, {ap, adp, ads});
  const index_t B = softmax_batch(op, ap), S = probs.dim(-1);
  MESH_VERIFY(
      dprobs.shape() == probs.shape() && dscores.shape() == probs.shape(),
      op << ": " << describe(adp) << " and " << describe(ads) << " must match " << describe(ap));
  if (device) {
    ON_CUDA(cuda::scaled_causal_softmax_backward(probs.dtype(), dprobs.raw(), probs.raw(), B, S,
                                                scale, dscores.raw()));
    return;
  }
  with_float_type(probs.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scaled_causal_softmax_backward<Host>(dprobs.data<T>(), probs.data<T>(), B, S, scale,
                                                  dscores.data<T>());
  });
}

void scaled_masked_softmax_forward(const Tensor& scores, const Tensor& key_mask, double scale,
                                   Tensor& probs) {
  const char* op = "scaled_masked_softmax_forward";
  const Arg as{"scores", scores}, ap{"probs", probs}, am{"key_mask", key_mask};
  const bool device = require_float_args(op, {as, ap});
  const index_t B = softmax_batch(op, as), S = scores.dim(-1);
  MESH_VERIFY(probs.shape() == scores.shape(),
              op << ": " << describe(ap) << " must match " << describe(as));
  require_index_arg(op, am);
  const index_t batch = key_mask.rank() == 2 ? key_mask.dim(0) : 0;
  MESH_VERIFY(batch > 0 && key_mask.dim(1) == S && B % batch == 0 &&
                  key_mask.space() == scores.space(),
              op << ": " << describe(am) << " must be [batch, " << S
                 << "] beside the scores, batch dividing " << B);
  const index_t heads = B / batch;
  if (device) {
    ON_CUDA(cuda::scaled_masked_softmax_forward(scores.dtype(), scores.raw(),
                                               key_mask.data<std::int32_t>(), B, heads, S, scale,
                                               probs.raw()));
    return;
  }
  with_float_type(scores.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scaled_masked_softmax_forward<Host>(scores.data<T>(), key_mask.data<std::int32_t>(),
                                                 B, heads, S, scale, probs.data<T>());
  });
}

void scaled_masked_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale,
                                    Tensor& dscores) {
  const char* op = "scaled_masked_softmax_backward";
  const Arg adp{"dprobs", dprobs}, ap{"probs", probs}, ads{"dscores", dscores};
  const bool device = require_float_args(op, {ap, adp, ads});
  const index_t B = softmax_batch(op, ap), S = probs.dim(-1);
  MESH_VERIFY(
      dprobs.shape() == probs.shape() && dscores.shape() == probs.shape(),
      op << ": " << describe(adp) << " and " << describe(ads) << " must match " << describe(ap));
  if (device) {
    ON_CUDA(cuda::scaled_masked_softmax_backward(probs.dtype(), dprobs.raw(), probs.raw(), B, S,
                                                scale, dscores.raw()));
    return;
  }
  with_float_type(probs.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scaled_masked_softmax_backward<Host>(dprobs.data<T>(), probs.data<T>(), B, S, scale,
                                                  dscores.data<T>());
  });
}

// ----------------------------------------------------- Attention softmax ---

namespace {
/// scores [B, Sq, Sk] (rank 3): returns B.
index_t attention_batch(const char* op, const Arg& scores) {
  const Tensor& s = scores.t;
  MESH_VERIFY(s.rank() == 3 && s.dim(1) > 0 && s.dim(2) > 0,
              op << ": " << describe(scores) << " must be [B, Sq, Sk] with Sq, Sk > 0");
  return s.dim(0);
}

/// The masks of attention_softmax_forward against scores [B, Sq, Sk]: a
/// bias [heads, Sq, Sk] fp32 (or the scores' fp64 on the host), a key mask
/// int32 [B / heads, Sk], both beside the scores.
void check_softmax_masks(const char* op, const Arg& scores, const SoftmaxMasks& masks,
                         bool device) {
  const Tensor& s = scores.t;
  const index_t B = s.dim(0), Sq = s.dim(1), Sk = s.dim(2), heads = masks.heads;
  MESH_VERIFY(heads > 0 && B % heads == 0,
              op << ": heads = " << heads << " must divide " << describe(scores));
  if (masks.bias.defined()) {
    const Arg ab{"masks.bias", masks.bias};
    const DType t = masks.bias.dtype();
    MESH_VERIFY(t == DType::F32 || (!device && t == DType::F64 && s.dtype() == DType::F64),
                op << ": " << describe(ab) << " must be fp32"
                   << (device ? "" : " (or fp64 under fp64 scores)"));
    MESH_VERIFY(masks.bias.shape() == Shape({heads, Sq, Sk}) && masks.bias.space() == s.space(),
                op << ": " << describe(ab) << " must be [" << heads << ", " << Sq << ", " << Sk
                   << "] beside " << describe(scores));
  }
  if (masks.key_mask.defined()) {
    const Arg am{"masks.key_mask", masks.key_mask};
    require_index_arg(op, am);
    MESH_VERIFY(masks.key_mask.shape() == Shape({B / heads, Sk}) &&
                    masks.key_mask.space() == s.space(),
                op << ": " << describe(am) << " must be [" << B / heads << ", " << Sk
                   << "] beside " << describe(scores));
  }
}
}  // namespace

void attention_softmax_forward(const Tensor& scores, double scale, const SoftmaxMasks& masks,
                               Tensor& probs) {
  const char* op = "attention_softmax_forward";
  const Arg as{"scores", scores}, ap{"probs", probs};
  const bool device = require_float_args(op, {as, ap});
  const index_t B = attention_batch(op, as), Sq = scores.dim(1), Sk = scores.dim(2);
  MESH_VERIFY(probs.shape() == scores.shape(),
              op << ": " << describe(ap) << " must match " << describe(as));
  check_softmax_masks(op, as, masks, device);
  const std::int32_t* key_mask =
      masks.key_mask.defined() ? masks.key_mask.data<std::int32_t>() : nullptr;
  const bool bias = masks.bias.defined();
  if (device) {
    ON_CUDA(cuda::attention_softmax_forward(scores.dtype(), scores.raw(), B, Sq, Sk, scale,
                                            masks.heads, bias ? masks.bias.data<float>() : nullptr,
                                            key_mask, masks.causal, probs.raw()));
    return;
  }
  with_float_type(scores.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto run = [&](const auto* bias_data) {
      kernels::attention_softmax_forward<Host>(scores.data<T>(), B, Sq, Sk, scale, masks.heads,
                                               bias_data, key_mask, masks.causal,
                                               probs.data<T>());
    };
    if (bias && masks.bias.dtype() == DType::F64)
      run(masks.bias.data<double>());
    else
      run(bias ? masks.bias.data<float>() : static_cast<const float*>(nullptr));
  });
}

void attention_softmax_backward(const Tensor& dprobs, const Tensor& probs, Tensor& dlogits) {
  const char* op = "attention_softmax_backward";
  const Arg adp{"dprobs", dprobs}, ap{"probs", probs}, adl{"dlogits", dlogits};
  const bool device = require_float_args(op, {ap, adp, adl});
  const index_t B = attention_batch(op, ap), Sq = probs.dim(1), Sk = probs.dim(2);
  MESH_VERIFY(
      dprobs.shape() == probs.shape() && dlogits.shape() == probs.shape(),
      op << ": " << describe(adp) << " and " << describe(adl) << " must match " << describe(ap));
  if (device) {
    ON_CUDA(cuda::attention_softmax_backward(probs.dtype(), dprobs.raw(), probs.raw(), B * Sq, Sk,
                                             dlogits.raw()));
    return;
  }
  with_float_type(probs.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::attention_softmax_backward<Host>(dprobs.data<T>(), probs.data<T>(), B * Sq, Sk,
                                              dlogits.data<T>());
  });
}

void attention_bias_backward(const Tensor& dlogits, index_t heads, Tensor& dbias) {
  const char* op = "attention_bias_backward";
  const Arg al{"dlogits", dlogits}, ab{"dbias", dbias};
  const bool device = require_float_args(op, {al});
  on_device(op, {al, ab});
  const index_t B = attention_batch(op, al), Sq = dlogits.dim(1), Sk = dlogits.dim(2);
  MESH_VERIFY(heads > 0 && B % heads == 0,
              op << ": heads = " << heads << " must divide " << describe(al));
  const DType g = dbias.dtype();
  MESH_VERIFY(g == DType::F32 || (!device && g == DType::F64 && dlogits.dtype() == DType::F64),
              op << ": " << describe(ab) << " must be fp32"
                 << (device ? "" : " (or fp64 under fp64 dlogits)"));
  MESH_VERIFY(dbias.shape() == Shape({heads, Sq, Sk}),
              op << ": " << describe(ab) << " must be [" << heads << ", " << Sq << ", " << Sk
                 << "] for " << describe(al));
  if (device) {
    ON_CUDA(cuda::attention_bias_backward(dlogits.dtype(), dlogits.raw(), B, Sq * Sk, heads,
                                          dbias.data<float>()));
    return;
  }
  with_float_type(dlogits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const auto run = [&](auto* out) {
      kernels::attention_bias_backward<Host>(dlogits.data<T>(), B, Sq * Sk, heads, out);
    };
    if (g == DType::F64)
      run(dbias.data<double>());
    else
      run(dbias.data<float>());
  });
}

// ------------------------------------------------------- Fused attention ---

bool fused_attention_supported(DType dtype, MemorySpace space, index_t head_dim) {
  if (space == MemorySpace::Host) return dtype == DType::F32 || dtype == DType::F64;
#ifdef MESHTRON_HAVE_CUDA
  return (dtype == DType::BF16 || dtype == DType::F16) && (head_dim == 64 || head_dim == 128);
#else
  return false;
#endif
}

namespace {
/// q [B, S, D] with every `same` tensor of its shape and `lse` holding B*S
/// rows; the device kernel's dtypes and head dims. Returns whether on the device.
bool check_attention(const char* op, const Arg& q, std::initializer_list<Arg> same,
                     const Arg& lse) {
  MESH_VERIFY(q.t.rank() == 3 && q.t.dim(1) > 0 && q.t.dim(2) > 0,
              op << ": " << describe(q) << " must be [batch x heads, S, head_dim]");
  for (const Arg& a : same)
    MESH_VERIFY(a.t.shape() == q.t.shape(), op << ": " << describe(a) << " must match "
                                               << describe(q));
  const bool device = !q.t.is_host();
  require_stat_args(op, device, q, {lse});
  require_per_row(op, lse, q.t.dim(0) * q.t.dim(1), q);
  if (device)
    MESH_VERIFY(fused_attention_supported(q.t.dtype(), q.t.space(), q.t.dim(2)),
                op << ": the CUDA kernel takes bf16 or fp16 with head_dim 64 or 128, got "
                   << describe(q));
  return device;
}

/// The fused attention's dropout on the [B, S, S] probabilities (B = b x
/// heads): p in [0, 1) and, when p > 0, a site view [b, heads, S*S] that
/// covers them (the row of query i is C's i-th block of S).
void check_attention_dropout(const char* op, const AttentionDropout& d, index_t B, index_t S) {
  if (d.p == 0.0) return;
  MESH_VERIFY(d.p > 0.0 && d.p < 1.0, op << ": dropout p must be in [0, 1), got " << d.p);
  const DropoutSite& s = d.site;
  check_dropout_site(op, s, B * S * S, "the probabilities [B, S, S]");
  MESH_VERIFY(s.c == S * S && s.c_global == S * S && s.c_offset == 0,
              op << ": the dropout site's C = " << s.c << " (global " << s.c_global
                 << ", offset " << s.c_offset << ") must be the whole S*S = " << S * S);
}

/// The checked scores of B entries of S x S (FusedAttentionScores) as the
/// host kernels take them; the device launchers copy the same fields.
kernels::AttentionScores attention_scores(const char* op, const FusedAttentionScores& sc,
                                          const AttentionDropout& dropout, index_t B, index_t S,
                                          MemorySpace space) {
  kernels::AttentionScores out;
  const Tensor &slopes = sc.alibi_slopes, &mask = sc.key_mask;
  MESH_VERIFY(!(slopes.defined() && mask.defined()),
              op << ": ALiBi slopes and a key mask together are not built");
  if (slopes.defined()) {
    MESH_VERIFY(slopes.dtype() == DType::F32 && slopes.rank() == 1 && slopes.numel() > 0 &&
                    B % slopes.numel() == 0 && slopes.space() == space,
                op << ": " << describe({"alibi_slopes", slopes})
                   << " must be fp32 [heads] beside the activations, heads dividing " << B);
    out.alibi_slopes = slopes.data<float>();
    out.alibi_heads = slopes.numel();
  }
  if (mask.defined()) {
    const Arg am{"key_mask", mask};
    require_index_arg(op, am);
    MESH_VERIFY(mask.rank() == 2 && mask.dim(0) > 0 && B % mask.dim(0) == 0 &&
                    mask.dim(1) == S && mask.space() == space,
                op << ": " << describe(am) << " must be [batch, " << S
                   << "] beside the activations, batch dividing " << B);
    // The mask drawn ahead covers the causal rows' words only.
    MESH_VERIFY(!dropout.mask_drawn,
                op << ": attention dropout drawn ahead (mask_drawn) is causal only");
    out.key_mask = mask.data<std::int32_t>();
    out.mask_heads = B / mask.dim(0);
  }
  // cuDNN's path (the only one drawing with cuDNN's generator) takes neither.
  MESH_VERIFY(!(dropout.p > 0 && dropout.cudnn_rng && (slopes.defined() || mask.defined())),
              op << ": cuDNN's attention dropout (cudnn_rng) runs without ALiBi or a key mask");
  return out;
}

/// Only the device token-major ops run cuDNN's fused attention, which draws
/// its own mask: every other path would silently draw meshtron's instead.
void refuse_cudnn_rng(const char* op, const AttentionDropout& d) {
  MESH_VERIFY(d.p == 0.0 || !d.cudnn_rng,
              op << ": attention dropout drawn by cuDNN (cudnn_rng) runs in the device "
                    "token-major ops only");
}

/// The host kernels' mask of a checked dropout.
kernels::AttentionMask attention_mask(const char* op, const AttentionDropout& d) {
  refuse_cudnn_rng(op, d);
  if (d.p == 0.0) return {};
  return {true, d.p, placement(d.site)};
}

#ifdef MESHTRON_HAVE_CUDA
/// The CUDA kernels' form of checked scores.
cuda::FlashScores device_scores(const kernels::AttentionScores& sc) {
  return {sc.alibi_slopes, sc.alibi_heads, sc.key_mask, sc.mask_heads};
}

/// The CUDA kernels' dropout of a checked dropout (B entries of S x S), with
/// its stored-decision words where given.
cuda::AttentionDropoutSite device_dropout(const char* op, const AttentionDropout& d, index_t B,
                                          index_t S, bool token_major = false) {
  if (d.p == 0.0) return {};
  if (!token_major) refuse_cudnn_rng(op, d);
  cuda::AttentionDropoutSite site{d.p, device_placement(d.site)};
  if (d.keep_bits.defined()) {
    const Shape shape = attention_keep_bits_shape(B, S);
    MESH_VERIFY(!d.keep_bits.is_host() && d.keep_bits.dtype() == DType::I32 &&
                    d.keep_bits.shape() == shape,
                op << ": keep_bits " << describe({"keep_bits", d.keep_bits})
                   << " must be a device I32 [" << shape[0] << ", " << shape[1] << ", "
                   << shape[2] << "]");
    site.keep_bits = static_cast<std::uint32_t*>(d.keep_bits.raw());
    site.keep_bits_words = shape[2];
  }
  MESH_VERIFY(!d.mask_drawn || (d.keep_bits.defined() && attention_mask_drawn_alone(S)),
              op << ": a mask drawn ahead needs keep_bits and S % 8 == 0 (S = " << S << ")");
  site.mask_drawn = d.mask_drawn;
  site.cudnn_rng = d.cudnn_rng;
  return site;
}
#endif
}  // namespace

void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             Tensor& out, Tensor& lse, const AttentionDropout& dropout,
                             const FusedAttentionScores& scores) {
  const char* op = "fused_attention_forward";
  const Arg aq{"q", q}, ak{"k", k}, av{"v", v}, ao{"out", out}, al{"lse", lse};
  on_device(op, {aq, ak, av, ao, al});
  require_float_args(op, {aq, ak, av, ao});
  const bool device = check_attention(op, aq, {ak, av, ao}, al);
  for (const Arg& a : {aq, ak, av})
    MESH_VERIFY(!overlaps(out, a.t), op << ": out must not share memory with " << a.name);
  const index_t B = q.dim(0), S = q.dim(1), D = q.dim(2);
  check_attention_dropout(op, dropout, B, S);
  const kernels::AttentionScores sc = attention_scores(op, scores, dropout, B, S, q.space());
  if (device) {
    ON_CUDA(cuda::fused_attention_forward(q.dtype(), q.raw(), k.raw(), v.raw(), B, S, D, scale,
                                          out.raw(), lse.data<float>(),
                                          device_dropout(op, dropout, B, S), device_scores(sc)));
    return;
  }
  const kernels::AttentionMask z = attention_mask(op, dropout);
  with_float_type(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::causal_attention_forward<Host>(q.data<T>(), k.data<T>(), v.data<T>(), B, S, D, scale,
                                            z, sc, out.data<T>(), lse.data<T>());
  });
}

void draw_attention_mask(const AttentionDropout& dropout, index_t B, index_t S, void* stream) {
  const char* op = "draw_attention_mask";
  MESH_VERIFY(dropout.p > 0 && dropout.keep_bits.defined() && !dropout.keep_bits.is_host() &&
                  attention_mask_drawn_alone(S),
              op << ": needs p > 0, device keep_bits and S % 8 == 0 (S = " << S << ")");
  check_attention_dropout(op, dropout, B, S);
  ON_CUDA(cuda::draw_attention_mask(device_dropout(op, dropout, B, S), B, S, stream));
}

void fused_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, double scale,
                              Tensor& dq, Tensor& dk, Tensor& dv, const AttentionDropout& dropout,
                              const FusedAttentionScores& scores) {
  const char* op = "fused_attention_backward";
  const Arg ado{"dout", dout}, aq{"q", q}, ak{"k", k}, av{"v", v}, ao{"out", out},
      al{"lse", lse}, adq{"dq", dq}, adk{"dk", dk}, adv{"dv", dv};
  on_device(op, {aq, ado, ak, av, ao, al, adq, adk, adv});
  require_float_args(op, {aq, ado, ak, av, ao, adq, adk, adv});
  const bool device = check_attention(op, aq, {ado, ak, av, ao, adq, adk, adv}, al);
  for (const Arg& g : {adq, adk, adv})
    for (const Arg& a : {ado, aq, ak, av, ao})
      MESH_VERIFY(!overlaps(g.t, a.t), op << ": " << g.name << " must not share memory with "
                                          << a.name);
  const index_t B = q.dim(0), S = q.dim(1), D = q.dim(2);
  check_attention_dropout(op, dropout, B, S);
  const kernels::AttentionScores sc = attention_scores(op, scores, dropout, B, S, q.space());
  if (device) {
    Tensor delta = Tensor::empty({B, S}, DType::F32, q.space());
    ON_CUDA(cuda::fused_attention_backward(q.dtype(), dout.raw(), q.raw(), k.raw(), v.raw(),
                                           out.raw(), lse.data<float>(), B, S, D, scale,
                                           delta.data<float>(), dq.raw(), dk.raw(), dv.raw(),
                                           device_dropout(op, dropout, B, S), device_scores(sc)));
    return;
  }
  const kernels::AttentionMask z = attention_mask(op, dropout);
  with_float_type(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::causal_attention_backward<Host>(dout.data<T>(), q.data<T>(), k.data<T>(),
                                             v.data<T>(), out.data<T>(), lse.data<T>(), B, S, D,
                                             scale, z, sc, dq.data<T>(), dk.data<T>(),
                                             dv.data<T>());
  });
}

namespace {
/// qkv [s*b, 3*heads*d] and context [s*b, heads*d] of one attention call;
/// returns d and whether on the device.
bool check_token_major(const char* op, const Arg& qkv, const Arg& context, index_t s, index_t b,
                       index_t heads, const Arg& lse, index_t& d) {
  MESH_VERIFY(s > 0 && b > 0 && heads > 0 && qkv.t.rank() == 2 && qkv.t.dim(0) == s * b &&
                  qkv.t.dim(1) % (3 * heads) == 0 && qkv.t.dim(1) > 0,
              op << ": " << describe(qkv) << " must be [s*b, 3*heads*d] for s = " << s
                 << ", b = " << b << ", heads = " << heads);
  d = qkv.t.dim(1) / (3 * heads);
  MESH_VERIFY(context.t.shape() == Shape({s * b, heads * d}),
              op << ": " << describe(context) << " must be [s*b, heads*d]");
  MESH_VERIFY(!overlaps(qkv.t, context.t),
              op << ": " << qkv.name << " and " << context.name << " must not share memory");
  const bool device = !qkv.t.is_host();
  require_stat_args(op, device, qkv, {lse});
  require_per_row(op, lse, b * heads * s, qkv);
  if (device)
    MESH_VERIFY(fused_attention_supported(qkv.t.dtype(), qkv.t.space(), d),
                op << ": the CUDA kernel takes bf16 or fp16 with head_dim 64 or 128, got "
                   << describe(qkv) << " with head_dim " << d);
  return device;
}
}  // namespace

void fused_attention_forward_token_major(const Tensor& qkv, index_t s, index_t b, index_t heads,
                                         double scale, Tensor& context, Tensor& lse,
                                         const AttentionDropout& dropout,
                                         const FusedAttentionScores& scores) {
  const char* op = "fused_attention_forward_token_major";
  const Arg aqkv{"qkv", qkv}, ac{"context", context}, al{"lse", lse};
  on_device(op, {aqkv, ac, al});
  require_float_args(op, {aqkv, ac});
  index_t d = 0;
  if (check_token_major(op, aqkv, ac, s, b, heads, al, d)) {
    check_attention_dropout(op, dropout, b * heads, s);
    const kernels::AttentionScores sc =
        attention_scores(op, scores, dropout, b * heads, s, qkv.space());
    ON_CUDA(cuda::fused_attention_forward_token_major(qkv.dtype(), qkv.raw(), s, b, heads, d,
                                                      scale, context.raw(), lse.data<float>(),
                                                      device_dropout(op, dropout, b * heads, s,
                                                                     /*token_major=*/true),
                                                      device_scores(sc)));
    return;
  }
  Tensor parts[3];
  split_heads(qkv, s, b, heads, 3, parts);
  Tensor head_major = Tensor::empty(parts[0].shape(), qkv.dtype(), qkv.space());
  fused_attention_forward(parts[0], parts[1], parts[2], scale, head_major, lse, dropout, scores);
  Tensor merged;
  merge_heads(&head_major, 1, s, b, heads, merged);
  context.copy_from(merged);
}

void fused_attention_backward_token_major(const Tensor& dcontext, const Tensor& qkv,
                                          const Tensor& context, const Tensor& lse, index_t s,
                                          index_t b, index_t heads, double scale, Tensor& dqkv,
                                          const AttentionDropout& dropout,
                                          const FusedAttentionScores& scores) {
  const char* op = "fused_attention_backward_token_major";
  const Arg adc{"dcontext", dcontext}, aqkv{"qkv", qkv}, ac{"context", context}, al{"lse", lse},
      adq{"dqkv", dqkv};
  on_device(op, {aqkv, adc, ac, al, adq});
  require_float_args(op, {aqkv, adc, ac, adq});
  index_t d = 0;
  const bool device = check_token_major(op, aqkv, ac, s, b, heads, al, d);
  MESH_VERIFY(dcontext.shape() == context.shape() && dqkv.shape() == qkv.shape(),
              op << ": " << describe(adc) << " must match " << describe(ac) << " and "
                 << describe(adq) << " " << describe(aqkv));
  for (const Arg& a : {adc, aqkv, ac})
    MESH_VERIFY(!overlaps(dqkv, a.t), op << ": dqkv must not share memory with " << a.name);
  if (device) {
    check_attention_dropout(op, dropout, b * heads, s);
    const kernels::AttentionScores sc =
        attention_scores(op, scores, dropout, b * heads, s, qkv.space());
    Tensor delta = Tensor::empty({b * heads, s}, DType::F32, qkv.space());
    ON_CUDA(cuda::fused_attention_backward_token_major(
        qkv.dtype(), dcontext.raw(), qkv.raw(), context.raw(), lse.data<float>(), s, b, heads, d,
        scale, delta.data<float>(), dqkv.raw(),
        device_dropout(op, dropout, b * heads, s, /*token_major=*/true), device_scores(sc)));
    return;
  }
  Tensor parts[3], dout, out;
  split_heads(qkv, s, b, heads, 3, parts);
  split_heads(dcontext, s, b, heads, 1, &dout);
  split_heads(context, s, b, heads, 1, &out);
  Tensor dparts[3];
  for (Tensor& g : dparts) g = Tensor::empty(parts[0].shape(), qkv.dtype(), qkv.space());
  fused_attention_backward(dout, parts[0], parts[1], parts[2], out, lse, scale, dparts[0],
                           dparts[1], dparts[2], dropout, scores);
  Tensor merged;
  merge_heads(dparts, 3, s, b, heads, merged);
  dqkv.copy_from(merged);
}

}  // namespace meshtron::ops
