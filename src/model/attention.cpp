#include "model/attention.hpp"

#include <cmath>

#include "ops/head_layout.hpp"

namespace meshtron {

Attention::Attention(const std::string& name, int layer, index_t hidden, int heads,
                     double dropout, const LayerContext& ctx, DType dtype)
    : qkv(name + ".qkv", hidden, 3 * hidden, /*fused_parts=*/3, ctx, dtype),
      proj(name + ".proj", hidden, hidden, ctx, dtype),
      layer_(layer),
      heads_local_(heads / ctx.tp.size()),
      head_dim_(hidden / heads),
      dropout_(dropout) {}

ops::DropoutSite Attention::probs_site(const LayerContext& ctx) const {
  // probs [b, heads_local, s*s]: global index ((sample * heads + head) * s*s + ij).
  ops::DropoutSite site;
  site.seed = ctx.seed;
  site.step = ctx.step;
  site.stream = std::uint32_t(layer_) * kStreamsPerLayer + kStreamAttentionProbs;
  site.a = ctx.micro_batch;
  site.b = heads_local_;
  site.c = ctx.seq_length * ctx.seq_length;
  site.a_offset = ctx.sample_offset;
  site.b_offset = index_t(ctx.tp.rank()) * heads_local_;
  site.b_global = index_t(heads_local_) * ctx.tp.size();
  site.c_global = site.c;
  return site;
}

void Attention::attention_probs(const Tensor& q, const Tensor& k, const LayerContext& ctx,
                                Tensor& probs, Tensor& probs_kept) const {
  const index_t s = ctx.seq_length;
  Tensor scores = Tensor::empty({q.dim(0), s, s}, q.dtype(), q.space());
  ops::gemm_batched(q, false, k, true, scores);
  probs = Tensor::empty(scores.shape(), q.dtype(), q.space());
  ops::scaled_causal_softmax_forward(scores, 1.0 / std::sqrt(double(head_dim_)), probs);
  probs_kept = probs;
  if (ctx.training && dropout_ > 0) {
    probs_kept = Tensor::empty(probs.shape(), q.dtype(), q.space());
    ops::dropout_forward(probs, dropout_, probs_site(ctx), probs_kept);
  }
}

Tensor Attention::forward(const Tensor& x, LayerContext& ctx, Cache& c) const {
  const index_t s = ctx.seq_length, b = ctx.micro_batch;
  Tensor qkv_out = qkv.forward(x, ctx, c.qkv);
  Tensor parts[3];
  ops::split_heads(qkv_out, s, b, heads_local_, 3, parts);
  c.q = parts[0];
  c.k = parts[1];
  c.v = parts[2];

  Tensor probs, probs_kept;
  attention_probs(c.q, c.k, ctx, probs, probs_kept);
  Tensor context = Tensor::empty({b * heads_local_, s, head_dim_}, x.dtype(), x.space());
  ops::gemm_batched(probs_kept, false, c.v, false, context);
  // Selective recompute keeps q, k, v only; the s x s tensors die here.
  if (ctx.recompute != Recompute::Selective) {
    c.probs = probs;
    c.probs_kept = probs_kept;
  }
  Tensor merged;
  ops::merge_heads(&context, 1, s, b, heads_local_, merged);
  return proj.forward(merged, ctx, c.proj);
}

Tensor Attention::backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  const index_t s = ctx.seq_length, b = ctx.micro_batch;
  Tensor dmerged = proj.backward(dy, ctx, c.proj);
  Tensor dcontext;
  ops::split_heads(dmerged, s, b, heads_local_, 1, &dcontext);

  Tensor probs = c.probs, probs_kept = c.probs_kept;
  if (!probs.defined()) attention_probs(c.q, c.k, ctx, probs, probs_kept);
  Tensor dprobs = Tensor::empty(probs.shape(), dy.dtype(), dy.space());
  ops::gemm_batched(dcontext, false, c.v, true, dprobs);   // dP = dC V^T
  Tensor dparts[3];
  dparts[2] = Tensor::empty(c.v.shape(), dy.dtype(), dy.space());
  ops::gemm_batched(probs_kept, true, dcontext, false, dparts[2]);  // dV = P^T dC
  if (ctx.training && dropout_ > 0)
    ops::dropout_backward(dprobs, dropout_, probs_site(ctx), dprobs);

  Tensor dscores = Tensor::empty(probs.shape(), dy.dtype(), dy.space());
  ops::scaled_causal_softmax_backward(dprobs, probs, 1.0 / std::sqrt(double(head_dim_)),
                                      dscores);
  dparts[0] = Tensor::empty(c.q.shape(), dy.dtype(), dy.space());
  dparts[1] = Tensor::empty(c.k.shape(), dy.dtype(), dy.space());
  ops::gemm_batched(dscores, false, c.k, false, dparts[0]);  // dQ = dS K
  ops::gemm_batched(dscores, true, c.q, false, dparts[1]);   // dK = dS^T Q
  Tensor dqkv;
  ops::merge_heads(dparts, 3, s, b, heads_local_, dqkv);
  return qkv.backward(dqkv, ctx, c.qkv);
}

}  // namespace meshtron
