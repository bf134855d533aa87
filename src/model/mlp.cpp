#include "model/mlp.hpp"

namespace meshtron {

// The projection's adds take the tp rank after the attention's (Attention:
// layer), so every rank has its share of both kinds: at tp 2 rank 0 adds in
// the even layers' attention and the odd layers' MLP, rank 1 in the others.
// (The MLP's fused add costs more than the attention's: its GEMM, K = ffn /
// tp, takes a slower out-of-place algorithm.)
Mlp::Mlp(const std::string& name, int layer, index_t hidden, const MlpSpec& spec,
         const LayerContext& ctx, DType dtype)
    : fc(name + ".fc", hidden, spec.ffn_hidden_size, 1, ctx, dtype),
      proj(name + ".proj", spec.ffn_hidden_size, hidden, ctx, dtype, /*epilogue_rank=*/layer + 1) {
  require_built(spec.activation == Activation::GeluTanh, "Mlp",
                "activation = " + to_string(spec.activation));
  require_built(spec.bias, "Mlp", "add_bias_linear = false");
}

// The GeLU rides in the GEMMs next to it (cuBLASLt epilogues on the device;
// on the host the same ops run one after the other, as before): fc's
// forward writes both pre_gelu and gelu(pre_gelu), and proj's dgrad GEMM
// applies gelu'(pre_gelu), so d(activated) is never stored.
Tensor Mlp::forward(const Tensor& x, LayerContext& ctx, Cache& c) const {
  const Tensor activated = fc.forward_gelu(x, ctx, c.fc, c.pre_gelu);
  return proj.forward(activated, ctx, c.proj);
}

Tensor Mlp::forward_residual(const Tensor& x, const Tensor& residual, LayerContext& ctx,
                            Cache& c) const {
  const Tensor activated = fc.forward_gelu(x, ctx, c.fc, c.pre_gelu);
  return proj.forward_residual(activated, residual, ctx, c.proj);
}

// fc's bias gradient (the column sums of dpre) is taken right after proj's
// dgrad GEMM writes dpre (ops::gemm_dgelu), by the column-sum kernel: a
// GPT-2 774M step on one H100 takes 97.1 ms that way against 97.3 with
// cuBLASLt's BGRADA epilogue in fc's weight-gradient GEMM. Except under
// sequence parallelism on tp > 1: there the sums run with fc's
// weight-gradient GEMM (linear_weight_grads) beside dX's reduce-scatter,
// off the path to the next layer. With the ones column fc's weight-gradient
// GEMM computes it (ColumnParallelLinear).
Tensor Mlp::backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  const bool bias_grad_after_dgelu = !ctx.sequence_sharded() && !fc.takes_ones_column();
  const Tensor dpre = proj.backward_through_gelu(dy, ctx, c.proj, c.pre_gelu,
                                                 bias_grad_after_dgelu ? &fc.bias : nullptr);
  return fc.backward(dpre, ctx, c.fc, /*bias_grad_accumulated=*/bias_grad_after_dgelu);
}

}  // namespace meshtron
