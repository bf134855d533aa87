#include "model/attention.hpp"

#include <cmath>

#include "common/error.hpp"
#include "ops/head_layout.hpp"

namespace meshtron {

namespace {
void reject_unbuilt(const AttentionSpec& a) {
  const auto reject_unless = [](bool built, const std::string& setting) {
    require_built(built, "Attention", setting);
  };
  reject_unless(a.mask != AttentionMask::None, "attention mask " + to_string(a.mask));
  reject_unless(a.mask == AttentionMask::Causal || a.position != PositionEmbedding::Alibi,
                "ALiBi with attention mask " + to_string(a.mask));
  reject_unless(a.position != PositionEmbedding::Relative,
                "relative position buckets outside T5 (model.arch = t5)");
  reject_unless(a.scale_scores, "unscaled attention scores outside T5 (model.arch = t5)");
}

/// The ALiBi slopes of this rank's heads (global heads [t H/tp, (t+1) H/tp)),
/// fp32 where the activations live; none without ALiBi.
Tensor alibi_slopes_of_rank(const AttentionSpec& a, const LayerContext& ctx) {
  if (a.position != PositionEmbedding::Alibi) return Tensor();
  const index_t local = a.num_heads / ctx.tp.size(), first = local * ctx.tp.rank();
  const std::vector<double> all = ops::alibi_slopes(a.num_heads);
  Tensor host = Tensor::empty({local}, DType::F32);
  for (index_t h = 0; h < local; ++h) host.data<float>()[h] = float(all[std::size_t(first + h)]);
  return ctx.space == MemorySpace::Host ? host : host.to_space(ctx.space);
}

ops::RotarySpec rotary_spec(const AttentionSpec& a) {
  ops::RotarySpec rope;
  if (a.position != PositionEmbedding::Rope) return rope;
  rope.rotary_dim = ops::rotary_dim_for(a.head_dim, a.rotary_percent);
  rope.base = a.rotary_base;
  rope.layout =
      a.rotary_interleaved ? ops::RotaryLayout::Interleaved : ops::RotaryLayout::HalfSplit;
  return rope;
}
}  // namespace

Attention::Attention(const std::string& name, int layer, index_t hidden, const AttentionSpec& spec,
                     double dropout, const LayerContext& ctx, DType dtype)
    : qkv(name + ".qkv", hidden, spec.qkv_width(), /*fused_parts=*/3, ctx, dtype, spec.bias),
      proj(name + ".proj", spec.context_width(), hidden, ctx, dtype, /*epilogue_rank=*/layer,
           spec.bias),
      layer_(layer),
      heads_local_(spec.num_heads / ctx.tp.size()),
      groups_local_(spec.num_query_groups / ctx.tp.size()),
      head_dim_(spec.head_dim),
      rotary_(spec.position == PositionEmbedding::Rope),
      rope_(rotary_spec(spec)),
      alibi_slopes_(alibi_slopes_of_rank(spec, ctx)),
      dropout_(dropout),
      padding_mask_(spec.mask == AttentionMask::Padding),
      backend_(attention_backend_from_string(spec.backend)) {
  reject_unbuilt(spec);
  MESH_REQUIRE(spec.num_query_groups > 0 && spec.num_heads % spec.num_query_groups == 0 &&
                   spec.num_query_groups % ctx.tp.size() == 0,
               "Attention: num_query_groups = " << spec.num_query_groups
                                                << " must divide num_heads = " << spec.num_heads
                                                << " and be a multiple of tp = " << ctx.tp.size());
  if (groups_local_ != heads_local_) {
    const std::vector<int> units{spec.num_heads / spec.num_query_groups, 1, 1};
    qkv.weight.part_units = qkv.bias.part_units = units;
  }
}

bool Attention::use_fused(DType activations, MemorySpace space) const {
  if (backend_ == AttentionBackend::Unfused) return false;
  const bool host = space == MemorySpace::Host;
  // Grouped queries run the fused kernels too, on k and v repeated per
  // query head (expand_kv_groups): (heads - groups) x 2 head vectors more
  // per token than the unfused core reads, against its b x heads x s x s
  // scores (1 GB a layer for llama-1b's micro-batch).
  const bool supported = ops::fused_attention_supported(activations, space, head_dim_);
  if (backend_ == AttentionBackend::Auto) return supported && !host;
  MESH_REQUIRE(supported,
               "model.attention_backend = fused needs, on the GPU, bf16 or fp16 with "
               "head dim 64 or 128; got "
                   << dtype_name(activations) << " on the " << (host ? "host" : "GPU")
                   << ", head dim " << head_dim_);
  return true;
}

const Tensor& Attention::rotary_positions(const LayerContext& ctx) const {
  const index_t s = ctx.seq_length, b = ctx.micro_batch;
  if (positions_.defined() && positions_.numel() == s * b && positions_.space() == ctx.space &&
      positions_b_ == b && positions_offset_ == position_offset)
    return positions_;
  Tensor host = Tensor::empty({s * b}, DType::I32);
  auto* pos = host.data<std::int32_t>();
  for (index_t row = 0; row < s * b; ++row)
    pos[row] = std::int32_t(position_offset + row / b);  // rows in [s, b] order
  positions_ = ctx.space == MemorySpace::Host ? host : host.to_space(ctx.space);
  positions_b_ = b;
  positions_offset_ = position_offset;
  return positions_;
}

void Attention::rotate_qk(Tensor& qkv_rows, const LayerContext& ctx, double sign) const {
  Tensor heads =
      qkv_rows.reshape({qkv_rows.dim(0), index_t(heads_local_ + 2 * groups_local_), head_dim_});
  const index_t rotated = heads_local_ + groups_local_;  // q and k
  if (sign > 0)
    ops::rotary_forward(heads, rotary_positions(ctx), rope_, heads, rotated);
  else
    ops::rotary_backward(heads, rotary_positions(ctx), rope_, heads, rotated);
}

void Attention::split_qkv(const Tensor& qkv_out, index_t s, index_t b, Tensor (&parts)[3]) const {
  if (groups_local_ == heads_local_) {
    ops::split_heads(qkv_out, s, b, heads_local_, 3, parts);
    return;
  }
  Tensor all;
  ops::split_heads(qkv_out, s, b, heads_local_ + 2 * groups_local_, 1, &all);
  const index_t count[3] = {heads_local_, groups_local_, groups_local_};
  for (int p = 0; p < 3; ++p)
    parts[p] = Tensor::empty({b * count[p], s, head_dim_}, qkv_out.dtype(), qkv_out.space());
  move_qkv_heads(all, parts, b, /*into_parts=*/true);
}

Tensor Attention::merge_qkv(const Tensor (&parts)[3], index_t s, index_t b) const {
  Tensor merged;
  if (groups_local_ == heads_local_) {
    ops::merge_heads(parts, 3, s, b, heads_local_, merged);
    return merged;
  }
  const index_t row_heads = heads_local_ + 2 * groups_local_;
  Tensor all = Tensor::empty({b * row_heads, s, head_dim_}, parts[0].dtype(), parts[0].space());
  move_qkv_heads(all, parts, b, /*into_parts=*/false);
  ops::merge_heads(&all, 1, s, b, row_heads, merged);
  return merged;
}

void Attention::move_qkv_heads(const Tensor& all, const Tensor (&parts)[3], index_t b,
                               bool into_parts) const {
  // A sample's heads lie together in `all`: q (heads_local), k, v (groups_local).
  const index_t row_heads = heads_local_ + 2 * groups_local_, matrix = all.numel() / all.dim(0);
  const index_t first[3] = {0, heads_local_, heads_local_ + groups_local_};
  const index_t count[3] = {heads_local_, groups_local_, groups_local_};
  const Tensor rows = all.reshape({all.dim(0), matrix});
  for (int p = 0; p < 3; ++p) {
    const Tensor part = parts[p].reshape({b * count[p], matrix});
    for (index_t bi = 0; bi < b; ++bi) {
      const index_t begin = bi * row_heads + first[p];
      Tensor in_all = rows.slice_rows(begin, begin + count[p]);
      Tensor in_part = part.slice_rows(bi * count[p], (bi + 1) * count[p]);
      if (into_parts) in_part.copy_from(in_all);
      else in_all.copy_from(in_part);
    }
  }
}

Tensor Attention::by_group(const Tensor& per_head) const {
  const index_t per_group = heads_local_ / groups_local_;
  return per_head.reshape(
      {per_head.dim(0) / per_group, per_group * per_head.dim(1), per_head.dim(2)});
}

const Tensor& Attention::key_padding_mask(const LayerContext& ctx) const {
  const Tensor& m = ctx.key_padding_mask;
  MESH_VERIFY(m.defined() && m.rank() == 2 && m.dim(0) == ctx.micro_batch &&
                  m.dim(1) == ctx.seq_length && m.space() == ctx.space,
              "Attention: a padding mask needs LayerContext::key_padding_mask int32 [b = "
                  << ctx.micro_batch << ", s = " << ctx.seq_length << "] where the layers live");
  return m;
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
  // own kernel ahead of their pass (the activations are the weights' dtype);
  // that kernel draws the causal rows' words only, so not under a padding
  // mask (the forward draws and stores the whole rows itself).
  return fused_dropout(ctx).p > 0 && !ctx.attention_dropout_cudnn && !padding_mask_ &&
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

ops::FusedAttentionScores Attention::fused_scores(const LayerContext& ctx) const {
  ops::FusedAttentionScores scores;
  scores.alibi_slopes = alibi_slopes_;
  if (padding_mask_) scores.key_mask = key_padding_mask(ctx);
  return scores;
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
  // Scores of a group's query heads at once: [b*groups, heads/groups * s, s]
  // is [b*heads, s, s] in memory.
  const Tensor q_groups = by_group(q);
  Tensor scores = Tensor::empty({q_groups.dim(0), q_groups.dim(1), s}, q.dtype(), q.space());
  ops::gemm_batched(q_groups, false, k, true, scores);
  scores = scores.reshape({q.dim(0), s, s});
  probs = Tensor::empty(scores.shape(), q.dtype(), q.space());
  if (padding_mask_)
    ops::scaled_masked_softmax_forward(scores, key_padding_mask(ctx), scale(), probs);
  else
    ops::scaled_causal_softmax_forward(scores, scale(), probs, alibi_slopes_);
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
  Tensor context_groups = by_group(context);
  ops::gemm_batched(by_group(probs_kept), false, c.v, false, context_groups);
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
  if (rotary_) rotate_qk(qkv_out, ctx, +1.0);
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
    MESH_REQUIRE(!(dropout.cudnn_rng && (alibi_slopes_.defined() || padding_mask_)),
                 "training.attention_dropout_rng = cudnn runs cuDNN's fused attention, which "
                 "meshtron gives no ALiBi or padding mask; use attention_dropout_rng = meshtron");
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
    if (groups_local_ != heads_local_) {
      ops::expand_kv_groups(qkv_out, heads_local_, groups_local_, c.qkv_out);
      qkv_out = c.qkv_out;
    }
    ops::fused_attention_forward_token_major(qkv_out, s, b, heads_local_, scale(), merged, c.lse,
                                             dropout, fused_scores(ctx));
  } else {
    MESH_REQUIRE(!fused_dropout(ctx).cudnn_rng,
                 "training.attention_dropout_rng = cudnn needs the fused attention on the GPU "
                 "(bf16 or fp16, head dim 64 or 128, model.attention_backend auto or fused); "
                 "this layer runs the unfused core on the "
                     << (x.is_host() ? "host" : "GPU"));
    Tensor parts[3];
    split_qkv(qkv_out, s, b, parts);
    c.q = parts[0];
    c.k = parts[1];
    c.v = parts[2];
    c.qkv_out = Tensor();
    const Tensor context = core_forward_unfused(ctx, c);
    ops::merge_heads(&context, 1, s, b, heads_local_, merged);
  }
  return merged;
}

Tensor Attention::forward_cached(const Tensor& x, const Tensor& residual, LayerContext& ctx,
                                 const CachedRows& rows, KvCache::Layer& kv) const {
  MESH_REQUIRE(!padding_mask_, "generation with a KV cache needs causal attention");
  Cache c;
  Tensor qkv_out = qkv.forward(x, ctx, c.qkv);
  if (rotary_) {
    Tensor heads = qkv_out.reshape(
        {qkv_out.dim(0), index_t(heads_local_ + 2 * groups_local_), head_dim_});
    ops::rotary_forward(heads, rows.positions, rope_, heads, heads_local_ + groups_local_);
  }
  Tensor context =
      Tensor::empty({qkv_out.dim(0), heads_local_ * head_dim_}, qkv_out.dtype(), qkv_out.space());
  ops::cached_attention(qkv_out, heads_local_, groups_local_, rows.slots, rows.positions,
                        scale(), kv.k, kv.v, context);
  return proj.forward_residual(context, residual, ctx, c.proj);
}

KvCache::Layer Attention::make_kv_cache(index_t slots, index_t capacity, DType dtype,
                                        MemorySpace space) const {
  const Shape shape{slots, index_t(groups_local_), capacity, head_dim_};
  return {Tensor::zeros(shape, dtype, space), Tensor::zeros(shape, dtype, space)};
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
                                              heads_local_, scale(), dqkv, dropout,
                                              fused_scores(ctx));
    if (groups_local_ != heads_local_) {  // c.qkv_out holds k and v per query head
      Tensor dexpanded = dqkv;
      ops::reduce_kv_groups(dexpanded, heads_local_, groups_local_, dqkv);
    }
  } else {
    Tensor dcontext, dparts[3];
    ops::split_heads(dmerged, s, b, heads_local_, 1, &dcontext);
    core_backward_unfused(dcontext, ctx, c, dparts);
    dqkv = merge_qkv(dparts, s, b);
  }
  if (rotary_) rotate_qk(dqkv, ctx, -1.0);
  return qkv.backward(dqkv, ctx, c.qkv);
}

/// dq, dk, dv of the unfused core from dcontext (rebuilding the
/// probabilities first under selective recompute).
void Attention::core_backward_unfused(const Tensor& dcontext, const LayerContext& ctx,
                                      const Cache& c, Tensor (&dparts)[3]) const {
  Tensor probs = c.probs, probs_kept = c.probs_kept;
  if (!probs.defined()) attention_probs(c.q, c.k, ctx, probs, probs_kept);
  // Per group: the query heads' rows [heads/groups * s] against the
  // group's s keys, so dV and dK sum over the group's heads in the GEMMs.
  const Tensor dcontext_g = by_group(dcontext), q_g = by_group(c.q);
  Tensor dprobs = Tensor::empty(probs.shape(), dcontext.dtype(), dcontext.space());
  Tensor dprobs_g = by_group(dprobs);
  ops::gemm_batched(dcontext_g, false, c.v, true, dprobs_g);  // dP = dC V^T
  dparts[2] = Tensor::empty(c.v.shape(), dcontext.dtype(), dcontext.space());
  ops::gemm_batched(by_group(probs_kept), true, dcontext_g, false, dparts[2]);  // dV = P^T dC
  if (ctx.training && dropout_ > 0)
    ops::dropout_backward(dprobs, dropout_, probs_site(ctx), dprobs);

  Tensor dscores = Tensor::empty(probs.shape(), dcontext.dtype(), dcontext.space());
  if (padding_mask_)
    ops::scaled_masked_softmax_backward(dprobs, probs, scale(), dscores);
  else
    ops::scaled_causal_softmax_backward(dprobs, probs, scale(), dscores);
  const Tensor dscores_g = by_group(dscores);
  dparts[0] = Tensor::empty(c.q.shape(), dcontext.dtype(), dcontext.space());
  dparts[1] = Tensor::empty(c.k.shape(), dcontext.dtype(), dcontext.space());
  Tensor dq_g = by_group(dparts[0]);
  ops::gemm_batched(dscores_g, false, c.k, false, dq_g);      // dQ = dS K
  ops::gemm_batched(dscores_g, true, q_g, false, dparts[1]);  // dK = dS^T Q
}

}  // namespace meshtron
