// LayerNorm over the hidden dimension. Its weights are replicated on every
// tp rank; with sequence parallelism each rank normalises its own sequence
// shard, so the weight gradients are partial sums (all-reduced over tp by the
// optimizer step, flagged tp_partial_grad).
#pragma once

#include "model/layer_context.hpp"
#include "model/model_spec.hpp"
#include "model/parameter.hpp"

namespace meshtron {

class LayerNorm {
 public:
  struct Cache {
    Tensor x, mean, rstd;
  };
  /// Parameters in `space` (weight 1, bias 0). Rejects a spec other than
  /// LayerNorm with a bias (the placement is the block's).
  LayerNorm(const std::string& name, index_t hidden, const NormSpec& spec, DType dtype,
            bool sequence_parallel, MemorySpace space = MemorySpace::Host);
  /// `ones_column`: y is [rows, H + kOnesColumnWidth], the ones column
  /// after each row (ops::layernorm_forward) for a ColumnParallelLinear that
  /// takes it.
  Tensor forward(const Tensor& x, Cache& cache, bool ones_column = false) const;
  /// Returns dx (+ residual_grad, summed in the same kernel, when given);
  /// accumulates weight and bias gradients, which with `chain` may be
  /// completed by the chain's next call (ops::LayerNormGradChain).
  Tensor backward(const Tensor& dy, const Cache& cache, const Tensor* residual_grad = nullptr,
                  ops::LayerNormGradChain* chain = nullptr);
  void collect(ParameterList& out) { out.push_back(&weight); out.push_back(&bias); }

  Parameter weight, bias;

 private:
  double eps_;
};

}  // namespace meshtron
