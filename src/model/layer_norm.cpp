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

Parameter bias_param(const std::string& name, index_t n, const NormSpec& spec, DType dtype,
                     bool sp, MemorySpace space) {
  if (spec.kind == NormKind::LayerNorm && spec.bias)
    return vector_param(name, n, dtype, 0.0, sp, space);
  Parameter absent;
  absent.name = name;
  return absent;
}
}  // namespace

LayerNorm::LayerNorm(const std::string& name, index_t hidden, const NormSpec& spec,
                     DType dtype, bool sp, MemorySpace space)
    : weight(vector_param(name + ".weight", hidden, dtype, 1.0, sp, space)),
      bias(bias_param(name + ".bias", hidden, spec, dtype, sp, space)),
      kind_(spec.kind),
      eps_(spec.epsilon) {}

Tensor LayerNorm::forward(const Tensor& x, Cache& cache, bool ones_column) const {
  MESH_VERIFY(!ones_column || writes_ones_column(),
              weight.name << ": only a LayerNorm with a bias writes the ones column");
  const index_t n = x.dim(0);
  const Shape shape = ones_column ? Shape{n, x.dim(1) + ops::kOnesColumnWidth} : x.shape();
  Tensor y = Tensor::empty(shape, x.dtype(), x.space());
  cache.x = x;
  if (kind_ == NormKind::RMSNorm) {  // rstd fp64 for fp64 x, else fp32 (ops::rmsnorm_forward)
    const DType rstd_dtype = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
    cache.rstd = Tensor::empty({n}, rstd_dtype, x.space());
    ops::rmsnorm_forward(x, weight.value, eps_, y, cache.rstd);
    return y;
  }
  cache.rstd = Tensor::empty({n}, stats_dtype(x), x.space());
  cache.mean = Tensor::empty({n}, stats_dtype(x), x.space());
  const Tensor beta = has_bias() ? bias.value : Tensor::zeros(weight.value.shape(),
                                                              x.dtype(), x.space());
  ops::layernorm_forward(x, weight.value, beta, eps_, y, cache.mean, cache.rstd);
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy, const Cache& cache, const Tensor* residual_grad,
                           ops::LayerNormGradChain* chain) {
  if (kind_ == NormKind::RMSNorm) return backward_rmsnorm(dy, cache, residual_grad);
  return backward_layernorm(dy, cache, residual_grad, chain);
}

Tensor LayerNorm::backward_layernorm(const Tensor& dy, const Cache& cache,
                                     const Tensor* residual_grad,
                                     ops::LayerNormGradChain* chain) {
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.space());
  if (has_bias()) {
    ops::layernorm_backward(dy, cache.x, weight.value, cache.mean, cache.rstd, dx, weight.grad,
                            bias.grad, residual_grad, take_grad_store(weight, bias), chain);
    return dx;
  }
  // The op writes dbeta too: into a scratch that is dropped (no chain, so
  // that it is complete before it goes).
  Tensor dbeta = Tensor::zeros(weight.grad.shape(), weight.grad.dtype(), weight.grad.space());
  ops::layernorm_backward(dy, cache.x, weight.value, cache.mean, cache.rstd, dx, weight.grad,
                          dbeta, residual_grad, weight.take_grad_store());
  return dx;
}

// The op has no residual input: the residual gradient is added after it.
Tensor LayerNorm::backward_rmsnorm(const Tensor& dy, const Cache& cache,
                                   const Tensor* residual_grad) {
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.space());
  ops::rmsnorm_backward(dy, cache.x, weight.value, cache.rstd, dx, weight.grad,
                        weight.take_grad_store());
  if (residual_grad) ops::add(dx, *residual_grad, dx);
  return dx;
}

}  // namespace meshtron
