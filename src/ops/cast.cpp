#include "ops/cast.hpp"

namespace meshtron::ops {

void cast(const Tensor& src, Tensor& dst) {
  MESH_VERIFY(src.numel() == dst.numel(), "cast: src " << shape_string(src.shape())
                                              << " and dst " << shape_string(dst.shape())
                                              << " differ in size");
  MESH_VERIFY(src.space() == dst.space(), "cast: src and dst are in different memory spaces");
#ifdef MESHTRON_HAVE_CUDA
  const auto on_device_pair = [](DType a, DType b) {
    const auto half = [](DType t) { return t == DType::BF16 || t == DType::F16; };
    return (a == DType::F32 && half(b)) || (half(a) && b == DType::F32);
  };
  if (!src.is_host() && on_device_pair(src.dtype(), dst.dtype())) {
    cuda::cast(src.dtype(), src.raw(), dst.dtype(), dst.raw(), src.numel());
    return;
  }
#endif
  dst.copy_from(src);  // same dtype (a copy), or a host conversion
}

}  // namespace meshtron::ops
