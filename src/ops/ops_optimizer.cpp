// The optimizer ops (ops.hpp: AdamW): adamw_step and MultiTensorAdamW.
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/kokkos/adamw.hpp"
#include "ops/cast.hpp"
#include "ops/clip_factor.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

// ----------------------------------------------------------------- AdamW ---

namespace {

/// The checks of adamw_step; returns whether it runs on the device.
bool check_adamw(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                 const Tensor& v, const AdamWParams& hp, const Tensor* compute_copy) {
  const Arg ap{"param", param}, ag{"grad", grad}, am{"m", m}, av{"v", v};
  const bool device = require_float_args(op, {ap, ag, am, av});
  if (device)
    MESH_VERIFY(param.dtype() == DType::F32,
                op << ": the CUDA path keeps fp32 master weights, gradients and moments; got "
                   << describe(ap));
  for (const Arg& a : {ag, am, av}) require_same_numel(op, ap, a);
  MESH_VERIFY(hp.step >= 1 && hp.lr >= 0 && hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 &&
                  hp.beta2 < 1 && hp.eps > 0 && hp.weight_decay >= 0,
              op << ": invalid hyper-parameters step=" << hp.step << " lr=" << hp.lr
                 << " beta1=" << hp.beta1 << " beta2=" << hp.beta2 << " eps=" << hp.eps
                 << " weight_decay=" << hp.weight_decay);
  if (compute_copy != nullptr) {
    const Arg ac{"compute_copy", *compute_copy};
    on_device(op, {ap, ac});
    require_same_numel(op, ap, ac);
    if (device)
      MESH_VERIFY(compute_copy->dtype() == DType::BF16 || compute_copy->dtype() == DType::F16,
                  op << ": the CUDA compute copy is bf16 or fp16; got " << describe(ac));
  }
  return device;
}

kernels::AdamWCoefficients adamw_coefficients(const AdamWParams& hp) {
  return kernels::adamw_coefficients(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.step);
}

/// The checks of AdamWParams::grad_sum_of_squares against the parameters'
/// memory space (device: whether they are on the device).
void check_clip_source(const char* op, const AdamWParams& hp, bool device) {
  const Tensor* s = hp.grad_sum_of_squares;
  if (s == nullptr) return;
  MESH_VERIFY(s->dtype() == DType::F64 && s->numel() == 1 && s->is_host() != device,
              op << ": grad_sum_of_squares is one F64 element where the parameters are; got "
                 << describe({"grad_sum_of_squares", *s}));
}

/// Resolves the clipping of hp on the host, where the norm can be read:
/// grad_scale from it; false when the update is to be skipped.
bool resolve_clip_on_host(AdamWParams& hp) {
  if (hp.grad_sum_of_squares == nullptr) return true;
  const double norm = std::sqrt(hp.grad_sum_of_squares->data<double>()[0]);
  if (hp.skip_nonfinite && !std::isfinite(norm)) return false;
  hp.grad_scale = clip_factor(norm, hp.clip_grad);
  hp.grad_sum_of_squares = nullptr;
  return true;
}

#ifdef MESHTRON_HAVE_CUDA
cuda::AdamWCoefficients cuda_coefficients(const kernels::AdamWCoefficients& k,
                                          const AdamWParams& hp) {
  const Tensor* s = hp.grad_sum_of_squares;
  return {k.lr,
          k.beta1,
          k.beta2,
          k.eps,
          k.weight_decay,
          k.step_size,
          k.inv_sqrt_bias2,
          float(hp.grad_scale),
          s ? s->data<double>() : nullptr,
          hp.clip_grad,
          hp.skip_nonfinite};
}
#endif

/// hp with the weight decay of one tensor of a multi-tensor step.
AdamWParams tensor_params(const AdamWParams& hp, bool decay) {
  AdamWParams out = hp;
  out.weight_decay = decay ? hp.weight_decay : 0.0;
  return out;
}

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp) {
  adamw_step(param, grad, m, v, hp, nullptr);
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp,
                Tensor* compute_copy) {
  const bool device = check_adamw("adamw_step", param, grad, m, v, hp, compute_copy);
  check_clip_source("adamw_step", hp, device);
  const kernels::AdamWCoefficients k = adamw_coefficients(hp);
  if (device) {
    ON_CUDA(cuda::adamw_step(param.data<float>(), grad.data<float>(), m.data<float>(),
                             v.data<float>(), param.numel(), cuda_coefficients(k, hp),
                             compute_copy ? compute_copy->dtype() : DType::BF16,
                             compute_copy ? compute_copy->raw() : nullptr));
    return;
  }
  AdamWParams resolved = hp;
  if (!resolve_clip_on_host(resolved)) return;
  with_float_type(param.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::adamw_step<Host>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(),
                              param.numel(), k, resolved.grad_scale);
  });
  if (compute_copy) cast(param, *compute_copy);
}

struct MultiTensorAdamW::DeviceTable {
#ifdef MESHTRON_HAVE_CUDA
  cuda::AdamWTable table;
#endif
};

MultiTensorAdamW::MultiTensorAdamW() = default;
MultiTensorAdamW::~MultiTensorAdamW() = default;
MultiTensorAdamW::MultiTensorAdamW(MultiTensorAdamW&&) noexcept = default;
MultiTensorAdamW& MultiTensorAdamW::operator=(MultiTensorAdamW&&) noexcept = default;

long MultiTensorAdamW::table_uploads() const {
#ifdef MESHTRON_HAVE_CUDA
  return table_ ? table_->table.uploads() : 0;
#else
  return 0;
#endif
}

void MultiTensorAdamW::step(const std::vector<AdamWTensor>& tensors, const AdamWParams& hp) {
  const char* op = "MultiTensorAdamW::step";
  if (tensors.empty()) return;
  const bool device = !tensors[0].param.is_host();
  for (const AdamWTensor& t : tensors) {
    const AdamWParams one = tensor_params(hp, t.decay);
    const Tensor* copy = t.compute_copy.defined() ? &t.compute_copy : nullptr;
    MESH_VERIFY(check_adamw(op, t.param, t.grad, t.m, t.v, one, copy) == device,
                op << ": the tensors are in different memory spaces");
  }
  check_clip_source(op, hp, device);
  if (!device) {  // the per-tensor host kernels, bit for bit what the device does at once
    AdamWParams resolved = hp;  // the norm read once, not once per tensor
    if (!resolve_clip_on_host(resolved)) return;
    for (const AdamWTensor& t : tensors) {
      AdamWTensor u = t;  // handles share the storage: updates land in t's tensors
      adamw_step(u.param, u.grad, u.m, u.v, tensor_params(resolved, t.decay),
                 t.compute_copy.defined() ? &u.compute_copy : nullptr);
    }
    return;
  }
#ifdef MESHTRON_HAVE_CUDA
  std::vector<cuda::AdamWTensorPtrs> ptrs;
  bool any_copy = false;
  DType copy_dtype = DType::BF16;  // any, without copies
  for (const AdamWTensor& t : tensors) {
    void* copy = nullptr;
    if (t.compute_copy.defined()) {
      if (!any_copy) copy_dtype = t.compute_copy.dtype(), any_copy = true;
      MESH_VERIFY(t.compute_copy.dtype() == copy_dtype,
                  op << ": compute copies of one step share a dtype; got "
                     << dtype_name(copy_dtype) << " and " << dtype_name(t.compute_copy.dtype()));
      copy = t.compute_copy.raw();
    }
    ptrs.push_back({t.param.data<float>(), t.grad.data<float>(), t.m.data<float>(),
                    t.v.data<float>(), copy, t.param.numel(), t.decay ? hp.weight_decay : 0.0});
  }
  if (!table_) table_ = std::make_unique<DeviceTable>();
  table_->table.step(ptrs, copy_dtype, cuda_coefficients(adamw_coefficients(hp), hp));
#endif
}

}  // namespace meshtron::ops
