// MLP h -> ffn -> h: a ColumnParallelLinear (ffn split over tp), the
// activation on the local columns, and a RowParallelLinear back to h.
//
// Gated activations (swiglu, geglu; Megatron's gated_linear_unit): fc is
// h -> 2 ffn, its weight stored [h, 2 ffn] as two logical halves, the gate
// then the up projection (Megatron's fused fc1; transformers' gate_proj and
// up_proj, transposed, side by side), with fused_parts = 2: each tp rank
// holds [gate_r | up_r], its ffn / tp columns of each half, so the
// activation act(gate_r) * up_r is local and proj takes the ffn / tp
// columns it pairs with (Megatron chunks fc1's local output the same way).
//
// The tanh GeLU rides in fc's GEMM epilogue (ColumnParallelLinear::
// forward_gelu); the exact GeLU (GPT-NeoX's hidden_act "gelu") and ReLU
// run as a kernel of their own between the GEMMs (cuBLASLt's GeLU epilogue
// is the tanh form), like the gated activations.
//
// Inner dropout (transformers' T5DenseActDense / T5DenseGatedActDense: wo(
// dropout(act(wi x)))): on the activation's output, between the GEMMs, its
// mask keyed by the global ffn column (Mlp::inner_site), so every
// tp split drops what one rank does. The GeLU then runs as a kernel of its
// own, not in the GEMMs' epilogues.
#pragma once

#include "model/linear.hpp"
#include "model/model_spec.hpp"

namespace meshtron {

/// The dropout between the activation and proj: its rate (0: none) and its
/// dropout stream (layer * kStreamsPerLayer + site).
struct MlpInnerDropout {
  double p = 0.0;
  std::uint32_t stream = 0;
};

class Mlp {
 public:
  struct Cache {
    ColumnParallelLinear::Cache fc;
    RowParallelLinear::Cache proj;
    /// fc's output, the activation's input: [rows, ffn / tp], or [rows, 2
    /// ffn / tp] (gate_r | up_r) when gated.
    Tensor pre_activation;
  };
  /// `layer`: the transformer layer's index (it picks proj's epilogue rank).
  /// Builds every Activation (geglu's gate is the erf GeLU, Megatron's
  /// F.gelu), with or without biases; `inner`: the dropout after the
  /// activation (none by default: Megatron's MLP has none).
  Mlp(const std::string& name, int layer, index_t hidden, const MlpSpec& spec,
      const LayerContext& ctx, DType dtype, const MlpInnerDropout& inner = {});
  Tensor forward(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  /// residual + forward(x), the add riding in proj's GEMM where it can
  /// (RowParallelLinear::forward_residual); the backward is backward().
  Tensor forward_residual(const Tensor& x, const Tensor& residual, LayerContext& ctx,
                          Cache& cache) const;
  Tensor backward(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  void collect(ParameterList& out) { fc.collect(out); proj.collect(out); }

  ColumnParallelLinear fc;
  RowParallelLinear proj;

 private:
  /// act(fc(x)) on this rank's columns, fc's output kept in the cache.
  Tensor activated(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  /// backward() of the activations that run as a kernel of their own.
  Tensor backward_unfused(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  bool drops_inner(const LayerContext& ctx) const { return ctx.training && inner_.p > 0; }
  ops::DropoutSite inner_site(const LayerContext& ctx) const;
  bool gated_;
  bool gelu_in_gemm_;          ///< the tanh GeLU, in fc's and proj's GEMMs
  ops::GatedActivation act_;   ///< the kernel's activation, unless gelu_in_gemm_
  MlpInnerDropout inner_;
};

}  // namespace meshtron
