// The block's norm over the hidden dimension: LayerNorm (weight and, unless
// the spec has none, bias) or RMSNorm (weight only, as Megatron's and
// transformers' LlamaRMSNorm). Its weights are replicated on every tp rank;
// with sequence parallelism each rank normalises its own sequence shard, so
// the weight gradients are partial sums (all-reduced over tp by the
// optimizer step, flagged tp_partial_grad).
#pragma once

#include "model/layer_context.hpp"
#include "model/model_spec.hpp"
#include "model/parameter.hpp"

namespace meshtron {

class LayerNorm {
 public:
  struct Cache {
    Tensor x, mean, rstd;  ///< mean: LayerNorm's only
  };
  /// Parameters in `space` (weight 1, bias 0). RMSNorm has no bias whatever
  /// spec.bias says; a LayerNorm without one normalises with beta = 0.
  LayerNorm(const std::string& name, index_t hidden, const NormSpec& spec, DType dtype,
            bool sequence_parallel, MemorySpace space = MemorySpace::Host);
  /// `ones_column`: y is [rows, H + kOnesColumnWidth], the ones column
  /// after each row (ops::layernorm_forward) for a ColumnParallelLinear that
  /// takes it; a LayerNorm with a bias only (takes_ones_column()).
  Tensor forward(const Tensor& x, Cache& cache, bool ones_column = false) const;
  /// Returns dx (+ residual_grad, summed in the same kernel, when given);
  /// accumulates weight and bias gradients, which with `chain` may be
  /// completed by the chain's next call (ops::LayerNormGradChain; a
  /// LayerNorm's only, RMSNorm ignores it).
  Tensor backward(const Tensor& dy, const Cache& cache, const Tensor* residual_grad = nullptr,
                  ops::LayerNormGradChain* chain = nullptr);
  void collect(ParameterList& out) {
    out.push_back(&weight);
    if (has_bias()) out.push_back(&bias);
  }
  /// Whether forward() can write the ones column (a LayerNorm with a bias).
  bool writes_ones_column() const { return kind_ == NormKind::LayerNorm && has_bias(); }
  bool has_bias() const { return bias.value.defined(); }

  Parameter weight;
  Parameter bias;  ///< empty (its name only) without a bias

 private:
  Tensor backward_layernorm(const Tensor& dy, const Cache& cache, const Tensor* residual_grad,
                            ops::LayerNormGradChain* chain);
  Tensor backward_rmsnorm(const Tensor& dy, const Cache& cache, const Tensor* residual_grad);
  NormKind kind_;
  double eps_;
};

}  // namespace meshtron
