// One pre-norm block (GPT-2's LayerNorm, Llama's RMSNorm) on the residual
// stream x ([s/sp * b, h] rows):
//   x = x + dropout(attention(ln_1(x)))
//   x = x + dropout(mlp(ln_2(x)))
// or, with a parallel residual (GPT-NeoX's use_parallel_residual, GPT-J),
// both branches reading the block's input through their own norm:
//   x = x + dropout(attention(ln_1(x))) + dropout(mlp(ln_2(x)))
// Under sequence parallelism each branch reduce-scatters its own output.
//
// A post-norm block (the original Transformer's and Google BERT's,
// transformers' BertLayer) normalises after each residual add instead:
//   h = ln_1(x + dropout(attention(x)))
//   y = ln_2(h + dropout(mlp(h)))
// so its output is already normed and the model has no final norm
// (ModelSpec::has_final_norm). Its linears take the plain path (no ones
// column: their inputs are not the output of the norm right before them).
#pragma once

#include "model/attention.hpp"
#include "model/model_spec.hpp"
#include "model/layer_norm.hpp"
#include "model/mlp.hpp"

namespace meshtron {

class TransformerLayer {
 public:
  struct Cache {
    LayerNorm::Cache ln_1, ln_2;
    Attention::Cache attention;
    Mlp::Cache mlp;
    /// Full recompute: the layer input, the only tensor kept (everything
    /// above is empty then and rebuilt by the backward).
    Tensor input;
    bool checkpointed = false;
  };
  /// `index` is the global layer number (names, dropout streams, init).
  /// Rejects a post-norm block with a parallel residual (and, through its
  /// parts, what they reject).
  TransformerLayer(int index, const ModelSpec& config, const LayerContext& ctx, DType dtype);
  Tensor forward(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  /// Full recompute: the same output as forward(), keeping only x in `cache`.
  /// Generation: forward() without dropout over cached keys and values
  /// (Attention::forward_cached).
  Tensor forward_cached(const Tensor& x, LayerContext& ctx, const CachedRows& rows,
                        KvCache::Layer& kv) const;
  Tensor forward_checkpointed(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  /// Runs the forward again first when `cache` is checkpointed.
  Tensor backward(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  void collect(ParameterList& out);

  LayerNorm ln_1;
  Attention attention;
  LayerNorm ln_2;
  Mlp mlp;

 private:
  /// The dropout site of `site_in_layer` (one of kStream*) of this layer.
  ops::DropoutSite site(std::uint32_t site_in_layer, const LayerContext& ctx,
                        index_t hidden) const;
  /// residual + dropout(x) at `site` (training with hidden dropout), one pass.
  Tensor dropout_add(const Tensor& x, const Tensor& residual, std::uint32_t site,
                     const LayerContext& ctx) const;
  Tensor dropout_backward(const Tensor& dy, std::uint32_t site, const LayerContext& ctx) const;
  Tensor backward_stored(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  Tensor forward_post_norm(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  Tensor backward_post_norm(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  /// residual + dropout(branch) at `site`: the add in the branch's last GEMM
  /// without hidden dropout, in the dropout kernel with it.
  template <class Branch>
  Tensor residual_branch(Branch& branch, const Tensor& x, const Tensor& residual,
                         std::uint32_t site, LayerContext& ctx,
                         typename Branch::Cache& cache) const;
  int index_;
  double hidden_dropout_;
  bool parallel_residual_;
  bool post_norm_;
};

}  // namespace meshtron
