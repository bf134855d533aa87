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
// (every model deck's). Each thread takes chunks of
// two 16-byte packs (8 fp32 or 16 bf16: 1 or 2 Philox calls, independent,
// which the compiler interleaves) over a resident grid, and per chunk:
//   - no division: the chunk's global groups come from a walk (GroupWalk)
//     that adds the grid stride's (b, c) parts with carries, the divisions
//     done once per thread (before the wait for the previous kernel);
//   - the next chunk's loads issued before this chunk's calls (software
//     pipelining: loads stay in flight while the thread computes, which
//     a thread otherwise does most of the time);
//   - the decisions as one integer compare on the call's word (keep_low /
//     keep_high: no half-word extraction), and a bf16 pair widened by a
//     shift and a mask and rounded by one cvt of the pair.
// A bf16 [8192, 3072] dropout takes about 2/3 of the instructions per
// 16 bytes it did with a division pair per chunk and per-element
// extraction and rounding (sm_90 code size of one chunk's body).
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
// bit for bit the scalar kernel's (the grouped kernel's too: the same
// decision in integers, the same fp32 product, the same rounding). The scalar kernel stays the fallback for
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
#pragma unroll
  for (int j = 0; j < kPack<T>; ++j) out.v[j] = from_f<T>(__fadd_rn(to_f(r.v[j]), to_f(out.v[j])));
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

/// Where a grouped-kernel thread is: the first group of its chunk as local
/// (b, cg), cg = c / 8 in [0, Cg), Cg = C / 8, and as global group q; and
/// its grid stride as the same three, (db, dcg) and dq (the a part folded
/// into dq). Moving on adds them with carries, cg into b and b into a,
/// and q follows in global units: one row of C_global / 8 groups per b, a
/// carry out of c skips the row's other C_global / 8 - Cg groups, one out
/// of b the plane's other B_global - B rows. Exact integer arithmetic (mod
/// 2^64), so q is group_of(global_index(s, a, b, 8 cg)) without the
/// divisions and the 64-bit multiplies of that formula, which a thread now
/// does once instead of once per chunk.
template <class I>
struct GroupWalk {
  I Cg, B, cg, b, dcg, db;
  std::uint64_t q, dq, row_skip, plane_skip;

  /// The walk of the chunks first_group, first_group + stride_groups, ...:
  /// the divisions, from the launch's extents only (no placement offsets),
  /// so a thread may do them before it waits for the previous kernel.
  __device__ __forceinline__ GroupWalk(const DropoutPlacement& site, I first_group,
                                       I stride_groups)
      : Cg(I(site.c / kGroup)), B(I(site.b)) {
    cg = first_group % Cg;
    b = (first_group / Cg) % B;
    dcg = stride_groups % Cg;
    db = (stride_groups / Cg) % B;
  }

  /// q and the skips from the resolved placement (offsets, sample), with the
  /// a coordinates (first_group's and the stride's) redone from the others.
  __device__ __forceinline__ void place(const DropoutPlacement& s, I first_group,
                                        I stride_groups) {
    const kindex a = kindex(first_group / Cg / B), da = kindex(stride_groups / Cg / B);
    const std::uint64_t row_groups = std::uint64_t(s.c_global / kGroup);
    q = group_of(std::uint64_t(row_start(s, a, kindex(b)))) + std::uint64_t(cg);
    dq = std::uint64_t(dcg) + (std::uint64_t(db) + std::uint64_t(da) * std::uint64_t(s.b_global)) *
                                  row_groups;
    row_skip = row_groups - std::uint64_t(Cg);
    plane_skip = (std::uint64_t(s.b_global) - std::uint64_t(B)) * row_groups;
  }

  /// (cg, b, q) moved on by (dc, dbb, dqq): a carry out of each at most.
  __device__ __forceinline__ void step(I& c, I& bb, std::uint64_t& qq, I dc, I dbb,
                                       std::uint64_t dqq) const {
    c += dc;
    bb += dbb;
    qq += dqq;
    if (c >= Cg) {
      c -= Cg;
      ++bb;
      qq += row_skip;
    }
    if (bb >= B) {
      bb -= B;
      qq += plane_skip;
    }
  }

  /// The global groups of the current chunk's G consecutive local groups.
  template <int G>
  __device__ __forceinline__ void chunk_groups(std::uint64_t (&qs)[G]) const {
    I c = cg, bb = b;
    std::uint64_t qq = q;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      qs[g] = qq;
      if (g + 1 < G) step(c, bb, qq, I(1), I(0), 1u);
    }
  }

  /// On to the thread's next chunk.
  __device__ __forceinline__ void advance() { step(cg, b, q, dcg, db, dq); }
};

/// Word j of a 16-byte pack, as a reference (j a constant after unrolling).
__device__ __forceinline__ std::uint32_t& word_ref(uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/// The dropped pair of a 32-bit word of two 16-bit values: each as fp32
/// times keep_scale where kept, +0 where not, rounded to T together
/// (widen_pair, narrow_pair: the values and bits of to_f and from_f).
template <class T>
__device__ __forceinline__ std::uint32_t drop_pair(std::uint32_t x, bool keep_lo, bool keep_hi,
                                                   float keep_scale) {
  const float2 v = widen_pair<T>(x);
  return narrow_pair<T>(keep_lo ? v.x * keep_scale : 0.f, keep_hi ? v.y * keep_scale : 0.f);
}

/// The chunk's P packs dropped, y from x, with the words r of its groups:
/// element e decides by half-word e % 8 of group e / 8 (keep_low / keep_high
/// against `above`, no extraction). A 16-bit pair's two half-words are one
/// whole word of r (elements 2i, 2i + 1: low, high).
template <class T, int P, int G>
__device__ __forceinline__ void drop_chunk(const uint4 (&r)[G], std::uint32_t above,
                                           float keep_scale, uint4 (&x)[P], uint4 (&y)[P]) {
  constexpr int W = 4 / int(sizeof(T));  // elements per 32-bit word
#pragma unroll
  for (int i = 0; i < 4 * P; ++i) {
    const int e = i * W;
    const std::uint32_t rw = word(r[e / kGroup], (e % kGroup) / 2);
    const std::uint32_t xw = word_ref(x[i / 4], i % 4);
    std::uint32_t& yw = word_ref(y[i / 4], i % 4);
    if constexpr (W == 2) {
      yw = drop_pair<T>(xw, keep_low(rw, above), keep_high(rw, above), keep_scale);
    } else {
      const bool keep = (e & 1) ? keep_high(rw, above) : keep_low(rw, above);
      yw = __float_as_uint(keep ? __uint_as_float(xw) * keep_scale : 0.f);
    }
  }
}

/// y += the residual pack res, element by element (add_residual_pack on words).
template <class T>
__device__ __forceinline__ void add_residual_words(const uint4& res, uint4& y) {
  Pack<T> r, out;
  __builtin_memcpy(&r, &res, sizeof(r));
  __builtin_memcpy(&out, &y, sizeof(out));
  add_residual_pack(r, out);
  __builtin_memcpy(&y, &out, sizeof(y));
}

/// Chunk k's P packs of x (and of the residual, with one).
template <bool kResidual, int P>
__device__ __forceinline__ void load_chunk(const uint4* x4, const uint4* r4, kindex k,
                                           uint4 (&x)[P], uint4 (&res)[P]) {
#pragma unroll
  for (int u = 0; u < P; ++u) x[u] = x4[k * P + u];
  if constexpr (kResidual)
#pragma unroll
    for (int u = 0; u < P; ++u) res[u] = r4[k * P + u];
}

/// One Philox call per aligned group of 8 (see the header: C, c_offset,
/// C_global multiples of 8, in and out 16-byte aligned). Thread chunks of
/// E = kGroupedPacks packs, G = E / 8 groups, grid-strided over a resident
/// grid (launch_dropout): each thread walks its chunks' groups with a
/// GroupWalk (divisions once per thread, not per chunk), issues the chunk's
/// loads first, then its G independent calls, then the decisions in
/// integers (keep_low / keep_high) and the scaling two 16-bit values to an
/// instruction pair where it can. kResidual: residual is not null (a kernel
/// of its own, so that the plain dropout carries no residual registers or
/// branches). The n % E tail (whole groups) in block 0.
template <class T, class I, bool kResidual>
__global__ void __launch_bounds__(256, sizeof(I) == 4 && !kResidual ? 4 : 3)
    dropout_grouped_kernel(const T* in, kindex n, std::uint32_t threshold, float keep_scale,
                           DropoutPlacement site, const T* residual, T* out) {
  constexpr int P = kGroupedPacks, E = P * kPack<T>, G = E / kGroup;
  const kindex chunks = n / E;
  const kindex first = kindex(blockIdx.x) * blockDim.x + threadIdx.x;
  const kindex stride = kindex(gridDim.x) * blockDim.x;
  // The walk's divisions use the launch's own arguments only: before the wait.
  GroupWalk<I> walk(site, I(first * G), I(stride * G));
  start_after_prior_grid();
  const DropoutPlacement s = resolved(site);
  const std::uint32_t above = keep_above(threshold);
  walk.place(s, I(first * G), I(stride * G));
  const uint4* x4 = reinterpret_cast<const uint4*>(in);
  const uint4* r4 = reinterpret_cast<const uint4*>(residual);
  uint4* y4 = reinterpret_cast<uint4*>(out);
  // Chunk k dropped from its loaded packs (and residual) and stored; the
  // walk moves on to the thread's next chunk.
  const auto drop_store = [&](kindex k, uint4 (&x)[P], const uint4 (&res)[P]) {
    std::uint64_t q[G];  // the counters first: the G calls are then independent
    walk.chunk_groups(q);
    uint4 r[G];
#pragma unroll
    for (int g = 0; g < G; ++g) r[g] = group_bits(s, q[g]);
    uint4 y[P];
    drop_chunk<T>(r, above, keep_scale, x, y);
#pragma unroll
    for (int u = 0; u < P; ++u) {
      if constexpr (kResidual) add_residual_words<T>(res[u], y[u]);
      y4[k * P + u] = y[u];
    }
    walk.advance();
  };
  // Software-pipelined: the next chunk's loads are issued before this
  // chunk's calls, so a thread keeps loads in flight while it computes (the
  // calls, not the loads, take most of its time). (Two bodies on two
  // buffers instead of the copy at the end: the compiler interleaved them,
  // 104-128 registers, or spills at 64.)
  uint4 x[P], res[P];
  if (first < chunks) load_chunk<kResidual>(x4, r4, first, x, res);
  for (kindex k = first; k < chunks; k += stride) {
    uint4 x_next[P], res_next[P];
    if (k + stride < chunks) load_chunk<kResidual>(x4, r4, k + stride, x_next, res_next);
    drop_store(k, x, res);
#pragma unroll
    for (int u = 0; u < P; ++u) {
      x[u] = x_next[u];
      if constexpr (kResidual) res[u] = res_next[u];
    }
  }
  if (blockIdx.x == 0)
    for (kindex f = chunks * E + kindex(threadIdx.x) * kGroup; f < n;
         f += kindex(blockDim.x) * kGroup) {
      const I sc = I(s.c), sb = I(s.b);
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

/// dropout_grouped_kernel on a resident grid: the walk's setup once per
/// thread, not per chunk.
template <class T, class I, bool kResidual>
void launch_grouped(const T* in, kindex n, std::uint32_t threshold, float keep_scale,
                    const DropoutPlacement& site, const T* residual, T* out) {
  constexpr int E = kGroupedPacks * kPack<T>;
  MESH_VERIFY(threshold >= 1, "dropout: keep_above needs p > 0");  // p = 0 never draws
  static const kindex resident =
      resident_blocks(dropout_grouped_kernel<T, I, kResidual>, kThreads);
  launch_dependent(dropout_grouped_kernel<T, I, kResidual>, grid_for(n / E, kThreads, resident),
                   kThreads, 0, compute_stream(), in, n, threshold, keep_scale, site, residual,
                   out);
}

template <class T, class I>
void launch_dropout(const T* in, kindex n, std::uint32_t threshold, float keep_scale,
                    const DropoutPlacement& site, const T* residual, T* out) {
  const bool packed = aligned16(in) && aligned16(out) && (!residual || aligned16(residual));
  if (packed && groups_align(site)) {
    if (residual)
      launch_grouped<T, I, true>(in, n, threshold, keep_scale, site, residual, out);
    else
      launch_grouped<T, I, false>(in, n, threshold, keep_scale, site, residual, out);
  } else if (packed)
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
