// ================================================================= Dropout ==
//
// The counter-based dropout of kernels/kokkos/dropout.hpp, bit for bit: the
// keep decision of an element is Philox4x32-10 with
//   key     = {seed lo32, seed hi32}
//   counter = {global index lo32, global index hi32, step, stream}
//   keep    = (first word >> 8) * 2^-24 >= p
// and the global index of local (a, b, c) in the view [A, B, C] placed at
// (a_off, b_off, c_off) inside [*, B_global, C_global] is
//   ((a + a_off) B_global + (b + b_off)) C_global + (c + c_off).
// The Kokkos header cannot be shared (its functions are host-only in the
// Serial build), so the generator is restated here with the same constants;
// tests/gpu checks the masks against the host's, element by element.
// __umulhi gives the high half of the 32x32 products in one instruction.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

/// First output word of Philox4x32-10 (the only one dropout uses).
__device__ __forceinline__ std::uint32_t philox4x32_10_word0(std::uint32_t c0, std::uint32_t c1,
                                                             std::uint32_t c2, std::uint32_t c3,
                                                             std::uint32_t k0, std::uint32_t k1) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // key schedule: bump before every round but the first
      k0 += kW0;
      k1 += kW1;
    }
    const std::uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const std::uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return c0;
}

/// keep iff (w >> 8) 2^-24 >= p, i.e. iff (w >> 8) >= ceil(p 2^24): the
/// same decision in integers (p 2^24 is exact in double), computed once.
__device__ __forceinline__ bool keep_element(const DropoutPlacement& s, std::uint64_t index,
                                             std::uint32_t threshold) {
  const std::uint32_t w = philox4x32_10_word0(std::uint32_t(index), std::uint32_t(index >> 32),
                                              s.step, s.stream, std::uint32_t(s.seed),
                                              std::uint32_t(s.seed >> 32));
  return (w >> 8) >= threshold;
}

/// I = uint32_t when every extent fits (64-bit division is emulated on the
/// GPU and would cost more than the generator itself), else uint64_t.
template <class T, class I>
__global__ void dropout_kernel(const T* in, kindex n, std::uint32_t threshold, float keep_scale,
                               DropoutPlacement s, T* out) {
  const I sc = I(s.c), sb = I(s.b);
  GRID_STRIDE(i, n) {
    const I li = I(i);
    const I c = li % sc, ab = li / sc, b = ab % sb, a = ab / sb;
    const std::uint64_t global =
        std::uint64_t(((kindex(a) + s.a_offset) * s.b_global + (kindex(b) + s.b_offset)) *
                          s.c_global +
                      (kindex(c) + s.c_offset));
    store_f(out, i, keep_element(s, global, threshold) ? load_f(in, i) * keep_scale : 0.f);
  }
}

constexpr int kThreads = 256;

}  // namespace

void dropout_apply(DType t, const void* in, index_t n, double p, const DropoutPlacement& site,
                   void* out) {
  if (n == 0) return;
  with_storage_type(t, "dropout", [&](auto zero) {
    using T = decltype(zero);
    if (p == 0.0) {  // no mask, no scaling: a copy (or nothing, in place)
      if (in != out)
        CUDA_CHECK(cudaMemcpyAsync(out, in, std::size_t(n) * sizeof(T), cudaMemcpyDeviceToDevice,
                                   kStream));
      return;
    }
    const auto threshold = std::uint32_t(std::ceil(p * 16777216.0));  // p < 1: <= 2^24
    const float keep_scale = float(1.0 / (1.0 - p));
    if (n <= kindex(UINT32_MAX))
      dropout_kernel<T, std::uint32_t><<<grid_for(n, kThreads), kThreads, 0, kStream>>>(
          static_cast<const T*>(in), n, threshold, keep_scale, site, static_cast<T*>(out));
    else
      dropout_kernel<T, std::uint64_t><<<grid_for(n, kThreads), kThreads, 0, kStream>>>(
          static_cast<const T*>(in), n, threshold, keep_scale, site, static_cast<T*>(out));
    MESH_CUDA_LAUNCHED();
  });
}

}  // namespace meshtron::cuda
