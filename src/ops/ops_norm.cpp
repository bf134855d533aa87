// The LayerNorm ops (ops.hpp: LayerNorm) and LayerNormGradChain; the RMSNorm ops.
#include <algorithm>
#include <exception>
#include <memory>
#include <type_traits>

#include "kernels/kokkos/layernorm.hpp"
#include "kernels/kokkos/rmsnorm.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

// ------------------------------------------------------------- LayerNorm ---

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "layernorm_forward";
  const Arg ax{"x", x}, ag{"gamma", gamma}, ab{"beta", beta}, ay{"y", y}, am{"mean", mean},
      ar{"rstd", rstd};
  on_device(op, {ax, ag, ab, ay, am, ar});
  const bool device = require_float_args(op, {ax, ag, ab, ay});
  require_stat_args(op, device, ax, {am, ar});
  const index_t N = rows_of(op, ax), H = x.dim(-1);
  MESH_VERIFY(gamma.numel() == H && beta.numel() == H,
              op << ": " << describe(ag) << " and " << describe(ab) << " must hold " << H
                 << " elements, the last dim of " << describe(ax));
  const bool ones_column = y.rank() == 2 && x.rank() == 2 && y.dim(0) == N &&
                           y.dim(1) == H + kOnesColumnWidth;
  MESH_VERIFY(y.shape() == x.shape() || ones_column,
              op << ": " << describe(ay) << " must match " << describe(ax) << " or be [" << N
                 << ", " << H + kOnesColumnWidth << "] (the ones column)");
  require_per_row(op, am, N, ax);
  require_per_row(op, ar, N, ax);
  MESH_VERIFY(eps > 0, op << ": eps must be positive, got " << eps);
  const index_t ldy = y.dim(-1);
  if (device) {
    ON_CUDA(cuda::layernorm_forward(x.dtype(), x.raw(), gamma.raw(), beta.raw(), N, H, eps,
                                    y.raw(), ldy, mean.data<float>(), rstd.data<float>()));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (!ones_column) {
      kernels::layernorm_forward<Host>(x.data<T>(), gamma.data<T>(), beta.data<T>(), N, H, eps,
                                       y.data<T>(), mean.data<T>(), rstd.data<T>());
      return;
    }
    // The same kernel into rows of H, then each row moved to its place in y
    // beside its ones column (the host path is for tests and small runs).
    Tensor rows = Tensor::empty(x.shape(), x.dtype());
    kernels::layernorm_forward<Host>(x.data<T>(), gamma.data<T>(), beta.data<T>(), N, H, eps,
                                     rows.data<T>(), mean.data<T>(), rstd.data<T>());
    const T* from = rows.data<T>();
    T* to = y.data<T>();
    for (index_t r = 0; r < N; ++r) {
      std::copy(from + r * H, from + (r + 1) * H, to + r * ldy);
      for (index_t c = H; c < ldy; ++c) to[r * ldy + c] = T(c == H ? 1.0f : 0.0f);
    }
  });
}

#ifdef MESHTRON_HAVE_CUDA
struct LayerNormGradChain::DeviceSums {
  cuda::LayerNormPendingSums pending;
};
#else
struct LayerNormGradChain::DeviceSums {};  // nothing is ever held on the host
#endif

LayerNormGradChain::LayerNormGradChain() : sums_(std::make_unique<DeviceSums>()) {}

LayerNormGradChain::~LayerNormGradChain() {
#ifdef MESHTRON_HAVE_CUDA
  if (std::uncaught_exceptions() > 0)
    cuda::layernorm_drop_pending(sums_->pending);
  else
    flush();  // throws only on a CUDA error: terminate, loudly
#endif
}

void LayerNormGradChain::flush() {
#ifdef MESHTRON_HAVE_CUDA
  cuda::layernorm_add_pending(sums_->pending);
#endif
}

bool LayerNormGradChain::holds(const Tensor& grad) const {
#ifdef MESHTRON_HAVE_CUDA
  const cuda::LayerNormPendingSums& p = sums_->pending;
  return p.partial && grad.defined() && (grad.raw() == p.dgamma || grad.raw() == p.dbeta);
#else
  (void)grad;
  return false;
#endif
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                        const Tensor* residual_grad, GradStore store, LayerNormGradChain* chain) {
  const char* op = "layernorm_backward";
  const Arg ady{"dy", dy}, ax{"x", x}, ag{"gamma", gamma}, am{"mean", mean}, ar{"rstd", rstd},
      adx{"dx", dx}, adg{"dgamma", dgamma}, adb{"dbeta", dbeta};
  on_device(op, {ax, ady, ag, am, ar, adx, adg, adb});
  const bool device = require_float_args(op, {ax, ady, ag, adx});
  require_stat_args(op, device, ax, {am, ar});
  require_grad_args(op, device, ax, {adg, adb});
  MESH_VERIFY(dgamma.dtype() == dbeta.dtype(),
              op << ": " << describe(adg) << " and " << describe(adb) << " must share a dtype");
  const index_t N = rows_of(op, ax), H = x.dim(-1);
  MESH_VERIFY(
      dy.shape() == x.shape() && dx.shape() == x.shape(),
      op << ": " << describe(ady) << " and " << describe(adx) << " must match " << describe(ax));
  for (const Arg& a : {ag, adg, adb})
    MESH_VERIFY(a.t.numel() == H, op << ": " << describe(a) << " must hold " << H
                                     << " elements, the last dim of " << describe(ax));
  require_per_row(op, am, N, ax);
  require_per_row(op, ar, N, ax);
  if (residual_grad) {
    const Arg arg{"residual_grad", *residual_grad};
    on_device(op, {ax, arg});
    require_float_args(op, {ax, arg});
    MESH_VERIFY(residual_grad->shape() == x.shape(),
                op << ": " << describe(arg) << " must match " << describe(ax));
  }
  if (device) {
    ON_CUDA(cuda::layernorm_backward(x.dtype(), dgamma.dtype(), dy.raw(), x.raw(), gamma.raw(),
                                     mean.data<float>(), rstd.data<float>(), N, H, dx.raw(),
                                     dgamma.raw(), dbeta.raw(),
                                     residual_grad ? residual_grad->raw() : nullptr,
                                     store == GradStore::Accumulate,
                                     chain ? &chain->device_sums().pending : nullptr));
    return;
  }
  if (store == GradStore::Overwrite) {  // the host kernel adds
    dgamma.fill(0.0);
    dbeta.fill(0.0);
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::layernorm_backward<Host>(dy.data<T>(), x.data<T>(), gamma.data<T>(), mean.data<T>(),
                                      rstd.data<T>(), N, H, dx.data<T>(), dgamma.data<T>(),
                                      dbeta.data<T>());
  });
  if (residual_grad) add(dx, *residual_grad, dx);
}

// --------------------------------------------------------------- RMSNorm ---

namespace {

/// Calls f(T{}, S{}): the storage type and that of rstd (fp64 for fp64
/// storage, fp32 otherwise).
template <class F>
void with_rmsnorm_types(DType storage, F&& f) {
  with_storage_type(storage, [&](auto zero) {
    using T = decltype(zero);
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    f(T{}, S{});
  });
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& gamma, double eps, Tensor& y, Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  const Arg ax{"x", x}, ag{"gamma", gamma}, ay{"y", y}, ar{"rstd", rstd};
  on_device(op, {ax, ag, ay, ar});
  const bool device = require_storage_args(op, {ax, ag, ay});
  require_stat_args(op, device, ax, {ar});
  const index_t N = rows_of(op, ax), H = x.dim(-1);
  MESH_VERIFY(gamma.numel() == H,
              op << ": " << describe(ag) << " must hold " << H << " elements, the last dim of "
                 << describe(ax));
  MESH_VERIFY(y.shape() == x.shape(), op << ": " << describe(ay) << " must match " << describe(ax));
  require_per_row(op, ar, N, ax);
  MESH_VERIFY(eps > 0, op << ": eps must be positive, got " << eps);
  if (device) {
    ON_CUDA(cuda::rmsnorm_forward(x.dtype(), x.raw(), gamma.raw(), N, H, eps, y.raw(),
                                  rstd.data<float>()));
    return;
  }
  with_rmsnorm_types(x.dtype(), [&](auto t, auto s) {
    using T = decltype(t);
    using S = decltype(s);
    kernels::rmsnorm_forward<Host>(x.data<T>(), gamma.data<T>(), N, H, eps, y.data<T>(),
                                   rstd.data<S>());
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      Tensor& dx, Tensor& dgamma, GradStore store) {
  const char* op = "rmsnorm_backward";
  const Arg ady{"dy", dy}, ax{"x", x}, ag{"gamma", gamma}, ar{"rstd", rstd}, adx{"dx", dx},
      adg{"dgamma", dgamma};
  on_device(op, {ax, ady, ag, ar, adx, adg});
  const bool device = require_storage_args(op, {ax, ady, ag, adx});
  require_stat_args(op, device, ax, {ar});
  require_grad_args(op, device, ax, {adg});
  const index_t N = rows_of(op, ax), H = x.dim(-1);
  MESH_VERIFY(
      dy.shape() == x.shape() && dx.shape() == x.shape(),
      op << ": " << describe(ady) << " and " << describe(adx) << " must match " << describe(ax));
  for (const Arg& a : {ag, adg})
    MESH_VERIFY(a.t.numel() == H, op << ": " << describe(a) << " must hold " << H
                                     << " elements, the last dim of " << describe(ax));
  require_per_row(op, ar, N, ax);
  MESH_VERIFY(!overlaps(dx, dy) && !overlaps(dx, x),
              op << ": " << describe(adx) << " must not overlap dy or x");
  if (device) {
    ON_CUDA(cuda::rmsnorm_backward(x.dtype(), dgamma.dtype(), dy.raw(), x.raw(), gamma.raw(),
                                   rstd.data<float>(), N, H, dx.raw(), dgamma.raw(),
                                   /*residual_grad=*/nullptr, store == GradStore::Accumulate));
    return;
  }
  if (store == GradStore::Overwrite) dgamma.fill(0.0);  // the host kernel adds
  with_rmsnorm_types(x.dtype(), [&](auto t, auto s) {
    using T = decltype(t);
    using S = decltype(s);
    const auto run = [&](auto* dgamma_data) {
      kernels::rmsnorm_backward<Host>(dy.data<T>(), x.data<T>(), gamma.data<T>(), rstd.data<S>(),
                                      N, H, dx.data<T>(), dgamma_data);
    };
    if (dgamma.dtype() == x.dtype())
      run(dgamma.data<T>());
    else
      run(dgamma.data<float>());
  });
}

}  // namespace meshtron::ops
