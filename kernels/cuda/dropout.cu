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
//
// Speed. Each element uses word 0 of ITS OWN counter (the counter is the
// element's global index), so one Philox call cannot serve 4 elements
// without changing the masks; the generator cost per element is fixed.
// What the packed kernel removes is everything around it:
//   - one 16-byte load and store per thread per pack (4 fp32 / 8 bf16)
//     instead of 2- or 4-byte accesses;
//   - one (c, b, a) division pair per pack instead of per element: within
//     the pack the local coordinates advance by one with carries (c wraps at
//     C into b, b wraps at B into a), and the global index is the row's
//     start (64-bit multiplies, redone only on a carry) plus c: in exact
//     integer arithmetic the same number the per-element formula gives;
//   - V independent Philox chains per thread, which the compiler
//     interleaves (instruction-level parallelism for the 10 serial rounds).
// Every element's decision and value are computed by the same functions
// as before (keep_element, load_f * keep_scale, store_f), so the output is
// bit for bit the scalar kernel's. The scalar kernel stays the fallback for
// pointers that are not 16-byte aligned (views from slice_rows).
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

/// Global Philox index of local (a, b, c) (see the header comment).
__device__ __forceinline__ std::uint64_t global_index(const DropoutPlacement& s, kindex a,
                                                      kindex b, kindex c) {
  return std::uint64_t(((a + s.a_offset) * s.b_global + (b + s.b_offset)) * s.c_global +
                       (c + s.c_offset));
}

/// global_index(s, a, b, 0).
__device__ __forceinline__ kindex row_start(const DropoutPlacement& s, kindex a, kindex b) {
  return ((a + s.a_offset) * s.b_global + (b + s.b_offset)) * s.c_global + s.c_offset;
}

/// Packs of V = 16 / sizeof(T) elements; in, out 16-byte aligned. The
/// n % V tail goes element by element (block 0), like map3_packed_kernel.
template <class T, class I>
__global__ void dropout_packed_kernel(const T* in, kindex n, std::uint32_t threshold,
                                      float keep_scale, DropoutPlacement s, T* out) {
  constexpr int V = kPack<T>;
  const I sc = I(s.c), sb = I(s.b);
  const kindex packs = n / V;
  GRID_STRIDE(k, packs) {
    const Pack<T> pin = reinterpret_cast<const Pack<T>*>(in)[k];
    const I first = I(k * V);
    I c = first % sc, ab = first / sc, b = ab % sb, a = ab / sb;
    // global = row_start(a, b) + c: exact integer arithmetic, equal to
    // global_index(s, a, b, c); row_start changes only when c carries.
    kindex row = row_start(s, kindex(a), kindex(b));
    Pack<T> pout;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const bool keep = keep_element(s, std::uint64_t(row + kindex(c)), threshold);
      pout.v[j] = from_f<T>(keep ? to_f(pin.v[j]) * keep_scale : 0.f);
      if (++c == sc) {  // next element: carry c into b, b into a
        c = 0;
        if (++b == sb) {
          b = 0;
          ++a;
        }
        row = row_start(s, kindex(a), kindex(b));
      }
    }
    reinterpret_cast<Pack<T>*>(out)[k] = pout;
  }
  if (blockIdx.x == 0)
    for (kindex i = packs * V + threadIdx.x; i < n; i += blockDim.x) {
      const I li = I(i);
      const I c = li % sc, ab = li / sc, b = ab % sb, a = ab / sb;
      const bool keep = keep_element(s, global_index(s, kindex(a), kindex(b), kindex(c)),
                                     threshold);
      store_f(out, i, keep ? load_f(in, i) * keep_scale : 0.f);
    }
}

constexpr int kThreads = 256;

template <class T, class I>
void launch_dropout(const T* in, kindex n, std::uint32_t threshold, float keep_scale,
                    const DropoutPlacement& site, T* out) {
  if (aligned16(in) && aligned16(out))
    dropout_packed_kernel<T, I><<<grid_for(n / kPack<T> + 1, kThreads), kThreads, 0, kStream>>>(
        in, n, threshold, keep_scale, site, out);
  else
    dropout_kernel<T, I><<<grid_for(n, kThreads), kThreads, 0, kStream>>>(in, n, threshold,
                                                                          keep_scale, site, out);
  MESH_CUDA_LAUNCHED();
}

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
    // The packed kernel's carries can step one past the last element
    // (a = A), so 32-bit indices need n < UINT32_MAX, not <=.
    if (n < kindex(UINT32_MAX))
      launch_dropout<T, std::uint32_t>(static_cast<const T*>(in), n, threshold, keep_scale, site,
                                       static_cast<T*>(out));
    else
      launch_dropout<T, std::uint64_t>(static_cast<const T*>(in), n, threshold, keep_scale, site,
                                       static_cast<T*>(out));
  });
}

}  // namespace meshtron::cuda
