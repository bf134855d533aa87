// The rotary position embedding ops (ops.hpp: Rotary position embedding).
#include <cmath>

#include "kernels/kokkos/rotary.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

index_t rotary_dim_for(index_t head_dim, double percent) {
  MESH_REQUIRE(percent > 0 && percent <= 1,
               "rotary: the rotary percent must be in (0, 1], got " << percent);
  const index_t dim = index_t(double(head_dim) * percent);
  MESH_REQUIRE(dim > 0 && dim % 2 == 0, "rotary: head dim " << head_dim << " x rotary percent "
                                                            << percent << " gives " << dim
                                                            << " rotary dims; they must be even "
                                                               "and positive");
  return dim;
}

namespace {

/// Checks x, y [tokens, heads, head_dim], positions int32 [tokens] and the
/// spec; returns the kernels' geometry.
kernels::RotaryGeometry rotary_geometry(const char* op, const Arg& ax, const Arg& ap, const Arg& ay,
                                        const RotarySpec& rope, index_t rotated_heads) {
  const Tensor& x = ax.t;
  MESH_VERIFY(x.rank() == 3, op << ": " << describe(ax) << " must be [tokens, heads, head_dim]");
  MESH_VERIFY(ay.t.shape() == x.shape(),
              op << ": " << describe(ay) << " must match " << describe(ax));
  require_index_arg(op, ap);
  require_per_row(op, ap, x.dim(0), ax);
  const index_t heads = x.dim(1), head_dim = x.dim(2);
  MESH_VERIFY(rope.rotary_dim > 0 && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= head_dim,
              op << ": rotary_dim " << rope.rotary_dim << " must be even, positive and at most "
                 << "the head dim of " << describe(ax));
  MESH_VERIFY(rope.base > 1 && std::isfinite(rope.base),
              op << ": the rotary base must be finite and above 1, got " << rope.base);
  if (rotated_heads < 0) rotated_heads = heads;
  MESH_VERIFY(rotated_heads <= heads,
              op << ": cannot rotate " << rotated_heads << " heads of " << describe(ax));
  return {x.dim(0),      heads,           head_dim,
          rotated_heads, rope.rotary_dim, rope.layout == RotaryLayout::Interleaved};
}

#ifdef MESHTRON_HAVE_CUDA
/// The device kernel rotates the first g.rotated_heads heads of each row in
/// place or into y; the heads it leaves are copied first when y is apart.
void rotate_on_device(const Tensor& x, const Tensor& positions, const kernels::RotaryGeometry& g,
                      const RotarySpec& rope, const Tensor& y, double sign) {
  const Tensor* from = &x;
  if (x.raw() != y.raw() && g.rotated_heads < g.heads) {
    Tensor(y).copy_from(x);  // a handle: y's memory
    from = &y;
  }
  const index_t row = g.heads * g.head_dim;
  const auto layout = rope.layout == RotaryLayout::Interleaved ? cuda::RotaryLayout::Interleaved
                                                               : cuda::RotaryLayout::HalfSplit;
  const auto launch = sign > 0 ? cuda::rotary_forward : cuda::rotary_backward;
  launch(x.dtype(), from->raw(), row, y.raw(), row, positions.data<std::int32_t>(), g.tokens,
         g.rotated_heads, g.head_dim, g.rotary_dim, rope.base, layout);
}
#endif

void rotate(const char* op, const Arg& ax, const Arg& ap, const RotarySpec& rope, const Arg& ay,
            index_t rotated_heads, double sign) {
  on_device(op, {ax, ap, ay});
  const bool device = require_storage_args(op, {ax, ay});
  const kernels::RotaryGeometry g = rotary_geometry(op, ax, ap, ay, rope, rotated_heads);
  MESH_VERIFY(ax.t.raw() == ay.t.raw() || !overlaps(ax.t, ay.t),
              op << ": " << describe(ay) << " must be " << ax.name << " itself or apart from it");
  if (device) {
    ON_CUDA(rotate_on_device(ax.t, ap.t, g, rope, ay.t, sign));
    return;
  }
  with_storage_type(ax.t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::rotary<Host>(ax.t.data<T>(), ap.t.data<std::int32_t>(), g, rope.base, sign,
                          ay.t.data<T>());
  });
}

}  // namespace

void rotary_forward(const Tensor& x, const Tensor& positions, const RotarySpec& rope, Tensor& y,
                    index_t rotated_heads) {
  rotate("rotary_forward", {"x", x}, {"positions", positions}, rope, {"y", y}, rotated_heads, 1.0);
}

void rotary_backward(const Tensor& dy, const Tensor& positions, const RotarySpec& rope, Tensor& dx,
                     index_t rotated_heads) {
  rotate("rotary_backward", {"dy", dy}, {"positions", positions}, rope, {"dx", dx}, rotated_heads,
         -1.0);
}

}  // namespace meshtron::ops
