// The reductions of the op table (ops.hpp: Reductions): sums of squares,
// of one tensor and of many (the gradient norm).
#include <vector>

#include "kernels/kokkos/elementwise.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

// ------------------------------------------------------------ Reductions ---

double sum_of_squares(const Tensor& x) {
  const bool device = require_float_args("sum_of_squares", {{"x", x}});
  double total = 0;
  if (device) {
    ON_CUDA(total = cuda::sum_of_squares(x.dtype(), x.raw(), x.numel()));
    return total;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    total = kernels::sum_of_squares<Host>(x.data<T>(), x.numel());
  });
  return total;
}

namespace {

/// The launchers' view of a list of device tensors (sum_of_squares_many*),
/// each checked to be floating point and on the device.
struct DeviceTensorList {
  std::vector<DType> types;
  std::vector<const void*> data;
  std::vector<index_t> sizes;
  explicit DeviceTensorList(const char* op, const std::vector<Tensor>& xs) {
    for (const Tensor& x : xs) {
      require_float_args(op, {{"x", x}});
      MESH_VERIFY(x.space() == MemorySpace::Cuda, op << ": tensors in different spaces");
      types.push_back(x.dtype());
      data.push_back(x.raw());
      sizes.push_back(x.numel());
    }
  }
  int count() const { return int(types.size()); }
};

}  // namespace

double sum_of_squares(const std::vector<Tensor>& xs) {
  if (xs.empty()) return 0.0;
  if (xs.front().space() == MemorySpace::Cuda) {
    const DeviceTensorList l("sum_of_squares", xs);
    double total = 0;
    ON_CUDA(total = cuda::sum_of_squares_many(l.count(), l.types.data(), l.data.data(),
                                              l.sizes.data()));
    return total;
  }
  double total = 0;  // the host sums tensor by tensor
  for (const Tensor& x : xs) total += sum_of_squares(x);
  return total;
}

void sum_of_squares_into(const std::vector<Tensor>& xs, Tensor& total) {
  const char* op = "sum_of_squares_into";
  MESH_VERIFY(total.dtype() == DType::F64 && total.numel() == 1,
              op << ": total is one F64 element; got " << describe({"total", total}));
  if (total.is_host()) {
    total.data<double>()[0] = sum_of_squares(xs);
    return;
  }
  const DeviceTensorList l(op, xs);
  ON_CUDA(cuda::sum_of_squares_many_to(l.count(), l.types.data(), l.data.data(), l.sizes.data(),
                                       total.data<double>()));
}

}  // namespace meshtron::ops
