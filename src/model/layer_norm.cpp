#include "model/layer_norm.hpp"

#include "common/error.hpp"

namespace meshtron {

namespace {
Parameter vector_param(const std::string& name, index_t n, DType dtype, double value,
                       bool sp, MemorySpace space) {
  Parameter p;
  p.name = name;
  p.global_shape = {n};
  p.value = Tensor::empty({n}, dtype, space);
  p.value.fill(value);
  p.grad = Tensor::zeros({n}, grad_dtype_for(dtype), space);
  p.shard.tp_partial_grad = sp;
  p.weight_decay = false;
  return p;
}
}  // namespace

LayerNorm::LayerNorm(const std::string& name, index_t hidden, const NormSpec& spec,
                     DType dtype, bool sp, MemorySpace space)
    : weight(vector_param(name + ".weight", hidden, dtype, 1.0, sp, space)),
      bias(vector_param(name + ".bias", hidden, dtype, 0.0, sp, space)),
      eps_(spec.epsilon) {
  require_built(spec.kind == NormKind::LayerNorm, "LayerNorm",
                "normalization = " + to_string(spec.kind));
  require_built(spec.bias, "LayerNorm", "a norm without bias");
}

Tensor LayerNorm::forward(const Tensor& x, Cache& cache, bool ones_column) const {
  const index_t n = x.dim(0);
  const Shape shape = ones_column ? Shape{n, x.dim(1) + ops::kOnesColumnWidth} : x.shape();
  Tensor y = Tensor::empty(shape, x.dtype(), x.space());
  cache.x = x;
  cache.mean = Tensor::empty({n}, stats_dtype(x), x.space());
  cache.rstd = Tensor::empty({n}, stats_dtype(x), x.space());
  ops::layernorm_forward(x, weight.value, bias.value, eps_, y, cache.mean, cache.rstd);
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy, const Cache& cache, const Tensor* residual_grad,
                           ops::LayerNormGradChain* chain) {
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.space());
  ops::layernorm_backward(dy, cache.x, weight.value, cache.mean, cache.rstd, dx,
                          weight.grad, bias.grad, residual_grad, take_grad_store(weight, bias),
                          chain);
  return dx;
}

}  // namespace meshtron
