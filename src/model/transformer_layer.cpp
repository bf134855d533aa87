#include "model/transformer_layer.hpp"

namespace meshtron {

namespace {
/// `ctx` for the block's linears: the ones column only where the norm before
/// them writes it (a LayerNorm with a bias; an RMSNorm's linears take the
/// plain path).
LayerContext linear_context(const LayerContext& ctx, const NormSpec& norm) {
  LayerContext out = ctx;
  out.bias_in_weight_gemm =
      ctx.bias_in_weight_gemm && norm.kind == NormKind::LayerNorm && norm.bias;
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
      parallel_residual_(c.parallel_residual) {
  require_built(c.block.norm.placement == NormPlacement::Pre, "TransformerLayer",
                "norm placement " + to_string(c.block.norm.placement));
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

Tensor TransformerLayer::forward(const Tensor& x, LayerContext& ctx, Cache& c) const {
  // Without hidden dropout the residual adds ride in the attention's and the
  // MLP's last GEMMs (one cuBLASLt epilogue on one tp rank; the same numbers
  // on the host).
  const bool fuse_residual = !ctx.training || hidden_dropout_ == 0;
  // With it, the residual adds ride in the dropout kernels (dropout_add).
  const Tensor attn_in = ln_1.forward(x, c.ln_1, attention.qkv.takes_ones_column());
  const Tensor h = fuse_residual ? attention.forward_residual(attn_in, x, ctx, c.attention)
                                 : dropout_add(attention.forward(attn_in, ctx, c.attention), x,
                                               kStreamAttentionOut, ctx);
  // A parallel residual's MLP reads the block's input, through its own norm;
  // h = x + attention is then the MLP's residual all the same.
  const Tensor mlp_in =
      ln_2.forward(parallel_residual_ ? x : h, c.ln_2, mlp.fc.takes_ones_column());
  if (fuse_residual) return mlp.forward_residual(mlp_in, h, ctx, c.mlp);
  return dropout_add(mlp.forward(mlp_in, ctx, c.mlp), h, kStreamMlpOut, ctx);
}

Tensor TransformerLayer::forward_cached(const Tensor& x, LayerContext& ctx, const CachedRows& rows,
                                        KvCache::Layer& kv) const {
  Cache c;
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

}  // namespace meshtron
