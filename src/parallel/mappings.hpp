// The mapping pairs: the only way layers reach other ranks.
//
// Each function is one half of a pair whose backward is the other's forward
// (Megatron's mappings.py):
//
//   copy_to_tp          fwd identity            bwd all-reduce
//   reduce_from_tp      fwd all-reduce          bwd identity
//   scatter_to_sp       fwd keep my row shard   bwd all-gather rows
//   gather_from_sp      fwd all-gather rows     bwd keep my row shard
//   reduce_scatter_to_sp fwd reduce-scatter rows bwd all-gather rows
//   all_gather_from_sp  fwd all-gather rows     bwd reduce-scatter rows
//   scatter_to_tp       fwd keep my column shard bwd all-gather columns
//   gather_from_tp      fwd all-gather columns  bwd keep my column shard
//
// "Rows" are tokens in [s, b] order, so a sequence shard of s/tp positions is
// a contiguous block of rows. Every function takes the tensor-parallel
// Communicator and returns a new tensor (or the input itself for identities).
#pragma once

#include <functional>

#include "parallel/communicator.hpp"
#include "tensor/tensor.hpp"

namespace meshtron {

struct TensorParallelGroup {
  Communicator& comm;  ///< Not owned.
  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
};

namespace mapping {

// Forward functions, named as Megatron names them.
Tensor copy_to_tp(TensorParallelGroup& g, const Tensor& x);
Tensor reduce_from_tp(TensorParallelGroup& g, const Tensor& x);
/// The same sum written over `partial` itself, for a caller's own partial
/// sum that nothing else reads (the row-parallel GEMM's output): no clone,
/// which cost a full-size copy on the compute stream per call.
Tensor reduce_from_tp(TensorParallelGroup& g, Tensor&& partial);
/// Whether reduce_from_tp_adding can sum `count` elements of `dtype` (the
/// communicator adds in its own reduction pass: the copy-engine sums).
/// The same answer on every rank of the group.
bool tp_sum_adds(const TensorParallelGroup& g, std::size_t count, DType dtype);
/// reduce_from_tp(partial) + bias (broadcast over rows) + residual (null:
/// none), the addends added once in the reduction's own sum kernel; only
/// where tp_sum_adds holds.
Tensor reduce_from_tp_adding(TensorParallelGroup& g, Tensor&& partial, const Tensor& bias,
                             const Tensor* residual);
/// Whether reduce_scatter_to_sp_adding can take a partial sum of
/// `count` elements of `dtype` (the whole partial, all ranks' rows): the
/// copy-engine reduce-scatter. The same answer on every rank of the group.
bool tp_scatter_adds(const TensorParallelGroup& g, std::size_t count, DType dtype);
/// reduce_scatter_to_sp(partial) + bias (broadcast over rows) + residual
/// (this rank's row shard, or null), the addends added once in the
/// reduction's own sum kernel; only where tp_scatter_adds holds.
Tensor reduce_scatter_to_sp_adding(TensorParallelGroup& g, const Tensor& partial,
                                   const Tensor& bias, const Tensor* residual);
Tensor scatter_to_sp(TensorParallelGroup& g, const Tensor& x);
Tensor gather_from_sp(TensorParallelGroup& g, const Tensor& x);
Tensor reduce_scatter_to_sp(TensorParallelGroup& g, const Tensor& x);
Tensor all_gather_from_sp(TensorParallelGroup& g, const Tensor& x);
Tensor scatter_to_tp(TensorParallelGroup& g, const Tensor& x);
Tensor gather_from_tp(TensorParallelGroup& g, const Tensor& x);

// Their backward functions (gradient in, gradient out).
inline Tensor copy_to_tp_backward(TensorParallelGroup& g, const Tensor& dy) {
  return reduce_from_tp(g, dy);
}
inline Tensor reduce_from_tp_backward(TensorParallelGroup& g, const Tensor& dy) {
  return copy_to_tp(g, dy);
}
inline Tensor scatter_to_sp_backward(TensorParallelGroup& g, const Tensor& dy) {
  return gather_from_sp(g, dy);
}
inline Tensor gather_from_sp_backward(TensorParallelGroup& g, const Tensor& dy) {
  return scatter_to_sp(g, dy);
}
inline Tensor reduce_scatter_to_sp_backward(TensorParallelGroup& g, const Tensor& dy) {
  return all_gather_from_sp(g, dy);
}
inline Tensor all_gather_from_sp_backward(TensorParallelGroup& g, const Tensor& dy) {
  return reduce_scatter_to_sp(g, dy);
}
inline Tensor scatter_to_tp_backward(TensorParallelGroup& g, const Tensor& dy) {
  return gather_from_tp(g, dy);
}
inline Tensor gather_from_tp_backward(TensorParallelGroup& g, const Tensor& dy) {
  return scatter_to_tp(g, dy);
}

}  // namespace mapping
}  // namespace meshtron

namespace meshtron::mapping {
/// The input gradient of a column-parallel GEMM reduced over the tp group
/// while `meanwhile` runs (the weight-gradient GEMM: Megatron's async
/// communication): with `sequence_parallel` all_gather_from_sp's backward
/// (a reduce-scatter of rows, returning this rank's shard), else
/// copy_to_tp's (an all-reduce, in place). The collective is started,
/// `meanwhile` called, then the collective waited for; on one rank just
/// `meanwhile`.
Tensor reduce_input_grad(TensorParallelGroup& g, const Tensor& dx_full, bool sequence_parallel,
                         const std::function<void()>& meanwhile);

/// Element-wise max over the tp group (vocab-parallel softmax statistics;
/// the maximum carries no gradient, so there is no backward).
Tensor reduce_max_from_tp(TensorParallelGroup& g, const Tensor& x);
}  // namespace meshtron::mapping
