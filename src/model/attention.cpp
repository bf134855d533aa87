#include "model/attention.hpp"

#include <cmath>

#include "common/error.hpp"
#include "ops/head_layout.hpp"

namespace meshtron {

namespace {
void reject_unbuilt(const AttentionSpec& a, index_t hidden) {
  const auto reject_unless = [](bool built, const std::string& setting) {
    require_built(built, "Attention", setting);
  };
  reject_unless(a.num_query_groups == a.num_heads,
                MESH_MSG("num_query_groups = " << a.num_query_groups << " (not num_heads = "
                                               << a.num_heads << ")"));
  reject_unless(index_t(a.context_width()) == hidden,
                MESH_MSG("kv_channels = " << a.head_dim << " (not hidden_size / num_heads = "
                                          << hidden / a.num_heads << ")"));
  reject_unless(a.mask == AttentionMask::Causal, "attention mask " + to_string(a.mask));
  reject_unless(a.position != PositionEmbedding::Rope && a.position != PositionEmbedding::Alibi,
                "position_embedding_type = " + to_string(a.position));
  reject_unless(a.bias, "add_bias_linear = false");
}
}  // namespace

Attention::Attention(const std::string& name, int layer, index_t hidden,
                     const AttentionSpec& spec, double dropout, const LayerContext& ctx,
                     DType dtype)
    : qkv(name + ".qkv", hidden, 3 * hidden, /*fused_parts=*/3, ctx, dtype),
      proj(name + ".proj", hidden, hidden, ctx, dtype, /*epilogue_rank=*/layer),
      layer_(layer),
      heads_local_(spec.num_heads / ctx.tp.size()),
      head_dim_(spec.head_dim),
      dropout_(dropout),
      backend_(attention_backend_from_string(spec.backend)) {
  reject_unbuilt(spec, hidden);
}

bool Attention::use_fused(DType activations, MemorySpace space) const {
  if (backend_ == AttentionBackend::Unfused) return false;
  const bool host = space == MemorySpace::Host;
  const bool supported = ops::fused_attention_supported(activations, space, head_dim_);
  if (backend_ == AttentionBackend::Auto) return supported && !host;
  MESH_REQUIRE(supported, "model.attention_backend = fused needs, on the GPU, bf16 or fp16 with "
                          "head dim 64 or 128; got "
                              << dtype_name(activations) << " on the "
                              << (host ? "host" : "GPU") << ", head dim " << head_dim_);
  return true;
}

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
  site.live = ctx.dropout_live;
  site.sample_axis = 0;  // samples are the a axis here
  return site;
}

bool Attention::draws_mask_ahead(const LayerContext& ctx) const {
  // Where core_forward's fused kernels would store the mask, drawn by its
  // own kernel ahead of their pass (the activations are the weights' dtype).
  return fused_dropout(ctx).p > 0 && !ctx.attention_dropout_cudnn &&
         ctx.space != MemorySpace::Host &&
         use_fused(qkv.weight.value.dtype(), ctx.space) &&
         ops::attention_mask_drawn_alone(ctx.seq_length);
}

void Attention::draw_mask_ahead(const LayerContext& ctx, void* stream) {
  MESH_VERIFY(draws_mask_ahead(ctx), "Attention::draw_mask_ahead where the forward draws its own");
  ops::AttentionDropout dropout = fused_dropout(ctx);
  const index_t s = ctx.seq_length, entries = ctx.micro_batch * heads_local_;
  const Shape shape = ops::attention_keep_bits_shape(entries, s);
  // Made once (the caller's first draws wait for everything queued before
  // them, so for every earlier use of the block), then drawn into in place.
  if (!ahead_keep_bits_.defined()) ahead_keep_bits_ = Tensor::empty(shape, DType::I32, ctx.space);
  MESH_VERIFY(ahead_keep_bits_.shape() == shape,
              "Attention::draw_mask_ahead: the micro-batch changed shape between steps");
  dropout.keep_bits = ahead_keep_bits_;
  ops::draw_attention_mask(dropout, entries, s, stream);
}

ops::AttentionDropout Attention::fused_dropout(const LayerContext& ctx) const {
  if (!ctx.training || dropout_ == 0) return {};
  ops::AttentionDropout d{dropout_, probs_site(ctx)};
  d.cudnn_rng = ctx.attention_dropout_cudnn;
  return d;
}

void Attention::attention_probs(const Tensor& q, const Tensor& k, const LayerContext& ctx,
                                Tensor& probs, Tensor& probs_kept) const {
  const index_t s = ctx.seq_length;
  Tensor scores = Tensor::empty({q.dim(0), s, s}, q.dtype(), q.space());
  ops::gemm_batched(q, false, k, true, scores);
  probs = Tensor::empty(scores.shape(), q.dtype(), q.space());
  ops::scaled_causal_softmax_forward(scores, scale(), probs);
  probs_kept = probs;
  if (ctx.training && dropout_ > 0) {
    probs_kept = Tensor::empty(probs.shape(), q.dtype(), q.space());
    ops::dropout_forward(probs, dropout_, probs_site(ctx), probs_kept);
  }
}

/// context = dropout(softmax(q k^T / sqrt(d))) v, keeping the probabilities
/// in the cache unless selective recompute rebuilds them in the backward.
Tensor Attention::core_forward_unfused(const LayerContext& ctx, Cache& c) const {
  Tensor probs, probs_kept;
  attention_probs(c.q, c.k, ctx, probs, probs_kept);
  Tensor context = Tensor::empty(c.q.shape(), c.q.dtype(), c.q.space());
  ops::gemm_batched(probs_kept, false, c.v, false, context);
  // Selective recompute keeps q, k, v only; the s x s tensors die here.
  const bool keep = ctx.recompute != Recompute::Selective;
  c.probs = keep ? probs : Tensor();
  c.probs_kept = keep ? probs_kept : Tensor();
  c.lse = c.keep_bits = Tensor();  // the backward takes the unfused path
  return context;
}

Tensor Attention::forward(const Tensor& x, LayerContext& ctx, Cache& c) const {
  return proj.forward(core_forward(x, ctx, c), ctx, c.proj);
}

Tensor Attention::forward_residual(const Tensor& x, const Tensor& residual, LayerContext& ctx,
                                   Cache& c) const {
  return proj.forward_residual(core_forward(x, ctx, c), residual, ctx, c.proj);
}

/// The qkv projection and the attention core: the merged context, proj's input.
Tensor Attention::core_forward(const Tensor& x, LayerContext& ctx, Cache& c) const {
  const index_t s = ctx.seq_length, b = ctx.micro_batch;
  Tensor qkv_out = qkv.forward(x, ctx, c.qkv);
  Tensor merged;
  if (use_fused(qkv_out.dtype(), qkv_out.space())) {
    // The fused core reads q, k, v from the projection's output and writes
    // the context in proj's input layout: no head copies. Nothing s x s is
    // stored but, with attention dropout on the GPU, one bit per
    // probability; selective recompute has nothing to drop.
    c.qkv_out = qkv_out;
    c.q = c.k = c.v = c.probs = c.probs_kept = c.keep_bits = Tensor();
    merged = Tensor::empty({s * b, heads_local_ * head_dim_}, x.dtype(), x.space());
    c.lse = Tensor::empty({b * heads_local_, s}, stats_dtype(x), x.space());
    ops::AttentionDropout dropout = fused_dropout(ctx);
    if (dropout.cudnn_rng) {
      // cuDNN draws (and redraws in the backward) its own mask: nothing stored.
    } else if (dropout.p > 0 && ctx.attention_masks_drawn && ahead_keep_bits_.defined()) {
      dropout.keep_bits = ahead_keep_bits_;  // drawn at the start of the step
      dropout.mask_drawn = true;
    } else if (dropout.p > 0 && !x.is_host()) {  // b * heads * s^2 / 8 bytes, not 2 Philox passes
      dropout.keep_bits =
          Tensor::empty(ops::attention_keep_bits_shape(b * heads_local_, s), DType::I32, x.space());
    }
    c.keep_bits = dropout.keep_bits;
    ops::fused_attention_forward_token_major(qkv_out, s, b, heads_local_, scale(), merged, c.lse,
                                             dropout);
  } else {
    MESH_REQUIRE(!fused_dropout(ctx).cudnn_rng,
                 "training.attention_dropout_rng = cudnn needs the fused attention on the GPU "
                 "(bf16 or fp16, head dim 64 or 128, model.attention_backend auto or fused); "
                 "this layer runs the unfused core on the "
                     << (x.is_host() ? "host" : "GPU"));
    Tensor parts[3];
    ops::split_heads(qkv_out, s, b, heads_local_, 3, parts);
    c.q = parts[0];
    c.k = parts[1];
    c.v = parts[2];
    c.qkv_out = Tensor();
    const Tensor context = core_forward_unfused(ctx, c);
    ops::merge_heads(&context, 1, s, b, heads_local_, merged);
  }
  return merged;
}

Tensor Attention::backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  const index_t s = ctx.seq_length, b = ctx.micro_batch;
  Tensor dmerged = proj.backward(dy, ctx, c.proj);
  Tensor dqkv;
  if (c.lse.defined()) {  // the forward ran the fused core; proj kept the context
    dqkv = Tensor::empty(c.qkv_out.shape(), dy.dtype(), dy.space());
    ops::AttentionDropout dropout = fused_dropout(ctx);
    dropout.keep_bits = c.keep_bits;
    ops::fused_attention_backward_token_major(dmerged, c.qkv_out, c.proj.x, c.lse, s, b,
                                              heads_local_, scale(), dqkv, dropout);
  } else {
    Tensor dcontext, dparts[3];
    ops::split_heads(dmerged, s, b, heads_local_, 1, &dcontext);
    core_backward_unfused(dcontext, ctx, c, dparts);
    ops::merge_heads(dparts, 3, s, b, heads_local_, dqkv);
  }
  return qkv.backward(dqkv, ctx, c.qkv);
}

/// dq, dk, dv of the unfused core from dcontext (rebuilding the
/// probabilities first under selective recompute).
void Attention::core_backward_unfused(const Tensor& dcontext, const LayerContext& ctx,
                                      const Cache& c, Tensor (&dparts)[3]) const {
  Tensor probs = c.probs, probs_kept = c.probs_kept;
  if (!probs.defined()) attention_probs(c.q, c.k, ctx, probs, probs_kept);
  Tensor dprobs = Tensor::empty(probs.shape(), dcontext.dtype(), dcontext.space());
  ops::gemm_batched(dcontext, false, c.v, true, dprobs);   // dP = dC V^T
  dparts[2] = Tensor::empty(c.v.shape(), dcontext.dtype(), dcontext.space());
  ops::gemm_batched(probs_kept, true, dcontext, false, dparts[2]);  // dV = P^T dC
  if (ctx.training && dropout_ > 0)
    ops::dropout_backward(dprobs, dropout_, probs_site(ctx), dprobs);

  Tensor dscores = Tensor::empty(probs.shape(), dcontext.dtype(), dcontext.space());
  ops::scaled_causal_softmax_backward(dprobs, probs, scale(),
                                      dscores);
  dparts[0] = Tensor::empty(c.q.shape(), dcontext.dtype(), dcontext.space());
  dparts[1] = Tensor::empty(c.k.shape(), dcontext.dtype(), dcontext.space());
  ops::gemm_batched(dscores, false, c.k, false, dparts[0]);  // dQ = dS K
  ops::gemm_batched(dscores, true, c.q, false, dparts[1]);   // dK = dS^T Q
}

}  // namespace meshtron
