// Causal multi-head self-attention with heads split across the tp group:
// a fused q|k|v ColumnParallelLinear gives each rank heads/tp heads, the core
// (softmax(q k^T / sqrt(d)) v) runs locally per head, and a RowParallelLinear
// sums the heads' contributions. One all-reduce forward and one backward
// (reduce-scatter / all-gather pairs under sequence parallelism).
#pragma once

#include "model/linear.hpp"

namespace meshtron {

class Attention {
 public:
  struct Cache {
    ColumnParallelLinear::Cache qkv;
    RowParallelLinear::Cache proj;
    Tensor q, k, v;    ///< [b * heads_local, s, d]
    /// softmax output before dropout; undefined under selective recompute
    /// (rebuilt from q and k in the backward)
    Tensor probs;
    Tensor probs_kept; ///< after dropout (aliases probs when p = 0); likewise
  };
  Attention(const std::string& name, int layer, index_t hidden, int heads,
            double dropout, const LayerContext& ctx, DType dtype);
  Tensor forward(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  Tensor backward(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  void collect(ParameterList& out) { qkv.collect(out); proj.collect(out); }

  ColumnParallelLinear qkv;
  RowParallelLinear proj;

 private:
  ops::DropoutSite probs_site(const LayerContext& ctx) const;
  /// probs = softmax(q k^T / sqrt(d)) (causal) and probs_kept = dropout(probs)
  /// (the same tensor when dropout is off): the part selective recompute
  /// runs twice. Deterministic, so the rebuilt tensors equal the first ones.
  void attention_probs(const Tensor& q, const Tensor& k, const LayerContext& ctx,
                       Tensor& probs, Tensor& probs_kept) const;
  int layer_;
  int heads_local_;
  index_t head_dim_;
  double dropout_;
};

}  // namespace meshtron
