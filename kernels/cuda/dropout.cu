// ================================================================= Dropout ==
//
// The counter-based dropout of kernels/kokkos/dropout.hpp, bit for bit: one
// Philox4x32-10 call serves the 8 consecutive global indices 8q .. 8q + 7,
//   key     = {seed lo32, seed hi32}
//   counter = {q lo32, q hi32, step, stream}        q = global index >> 3
//   keep    = (half-word (global index & 7)) * 2^-16 >= p
// and the global index of local (a, b, c) in the view [A, B, C] placed at
// (a_off, b_off, c_off) inside [*, B_global, C_global] is
//   ((a + a_off) B_global + (b + b_off)) C_global + (c + c_off).
// The generator and the decision are kernels/cuda/philox.cuh's (shared with
// the attention dropout of the fused attention kernels).
//
// Speed. The generator (10 rounds of 32x32-bit multiplies) bounded the
// kernel when every element ran its own call; now the grouped kernel gives
// each thread aligned groups of 8 consecutive elements and makes ONE call
// per group. It applies when the groups of the local view are groups of
// the global index: C, c_offset and C_global multiples of 8 (then the
// global index of local element 8m is a multiple of 8 and 8m .. 8m + 7
// share its row), in and out 16-byte aligned: the transformer's dropouts
// (rows of H, or H / tp, features) are whenever those are multiples of 8
// (every model deck's). Each thread takes
// two 16-byte packs (8 fp32 or 16 bf16: 1 or 2 Philox calls, independent,
// which the compiler interleaves), computes the groups' counters first
// (division once per chunk, then carries as below) and then the calls.
// Other placements keep the per-element kernels below, which call the
// generator once per element and take the element's half-word.
// What the per-element packed kernel removes is everything around it:
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
//
// With a residual (ops::dropout_add, Megatron's dropout-add fusion) every
// kernel also reads the residual's element and writes residual + dropped:
// one pass over three tensors instead of dropout (two) then add (three).
// The dropped value is rounded to T first and the sum is __fadd_rn (never
// contracted into an FMA), so the bits are dropout_forward's then add's.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/philox.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

using namespace philox;

/// residual[i] + dropped where there is a residual (rounded to T as add
/// rounds it), else dropped.
template <class T>
__device__ __forceinline__ float plus_residual(const T* residual, kindex i, T dropped) {
  return residual ? __fadd_rn(load_f(residual, i), to_f(dropped)) : to_f(dropped);
}

/// The pack form: out (the dropped pack) += residual pack k, element by element.
template <class T>
__device__ __forceinline__ void add_residual_pack(const Pack<T>& r, Pack<T>& out) {
  const Widened<T> wr = widen(r), wo = widen(out);
#pragma unroll
  for (int j = 0; j < kPack<T>; ++j) out.v[j] = from_f<T>(__fadd_rn(wr.v[j], wo.v[j]));
}

/// I = uint32_t when every extent fits (64-bit division is emulated on the
/// GPU and would cost more than the generator itself), else uint64_t.
template <class T, class I>
__global__ void dropout_kernel(const T* in, kindex n, std::uint32_t threshold, float keep_scale,
                               DropoutPlacement site, const T* residual, T* out) {
  start_after_prior_grid();
  const DropoutPlacement s = resolved(site);
  const I sc = I(s.c), sb = I(s.b);
  GRID_STRIDE(i, n) {
    const I li = I(i);
    const I c = li % sc, ab = li / sc, b = ab % sb, a = ab / sb;
    const std::uint64_t global =
        std::uint64_t(((kindex(a) + s.a_offset) * s.b_global + (kindex(b) + s.b_offset)) *
                          s.c_global +
                      (kindex(c) + s.c_offset));
    const T dropped =
        from_f<T>(keep_element(s, global, threshold) ? load_f(in, i) * keep_scale : 0.f);
    store_f(out, i, plus_residual(residual, i, dropped));
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
                                      float keep_scale, DropoutPlacement site, const T* residual,
                                      T* out) {
  start_after_prior_grid();
  const DropoutPlacement s = resolved(site);
  constexpr int V = kPack<T>;
  const I sc = I(s.c), sb = I(s.b);
  const kindex packs = n / V;
  GRID_STRIDE(k, packs) {
    const Pack<T> pin = reinterpret_cast<const Pack<T>*>(in)[k];
    Pack<T> pres;
    if (residual) pres = reinterpret_cast<const Pack<T>*>(residual)[k];
    const I first = I(k * V);
    I c = first % sc, ab = first / sc, b = ab % sb, a = ab / sb;
    // global = row_start(a, b) + c: exact integer arithmetic, equal to
    // global_index(s, a, b, c); row_start changes only when c carries.
    kindex row = row_start(s, kindex(a), kindex(b));
    Pack<T> pout;
    const Widened<T> win = widen(pin);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const bool keep = keep_element(s, std::uint64_t(row + kindex(c)), threshold);
      pout.v[j] = from_f<T>(keep ? win.v[j] * keep_scale : 0.f);
      if (++c == sc) {  // next element: carry c into b, b into a
        c = 0;
        if (++b == sb) {
          b = 0;
          ++a;
        }
        row = row_start(s, kindex(a), kindex(b));
      }
    }
    if (residual) add_residual_pack(pres, pout);
    reinterpret_cast<Pack<T>*>(out)[k] = pout;
  }
  if (blockIdx.x == 0)
    for (kindex i = packs * V + threadIdx.x; i < n; i += blockDim.x) {
      const I li = I(i);
      const I c = li % sc, ab = li / sc, b = ab % sb, a = ab / sb;
      const bool keep = keep_element(s, global_index(s, kindex(a), kindex(b), kindex(c)),
                                     threshold);
      store_f(out, i, plus_residual(residual, i, from_f<T>(keep ? load_f(in, i) * keep_scale : 0.f)));
    }
}

/// Packs per thread of the grouped kernel.
constexpr int kGroupedPacks = 2;

/// One Philox call per aligned group of 8 (see the header: C, c_offset,
/// C_global multiples of 8, in and out 16-byte aligned). Thread chunks of
/// E = kGroupedPacks packs; the n % E tail (whole groups) in block 0.
template <class T, class I>
__global__ void dropout_grouped_kernel(const T* in, kindex n, std::uint32_t threshold,
                                       float keep_scale, DropoutPlacement site, const T* residual,
                                       T* out) {
  start_after_prior_grid();
  const DropoutPlacement s = resolved(site);
  constexpr int E = kGroupedPacks * kPack<T>, G = E / kGroup;
  const I sc = I(s.c), sb = I(s.b);
  const kindex chunks = n / E;
  GRID_STRIDE(k, chunks) {
    Pack<T> pin[kGroupedPacks];
#pragma unroll
    for (int u = 0; u < kGroupedPacks; ++u)
      pin[u] = reinterpret_cast<const Pack<T>*>(in)[k * kGroupedPacks + u];
    Pack<T> pres[kGroupedPacks];
    if (residual)
#pragma unroll
      for (int u = 0; u < kGroupedPacks; ++u)
        pres[u] = reinterpret_cast<const Pack<T>*>(residual)[k * kGroupedPacks + u];
    const I first = I(k * E);
    I c = first % sc, ab = first / sc, b = ab % sb, a = ab / sb;
    kindex row = row_start(s, kindex(a), kindex(b));
    std::uint64_t q[G];  // the counters first: the G calls are then independent
#pragma unroll
    for (int g = 0; g < G; ++g) {
      q[g] = group_of(std::uint64_t(row + kindex(c)));
      c += kGroup;
      if (c == sc) {  // C % 8 == 0: a group never straddles a row
        c = 0;
        if (++b == sb) {
          b = 0;
          ++a;
        }
        row = row_start(s, kindex(a), kindex(b));
      }
    }
    uint4 r[G];
#pragma unroll
    for (int g = 0; g < G; ++g) r[g] = group_bits(s, q[g]);
    Pack<T> pout[kGroupedPacks];
    Widened<T> win[kGroupedPacks];
#pragma unroll
    for (int u = 0; u < kGroupedPacks; ++u) win[u] = widen(pin[u]);
#pragma unroll
    for (int e = 0; e < E; ++e) {  // element e of the chunk: group e / 8, half-word e % 8
      const float v = win[e / kPack<T>].v[e % kPack<T>];
      pout[e / kPack<T>].v[e % kPack<T>] = from_f<T>(
          keep_half(half_word(r[e / kGroup], e % kGroup), threshold) ? v * keep_scale : 0.f);
    }
#pragma unroll
    for (int u = 0; u < kGroupedPacks; ++u) {
      if (residual) add_residual_pack(pres[u], pout[u]);
      reinterpret_cast<Pack<T>*>(out)[k * kGroupedPacks + u] = pout[u];
    }
  }
  if (blockIdx.x == 0)
    for (kindex f = chunks * E + kindex(threadIdx.x) * kGroup; f < n;
         f += kindex(blockDim.x) * kGroup) {
      const I li = I(f);
      const I c = li % sc, ab = li / sc, b = ab % sb, a = ab / sb;
      const uint4 r = group_bits(s, group_of(global_index(s, kindex(a), kindex(b), kindex(c))));
#pragma unroll
      for (int j = 0; j < kGroup; ++j)
        store_f(out, f + j,
                plus_residual(residual, f + j,
                              from_f<T>(keep_half(half_word(r, j), threshold)
                                            ? load_f(in, f + j) * keep_scale
                                            : 0.f)));
    }
}

constexpr int kThreads = 256;

/// Whether local groups of 8 are global groups (see dropout_grouped_kernel).
bool groups_align(const DropoutPlacement& s) {
  return s.c % kGroup == 0 && s.c_offset % kGroup == 0 && s.c_global % kGroup == 0;
}

template <class T, class I>
void launch_dropout(const T* in, kindex n, std::uint32_t threshold, float keep_scale,
                    const DropoutPlacement& site, const T* residual, T* out) {
  constexpr int E = kGroupedPacks * kPack<T>;
  const bool packed = aligned16(in) && aligned16(out) && (!residual || aligned16(residual));
  if (packed && groups_align(site))
    launch_dependent(dropout_grouped_kernel<T, I>, grid_for(n / E + 1, kThreads), kThreads, 0,
                     compute_stream(), in, n, threshold, keep_scale, site, residual, out);
  else if (packed)
    launch_dependent(dropout_packed_kernel<T, I>, grid_for(n / kPack<T> + 1, kThreads), kThreads, 0,
                     compute_stream(), in, n, threshold, keep_scale, site, residual, out);
  else
    launch_dependent(dropout_kernel<T, I>, grid_for(n, kThreads), kThreads, 0, compute_stream(), in,
                     n, threshold, keep_scale, site, residual, out);
}

}  // namespace

void dropout_apply(DType t, const void* in, index_t n, double p, const DropoutPlacement& site,
                   void* out, const void* residual) {
  if (n == 0) return;
  if (p == 0.0 && residual) {  // no mask, no scaling: the add
    add(t, residual, in, n, out);
    return;
  }
  with_storage_type(t, "dropout", [&](auto zero) {
    using T = decltype(zero);
    if (p == 0.0) {  // no mask, no scaling: a copy (or nothing, in place)
      if (in != out)
        CUDA_CHECK(cudaMemcpyAsync(out, in, std::size_t(n) * sizeof(T), cudaMemcpyDeviceToDevice,
                                   compute_stream()));
      return;
    }
    const std::uint32_t threshold = keep_threshold(p);
    const float keep_scale = float(1.0 / (1.0 - p));
    // The packed kernel's carries can step one past the last element
    // (a = A), so 32-bit indices need n < UINT32_MAX, not <=.
    if (n < kindex(UINT32_MAX))
      launch_dropout<T, std::uint32_t>(static_cast<const T*>(in), n, threshold, keep_scale, site,
                                       static_cast<const T*>(residual), static_cast<T*>(out));
    else
      launch_dropout<T, std::uint64_t>(static_cast<const T*>(in), n, threshold, keep_scale, site,
                                       static_cast<const T*>(residual), static_cast<T*>(out));
  });
}

}  // namespace meshtron::cuda
