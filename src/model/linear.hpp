// Tensor-parallel linear layers (Shoeybi et al., 2019). Weights are stored
// [in, out] (as Hugging Face's GPT-2 Conv1D), so Y = X W + b.
#pragma once

#include <functional>

#include "model/layer_context.hpp"
#include "model/parameter.hpp"

namespace meshtron {

/// ColumnParallelLinear: Y = X A + b with A split along its columns,
///   A = [A_1, ..., A_p],  b = [b_1, ..., b_p],  Y_i = X A_i + b_i.
/// Each rank needs all of X: copy_to_tp (or all_gather_from_sp under sequence
/// parallelism) brings it, and the backward all-reduces (or reduce-scatters)
/// dX = sum_i dY_i A_i^T. The output stays sharded by columns.
/// `fused_parts` > 1 splits each of that many column blocks (fused q|k|v).
/// Without a bias (`bias` false: Megatron's add_bias_linear = false) Y_i =
/// X A_i; `bias` is then an empty Parameter that collect() leaves out.
///
/// The ones column (ctx.bias_in_weight_gemm on the device): the bias rides
/// in the GEMMs as a row of the weight. A and b live in one block
///   A' = [A_i; b_i; 0] [in + kOnesColumnWidth, out / tp]
/// (and their gradients in another), and the input arrives with its ones
/// column, X' = [X, 1, 0] [rows, in + kOnesColumnWidth] (LayerNorm::forward
/// writes it), so Y_i = X' A'_i and the weight-gradient GEMM X'^T dY_i
/// gives dA_i and db_i = colsum(dY_i) at once: no bias epilogue, no
/// column-sum kernel. The zero rows keep the GEMM's row count a multiple of
/// 8 (over in + 1 rows cuBLASLt's algorithms are 1.4-1.8x slower); they are
/// the bias's trailing_padding, zeros in every flat buffer. GPT-2 774M
/// layer on an H200, weight gradient and bias gradient: qkv 0.124 ms against
/// 0.142 as GEMM + bias_backward, fc 0.163 against 0.202 (`perf/bench_cuda_ops
/// bias_in_wgrad`).
class ColumnParallelLinear {
 public:
  struct Cache {
    /// The input kept for dA = X^T dY: the full X without sequence
    /// parallelism; only this rank's sequence shard with it (re-gathered in
    /// the backward, as Megatron does, so stored activations fall by tp).
    Tensor x;
  };
  ColumnParallelLinear(const std::string& name, index_t in, index_t out, int fused_parts,
                       const LayerContext& ctx, DType dtype, bool bias = true);
  Tensor forward(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  /// forward() followed by GPT-2's GeLU, which rides in the GEMM's epilogue
  /// on the device (ops::gemm_bias_gelu): returns gelu(Y_i) and keeps Y_i
  /// (the GeLU's input, for its backward) in `pre_gelu`.
  Tensor forward_gelu(const Tensor& x, LayerContext& ctx, Cache& cache, Tensor& pre_gelu) const;
  /// `bias_grad_accumulated`: db += colsum(dY) was already done by the GEMM
  /// that produced dY (RowParallelLinear::backward_through_gelu), so only
  /// dA and dX are computed here.
  Tensor backward(const Tensor& dy, LayerContext& ctx, const Cache& cache,
                  bool bias_grad_accumulated = false);
  void collect(ParameterList& out) {
    out.push_back(&weight);
    if (has_bias_) out.push_back(&bias);
  }
  /// Whether forward() takes X' (the ones column) instead of X; then the
  /// backward always computes db itself (bias_grad_accumulated is false).
  /// Never without a bias (a ones column would multiply nothing).
  bool takes_ones_column() const { return ones_column_; }
  bool has_bias() const { return has_bias_; }

  Parameter weight, bias;

 private:
  /// Places weight and bias (values and gradients) in their blocks.
  void place_in_blocks(DType dtype, MemorySpace space);
  /// A' or dA' as one [in + kOnesColumnWidth, out / tp] view, after checking
  /// that weight and bias still lie there (an optimizer's flat buffers keep
  /// them adjacent with the padding: Parameter::trailing_padding).
  Tensor block_of(Tensor Parameter::*field) const;
  /// dX's shape for an input (X or X') of `rows` rows.
  Shape input_grad_shape(index_t rows) const { return {rows, weight.value.dim(0)}; }
  bool has_bias_ = true;
  bool ones_column_ = false;

  /// The full X this rank multiplies (gathered or copied); fills the cache.
  Tensor input_for_gemm(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  /// backward() under sequence parallelism on tp > 1: the input's all-gather
  /// and the input gradient's reduce-scatter overlap the two GEMMs.
  Tensor backward_overlapped(const Tensor& dy, LayerContext& ctx, const Cache& cache,
                             bool bias_grad_accumulated);
  /// Rows [begin, end) of X_full times A, written where the caller wants.
  using RowMultiply = std::function<void(const Tensor& x_rows, index_t begin, index_t end)>;
  /// Under SP on tp > 1 with split_column_parallel_forward: multiply(own
  /// rows) while the all-gather brings the others', then multiply(the
  /// others'); fills the cache as input_for_gemm. Otherwise multiply(all
  /// rows of input_for_gemm).
  void multiply_gathered(const Tensor& x, LayerContext& ctx, Cache& cache,
                         const RowMultiply& multiply) const;
  /// dA += X^T dY and, unless bias_grad_accumulated, db += colsum(dY).
  void accumulate_grads(const Tensor& x, const Tensor& dy, bool bias_grad_accumulated);
};

/// RowParallelLinear: Y = X A + b with A split along its rows and X along its
/// columns (the output of a ColumnParallelLinear),
///   A = [A_1; ...; A_p],  X = [X_1, ..., X_p],  Y = sum_i X_i A_i + b.
/// The sum is reduce_from_tp (or reduce_scatter_to_sp under sequence
/// parallelism); b is replicated and added after the reduction under SP,
/// before it (by one tp rank, epilogue_rank) without SP. Without a bias
/// (`bias` false) Y = sum_i X_i A_i, and a residual is added after the sum.
class RowParallelLinear {
 public:
  struct Cache {
    Tensor x;
  };
  /// `epilogue_rank`: the tp rank (taken modulo tp) that adds bias and
  /// residual in its GEMM before the all-reduce without SP; the layers
  /// spread it over the tp ranks (Attention, Mlp), so that no rank does all
  /// of these adds while the others wait for it at the reductions.
  RowParallelLinear(const std::string& name, index_t in, index_t out,
                    const LayerContext& ctx, DType dtype, int epilogue_rank, bool bias = true);
  Tensor forward(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  /// residual + forward(x), for the residual add after a projection
  /// (residual [rows of Y, out]); its backward is backward() (the add's is
  /// the identity). Without SP the add rides in one tp rank's GEMM epilogue on
  /// the device (ops::gemm_bias_residual), before the sum; under SP it
  /// follows the reduce-scatter.
  Tensor forward_residual(const Tensor& x, const Tensor& residual, LayerContext& ctx,
                          Cache& cache) const;
  Tensor backward(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  /// backward() for an input X_i = gelu(P_i) (the MLP's projection): returns
  /// dP_i = (dY A_i^T) * gelu'(P_i), the GeLU's derivative riding in the
  /// dgrad GEMM on the device (ops::gemm_dgelu), so dX_i is never stored.
  /// With `pre_gelu_bias` (the bias of the layer that made P_i), colsum(dP_i)
  /// goes into its gradient here (ops::gemm_dgelu).
  Tensor backward_through_gelu(const Tensor& dy, LayerContext& ctx, const Cache& cache,
                               const Tensor& pre_gelu, Parameter* pre_gelu_bias = nullptr);
  void collect(ParameterList& out) {
    out.push_back(&weight);
    if (has_bias_) out.push_back(&bias);
  }
  bool has_bias() const { return has_bias_; }

  Parameter weight, bias;

 private:
  /// forward() with an optional residual (forward_residual()).
  Tensor project(const Tensor& x, const Tensor* residual, LayerContext& ctx,
                 Cache& cache) const;
  /// forward() of a linear without a bias.
  Tensor project_without_bias(const Tensor& x, const Tensor* residual,
                              LayerContext& ctx) const;
  /// Accumulates dA and db; returns the dY this rank's dgrad GEMM takes.
  Tensor accumulate_grads(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  /// Writes the input gradient's rows [begin, end) from dy's rows there.
  using RowGradient = std::function<void(const Tensor& dy_rows, index_t begin, index_t end)>;
  void backward_by_blocks(const Tensor& dy, LayerContext& ctx, const Cache& cache,
                          const RowGradient& dgrad_rows);
  static bool splits_backward(const LayerContext& ctx);
  /// dpre = (dy_rows A^T) * gelu'(pre_gelu) and, with pre_gelu_bias, its
  /// column sums into that bias's gradient.
  void dgelu_into(const Tensor& dy_rows, const Tensor& pre_gelu, Tensor& dpre,
                  Parameter* pre_gelu_bias) const;

  bool has_bias_ = true;
  int epilogue_rank_;  ///< in [0, tp)
};

/// Y = X W for X [n, in], W [in, out] (helper shared by the layers).
Tensor matmul(const Tensor& x, const Tensor& w);
/// Y = X W + b (b [out] broadcast over rows), the bias fused into the GEMM
/// on the device (ops::gemm_bias).
Tensor matmul_bias(const Tensor& x, const Tensor& w, const Tensor& b);

}  // namespace meshtron
