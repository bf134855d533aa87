#include "model/mlp.hpp"

namespace meshtron {

Mlp::Mlp(const std::string& name, index_t hidden, index_t ffn, const LayerContext& ctx,
         DType dtype)
    : fc(name + ".fc", hidden, ffn, 1, ctx, dtype), proj(name + ".proj", ffn, hidden, ctx, dtype) {}

Tensor Mlp::forward(const Tensor& x, LayerContext& ctx, Cache& c) const {
  c.pre_gelu = fc.forward(x, ctx, c.fc);
  Tensor activated = Tensor::empty(c.pre_gelu.shape(), x.dtype(), x.space());
  ops::gelu_forward(c.pre_gelu, activated);
  return proj.forward(activated, ctx, c.proj);
}

Tensor Mlp::backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  Tensor dactivated = proj.backward(dy, ctx, c.proj);
  Tensor dpre = Tensor::empty(c.pre_gelu.shape(), dy.dtype(), dy.space());
  ops::gelu_backward(dactivated, c.pre_gelu, dpre);
  return fc.backward(dpre, ctx, c.fc);
}

}  // namespace meshtron
