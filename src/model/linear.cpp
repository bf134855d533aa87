#include "model/linear.hpp"

#include <utility>

namespace meshtron {

Tensor matmul(const Tensor& x, const Tensor& w) {
  Tensor y = Tensor::empty({x.dim(0), w.dim(1)}, x.dtype(), x.space());
  ops::gemm(x, false, w, false, y);
  return y;
}

Tensor matmul_bias(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor y = Tensor::empty({x.dim(0), w.dim(1)}, x.dtype(), x.space());
  ops::gemm_bias(x, false, w, false, b, y);
  return y;
}

namespace {

Parameter make_param(const std::string& name, Shape global, Shape local, ShardSpec shard,
                     bool decay, DType dtype, MemorySpace space) {
  Parameter p;
  p.name = name;
  p.global_shape = std::move(global);
  p.value = Tensor::zeros(local, dtype, space);
  p.grad = Tensor::zeros(local, grad_dtype_for(dtype), space);
  p.shard = shard;
  p.weight_decay = decay;
  return p;
}

/// A linear's bias: make_param's, or without one an empty Parameter (its
/// name only) that no list and no op sees.
Parameter bias_param(bool present, const std::string& name, Shape global, Shape local,
                     ShardSpec shard, DType dtype, MemorySpace space) {
  if (present)
    return make_param(name, std::move(global), std::move(local), shard, false, dtype, space);
  Parameter absent;
  absent.name = name;
  return absent;
}

/// dW += X^T dY and, with a bias, db += colsum(dY).
void accumulate_weight_grads(const Tensor& x, const Tensor& dy, Parameter& w, Parameter* b) {
  if (!b) {
    ops::gemm(x, true, dy, false, w.grad, 1.0, ops::gemm_beta(w.take_grad_store()));
    return;
  }
  ops::linear_weight_grads(x, dy, w.grad, b->grad, w.take_grad_store(), b->take_grad_store());
}

/// Rows of the GEMM input: x's, times tp under SP (the all-gathered tokens).
index_t gathered_rows(const Tensor& x, const LayerContext& ctx) {
  return x.dim(0) * (ctx.sequence_parallel ? ctx.tp.size() : 1);
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(const std::string& name, index_t in, index_t out,
                                           int fused_parts, const LayerContext& ctx,
                                           DType dtype, bool bias)
    : weight(make_param(name + ".weight", {in, out}, {in, out / ctx.tp.size()},
                        {1, fused_parts, false}, true, dtype, ctx.space)),
      bias(bias_param(bias, name + ".bias", {out}, {out / ctx.tp.size()},
                      {0, fused_parts, false}, dtype, ctx.space)),
      has_bias_(bias),
      ones_column_(ctx.bias_in_weight_gemm && bias) {
  if (ones_column_) place_in_blocks(dtype, ctx.space);
}

void ColumnParallelLinear::place_in_blocks(DType dtype, MemorySpace space) {
  const index_t in = weight.value.dim(0), out = weight.value.dim(1);
  const Shape block{in + ops::kOnesColumnWidth, out};
  auto place = [&](Tensor block_tensor, Tensor Parameter::*field) {
    weight.*field = block_tensor.slice_rows(0, in);
    bias.*field = block_tensor.slice_rows(in, in + 1).reshape({out});
  };
  place(Tensor::zeros(block, dtype, space), &Parameter::value);
  place(Tensor::zeros(block, grad_dtype_for(dtype), space), &Parameter::grad);
  bias.trailing_padding = (ops::kOnesColumnWidth - 1) * out;
}

Tensor ColumnParallelLinear::block_of(Tensor Parameter::*field) const {
  const Tensor& w = weight.*field;
  const Tensor& b = bias.*field;
  const index_t in = w.dim(0), out = w.dim(1);
  MESH_VERIFY(static_cast<const char*>(w.raw()) + w.bytes() == b.raw() &&
                  bias.trailing_padding == (ops::kOnesColumnWidth - 1) * out,
              weight.name << " and " << bias.name
                          << " left their block (the ones column needs the bias row right "
                             "after the weight, then its padding)");
  return Tensor::view(w.raw(), {in + ops::kOnesColumnWidth, out}, w.dtype(), w.space());
}

Tensor ColumnParallelLinear::input_for_gemm(const Tensor& x, LayerContext& ctx,
                                            Cache& cache) const {
  const Tensor x_full = ctx.sequence_parallel ? mapping::all_gather_from_sp(ctx.tp, x)
                                              : mapping::copy_to_tp(ctx.tp, x);
  cache.x = ctx.sequence_parallel && !ctx.keep_gathered_input ? x : x_full;
  return x_full;
}

void ColumnParallelLinear::multiply_gathered(const Tensor& x, LayerContext& ctx, Cache& cache,
                                             const RowMultiply& multiply) const {
  const index_t ranks = ctx.tp.size();
  if (!(ctx.sequence_sharded() && ctx.split_column_parallel_forward)) {
    const Tensor x_full = input_for_gemm(x, ctx, cache);
    multiply(x_full, 0, x_full.dim(0));
    return;
  }
  const index_t rows = x.dim(0), me = ctx.tp.rank();
  Shape full_shape = x.shape();
  full_shape[0] *= ranks;
  Tensor x_full = Tensor::empty(full_shape, x.dtype(), x.space());
  cache.x = ctx.keep_gathered_input ? x_full : x;  // the gather fills every row, own ones too
  const std::vector<std::size_t> counts(std::size_t(ranks), std::size_t(x.numel()));
  const long gather = ctx.tp.comm.iall_gather(x.raw(), x_full.raw(), counts, x.dtype());
  multiply(x, me * rows, (me + 1) * rows);
  ctx.tp.comm.wait_collective(gather);
  if (me > 0) multiply(x_full.slice_rows(0, me * rows), 0, me * rows);
  if (me + 1 < ranks)
    multiply(x_full.slice_rows((me + 1) * rows, ranks * rows), (me + 1) * rows, ranks * rows);
}

Tensor ColumnParallelLinear::forward(const Tensor& x, LayerContext& ctx,
                                     Cache& cache) const {
  const index_t tokens = gathered_rows(x, ctx);
  Tensor y = Tensor::empty({tokens, weight.value.dim(1)}, x.dtype(), x.space());
  const Tensor block = ones_column_ ? block_of(&Parameter::value) : Tensor();
  multiply_gathered(x, ctx, cache, [&](const Tensor& rows, index_t begin, index_t end) {
    Tensor out = y.slice_rows(begin, end);
    if (ones_column_)
      ops::gemm(rows, false, block, false, out);
    else if (has_bias_)
      ops::gemm_bias(rows, false, weight.value, false, bias.value, out);
    else
      ops::gemm(rows, false, weight.value, false, out);
  });
  return y;
}

Tensor ColumnParallelLinear::forward_gelu(const Tensor& x, LayerContext& ctx, Cache& cache,
                                          Tensor& pre_gelu) const {
  const index_t tokens = gathered_rows(x, ctx);
  const Shape shape{tokens, weight.value.dim(1)};
  pre_gelu = Tensor::empty(shape, x.dtype(), x.space());
  Tensor activated = Tensor::empty(shape, x.dtype(), x.space());
  const Tensor block = ones_column_ ? block_of(&Parameter::value) : Tensor();
  multiply_gathered(x, ctx, cache, [&](const Tensor& rows, index_t begin, index_t end) {
    Tensor pre = pre_gelu.slice_rows(begin, end), act = activated.slice_rows(begin, end);
    if (ones_column_)
      ops::gemm_gelu(rows, false, block, false, pre, act);
    else if (has_bias_)
      ops::gemm_bias_gelu(rows, false, weight.value, false, bias.value, pre, act);
    else
      ops::gemm_gelu(rows, false, weight.value, false, pre, act);
  });
  return activated;
}

void ColumnParallelLinear::accumulate_grads(const Tensor& x, const Tensor& dy,
                                            bool bias_grad_accumulated) {
  if (ones_column_) {  // dA' = X'^T dY: dA and db in one GEMM
    MESH_VERIFY(!bias_grad_accumulated,
                bias.name << ": its gradient comes from the weight-gradient GEMM (ones column)");
    Tensor grads = block_of(&Parameter::grad);
    ops::gemm(x, true, dy, false, grads, 1.0, ops::gemm_beta(take_grad_store(weight, bias)));
    return;
  }
  const bool bias_grad_here = has_bias_ && !bias_grad_accumulated;
  accumulate_weight_grads(x, dy, weight, bias_grad_here ? &bias : nullptr);
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, LayerContext& ctx, const Cache& cache,
                                      bool bias_grad_accumulated) {
  if (ctx.sequence_sharded())
    return backward_overlapped(dy, ctx, cache, bias_grad_accumulated);
  Tensor dx_full = Tensor::empty(input_grad_shape(cache.x.dim(0)), dy.dtype(), dy.space());
  ops::gemm(dy, false, weight.value, true, dx_full);
  // copy_to_tp's backward during the weight-gradient GEMM (Megatron's async
  // all-reduce of the input gradient).
  return mapping::reduce_input_grad(ctx.tp, dx_full, /*sequence_parallel=*/false, [&] {
    accumulate_grads(cache.x, dy, bias_grad_accumulated);
  });
}

Tensor ColumnParallelLinear::backward_overlapped(const Tensor& dy, LayerContext& ctx,
                                                 const Cache& cache, bool bias_grad_accumulated) {
  // Under sequence parallelism the input is gathered again (Megatron does the
  // same) unless the forward kept it whole (keep_gathered_input). As in
  // Megatron's LinearWithGradAccumulationAndAsyncCommunication, the gather
  // runs while the input gradient's GEMM (which needs only dy and W) does,
  // and the input gradient's reduce-scatter while the weight-gradient GEMM
  // does.
  Communicator& comm = ctx.tp.comm;
  const bool gather = !ctx.keep_gathered_input;
  Shape full_shape = cache.x.shape();
  if (gather) full_shape[0] *= ctx.tp.size();
  Tensor x_full = gather ? Tensor::empty(full_shape, cache.x.dtype(), cache.x.space()) : cache.x;
  long gathering = -1;
  if (gather) {
    const std::vector<std::size_t> counts(std::size_t(ctx.tp.size()),
                                          std::size_t(cache.x.numel()));
    gathering = comm.iall_gather(cache.x.raw(), x_full.raw(), counts, x_full.dtype());
  }
  Tensor dx_full = Tensor::empty(input_grad_shape(full_shape[0]), dy.dtype(), dy.space());
  ops::gemm(dy, false, weight.value, true, dx_full);
  if (gather) comm.wait_collective(gathering);
  return mapping::reduce_input_grad(ctx.tp, dx_full, /*sequence_parallel=*/true, [&] {
    accumulate_grads(x_full, dy, bias_grad_accumulated);
  });
}

RowParallelLinear::RowParallelLinear(const std::string& name, index_t in, index_t out,
                                     const LayerContext& ctx, DType dtype, int epilogue_rank,
                                     bool bias)
    : weight(make_param(name + ".weight", {in, out}, {in / ctx.tp.size(), out},
                        {0, 1, false}, true, dtype, ctx.space)),
      bias(bias_param(bias, name + ".bias", {out}, {out}, {-1, 1, ctx.sequence_parallel},
                      dtype, ctx.space)),
      has_bias_(bias),
      epilogue_rank_(epilogue_rank % ctx.tp.size()) {}

Tensor RowParallelLinear::forward(const Tensor& x, LayerContext& ctx, Cache& cache) const {
  return project(x, nullptr, ctx, cache);
}

Tensor RowParallelLinear::forward_residual(const Tensor& x, const Tensor& residual,
                                           LayerContext& ctx, Cache& cache) const {
  return project(x, &residual, ctx, cache);
}

Tensor RowParallelLinear::project(const Tensor& x, const Tensor* residual, LayerContext& ctx,
                                  Cache& cache) const {
  cache.x = x;
  if (!has_bias_) return project_without_bias(x, residual, ctx);
  if (ctx.sequence_parallel && ctx.tp.size() > 1) {
    // The residual is this rank's row shard: bias and residual follow the
    // reduce-scatter, in its own sum kernel where it has one (the copy
    // engines: one pass over the shard instead of three).
    const Tensor partial = matmul(x, weight.value);
    if (mapping::tp_scatter_adds(ctx.tp, std::size_t(partial.numel()), partial.dtype()))
      return mapping::reduce_scatter_to_sp_adding(ctx.tp, partial, bias.value, residual);
    Tensor y = mapping::reduce_scatter_to_sp(ctx.tp, partial);
    ops::bias_add(y, bias.value);
    if (residual) ops::add(*residual, y, y);
    return y;
  }
  // Without SP the bias and the residual are the same on every tp rank, so
  // they are added once, before anything waits for the sum: where the
  // reduction has a sum kernel of its own (the copy-engine all-reduce) in
  // that kernel, every rank running the plain GEMM (an out-of-place
  // residual epilogue costs the GEMM 30 us at 774M's tp 2 shapes); else
  // one tp rank (epilogue_rank_) adds them in its GEMM's epilogue and the
  // all-reduce sums them in. Either way, after the reduction (which the
  // other micro-batch's compute hides under parallel.tp_interleave) no
  // kernel is left to wait for it. Megatron adds the bias after the sum;
  // this rounds the partial products once less. On one tp rank the
  // reduction is the identity.
  const std::size_t count = std::size_t(x.numel() / x.dim(x.rank() - 1) * weight.value.dim(1));
  if (mapping::tp_sum_adds(ctx.tp, count, x.dtype()))
    return mapping::reduce_from_tp_adding(ctx.tp, matmul(x, weight.value), bias.value, residual);
  Tensor y;
  if (ctx.tp.rank() != epilogue_rank_) {
    y = matmul(x, weight.value);
  } else if (residual) {
    y = Tensor::empty(residual->shape(), x.dtype(), x.space());
    ops::gemm_bias_residual(x, false, weight.value, false, bias.value, *residual, y);
  } else {
    y = matmul_bias(x, weight.value, bias.value);
  }
  return mapping::reduce_from_tp(ctx.tp, std::move(y));
}

// The sum first, then the residual: one add kernel after the reduction, on
// every decomposition the same order (the reduction's adding kernels and the
// GEMM epilogues of the biased path expect a bias).
Tensor RowParallelLinear::project_without_bias(const Tensor& x, const Tensor* residual,
                                               LayerContext& ctx) const {
  Tensor partial = matmul(x, weight.value);
  Tensor y = ctx.sequence_sharded() ? mapping::reduce_scatter_to_sp(ctx.tp, partial)
                                    : mapping::reduce_from_tp(ctx.tp, std::move(partial));
  if (residual) ops::add(*residual, y, y);
  return y;
}

Tensor RowParallelLinear::accumulate_grads(const Tensor& dy, LayerContext& ctx,
                                           const Cache& cache) {
  if (!ctx.sequence_parallel) {  // dy_full is dy: one GEMM gives both gradients
    Tensor dy_full = mapping::reduce_from_tp_backward(ctx.tp, dy);
    accumulate_weight_grads(cache.x, dy_full, weight, has_bias_ ? &bias : nullptr);
    return dy_full;
  }
  // Under SP the bias gradient is this rank's shard's (summed over tp later),
  // the weight gradient the gathered dy's.
  if (has_bias_) ops::bias_backward(dy, bias.grad, bias.take_grad_store());
  Tensor dy_full = mapping::reduce_scatter_to_sp_backward(ctx.tp, dy);
  ops::gemm(cache.x, true, dy_full, false, weight.grad, 1.0,
            ops::gemm_beta(weight.take_grad_store()));
  return dy_full;
}

// Under SP on more than one tp rank the gradient dy arrives as this rank's
// token shard and must be all-gathered; both GEMMs split by token blocks
// (the weight gradient over its K, the input gradient over its rows), so
// this rank's own block runs while the all-gather brings the others'.
void RowParallelLinear::backward_by_blocks(const Tensor& dy, LayerContext& ctx,
                                           const Cache& cache, const RowGradient& dgrad_rows) {
  if (has_bias_) ops::bias_backward(dy, bias.grad, bias.take_grad_store());
  const index_t rows = dy.dim(0), me = ctx.tp.rank(), ranks = ctx.tp.size();
  Tensor dy_full = Tensor::empty({rows * ranks, dy.dim(1)}, dy.dtype(), dy.space());
  const std::vector<std::size_t> counts(std::size_t(ranks), std::size_t(dy.numel()));
  const long gather = ctx.tp.comm.iall_gather(dy.raw(), dy_full.raw(), counts, dy.dtype());
  auto block = [&](const Tensor& dy_block, index_t r) {
    const index_t begin = r * rows, end = begin + rows;
    ops::gemm(cache.x.slice_rows(begin, end), true, dy_block, false, weight.grad, 1.0,
              ops::gemm_beta(weight.take_grad_store()));
    dgrad_rows(dy_block, begin, end);
  };
  // Under parallel.tp_interleave the wait switches to the other micro-batch,
  // which then fills the gap instead of this rank's own block; the block
  // goes after the wait, so that all of this layer's gradient accumulations
  // (the weight's, and fc's bias in dgrad_rows) stay on one side of the
  // switch, in the same order as without it.
  const bool own_block_first = !ctx.tp.comm.interleaving();
  if (own_block_first) block(dy, me);
  ctx.tp.comm.wait_collective(gather);
  if (!own_block_first) block(dy, me);
  for (index_t r = 0; r < ranks; ++r)
    if (r != me) block(dy_full.slice_rows(r * rows, (r + 1) * rows), r);
}

bool RowParallelLinear::splits_backward(const LayerContext& ctx) {
  return ctx.sequence_sharded() && ctx.split_row_parallel_backward;
}

Tensor RowParallelLinear::backward(const Tensor& dy, LayerContext& ctx, const Cache& cache) {
  Tensor dx = Tensor::empty(cache.x.shape(), dy.dtype(), dy.space());
  if (splits_backward(ctx)) {
    backward_by_blocks(dy, ctx, cache, [&](const Tensor& dy_rows, index_t begin, index_t end) {
      Tensor out = dx.slice_rows(begin, end);
      ops::gemm(dy_rows, false, weight.value, true, out);
    });
    return dx;
  }
  const Tensor dy_full = accumulate_grads(dy, ctx, cache);
  ops::gemm(dy_full, false, weight.value, true, dx);
  return dx;
}

void RowParallelLinear::dgelu_into(const Tensor& dy_rows, const Tensor& pre_gelu, Tensor& dpre,
                                   Parameter* pre_gelu_bias) const {
  if (!pre_gelu_bias) {
    ops::gemm_dgelu(dy_rows, false, weight.value, true, pre_gelu, dpre);
    return;
  }
  ops::gemm_dgelu(dy_rows, false, weight.value, true, pre_gelu, dpre, &pre_gelu_bias->grad,
                  pre_gelu_bias->take_grad_store());
}

Tensor RowParallelLinear::backward_through_gelu(const Tensor& dy, LayerContext& ctx,
                                                const Cache& cache, const Tensor& pre_gelu,
                                                Parameter* pre_gelu_bias) {
  Tensor dpre = Tensor::empty(cache.x.shape(), dy.dtype(), dy.space());
  if (splits_backward(ctx)) {
    backward_by_blocks(dy, ctx, cache, [&](const Tensor& dy_rows, index_t begin, index_t end) {
      Tensor out = dpre.slice_rows(begin, end);
      dgelu_into(dy_rows, pre_gelu.slice_rows(begin, end), out, pre_gelu_bias);
    });
    return dpre;
  }
  const Tensor dy_full = accumulate_grads(dy, ctx, cache);
  dgelu_into(dy_full, pre_gelu, dpre, pre_gelu_bias);
  return dpre;
}

}  // namespace meshtron
