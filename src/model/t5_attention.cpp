#include "model/t5_attention.hpp"

#include <cmath>

#include "common/error.hpp"
#include "ops/head_layout.hpp"

namespace meshtron {

T5Attention::T5Attention(const std::string& name, Kind kind, int stream_layer,
                         std::uint32_t probs_site, index_t hidden, const AttentionSpec& spec,
                         double dropout, const LayerContext& ctx, DType dtype)
    : in(name + (kind == Kind::Self ? ".qkv" : ".q"), hidden,
         (kind == Kind::Self ? 3 : 1) * spec.context_width(), kind == Kind::Self ? 3 : 1,
         ctx, dtype, /*bias=*/false),
      proj(name + ".proj", spec.context_width(), hidden, ctx, dtype,
           /*epilogue_rank=*/stream_layer, /*bias=*/false),
      kind_(kind),
      stream_layer_(stream_layer),
      probs_site_(probs_site),
      heads_local_(spec.num_heads / ctx.tp.size()),
      head_dim_(spec.head_dim),
      scale_(spec.scale_scores ? 1.0 / std::sqrt(double(spec.head_dim)) : 1.0),
      dropout_(dropout) {
  MESH_REQUIRE(spec.num_heads % ctx.tp.size() == 0,
               "T5: num_heads = " << spec.num_heads << " is not a multiple of tp = "
                                  << ctx.tp.size());
  MESH_REQUIRE(spec.num_query_groups == spec.num_heads,
               "T5: grouped queries (num_query_groups = " << spec.num_query_groups
                                                          << ") are not built");
  if (kind == Kind::Cross)
    kv.emplace(name + ".kv", hidden, 2 * spec.context_width(), /*fused_parts=*/2,
               ctx, dtype, /*bias=*/false);
}

void T5Attention::collect(ParameterList& out) {
  in.collect(out);
  if (kv) kv->collect(out);
  proj.collect(out);
}

ops::DropoutSite T5Attention::probs_site(const LayerContext& ctx, index_t sq, index_t sk) const {
  // probs [b, heads_local, sq*sk]: global index ((sample * heads + head) * sq*sk + ij).
  ops::DropoutSite site;
  site.seed = ctx.seed;
  site.step = ctx.step;
  site.stream = std::uint32_t(stream_layer_) * kStreamsPerLayer + probs_site_;
  site.a = ctx.micro_batch;
  site.b = heads_local_;
  site.c = sq * sk;
  site.a_offset = ctx.sample_offset;
  site.b_offset = index_t(ctx.tp.rank()) * heads_local_;
  site.b_global = index_t(heads_local_) * ctx.tp.size();
  site.c_global = site.c;
  site.live = ctx.dropout_live;
  site.sample_axis = 0;
  return site;
}

void T5Attention::attention_probs(const Tensor& q, const Tensor& k,
                                  const ops::SoftmaxMasks& masks, const LayerContext& ctx,
                                  Tensor& probs, Tensor& probs_kept) const {
  const index_t sq = q.dim(1), sk = k.dim(1);
  Tensor scores = Tensor::empty({q.dim(0), sq, sk}, q.dtype(), q.space());
  ops::gemm_batched(q, false, k, true, scores);
  probs = Tensor::empty(scores.shape(), q.dtype(), q.space());
  ops::attention_softmax_forward(scores, scale_, masks, probs);
  probs_kept = probs;
  if (ctx.training && dropout_ > 0) {
    probs_kept = Tensor::empty(probs.shape(), q.dtype(), q.space());
    ops::dropout_forward(probs, dropout_, probs_site(ctx, sq, sk), probs_kept);
  }
}

Tensor T5Attention::forward(const Tensor& x, const Tensor& memory,
                            const ops::SoftmaxMasks& masks, LayerContext& ctx, Cache& c) const {
  // The projections' outputs hold every token (under sequence parallelism
  // the column-parallel linears gather the shards of x and memory first).
  const index_t b = ctx.micro_batch;
  const Tensor projected = in.forward(x, ctx, c.in);
  const index_t sq = projected.dim(0) / b;
  if (kind_ == Kind::Self) {
    Tensor parts[3];
    ops::split_heads(projected, sq, b, heads_local_, 3, parts);
    c.q = parts[0];
    c.k = parts[1];
    c.v = parts[2];
  } else {
    MESH_VERIFY(memory.defined(), "T5Attention: cross-attention needs the encoder's output");
    ops::split_heads(projected, sq, b, heads_local_, 1, &c.q);
    const Tensor kv_out = kv->forward(memory, ctx, c.kv);
    Tensor parts[2];
    ops::split_heads(kv_out, kv_out.dim(0) / b, b, heads_local_, 2, parts);
    c.k = parts[0];
    c.v = parts[1];
  }
  Tensor probs, probs_kept;
  attention_probs(c.q, c.k, masks, ctx, probs, probs_kept);
  Tensor context = Tensor::empty(c.q.shape(), c.q.dtype(), c.q.space());
  ops::gemm_batched(probs_kept, false, c.v, false, context);
  const bool keep = ctx.recompute != Recompute::Selective;
  c.probs = keep ? probs : Tensor();
  c.probs_kept = keep ? probs_kept : Tensor();
  Tensor merged;
  ops::merge_heads(&context, 1, sq, b, heads_local_, merged);
  return proj.forward(merged, ctx, c.proj);
}

Tensor T5Attention::backward(const Tensor& dy, const ops::SoftmaxMasks& masks, LayerContext& ctx,
                             const Cache& c, Tensor* dbias, Tensor* dmemory) {
  const index_t b = ctx.micro_batch, sq = c.q.dim(1), sk = c.k.dim(1);
  Tensor probs = c.probs, probs_kept = c.probs_kept;
  if (!probs.defined()) attention_probs(c.q, c.k, masks, ctx, probs, probs_kept);
  Tensor dcontext;
  ops::split_heads(proj.backward(dy, ctx, c.proj), sq, b, heads_local_, 1, &dcontext);
  Tensor dprobs = Tensor::empty(probs.shape(), dy.dtype(), dy.space());
  ops::gemm_batched(dcontext, false, c.v, true, dprobs);  // dP = dC V^T
  Tensor dv = Tensor::empty(c.v.shape(), dy.dtype(), dy.space());
  ops::gemm_batched(probs_kept, true, dcontext, false, dv);  // dV = P^T dC
  if (ctx.training && dropout_ > 0)
    ops::dropout_backward(dprobs, dropout_, probs_site(ctx, sq, sk), dprobs);
  Tensor dlogits = Tensor::empty(probs.shape(), dy.dtype(), dy.space());
  ops::attention_softmax_backward(dprobs, probs, dlogits);
  if (dbias) ops::attention_bias_backward(dlogits, heads_local_, *dbias);
  if (scale_ != 1.0) ops::scale(dlogits, scale_);  // now d(scores)
  Tensor dq = Tensor::empty(c.q.shape(), dy.dtype(), dy.space());
  Tensor dk = Tensor::empty(c.k.shape(), dy.dtype(), dy.space());
  ops::gemm_batched(dlogits, false, c.k, false, dq);  // dQ = dS K
  ops::gemm_batched(dlogits, true, c.q, false, dk);   // dK = dS^T Q
  Tensor merged;
  if (kind_ == Kind::Self) {
    const Tensor parts[3] = {dq, dk, dv};
    ops::merge_heads(parts, 3, sq, b, heads_local_, merged);
    return in.backward(merged, ctx, c.in);
  }
  const Tensor kv_parts[2] = {dk, dv};
  Tensor dkv;
  ops::merge_heads(kv_parts, 2, sk, b, heads_local_, dkv);
  Tensor dmem = kv->backward(dkv, ctx, c.kv);
  MESH_VERIFY(dmemory, "T5Attention: cross-attention's backward needs a d(memory)");
  if (dmemory->defined()) ops::add(*dmemory, dmem, *dmemory);
  else *dmemory = dmem;
  ops::merge_heads(&dq, 1, sq, b, heads_local_, merged);
  return in.backward(merged, ctx, c.in);
}

T5Attention::KeyValues T5Attention::make_cache(index_t b, index_t capacity, DType dtype,
                                               MemorySpace space) const {
  const Shape shape{b * heads_local_, capacity, head_dim_};
  return {Tensor::zeros(shape, dtype, space), Tensor::zeros(shape, dtype, space)};
}

T5Attention::KeyValues T5Attention::key_values(const Tensor& memory, LayerContext& ctx) const {
  MESH_VERIFY(kv && !ctx.sequence_parallel,
              "T5Attention::key_values: cross-attention without sequence parallelism only");
  ColumnParallelLinear::Cache scratch;
  const Tensor kv_out = kv->forward(memory, ctx, scratch);
  Tensor parts[2];
  ops::split_heads(kv_out, kv_out.dim(0) / ctx.micro_batch, ctx.micro_batch, heads_local_, 2,
                   parts);
  return {parts[0], parts[1]};
}

Tensor T5Attention::forward_step(const Tensor& x, index_t position,
                                 const ops::SoftmaxMasks& masks, LayerContext& ctx,
                                 KeyValues& kv) const {
  MESH_VERIFY(!ctx.sequence_parallel && x.dim(0) == ctx.micro_batch,
              "T5Attention::forward_step: one row per sample, no sequence parallelism");
  const index_t b = ctx.micro_batch, matrices = b * heads_local_;
  ColumnParallelLinear::Cache scratch;
  const Tensor projected = in.forward(x, ctx, scratch);
  Tensor q;
  if (kind_ == Kind::Self) {
    Tensor parts[3];
    ops::split_heads(projected, 1, b, heads_local_, 3, parts);
    q = parts[0];
    // Row `position` of every (sample, head) matrix of the cache.
    const index_t capacity = kv.k.dim(1);
    MESH_VERIFY(position < capacity, "T5Attention::forward_step: position " << position
                                                                            << " past the cache's "
                                                                            << capacity);
    for (int p = 1; p <= 2; ++p) {
      Tensor rows = (p == 1 ? kv.k : kv.v).reshape({matrices * capacity, head_dim_});
      const Tensor fresh = parts[p].reshape({matrices, head_dim_});
      for (index_t m = 0; m < matrices; ++m)
        rows.slice_rows(m * capacity + position, m * capacity + position + 1)
            .copy_from(fresh.slice_rows(m, m + 1));
    }
  } else {
    ops::split_heads(projected, 1, b, heads_local_, 1, &q);
  }
  Tensor scores = Tensor::empty({matrices, 1, kv.k.dim(1)}, q.dtype(), q.space());
  ops::gemm_batched(q, false, kv.k, true, scores);
  Tensor probs = Tensor::empty(scores.shape(), q.dtype(), q.space());
  ops::attention_softmax_forward(scores, scale_, masks, probs);
  Tensor context = Tensor::empty(q.shape(), q.dtype(), q.space());
  ops::gemm_batched(probs, false, kv.v, false, context);
  Tensor merged;
  ops::merge_heads(&context, 1, 1, b, heads_local_, merged);
  RowParallelLinear::Cache proj_scratch;
  return proj.forward(merged, ctx, proj_scratch);
}

}  // namespace meshtron
