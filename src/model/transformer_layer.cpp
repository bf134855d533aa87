#include "model/transformer_layer.hpp"

namespace meshtron {

namespace {
/// `ctx` for the block's linears: the ones column only where the norm before
/// them writes it (a pre-norm LayerNorm with a bias; an RMSNorm's linears,
/// and a post-norm block's, take the plain path).
LayerContext linear_context(const LayerContext& ctx, const NormSpec& norm) {
  LayerContext out = ctx;
  out.bias_in_weight_gemm = ctx.bias_in_weight_gemm && norm.kind == NormKind::LayerNorm &&
                            norm.bias && norm.placement == NormPlacement::Pre;
  return out;
}

Tensor sum(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.space());
  ops::add(a, b, out);
  return out;
}
}  // namespace

TransformerLayer::TransformerLayer(int index, const ModelSpec& c, const LayerContext& ctx,
                                   DType dtype)
    : ln_1("layers." + std::to_string(index) + ".ln_1", c.hidden_size, c.block.norm, dtype,
           ctx.sequence_parallel, ctx.space),
      attention("layers." + std::to_string(index) + ".attention", index, c.hidden_size,
                c.block.attention, c.attention_dropout, linear_context(ctx, c.block.norm),
                dtype),
      ln_2("layers." + std::to_string(index) + ".ln_2", c.hidden_size, c.block.norm, dtype,
           ctx.sequence_parallel, ctx.space),
      mlp("layers." + std::to_string(index) + ".mlp", index, c.hidden_size, c.block.mlp,
          linear_context(ctx, c.block.norm), dtype),
      index_(index),
      hidden_dropout_(c.hidden_dropout),
      parallel_residual_(c.parallel_residual),
      post_norm_(c.block.norm.placement == NormPlacement::Post) {
  require_built(!(post_norm_ && parallel_residual_), "TransformerLayer",
                "a parallel residual with norm placement post");
}

void TransformerLayer::collect(ParameterList& out) {
  ln_1.collect(out);
  attention.collect(out);
  ln_2.collect(out);
  mlp.collect(out);
}

ops::DropoutSite TransformerLayer::site(std::uint32_t site_in_layer, const LayerContext& ctx,
                                        index_t hidden) const {
  return ctx.hidden_site(std::uint32_t(index_) * kStreamsPerLayer + site_in_layer, hidden);
}

Tensor TransformerLayer::dropout_add(const Tensor& x, const Tensor& residual,
                                     std::uint32_t site_in_layer, const LayerContext& ctx) const {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.space());
  ops::dropout_add(x, residual, hidden_dropout_, site(site_in_layer, ctx, x.dim(1)), out);
  return out;
}

Tensor TransformerLayer::dropout_backward(const Tensor& dy, std::uint32_t site_in_layer,
                                          const LayerContext& ctx) const {
  if (!ctx.training || hidden_dropout_ == 0) return dy;
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.space());
  ops::dropout_backward(dy, hidden_dropout_, site(site_in_layer, ctx, dy.dim(1)), dx);
  return dx;
}

template <class Branch>
Tensor TransformerLayer::residual_branch(Branch& branch, const Tensor& x, const Tensor& residual,
                                         std::uint32_t site_in_layer, LayerContext& ctx,
                                         typename Branch::Cache& cache) const {
  // Without hidden dropout the residual add rides in the branch's last GEMM
  // (one cuBLASLt epilogue on one tp rank; the same numbers on the host).
  if (!ctx.training || hidden_dropout_ == 0)
    return branch.forward_residual(x, residual, ctx, cache);
  // With it, the residual add rides in the dropout kernel (dropout_add).
  return dropout_add(branch.forward(x, ctx, cache), residual, site_in_layer, ctx);
}

Tensor TransformerLayer::forward(const Tensor& x, LayerContext& ctx, Cache& c) const {
  if (post_norm_) return forward_post_norm(x, ctx, c);
  const Tensor attn_in = ln_1.forward(x, c.ln_1, attention.qkv.takes_ones_column());
  const Tensor h = residual_branch(attention, attn_in, x, kStreamAttentionOut, ctx, c.attention);
  // A parallel residual's MLP reads the block's input, through its own norm;
  // h = x + attention is then the MLP's residual all the same.
  const Tensor mlp_in =
      ln_2.forward(parallel_residual_ ? x : h, c.ln_2, mlp.fc.takes_ones_column());
  return residual_branch(mlp, mlp_in, h, kStreamMlpOut, ctx, c.mlp);
}

Tensor TransformerLayer::forward_post_norm(const Tensor& x, LayerContext& ctx, Cache& c) const {
  const Tensor h = ln_1.forward(
      residual_branch(attention, x, x, kStreamAttentionOut, ctx, c.attention), c.ln_1);
  return ln_2.forward(residual_branch(mlp, h, h, kStreamMlpOut, ctx, c.mlp), c.ln_2);
}

Tensor TransformerLayer::forward_cached(const Tensor& x, LayerContext& ctx, const CachedRows& rows,
                                        KvCache::Layer& kv) const {
  Cache c;
  if (post_norm_) {
    const Tensor h = ln_1.forward(attention.forward_cached(x, x, ctx, rows, kv), c.ln_1);
    return ln_2.forward(mlp.forward_residual(h, h, ctx, c.mlp), c.ln_2);
  }
  const Tensor attn_in = ln_1.forward(x, c.ln_1, attention.qkv.takes_ones_column());
  const Tensor h = attention.forward_cached(attn_in, x, ctx, rows, kv);
  const Tensor mlp_in = ln_2.forward(h, c.ln_2, mlp.fc.takes_ones_column());
  return mlp.forward_residual(mlp_in, h, ctx, c.mlp);
}

Tensor TransformerLayer::forward_checkpointed(const Tensor& x, LayerContext& ctx,
                                              Cache& c) const {
  Cache discarded;  // freed on return: only the input outlives the forward
  Tensor out = forward(x, ctx, discarded);
  c = Cache{};
  c.input = x;
  c.checkpointed = true;
  return out;
}

Tensor TransformerLayer::backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  if (!c.checkpointed) return backward_stored(dy, ctx, c);
  // Same inputs, same dropout counters (step, layer, global position), same
  // kernels: the rebuilt activations equal the discarded ones bit for bit.
  Cache rebuilt;
  forward(c.input, ctx, rebuilt);
  return backward_stored(dy, ctx, rebuilt);
}

Tensor TransformerLayer::backward_stored(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  if (post_norm_) return backward_post_norm(dy, ctx, c);
  // dh = dy + d(mlp branch); dx = dh + d(attention branch). The residual
  // sums happen inside the layernorm backwards (one pass fewer each). With
  // a parallel residual the attention's output gradient is dy itself (and
  // dh, the MLP branch's share of dx, still joins it at ln_1).
  Tensor dh = ln_2.backward(mlp.backward(dropout_backward(dy, kStreamMlpOut, ctx), ctx, c.mlp),
                            c.ln_2, &dy, ctx.layernorm_grads);
  const Tensor& d_attention_out = parallel_residual_ ? dy : dh;
  return ln_1.backward(
      attention.backward(dropout_backward(d_attention_out, kStreamAttentionOut, ctx), ctx,
                         c.attention),
      c.ln_1, &dh, ctx.layernorm_grads);
}

Tensor TransformerLayer::backward_post_norm(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  // d(h + mlp branch) = ln_2's backward of dy; dh = that + d(mlp branch);
  // d(x + attention branch) = ln_1's backward of dh; dx = that + d(attention
  // branch). The residual gradient enters each norm's input, not its output,
  // so the adds are kernels of their own.
  const Tensor d_mlp_sum = ln_2.backward(dy, c.ln_2, nullptr, ctx.layernorm_grads);
  const Tensor dh = sum(
      mlp.backward(dropout_backward(d_mlp_sum, kStreamMlpOut, ctx), ctx, c.mlp), d_mlp_sum);
  const Tensor d_attention_sum = ln_1.backward(dh, c.ln_1, nullptr, ctx.layernorm_grads);
  return sum(attention.backward(dropout_backward(d_attention_sum, kStreamAttentionOut, ctx), ctx,
                                c.attention),
             d_attention_sum);
}

}  // namespace meshtron
