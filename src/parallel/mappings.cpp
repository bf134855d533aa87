#include "parallel/mappings.hpp"

#include <cstring>
#include <utility>

#include "common/error.hpp"

namespace meshtron::mapping {

namespace {

void require_divisible(const Tensor& x, int dim, int parts, const char* what) {
  MESH_VERIFY(x.dim(dim) % parts == 0, what << ": dimension " << dim << " of "
                                            << shape_string(x.shape())
                                            << " is not divisible by tp = " << parts);
}

}  // namespace

Tensor copy_to_tp(TensorParallelGroup&, const Tensor& x) { return x; }

Tensor reduce_from_tp(TensorParallelGroup& g, const Tensor& x) {
  if (g.size() == 1) return x;
  return reduce_from_tp(g, x.clone());
}

Tensor reduce_from_tp(TensorParallelGroup& g, Tensor&& partial) {
  Tensor sum = std::move(partial);
  if (g.size() > 1) g.comm.all_reduce(sum);
  return sum;
}

bool tp_sum_adds(const TensorParallelGroup& g, std::size_t count, DType dtype) {
  return g.size() > 1 && g.comm.adds_in_all_reduce(count, dtype);
}

Tensor reduce_from_tp_adding(TensorParallelGroup& g, Tensor&& partial, const Tensor& bias,
                             const Tensor* residual) {
  Tensor sum = std::move(partial);
  const index_t columns = sum.dim(sum.rank() - 1);
  MESH_VERIFY(bias.numel() == columns && bias.dtype() == sum.dtype() &&
                  (!residual || (residual->shape() == sum.shape() &&
                                 residual->dtype() == sum.dtype())),
              "reduce_from_tp_adding: bias " << shape_string(bias.shape()) << " / residual "
                                             << (residual ? shape_string(residual->shape()) : "-")
                                             << " do not fit the sum "
                                             << shape_string(sum.shape()));
  g.comm.all_reduce_adding(sum.raw(), std::size_t(sum.numel()), sum.dtype(),
                           residual ? residual->raw() : nullptr, bias.raw(), std::size_t(columns));
  return sum;
}

bool tp_scatter_adds(const TensorParallelGroup& g, std::size_t count, DType dtype) {
  return g.size() > 1 && count % std::size_t(g.size()) == 0 &&
         g.comm.adds_in_reduce_scatter(count / std::size_t(g.size()), dtype);
}

Tensor reduce_scatter_to_sp_adding(TensorParallelGroup& g, const Tensor& partial,
                                   const Tensor& bias, const Tensor* residual) {
  require_divisible(partial, 0, g.size(), "reduce_scatter_to_sp_adding");
  Shape shape = partial.shape();
  shape[0] /= g.size();
  const index_t columns = partial.dim(partial.rank() - 1);
  MESH_VERIFY(bias.numel() == columns && bias.dtype() == partial.dtype() &&
                  (!residual || (residual->shape() == shape &&
                                 residual->dtype() == partial.dtype())),
              "reduce_scatter_to_sp_adding: bias " << shape_string(bias.shape()) << " / residual "
                                                   << (residual ? shape_string(residual->shape()) : "-")
                                                   << " do not fit the shard "
                                                   << shape_string(shape));
  Tensor out = Tensor::empty(shape, partial.dtype(), partial.space());
  g.comm.reduce_scatter_adding(partial.raw(), out.raw(), std::size_t(out.numel()), out.dtype(),
                               residual ? residual->raw() : nullptr, bias.raw(),
                               std::size_t(columns));
  return out;
}

Tensor scatter_to_sp(TensorParallelGroup& g, const Tensor& x) {
  if (g.size() == 1) return x;
  require_divisible(x, 0, g.size(), "scatter_to_sp");
  const index_t rows = x.dim(0) / g.size();
  return x.slice_rows(rows * g.rank(), rows * (g.rank() + 1)).clone();
}

Tensor gather_from_sp(TensorParallelGroup& g, const Tensor& x) {
  if (g.size() == 1) return x;
  Shape shape = x.shape();
  shape[0] *= g.size();
  Tensor out = Tensor::empty(shape, x.dtype(), x.space());
  g.comm.all_gather(x.raw(), out.raw(), std::size_t(x.numel()), x.dtype());
  return out;
}

Tensor reduce_scatter_to_sp(TensorParallelGroup& g, const Tensor& x) {
  if (g.size() == 1) return x;
  require_divisible(x, 0, g.size(), "reduce_scatter_to_sp");
  Shape shape = x.shape();
  shape[0] /= g.size();
  Tensor out = Tensor::empty(shape, x.dtype(), x.space());
  g.comm.reduce_scatter(x.raw(), out.raw(), std::size_t(out.numel()), x.dtype(),
                        ReduceOp::Sum);
  return out;
}

Tensor all_gather_from_sp(TensorParallelGroup& g, const Tensor& x) {
  return gather_from_sp(g, x);
}

Tensor reduce_input_grad(TensorParallelGroup& g, const Tensor& dx_full, bool sequence_parallel,
                         const std::function<void()>& meanwhile) {
  if (g.size() == 1) {
    meanwhile();
    return dx_full;
  }
  if (!sequence_parallel) {
    const long reducing = g.comm.iall_reduce(dx_full.raw(), std::size_t(dx_full.numel()),
                                             dx_full.dtype(), ReduceOp::Sum);
    meanwhile();
    g.comm.wait_collective(reducing);
    return dx_full;
  }
  require_divisible(dx_full, 0, g.size(), "reduce_input_grad");
  Shape shape = dx_full.shape();
  shape[0] /= g.size();
  Tensor dx = Tensor::empty(shape, dx_full.dtype(), dx_full.space());
  const std::vector<std::size_t> counts(std::size_t(g.size()), std::size_t(dx.numel()));
  g.comm.ireduce_scatter(dx_full.raw(), dx.raw(), counts, dx.dtype(), ReduceOp::Sum);
  meanwhile();
  g.comm.wait_collectives();
  return dx;
}

// scatter_to_tp and gather_from_tp interleave columns with a host loop of
// memcpy; a device tensor takes the same path through a host copy (neither
// runs in the GPT training step: its logits are never gathered).

Tensor scatter_to_tp(TensorParallelGroup& g, const Tensor& x) {
  if (g.size() == 1) return x;
  if (!x.is_host()) return scatter_to_tp(g, x.to_host()).to_space(x.space());
  require_divisible(x, x.rank() - 1, g.size(), "scatter_to_tp");
  const index_t cols = x.dim(-1), part = cols / g.size(), rows = x.numel() / cols;
  Shape shape = x.shape();
  shape.back() = part;
  Tensor out = Tensor::empty(shape, x.dtype(), x.space());
  const std::size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(out.raw());
  for (index_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * part * es, src + (r * cols + g.rank() * part) * es, part * es);
  return out;
}

Tensor gather_from_tp(TensorParallelGroup& g, const Tensor& x) {
  if (g.size() == 1) return x;
  if (!x.is_host()) return gather_from_tp(g, x.to_host()).to_space(x.space());
  const index_t part = x.dim(-1), rows = x.numel() / part, cols = part * g.size();
  // All-gather the blocks rank-major, then interleave them into columns.
  Tensor blocks = Tensor::empty({g.size(), rows, part}, x.dtype(), x.space());
  g.comm.all_gather(x.raw(), blocks.raw(), std::size_t(x.numel()), x.dtype());
  Shape shape = x.shape();
  shape.back() = cols;
  Tensor out = Tensor::empty(shape, x.dtype(), x.space());
  const std::size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(blocks.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int k = 0; k < g.size(); ++k)
    for (index_t r = 0; r < rows; ++r)
      std::memcpy(dst + (r * cols + k * part) * es, src + ((k * rows + r) * part) * es,
                  part * es);
  return out;
}

}  // namespace meshtron::mapping

namespace meshtron::mapping {
Tensor reduce_max_from_tp(TensorParallelGroup& g, const Tensor& x) {
  if (g.size() == 1) return x;
  Tensor out = x.clone();
  g.comm.all_reduce(out, ReduceOp::Max);
  return out;
}
}  // namespace meshtron::mapping
