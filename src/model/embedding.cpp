#include "model/embedding.hpp"

#include <algorithm>
#include <utility>

#include "model/linear.hpp"
#include "ops/cast.hpp"

namespace meshtron {

index_t vocab_begin(const ModelSpec& c, const TensorParallelGroup& tp) {
  return index_t(c.padded_vocab_size / tp.size()) * tp.rank();
}

Parameter make_word_embedding(const ModelSpec& c, const LayerContext& ctx, DType dtype) {
  const index_t rows = c.padded_vocab_size / ctx.tp.size();
  Parameter p;
  p.name = "embedding.word.weight";
  p.global_shape = {c.vocab_size, c.hidden_size};
  p.value = Tensor::zeros({rows, c.hidden_size}, dtype, ctx.space);
  p.grad = Tensor::zeros({rows, c.hidden_size}, grad_dtype_for(dtype), ctx.space);
  p.shard.split_dim = 0;
  const index_t begin = vocab_begin(c, ctx.tp);
  p.padded_rows = std::clamp<index_t>(begin + rows - c.vocab_size, 0, rows);
  return p;
}

Embedding::Embedding(const ModelSpec& c, const LayerContext& ctx, DType dtype)
    : word(make_word_embedding(c, ctx, dtype)), config_(c) {
  if (c.embedding_norm)
    norm.emplace("embedding.norm", c.hidden_size, c.block.norm, dtype, ctx.sequence_parallel,
                 ctx.space);
  if (has_token_type_table()) {
    token_type.name = "embedding.token_type.weight";
    token_type.global_shape = {c.num_token_types, c.hidden_size};
    token_type.value = Tensor::zeros(token_type.global_shape, dtype, ctx.space);
    token_type.grad = Tensor::zeros(token_type.global_shape, grad_dtype_for(dtype), ctx.space);
  }
  if (!has_position_table()) return;  // rotary positions live in the attention
  position.name = "embedding.position.weight";
  position.global_shape = {c.max_positions, c.hidden_size};
  position.value = Tensor::zeros(position.global_shape, dtype, ctx.space);
  position.grad = Tensor::zeros(position.global_shape, grad_dtype_for(dtype), ctx.space);
}

Tensor Embedding::forward(const Tensor& ids, LayerContext& ctx, Cache& c,
                          const Tensor& token_types) const {
  const index_t n = ids.numel();
  c.ids = in_space(ids, ctx.space);
  MESH_VERIFY(token_types.defined() == has_token_type_table() &&
                  (!token_types.defined() || token_types.numel() == n),
              "Embedding: token types [" << n << "] go with a token-type table, and only then");
  // Position ids are built on the host once and kept where the tables live.
  if (has_position_table() &&
      (!positions_.defined() || positions_.numel() != n || positions_.space() != ctx.space ||
       positions_micro_batch_ != ctx.micro_batch)) {
    Tensor positions_host = Tensor::empty({n}, DType::I32);
    auto* pos = positions_host.data<std::int32_t>();
    for (index_t t = 0; t < n; ++t) pos[t] = std::int32_t(t / ctx.micro_batch);  // [s, b] rows
    positions_ = in_space(positions_host, ctx.space);
    positions_micro_batch_ = ctx.micro_batch;
  }
  c.positions = positions_;
  Tensor full = lookup(c.ids, c.positions, ctx);
  if (has_token_type_table()) {
    c.token_types = in_space(token_types, ctx.space);
    Tensor rows = Tensor::empty(full.shape(), full.dtype(), full.space());
    ops::embedding_forward(c.token_types, token_type.value, 0, rows);
    ops::add(full, rows, full);
  }
  Tensor x = ctx.sequence_parallel ? mapping::scatter_to_sp(ctx.tp, full) : full;
  if (norm) x = norm->forward(x, c.norm);
  if (!ctx.training || config_.hidden_dropout == 0) return x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.space());
  ops::dropout_forward(x, config_.hidden_dropout,
                       ctx.hidden_site(kStreamEmbedding, config_.hidden_size), y);
  return y;
}

Tensor Embedding::lookup(const Tensor& ids, const Tensor& positions, LayerContext& ctx) const {
  Tensor partial =
      Tensor::empty({ids.numel(), config_.hidden_size}, word.value.dtype(), word.value.space());
  ops::embedding_forward(ids, word.value, vocab_begin(config_, ctx.tp), partial);
  Tensor full = mapping::reduce_from_tp(ctx.tp, std::move(partial));
  if (has_position_table()) {
    Tensor rows = Tensor::empty(full.shape(), full.dtype(), full.space());
    ops::embedding_forward(positions, position.value, 0, rows);
    ops::add(full, rows, full);
  }
  return full;
}

Tensor Embedding::forward_at(const Tensor& ids, const Tensor& positions, LayerContext& ctx) const {
  return lookup(in_space(ids, ctx.space), in_space(positions, ctx.space), ctx);
}

void Embedding::backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  Tensor dx = dy;
  if (ctx.training && config_.hidden_dropout > 0) {
    dx = Tensor::empty(dy.shape(), dy.dtype(), dy.space());
    ops::dropout_backward(dy, config_.hidden_dropout,
                          ctx.hidden_site(kStreamEmbedding, config_.hidden_size), dx);
  }
  if (norm) dx = norm->backward(dx, c.norm);
  Tensor dfull = ctx.sequence_parallel ? mapping::scatter_to_sp_backward(ctx.tp, dx) : dx;
  if (has_token_type_table()) {
    token_type.zero_stale_grad();
    ops::embedding_backward(c.token_types, dfull, 0, token_type.grad);
  }
  if (has_position_table()) {
    position.zero_stale_grad();  // the scatters add
    ops::embedding_backward(c.positions, dfull, 0, position.grad);
  }
  Tensor dpartial = mapping::reduce_from_tp_backward(ctx.tp, dfull);
  word.zero_stale_grad();  // (a tied table's head GEMM, when it ran first, wrote it)
  ops::embedding_backward(c.ids, dpartial, vocab_begin(config_, ctx.tp), word.grad);
}

LmHeadLoss::LmHeadLoss(const ModelSpec& c, Parameter& w, Parameter* output_bias)
    : word(&w), bias(output_bias), config_(c) {}

Tensor LmHeadLoss::forward(const Tensor& x, const Tensor& targets, LayerContext& ctx,
                           Cache& c) const {
  c.x_full = ctx.sequence_parallel ? mapping::all_gather_from_sp(ctx.tp, x)
                                   : mapping::copy_to_tp(ctx.tp, x);
  const index_t n = c.x_full.dim(0), vocab_local = word->value.dim(0);
  const index_t begin = vocab_begin(config_, ctx.tp);
  c.targets = in_space(targets, ctx.space);
  // Logits in the statistics dtype by default: fp32 on the device even
  // under bf16 operands (the GEMM accumulates and writes fp32), so the
  // softmax and the loss never see bf16-rounded logits. With
  // logits_in_compute_dtype, in the operands' dtype as Megatron-LM's output
  // layer writes them (its loss upcasts them; our loss kernels load them
  // into fp32 likewise): half the bytes for the GEMM to write and for the
  // statistics and the backward to read.
  const DType stats = stats_dtype(x);
  const DType logits_dtype = ctx.logits_in_compute_dtype ? c.x_full.dtype() : stats;
  c.logits = Tensor::empty({n, vocab_local}, logits_dtype, x.space());
  ops::gemm(c.x_full, false, word->value, true, c.logits);
  if (bias) add_output_bias(c.logits);

  // sum_exp and the target logit travel in one all-reduce: [2, n].
  Tensor partials = Tensor::empty({2, n}, stats, x.space());
  Tensor sum_exp = partials.slice_rows(0, 1).reshape({n});
  Tensor target_logit = partials.slice_rows(1, 2).reshape({n});
  if (ctx.tp.size() == 1) {  // the whole vocabulary here: its statistics in one pass
    c.row_max = Tensor::empty({n}, stats, x.space());
    ops::cross_entropy_row_stats(c.logits, c.targets, begin, config_.vocab_size, c.row_max,
                                 sum_exp, target_logit);
  } else {  // the global max first, then the sums relative to it
    Tensor local_max = Tensor::empty({n}, stats, x.space());
    ops::cross_entropy_row_max(c.logits, begin, config_.vocab_size, local_max);
    c.row_max = mapping::reduce_max_from_tp(ctx.tp, local_max);
    ops::cross_entropy_partials(c.logits, c.targets, c.row_max, begin, config_.vocab_size,
                                sum_exp, target_logit);
  }
  Tensor totals = mapping::reduce_from_tp(ctx.tp, std::move(partials));
  c.sum_exp = totals.slice_rows(0, 1).reshape({n});
  Tensor loss = Tensor::empty({n}, stats, x.space());
  ops::cross_entropy_loss(c.sum_exp, totals.slice_rows(1, 2).reshape({n}), loss);
  return loss;
}

void LmHeadLoss::add_output_bias(Tensor& logits) const {
  // The bias in the logits' dtype (fp32 on the device under bf16 weights).
  ops::bias_add(logits, bias->value.dtype() == logits.dtype() ? bias->value
                                                               : bias->value.to(logits.dtype()));
}

Tensor LmHeadLoss::logits(const Tensor& x, LayerContext& ctx) const {
  const Tensor x_full = mapping::copy_to_tp(ctx.tp, x);
  Tensor out = Tensor::empty({x_full.dim(0), word->value.dim(0)}, stats_dtype(x), x.space());
  ops::gemm(x_full, false, word->value, true, out);
  if (bias) add_output_bias(out);
  return out;
}

Tensor LmHeadLoss::backward(const Tensor& dloss, LayerContext& ctx, const Cache& c) {
  const index_t begin = vocab_begin(config_, ctx.tp);
  // dlogits in the GEMMs' operand dtype (bf16 under mixed precision): the
  // kernel rounds the fp32 softmax gradient once, as a cast would.
  Tensor dlogits = Tensor::empty(c.logits.shape(), c.x_full.dtype(), c.logits.space());
  ops::cross_entropy_backward(c.logits, c.targets, c.row_max, c.sum_exp, dloss, begin,
                              config_.vocab_size, dlogits);
  if (bias) ops::bias_backward(dlogits, bias->grad, bias->take_grad_store());
  const Tensor dx_full = matmul(dlogits, word->value);  // dX = dL W
  // Its reduction over tp runs during the weight gradient's GEMM, the
  // backward's largest (vocabulary / tp rows): dW += dL^T X.
  return mapping::reduce_input_grad(ctx.tp, dx_full, ctx.sequence_parallel, [&] {
    ops::gemm(dlogits, true, c.x_full, false, word->grad, 1.0,
              ops::gemm_beta(word->take_grad_store()));
  });
}

std::vector<std::int32_t> host_ints(const Tensor& t) {
  const Tensor host = t.to_host();
  const auto* p = host.data<std::int32_t>();
  return std::vector<std::int32_t>(p, p + host.numel());
}

LabelledTargets labelled_targets(const Tensor& labels, DType weight_dtype) {
  const std::vector<std::int32_t> label = host_ints(labels);
  const index_t n = index_t(label.size());
  LabelledTargets out{Tensor::empty({n}, DType::I32), Tensor::zeros({n}, weight_dtype)};
  const auto count = double(std::count_if(label.begin(), label.end(),
                                          [](std::int32_t v) { return v != -100; }));
  for (index_t i = 0; i < n; ++i) {
    const std::int32_t v = label[std::size_t(i)];
    out.targets.data<std::int32_t>()[i] = v == -100 ? 0 : v;
    if (v != -100) set_element_from_double(out.weights, i, 1.0 / count);
  }
  return out;
}

Tensor spread_by_weights(const Tensor& values, const Tensor& weights, MemorySpace space) {
  const std::vector<double> v = values.to_doubles(), w = weights.to_doubles();
  const index_t n = index_t(v.size());
  Tensor out = Tensor::zeros({n}, values.dtype(), MemorySpace::Host);
  for (index_t i = 0; i < n; ++i)
    set_element_from_double(out, i, double(n) * w[std::size_t(i)] * v[std::size_t(i)]);
  return in_space(out, space);
}

}  // namespace meshtron
