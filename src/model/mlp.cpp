#include "model/mlp.hpp"

namespace meshtron {

Mlp::Mlp(const std::string& name, index_t hidden, index_t ffn, const LayerContext& ctx,
         DType dtype)
    : fc(name + ".fc", hidden, ffn, 1, ctx, dtype), proj(name + ".proj", ffn, hidden, ctx, dtype) {}

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
// dgrad GEMM writes dpre (ops::gemm_dgelu), not in fc's weight-gradient GEMM:
// cuBLASLt's BGRADA epilogue costs more there (see ops::gemm_dgelu).
Tensor Mlp::backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  const Tensor dpre = proj.backward_through_gelu(dy, ctx, c.proj, c.pre_gelu, &fc.bias.grad);
  return fc.backward(dpre, ctx, c.fc, /*bias_grad_accumulated=*/true);
}

}  // namespace meshtron
