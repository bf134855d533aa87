// The dropout ops (ops.hpp: Dropout): a counter-based mask keyed by the
// site's global placement (kernels/kokkos/dropout.hpp).
#include <cstdint>

#include "kernels/kokkos/dropout.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

// --------------------------------------------------------------- Dropout ---

namespace {
void check_dropout(const char* op, const Arg& in, double p, const DropoutSite& s, const Arg& out) {
  (void)require_float_args(op, {in, out});
  require_same_numel(op, in, out);
  MESH_VERIFY(p >= 0.0 && p < 1.0, op << ": p must be in [0, 1), got " << p);
  check_dropout_site(op, s, in.t.numel(), describe(in));
}

/// out = dropout(in), or residual + dropout(in) where residual is given.
void dropout_apply(const Tensor& in, double p, const DropoutSite& s, Tensor& out,
                   const Tensor* residual = nullptr) {
  if (!in.is_host()) {
    ON_CUDA(cuda::dropout_apply(in.dtype(), in.raw(), in.numel(), p, device_placement(s),
                                out.raw(), residual ? residual->raw() : nullptr));
    return;
  }
  const kernels::DropoutPlacement place = placement(s);
  with_float_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::dropout_apply<Host>(in.data<T>(), in.numel(), p, place, out.data<T>(),
                                 residual ? residual->data<T>() : nullptr);
  });
}
}  // namespace

void dropout_forward(const Tensor& x, double p, const DropoutSite& site, Tensor& y) {
  check_dropout("dropout_forward", {"x", x}, p, site, {"y", y});
  dropout_apply(x, p, site, y);
}

void dropout_add(const Tensor& x, const Tensor& residual, double p, const DropoutSite& site,
                 Tensor& out) {
  const char* op = "dropout_add";
  check_dropout(op, {"x", x}, p, site, {"out", out});
  const Arg ax{"x", x}, ar{"residual", residual};
  (void)require_float_args(op, {ax, ar});
  require_same_numel(op, ax, ar);
  dropout_apply(x, p, site, out, &residual);
}

void dropout_backward(const Tensor& dy, double p, const DropoutSite& site, Tensor& dx) {
  check_dropout("dropout_backward", {"dy", dy}, p, site, {"dx", dx});
  dropout_apply(dy, p, site, dx);
}

bool dropout_keep(std::uint64_t seed, std::uint32_t step, std::uint32_t stream,
                  std::uint64_t global_index, double p) {
  return kernels::dropout_keep(seed, step, stream, global_index, p);
}

}  // namespace meshtron::ops
