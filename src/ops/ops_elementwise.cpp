// The elementwise ops (ops.hpp: GeLU and biases, MLP activations): GeLU,
// the bias add and its gradient, add, axpy, scale; the exact GeLU and ReLU;
// SwiGLU and GeGLU.
#include "kernels/kokkos/elementwise.hpp"
#include "kernels/kokkos/gated_activation.hpp"
#include "kernels/kokkos/gelu.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

// ------------------------------------------------------ GeLU and biases ---

void gelu_forward(const Tensor& x, Tensor& y) {
  const char* op = "gelu_forward";
  const Arg ax{"x", x}, ay{"y", y};
  const bool device = require_float_args(op, {ax, ay});
  require_same_numel(op, ax, ay);
  if (device) {
    ON_CUDA(cuda::gelu_forward(x.dtype(), x.raw(), x.numel(), y.raw()));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::gelu_forward<Host>(x.data<T>(), x.numel(), y.data<T>());
  });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "gelu_backward";
  const Arg ady{"dy", dy}, ax{"x", x}, adx{"dx", dx};
  const bool device = require_float_args(op, {ax, ady, adx});
  require_same_numel(op, ax, ady);
  require_same_numel(op, ax, adx);
  if (device) {
    ON_CUDA(cuda::gelu_backward(x.dtype(), dy.raw(), x.raw(), x.numel(), dx.raw()));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::gelu_backward<Host>(dy.data<T>(), x.data<T>(), x.numel(), dx.data<T>());
  });
}

void bias_add(Tensor& y, const Tensor& bias) {
  const char* op = "bias_add";
  const Arg ay{"y", y}, ab{"bias", bias};
  const bool device = require_float_args(op, {ay, ab});
  const index_t N = rows_of(op, ay), C = y.dim(-1);
  MESH_VERIFY(bias.numel() == C, op << ": " << describe(ab) << " must hold " << C
                                    << " elements, the last dim of " << describe(ay));
  if (device) {
    ON_CUDA(cuda::bias_add(y.dtype(), y.raw(), bias.raw(), N, C));
    return;
  }
  with_float_type(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::bias_add<Host>(y.data<T>(), bias.data<T>(), N, C);
  });
}

void bias_backward(const Tensor& dy, Tensor& dbias, GradStore store) {
  const char* op = "bias_backward";
  const Arg ady{"dy", dy}, adb{"dbias", dbias};
  on_device(op, {ady, adb});
  const bool device = require_float_args(op, {ady});
  require_grad_args(op, device, ady, {adb});
  const index_t N = rows_of(op, ady), C = dy.dim(-1);
  MESH_VERIFY(dbias.numel() == C, op << ": " << describe(adb) << " must hold " << C
                                     << " elements, the last dim of " << describe(ady));
  if (device) {
    ON_CUDA(cuda::bias_backward(dy.dtype(), dbias.dtype(), dy.raw(), N, C, dbias.raw(),
                                store == GradStore::Accumulate));
    return;
  }
  if (store == GradStore::Overwrite) dbias.fill(0.0);  // the host kernel adds
  with_float_type(dy.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::bias_backward<Host>(dy.data<T>(), N, C, dbias.data<T>());
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  const Arg aa{"a", a}, ab{"b", b}, ao{"out", out};
  const bool device = require_float_args(op, {aa, ab, ao});
  require_same_numel(op, aa, ab);
  require_same_numel(op, aa, ao);
  if (device) {
    ON_CUDA(cuda::add(a.dtype(), a.raw(), b.raw(), a.numel(), out.raw()));
    return;
  }
  with_float_type(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::add<Host>(a.data<T>(), b.data<T>(), a.numel(), out.data<T>());
  });
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  const char* op = "axpy";
  const Arg ax{"x", x}, ay{"y", y};
  const bool device = require_float_args(op, {ax, ay});
  require_same_numel(op, ax, ay);
  if (device) {
    ON_CUDA(cuda::axpy(x.dtype(), alpha, x.raw(), x.numel(), y.raw()));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::axpy<Host>(alpha, x.data<T>(), x.numel(), y.data<T>());
  });
}

void scale(Tensor& x, double alpha) {
  const bool device = require_float_args("scale", {{"x", x}});
  if (device) {
    ON_CUDA(cuda::scale(x.dtype(), x.raw(), x.numel(), alpha));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scale<Host>(x.data<T>(), x.numel(), alpha);
  });
}

// ------------------------------------------------------- MLP activations ---

namespace {

kernels::GateKind gate_kind(GatedActivation act) {
  switch (act) {
    case GatedActivation::SiLU: return kernels::GateKind::SiLU;
    case GatedActivation::GeLUTanh: return kernels::GateKind::GeLUTanh;
    case GatedActivation::GeLUErf: return kernels::GateKind::GeLUErf;
    case GatedActivation::ReLU: return kernels::GateKind::ReLU;
    case GatedActivation::Tanh: return kernels::GateKind::Tanh;
  }
  MESH_VERIFY(false, "gated activation: unknown kind " << int(act));
  return kernels::GateKind::SiLU;
}

/// F, half the last dim of the gate | up tensor, which must be [N, 2F] for
/// the output-shaped `half` [N, F].
index_t gated_width(const char* op, const Arg& both, const Arg& half) {
  const index_t F = half.t.rank() == 2 ? half.t.dim(1) : 0;
  MESH_VERIFY(F > 0 && both.t.rank() == 2 && both.t.dim(0) == half.t.dim(0) &&
                  both.t.dim(1) == 2 * F,
              op << ": " << describe(both) << " must be [N, 2F] (gate | up) for "
                 << describe(half) << " [N, F]");
  return F;
}

#ifdef MESHTRON_HAVE_CUDA
cuda::GluActivation cuda_glu(GatedActivation act) {
  switch (act) {
    case GatedActivation::SiLU: return cuda::GluActivation::Silu;
    case GatedActivation::GeLUTanh: return cuda::GluActivation::GeluTanh;
    case GatedActivation::GeLUErf: return cuda::GluActivation::GeluErf;
    case GatedActivation::ReLU: return cuda::GluActivation::Relu;
    case GatedActivation::Tanh: return cuda::GluActivation::Tanh;
  }
  return cuda::GluActivation::Silu;
}
#endif

}  // namespace

void activation_forward(const Tensor& x, GatedActivation act, Tensor& y) {
  const char* op = "activation_forward";
  const Arg ax{"x", x}, ay{"y", y};
  const bool device = require_storage_args(op, {ax, ay});
  MESH_VERIFY(x.shape() == y.shape(), op << ": " << describe(ay) << " must match " << describe(ax));
  if (device) {
    ON_CUDA(cuda::activation_forward(x.dtype(), cuda_glu(act), x.raw(), x.numel(), y.raw()));
    return;
  }
  with_storage_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::activation_forward<Host>(x.data<T>(), x.numel(), gate_kind(act), y.data<T>());
  });
}

void activation_backward(const Tensor& dy, const Tensor& x, GatedActivation act, Tensor& dx) {
  const char* op = "activation_backward";
  const Arg ady{"dy", dy}, ax{"x", x}, adx{"dx", dx};
  const bool device = require_storage_args(op, {ax, ady, adx});
  MESH_VERIFY(dy.shape() == x.shape() && dx.shape() == x.shape(),
              op << ": " << describe(ady) << " and " << describe(adx) << " must match "
                 << describe(ax));
  if (device) {
    ON_CUDA(cuda::activation_backward(x.dtype(), cuda_glu(act), dy.raw(), x.raw(), x.numel(),
                                      dx.raw()));
    return;
  }
  with_storage_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::activation_backward<Host>(dy.data<T>(), x.data<T>(), x.numel(), gate_kind(act),
                                       dx.data<T>());
  });
}

void gated_activation_forward(const Tensor& x, GatedActivation act, Tensor& y) {
  const char* op = "gated_activation_forward";
  const Arg ax{"x", x}, ay{"y", y};
  const bool device = require_storage_args(op, {ax, ay});
  const index_t F = gated_width(op, ax, ay), N = y.dim(0);
  MESH_VERIFY(!overlaps(x, y), op << ": " << describe(ay) << " must not overlap " << describe(ax));
  if (device) {
    ON_CUDA(cuda::glu_forward(x.dtype(), cuda_glu(act), x.raw(), N, F, y.raw()));
    return;
  }
  with_storage_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::gated_activation_forward<Host>(x.data<T>(), N, F, gate_kind(act), y.data<T>());
  });
}

void gated_activation_backward(const Tensor& dy, const Tensor& x, GatedActivation act,
                               Tensor& dx) {
  const char* op = "gated_activation_backward";
  const Arg ady{"dy", dy}, ax{"x", x}, adx{"dx", dx};
  const bool device = require_storage_args(op, {ax, ady, adx});
  const index_t F = gated_width(op, ax, ady), N = dy.dim(0);
  MESH_VERIFY(dx.shape() == x.shape(), op << ": " << describe(adx) << " must match "
                                          << describe(ax));
  MESH_VERIFY(!overlaps(dx, dy), op << ": " << describe(adx) << " must not overlap "
                                    << describe(ady));
  if (device) {
    ON_CUDA(cuda::glu_backward(x.dtype(), cuda_glu(act), dy.raw(), x.raw(), N, F, dx.raw()));
    return;
  }
  with_storage_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::gated_activation_backward<Host>(dy.data<T>(), x.data<T>(), N, F, gate_kind(act),
                                             dx.data<T>());
  });
}

}  // namespace meshtron::ops
