// MLP h -> ffn -> h: a ColumnParallelLinear (ffn split over tp), GPT-2's tanh
// GeLU on the local columns, and a RowParallelLinear back to h.
#pragma once

#include "model/linear.hpp"
#include "model/model_spec.hpp"

namespace meshtron {

class Mlp {
 public:
  struct Cache {
    ColumnParallelLinear::Cache fc;
    RowParallelLinear::Cache proj;
    Tensor pre_gelu;
  };
  /// `layer`: the transformer layer's index (it picks proj's epilogue rank).
  /// Rejects a spec other than the tanh GeLU with biases.
  Mlp(const std::string& name, int layer, index_t hidden, const MlpSpec& spec,
      const LayerContext& ctx, DType dtype);
  Tensor forward(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  /// residual + forward(x), the add riding in proj's GEMM where it can
  /// (RowParallelLinear::forward_residual); the backward is backward().
  Tensor forward_residual(const Tensor& x, const Tensor& residual, LayerContext& ctx,
                          Cache& cache) const;
  Tensor backward(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  void collect(ParameterList& out) { fc.collect(out); proj.collect(out); }

  ColumnParallelLinear fc;
  RowParallelLinear proj;
};

}  // namespace meshtron
