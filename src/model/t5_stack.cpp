#include "model/t5_stack.hpp"

#include "common/error.hpp"

namespace meshtron {

namespace {
std::string block_name(const std::string& prefix, int index) {
  return prefix + ".layers." + std::to_string(index);
}

Parameter relative_bias_param(const std::string& name, const ModelSpec& spec,
                              const LayerContext& ctx, DType dtype) {
  const index_t buckets = spec.relative_attention_num_buckets, heads = spec.num_heads();
  Parameter p;
  p.name = name + ".relative_bias.weight";
  p.global_shape = {buckets, heads};
  const Shape local{buckets, heads / ctx.tp.size()};
  p.value = Tensor::zeros(local, dtype, ctx.space);
  p.grad = Tensor::zeros(local, grad_dtype_for(dtype), ctx.space);
  p.shard.split_dim = 1;  // the heads' columns
  return p;
}
}  // namespace

T5Block::T5Block(const std::string& prefix, int index, int stream_layer, bool decoder,
                 const ModelSpec& s, const LayerContext& ctx, DType dtype)
    : ln_1(block_name(prefix, index) + ".ln_1", s.hidden_size, s.block.norm, dtype,
           ctx.sequence_parallel, ctx.space),
      self_attention(block_name(prefix, index) + (decoder ? ".self_attention" : ".attention"),
                     T5Attention::Kind::Self, stream_layer, kStreamAttentionProbs, s.hidden_size,
                     s.block.attention, s.attention_dropout, ctx, dtype),
      ln_mlp(block_name(prefix, index) + (decoder ? ".ln_3" : ".ln_2"), s.hidden_size,
             s.block.norm, dtype, ctx.sequence_parallel, ctx.space),
      mlp(block_name(prefix, index) + ".mlp", stream_layer, s.hidden_size, s.block.mlp,
          ctx, dtype,
          MlpInnerDropout{s.hidden_dropout,
                          std::uint32_t(stream_layer) * kStreamsPerLayer + kStreamMlpInner}),
      stream_layer_(stream_layer),
      hidden_dropout_(s.hidden_dropout) {
  if (!decoder) return;
  ln_cross.emplace(block_name(prefix, index) + ".ln_2", s.hidden_size, s.block.norm, dtype,
                   ctx.sequence_parallel, ctx.space);
  cross_attention.emplace(block_name(prefix, index) + ".cross_attention",
                          T5Attention::Kind::Cross, stream_layer, kStreamCrossAttentionProbs,
                          s.hidden_size, s.block.attention, s.attention_dropout, ctx, dtype);
}

void T5Block::collect(ParameterList& out) {
  ln_1.collect(out);
  self_attention.collect(out);
  if (ln_cross) ln_cross->collect(out);
  if (cross_attention) cross_attention->collect(out);
  ln_mlp.collect(out);
  mlp.collect(out);
}

Tensor T5Block::add_branch(const Tensor& branch, const Tensor& residual, std::uint32_t site,
                           const LayerContext& ctx) const {
  Tensor out = Tensor::empty(branch.shape(), branch.dtype(), branch.space());
  if (!ctx.training || hidden_dropout_ == 0) {
    ops::add(branch, residual, out);
    return out;
  }
  ops::dropout_add(branch, residual, hidden_dropout_,
                   ctx.hidden_site(std::uint32_t(stream_layer_) * kStreamsPerLayer + site,
                                   branch.dim(1)),
                   out);
  return out;
}

Tensor T5Block::branch_backward(const Tensor& dy, std::uint32_t site,
                                const LayerContext& ctx) const {
  if (!ctx.training || hidden_dropout_ == 0) return dy;
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.space());
  ops::dropout_backward(
      dy, hidden_dropout_,
      ctx.hidden_site(std::uint32_t(stream_layer_) * kStreamsPerLayer + site, dy.dim(1)), dx);
  return dx;
}

Tensor T5Block::forward(const Tensor& x, const Tensor& memory, const T5Masks& masks,
                        LayerContext& ctx, Cache& c) const {
  Tensor h = add_branch(
      self_attention.forward(ln_1.forward(x, c.ln_1), Tensor(), masks.self, ctx, c.self_attention),
      x, kStreamAttentionOut, ctx);
  if (cross_attention)
    h = add_branch(cross_attention->forward(ln_cross->forward(h, c.ln_cross), memory, masks.cross,
                                            ctx, c.cross_attention),
                   h, kStreamCrossAttentionOut, ctx);
  return add_branch(mlp.forward(ln_mlp.forward(h, c.ln_mlp), ctx, c.mlp), h, kStreamMlpOut, ctx);
}

Tensor T5Block::forward_step(const Tensor& x, index_t position, const T5Masks& masks,
                             LayerContext& ctx, T5Attention::KeyValues& self_kv,
                             T5Attention::KeyValues& cross_kv) const {
  MESH_VERIFY(cross_attention, "T5Block::forward_step: a decoder block's");
  LayerNorm::Cache scratch;
  Tensor h = Tensor::empty(x.shape(), x.dtype(), x.space());
  ops::add(x, self_attention.forward_step(ln_1.forward(x, scratch), position, masks.self, ctx,
                                          self_kv),
           h);
  ops::add(h, cross_attention->forward_step(ln_cross->forward(h, scratch), position, masks.cross,
                                            ctx, cross_kv),
           h);
  Mlp::Cache mlp_scratch;
  return mlp.forward_residual(ln_mlp.forward(h, scratch), h, ctx, mlp_scratch);
}

Tensor T5Block::forward_checkpointed(const Tensor& x, const Tensor& memory, const T5Masks& masks,
                                     LayerContext& ctx, Cache& c) const {
  Cache discarded;  // freed on return: only the input outlives the forward
  Tensor out = forward(x, memory, masks, ctx, discarded);
  c = Cache{};
  c.input = x;
  c.checkpointed = true;
  return out;
}

Tensor T5Block::backward(const Tensor& dy, const Tensor& memory, const T5Masks& masks,
                         LayerContext& ctx, const Cache& c, Tensor& dbias, Tensor& dmemory) {
  if (!c.checkpointed) return backward_stored(dy, masks, ctx, c, dbias, dmemory);
  // Same inputs and dropout counters: the rebuilt activations equal the first ones.
  Cache rebuilt;
  forward(c.input, memory, masks, ctx, rebuilt);
  return backward_stored(dy, masks, ctx, rebuilt, dbias, dmemory);
}

Tensor T5Block::backward_stored(const Tensor& dy, const T5Masks& masks, LayerContext& ctx,
                                const Cache& c, Tensor& dbias, Tensor& dmemory) {
  // Each norm's backward adds the residual's gradient (the branch's dy).
  Tensor dh = ln_mlp.backward(mlp.backward(branch_backward(dy, kStreamMlpOut, ctx), ctx, c.mlp),
                              c.ln_mlp, &dy);
  if (cross_attention) {
    const Tensor dcross = cross_attention->backward(
        branch_backward(dh, kStreamCrossAttentionOut, ctx), masks.cross, ctx, c.cross_attention,
        nullptr, &dmemory);
    dh = ln_cross->backward(dcross, c.ln_cross, &dh);
  }
  const Tensor dself = self_attention.backward(branch_backward(dh, kStreamAttentionOut, ctx),
                                               masks.self, ctx, c.self_attention, &dbias, nullptr);
  return ln_1.backward(dself, c.ln_1, &dh);
}

T5Stack::T5Stack(const std::string& name, bool decoder, const ModelSpec& s,
                 int first_stream_layer, std::uint32_t final_stream, const LayerContext& ctx,
                 DType dtype, std::optional<T5StackPart> part)
    : relative_bias(relative_bias_param(name, s, ctx, dtype)),
      decoder_(decoder),
      num_buckets_(s.relative_attention_num_buckets),
      max_distance_(s.relative_attention_max_distance),
      heads_local_(s.num_heads() / ctx.tp.size()),
      hidden_dropout_(s.hidden_dropout),
      final_stream_(final_stream) {
  const T5StackPart here =
      part.value_or(T5StackPart::whole(decoder ? s.num_decoder_layers : s.num_layers));
  if (here.final_norm)
    final_norm.emplace(name + ".final_norm", s.hidden_size, s.block.norm, dtype,
                       ctx.sequence_parallel, ctx.space);
  blocks.reserve(std::size_t(here.count));
  for (int i = here.first; i < here.first + here.count; ++i)
    blocks.emplace_back(name, i, first_stream_layer + i, decoder, s, ctx, dtype);
  relative_bias.stage_copy = here.first > 0;
}

void T5Stack::collect(ParameterList& out) {
  if (!blocks.empty()) out.push_back(&relative_bias);
  for (auto& block : blocks) block.collect(out);
  if (final_norm) final_norm->collect(out);
}

DType T5Stack::bias_dtype(const LayerContext& ctx) const {
  return relative_bias.value.dtype() == DType::F64 && ctx.space == MemorySpace::Host ? DType::F64
                                                                                       : DType::F32;
}

Tensor T5Stack::position_bias(index_t sq, index_t sk, index_t query_offset,
                              const LayerContext& ctx, Tensor* buckets_out) const {
  // Made on the host once per shape and kept where the table lives: an
  // upload every micro-batch (a pageable copy) would make the host wait for
  // the device mid-step, as Embedding's position ids would.
  const std::array<index_t, 3> key{sq, sk, query_offset};
  if (!buckets_.defined() || buckets_key_ != key || buckets_.space() != ctx.space) {
    buckets_ = in_space(ops::relative_position_buckets(sq, sk, /*bidirectional=*/!decoder_,
                                                       num_buckets_, max_distance_, query_offset),
                        ctx.space);
    buckets_key_ = key;
  }
  const Tensor buckets = buckets_;
  Tensor bias = Tensor::empty({heads_local_, sq, sk}, bias_dtype(ctx), ctx.space);
  ops::relative_bias_forward(relative_bias.value, buckets, bias);
  if (buckets_out) *buckets_out = buckets;
  return bias;
}

Tensor T5Stack::forward(const Tensor& x, const Tensor& key_mask, const Tensor& memory,
                        const Tensor& memory_mask, LayerContext& ctx, Cache& c) const {
  const index_t s = ctx.seq_length;
  c.masks = T5Masks{};
  c.masks.self.heads = c.masks.cross.heads = heads_local_;
  c.masks.self.bias = position_bias(s, s, 0, ctx, &c.buckets);
  c.masks.self.key_mask = key_mask;
  c.masks.self.causal = decoder_;
  c.masks.cross.key_mask = memory_mask;
  c.memory = memory;
  c.blocks.resize(blocks.size());
  Tensor h = x;
  for (std::size_t i = 0; i < blocks.size(); ++i)
    h = ctx.recompute_layer(int(i))
            ? blocks[i].forward_checkpointed(h, memory, c.masks, ctx, c.blocks[i])
            : blocks[i].forward(h, memory, c.masks, ctx, c.blocks[i]);
  if (!final_norm) return h;
  Tensor out = final_norm->forward(h, c.final_norm);
  if (ctx.training && hidden_dropout_ > 0)
    ops::dropout_forward(out, hidden_dropout_, final_site(ctx), out);
  return out;
}

Tensor T5Stack::backward(const Tensor& dy, LayerContext& ctx, const Cache& c, Tensor* dmemory) {
  Tensor dx = dy;
  if (final_norm) {
    if (ctx.training && hidden_dropout_ > 0) {
      dx = Tensor::empty(dy.shape(), dy.dtype(), dy.space());
      ops::dropout_backward(dy, hidden_dropout_, final_site(ctx), dx);
    }
    dx = final_norm->backward(dx, c.final_norm);
  }
  // The blocks' d(bias) summed here, then scattered into the table once.
  Tensor dbias = Tensor::zeros(c.masks.self.bias.shape(), bias_dtype(ctx), ctx.space);
  Tensor unused;
  for (std::size_t i = blocks.size(); i-- > 0;)
    dx = blocks[i].backward(dx, c.memory, c.masks, ctx, c.blocks[i], dbias,
                            dmemory ? *dmemory : unused);
  relative_bias.zero_stale_grad();
  ops::relative_bias_backward(dbias, c.buckets, relative_bias.grad);
  return dx;
}

}  // namespace meshtron
