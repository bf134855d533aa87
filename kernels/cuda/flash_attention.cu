// ====================================================== Flash attention ==
//
// Fused causal attention, FlashAttention-2 style (Dao, 2023), for bf16 and
// fp16 storage with fp32 accumulation, head dims 64 and 128. Same math as
// kernels/kokkos/attention.hpp; q, k, v, out, dq, dk, dv are [B, S, D] (B =
// batch x heads) and lse [B, S] fp32 (natural log). Nothing of size S x S
// ever reaches memory.
//
// Tensor cores: mma.sync.m16n8k16 (bf16/fp16 in, fp32 out), operands read
// from shared memory with ldmatrix. Every warp owns 16 rows of the output
// tile. A score tile's fp32 accumulator fragment has exactly the layout of
// the A operand of the next mma, so P (or dS) goes from one GEMM to the
// next in registers, rounded to the storage type. Shared tiles have rows of
// D + 8 elements, so the 8 rows one ldmatrix reads fall in distinct banks.
// Global -> shared copies are cp.async (16 bytes, zero-filled past S),
// double-buffered: the next tile loads while the current one is used.
//
// Forward: one CTA per block of query rows (16 per warp); it walks the
// key/value blocks up to the causal diagonal only, keeping the running row
// max m and sum l (log2 domain, exp2f) in registers; lse = (m + log2 l) ln 2.
//
// Backward, deterministic (no atomics; the same bits every run):
//   1. delta_i = dout_i . out_i                            (one warp per row)
//   2. dK, dV: one CTA per block of keys (16 per warp), walking the query
//      blocks from the diagonal to the end; P^T, dP^T and dS^T are rebuilt
//      per tile from the saved lse; dV += P^T dO, dK += dS^T Q stay in
//      registers.
//   3. dQ: one CTA per block of queries, walking the key blocks up to the
//      diagonal (rebuilding S and dP once more); dQ += dS K in registers.
// Step 3 repeats two of step 2's GEMMs (7 GEMMs in all instead of 5 with
// fp32 atomics into dQ) for a result that does not depend on scheduling.
//
// Grids run the heaviest CTAs (longest causal walk) first.
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kPad = 8;  // elements of padding per shared row (16 bytes)
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// ------------------------------------------------ tensor-core primitives ---

template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<bf16_t>(float (&d)[4], const std::uint32_t (&a)[4],
                                                 std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<f16_t>(float (&d)[4], const std::uint32_t (&a)[4],
                                                std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats rounded to T, `lo` in the low half (the lower column).
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ std::uint32_t pack2<bf16_t>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<f16_t>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return std::uint32_t(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

/// 16 bytes global -> shared; zero-filled when !valid (src is not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ------------------------------------------------------- warp-level GEMMs ---
//
// A warp's accumulator acc[N/8][4] is a 16 x N fp32 tile: lane (g = lane/4,
// t = lane%4) holds rows g (elements 0, 1) and g + 8 (elements 2, 3) of
// columns nb*8 + 2t and nb*8 + 2t + 1 of each 8-column block nb.

/// acc (16 x N) += A B^T: A is 16 x K at `a` (row-major, stride lda), B is
/// N x K at `b` (row-major, stride ldb): e.g. S = Q K^T.
template <class T, int N, int K>
__device__ __forceinline__ void mma_abt(float (&acc)[N / 8][4], const T* a, int lda, const T* b,
                                        int ldb, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    std::uint32_t af[4];
    ldsm_x4(af, a + (lane % 16) * lda + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      std::uint32_t bf[4];
      ldsm_x4(bf, b + (nb * 16 + lane % 8 + (lane / 16) * 8) * ldb + kk * 16 + (lane / 8 % 2) * 8);
      mma16816<T>(acc[2 * nb], af, bf[0], bf[1]);
      mma16816<T>(acc[2 * nb + 1], af, bf[2], bf[3]);
    }
  }
}

/// acc (16 x N) += A B: A in registers (16 x K, from to_a_operand), B is
/// K x N at `b` (row-major, stride ldb): e.g. O += P V.
template <class T, int N, int K>
__device__ __forceinline__ void mma_rab(float (&acc)[N / 8][4], const std::uint32_t (&a)[K / 16][4],
                                        const T* b, int ldb, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      std::uint32_t bf[4];
      ldsm_x4_trans(
          bf, b + (kk * 16 + lane % 8 + (lane / 8 % 2) * 8) * ldb + nb * 16 + (lane / 16) * 8);
      mma16816<T>(acc[2 * nb], a[kk], bf[0], bf[1]);
      mma16816<T>(acc[2 * nb + 1], a[kk], bf[2], bf[3]);
    }
}

/// The 16 x N accumulator tile as the A operand (16 x K = N) of the next mma.
template <class T, int N>
__device__ __forceinline__ void to_a_operand(std::uint32_t (&a)[N / 16][4],
                                             const float (&c)[N / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

/// Rows [row0, row0 + R) of a [S, D] matrix into a shared tile of stride
/// D + kPad; rows at or past S become zeros. All threads of the CTA take part.
template <class T, int R, int D, int kThreads>
__device__ __forceinline__ void load_tile(T* tile, const T* g, kindex row0, kindex S) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = threadIdx.x; c < R * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = row0 + r < S;
    cp_async16(tile + r * (D + kPad) + col, g + (valid ? row0 + r : 0) * D + col, valid);
  }
}

/// Double buffering of the key/value blocks in the loops over key blocks
/// (forward and dQ pass): start block j + 1 into the other stage of sK/sV
/// ([2][Bc][D + kPad] each), then wait until block j has landed.
template <class T, int Bc, int D, int kThreads>
__device__ __forceinline__ void prefetch_next_kv(T* sK, T* sV, const T* k, const T* v, int j,
                                                 int n_kv, kindex S) {
  if (j + 1 < n_kv) {
    const int stage = (j + 1) % 2;
    load_tile<T, Bc, D, kThreads>(sK + stage * Bc * (D + kPad), k, kindex(j + 1) * Bc, S);
    load_tile<T, Bc, D, kThreads>(sV + stage * Bc * (D + kPad), v, kindex(j + 1) * Bc, S);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

/// Stores a warp's 16 x D fp32 tile (rows row_lo + ..., times `mul`) as T,
/// rows at or past S skipped.
template <class T, int D>
__device__ __forceinline__ void store_rows(T* g, const float (&acc)[D / 8][4], kindex row_lo,
                                           kindex S, float mul0, float mul1, int lane) {
  const int r = lane / 4, c = (lane % 4) * 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const kindex row = row_lo + r + 8 * h;
    if (row >= S) continue;
    const float mul = h ? mul1 : mul0;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb)
      *reinterpret_cast<std::uint32_t*>(g + row * D + nb * 8 + c) =
          pack2<T>(acc[nb][2 * h] * mul, acc[nb][2 * h + 1] * mul);
  }
}

/// Row (h = 0: g, h = 1: g + 8) and column offsets of accumulator element e.
__device__ __forceinline__ int elem_row(int lane, int e) { return lane / 4 + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int elem_col(int lane, int nb, int e) {
  return nb * 8 + (lane % 4) * 2 + (e & 1);
}

// ----------------------------------------------------------------- forward ---

/// Tiling of the forward: `Warps` warps of 16 query rows each, key blocks
/// of `Bc`.
template <int D, int Warps, int Bc>
struct FwdTiles {
  static constexpr int kD = D, kWarps = Warps, kBr = 16 * kWarps, kBc = Bc, kLd = D + kPad;
  static constexpr std::size_t kSmem = std::size_t(kBr + 4 * kBc) * kLd * 2;  // Q, 2 x (K, V)
};

template <class T, class Tile>
__global__ void __launch_bounds__(Tile::kWarps * 32)
    flash_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         kindex S, float scale_log2, T* __restrict__ out, float* __restrict__ lse) {
  constexpr int D = Tile::kD, kBr = Tile::kBr, kBc = Tile::kBc, kLd = Tile::kLd,
                kThreads = Tile::kWarps * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kBr * kLd;      // [2][kBc][kLd]
  T* sV = sK + 2 * kBc * kLd;  // [2][kBc][kLd]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const kindex q0 = kindex(gridDim.x - 1 - blockIdx.x) * kBr;  // last (longest) blocks first
  const kindex base = kindex(blockIdx.y) * S * D;
  q += base, k += base, v += base, out += base, lse += kindex(blockIdx.y) * S;
  const int n_kv = int(((q0 + kBr < S ? q0 + kBr : S) + kBc - 1) / kBc);  // up to the diagonal

  load_tile<T, kBr, D, kThreads>(sQ, q, q0, S);
  load_tile<T, kBc, D, kThreads>(sK, k, 0, S);
  load_tile<T, kBc, D, kThreads>(sV, v, 0, S);
  cp_async_commit();

  const kindex row_lo = q0 + warp * 16;  // this warp's rows row_lo .. row_lo + 15
  const T* sQw = sQ + warp * 16 * kLd;
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int j = 0; j < n_kv; ++j) {
    prefetch_next_kv<T, kBc, D, kThreads>(sK, sV, k, v, j, n_kv, S);
    __syncthreads();
    const kindex k0 = kindex(j) * kBc;
    if (k0 <= row_lo + 15) {  // some key of the block is visible to some row of the warp
      const T* sKs = sK + (j % 2) * kBc * kLd;
      const T* sVs = sV + (j % 2) * kBc * kLd;
      float s[kBc / 8][4] = {};
      mma_abt<T, kBc, D>(s, sQw, kLd, sKs, kLd, lane);
      const bool diagonal = k0 + kBc - 1 > row_lo;
#pragma unroll
      for (int nb = 0; nb < kBc / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nb][e] *= scale_log2;
          if (diagonal && k0 + elem_col(lane, nb, e) > row_lo + elem_row(lane, e))
            s[nb][e] = -INFINITY;
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // online softmax of rows g (h = 0) and g + 8 (h = 1)
        float mx = m[h];
#pragma unroll
        for (int nb = 0; nb < kBc / 8; ++nb) mx = fmaxf(mx, fmaxf(s[nb][2 * h], s[nb][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float ref = mx == -INFINITY ? 0.f : mx;  // a row with nothing visible yet
        const float alpha = exp2f(m[h] - ref);
        m[h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nb = 0; nb < kBc / 8; ++nb) {
          s[nb][2 * h] = exp2f(s[nb][2 * h] - ref);
          s[nb][2 * h + 1] = exp2f(s[nb][2 * h + 1] - ref);
          sum += s[nb][2 * h] + s[nb][2 * h + 1];
        }
        l[h] = l[h] * alpha + sum;  // this lane's columns; the quad is summed at the end
#pragma unroll
        for (int nb = 0; nb < D / 8; ++nb) o[nb][2 * h] *= alpha, o[nb][2 * h + 1] *= alpha;
      }
      std::uint32_t p[kBc / 16][4];
      to_a_operand<T, kBc>(p, s);
      mma_rab<T, D, kBc>(o, p, sVs, kLd, lane);
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  store_rows<T, D>(out, o, row_lo, S, 1.f / l[0], 1.f / l[1], lane);
  if (lane % 4 == 0)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const kindex row = row_lo + lane / 4 + 8 * h;
      if (row < S) lse[row] = (m[h] + log2f(l[h])) * kLn2;
    }
}

// ---------------------------------------------------------------- backward ---

/// delta[r] = dout[r, :] . out[r, :] in fp32, one warp per row.
template <class T>
__global__ void row_dot_kernel(const T* __restrict__ dout, const T* __restrict__ out, kindex rows,
                               int D, float* __restrict__ delta) {
  const kindex r = kindex(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  float sum = 0.f;
  for (int c = lane; c < D; c += 32) sum += load_f(dout, r * D + c) * load_f(out, r * D + c);
  sum = warp_sum(sum);
  if (lane == 0) delta[r] = sum;
}

/// Tiling of the dK/dV pass: `Warps` warps of 16 keys each, query blocks
/// of `Br`.
template <int D, int Warps, int Br>
struct DkDvTiles {
  static constexpr int kD = D, kWarps = Warps, kBc = 16 * kWarps, kBr = Br, kLd = D + kPad;
  // K, V, then 2 stages of (Q, dO) and 2 stages of (lse, delta).
  static constexpr std::size_t kSmem =
      std::size_t(2 * kBc + 4 * kBr) * kLd * 2 + std::size_t(4 * kBr) * sizeof(float);
};

/// Stage the per-query statistics of rows [q0, q0 + R): lse in the log2
/// domain (+inf past S, so that P = 0 there) and delta (0 past S).
template <int R>
__device__ __forceinline__ void load_row_stats(float* sL, float* sDelta, const float* lse,
                                               const float* delta, kindex q0, kindex S) {
  for (int i = threadIdx.x; i < R; i += blockDim.x) {
    const bool valid = q0 + i < S;
    sL[i] = valid ? lse[q0 + i] * kLog2e : INFINITY;
    sDelta[i] = valid ? delta[q0 + i] : 0.f;
  }
}

template <class T, class Tile>
__global__ void __launch_bounds__(Tile::kWarps * 32)
    flash_backward_dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k,
                               const T* __restrict__ v, const T* __restrict__ dout,
                               const float* __restrict__ lse, const float* __restrict__ delta,
                               kindex S, float scale, float scale_log2, T* __restrict__ dk,
                               T* __restrict__ dv) {
  constexpr int D = Tile::kD, kBr = Tile::kBr, kBc = Tile::kBc, kLd = Tile::kLd,
                kThreads = Tile::kWarps * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kBc * kLd;
  T* sQ = sV + kBc * kLd;                                     // [2][kBr][kLd]
  T* sdO = sQ + 2 * kBr * kLd;                                // [2][kBr][kLd]
  float* sL = reinterpret_cast<float*>(sdO + 2 * kBr * kLd);  // [2][kBr]
  float* sDelta = sL + 2 * kBr;                               // [2][kBr]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const kindex k0 = kindex(blockIdx.x) * kBc;  // first key blocks see the most queries
  const kindex base = kindex(blockIdx.y) * S * D;
  q += base, k += base, v += base, dout += base, dk += base, dv += base;
  lse += kindex(blockIdx.y) * S, delta += kindex(blockIdx.y) * S;
  const int qb_begin = int(k0 / kBr), qb_end = int((S + kBr - 1) / kBr);

  load_tile<T, kBc, D, kThreads>(sK, k, k0, S);
  load_tile<T, kBc, D, kThreads>(sV, v, k0, S);
  load_tile<T, kBr, D, kThreads>(sQ, q, kindex(qb_begin) * kBr, S);
  load_tile<T, kBr, D, kThreads>(sdO, dout, kindex(qb_begin) * kBr, S);
  cp_async_commit();
  load_row_stats<kBr>(sL, sDelta, lse, delta, kindex(qb_begin) * kBr, S);

  const kindex key_lo = k0 + warp * 16;  // this warp's keys key_lo .. key_lo + 15
  const T* sKw = sK + warp * 16 * kLd;
  const T* sVw = sV + warp * 16 * kLd;
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  for (int qb = qb_begin; qb < qb_end; ++qb) {
    const int st = (qb - qb_begin) % 2;
    if (qb + 1 < qb_end) {
      const kindex next = kindex(qb + 1) * kBr;
      load_tile<T, kBr, D, kThreads>(sQ + (1 - st) * kBr * kLd, q, next, S);
      load_tile<T, kBr, D, kThreads>(sdO + (1 - st) * kBr * kLd, dout, next, S);
      cp_async_commit();
      load_row_stats<kBr>(sL + (1 - st) * kBr, sDelta + (1 - st) * kBr, lse, delta, next, S);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const kindex q0 = kindex(qb) * kBr;
    if (q0 + kBr - 1 >= key_lo) {  // some query of the block sees some key of the warp
      const T* sQs = sQ + st * kBr * kLd;
      const T* sdOs = sdO + st * kBr * kLd;
      const float* sLs = sL + st * kBr;
      const float* sDs = sDelta + st * kBr;
      // P^T = exp2(scale log2e K Q^T - lse log2e), keys as rows.
      float pt[kBr / 8][4] = {};
      mma_abt<T, kBr, D>(pt, sKw, kLd, sQs, kLd, lane);
      const bool diagonal = key_lo + 15 > q0;
#pragma unroll
      for (int nb = 0; nb < kBr / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = elem_col(lane, nb, e);
          float x = pt[nb][e] * scale_log2 - sLs[col];
          if (diagonal && key_lo + elem_row(lane, e) > q0 + col) x = -INFINITY;
          pt[nb][e] = exp2f(x);
        }
      std::uint32_t a[kBr / 16][4];
      to_a_operand<T, kBr>(a, pt);
      mma_rab<T, D, kBr>(dv_acc, a, sdOs, kLd, lane);  // dV += P^T dO
      float dpt[kBr / 8][4] = {};
      mma_abt<T, kBr, D>(dpt, sVw, kLd, sdOs, kLd, lane);  // dP^T = V dO^T
#pragma unroll
      for (int nb = 0; nb < kBr / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dpt[nb][e] = pt[nb][e] * (dpt[nb][e] - sDs[elem_col(lane, nb, e)]);  // dS^T / scale
      to_a_operand<T, kBr>(a, dpt);
      mma_rab<T, D, kBr>(dk_acc, a, sQs, kLd, lane);  // dK += dS^T Q
    }
    __syncthreads();
  }
  store_rows<T, D>(dk, dk_acc, key_lo, S, scale, scale, lane);
  store_rows<T, D>(dv, dv_acc, key_lo, S, 1.f, 1.f, lane);
}

/// Tiling of the dQ pass: `Warps` warps of 16 query rows each, key blocks
/// of `Bc`.
template <int D, int Warps, int Bc>
struct DqTiles {
  static constexpr int kD = D, kWarps = Warps, kBr = 16 * kWarps, kBc = Bc, kLd = D + kPad;
  static constexpr std::size_t kSmem =
      std::size_t(2 * kBr + 4 * kBc) * kLd * 2;  // Q, dO, 2 x (K, V)
};

template <class T, class Tile>
__global__ void __launch_bounds__(Tile::kWarps * 32)
    flash_backward_dq_kernel(const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, const T* __restrict__ dout,
                             const float* __restrict__ lse, const float* __restrict__ delta,
                             kindex S, float scale, float scale_log2, T* __restrict__ dq) {
  constexpr int D = Tile::kD, kBr = Tile::kBr, kBc = Tile::kBc, kLd = Tile::kLd,
                kThreads = Tile::kWarps * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kBr * kLd;
  T* sK = sdO + kBr * kLd;     // [2][kBc][kLd]
  T* sV = sK + 2 * kBc * kLd;  // [2][kBc][kLd]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const kindex q0 = kindex(gridDim.x - 1 - blockIdx.x) * kBr;
  const kindex base = kindex(blockIdx.y) * S * D;
  q += base, k += base, v += base, dout += base, dq += base;
  lse += kindex(blockIdx.y) * S, delta += kindex(blockIdx.y) * S;
  const int n_kv = int(((q0 + kBr < S ? q0 + kBr : S) + kBc - 1) / kBc);

  load_tile<T, kBr, D, kThreads>(sQ, q, q0, S);
  load_tile<T, kBr, D, kThreads>(sdO, dout, q0, S);
  load_tile<T, kBc, D, kThreads>(sK, k, 0, S);
  load_tile<T, kBc, D, kThreads>(sV, v, 0, S);
  cp_async_commit();

  const kindex row_lo = q0 + warp * 16;
  float lse2[2], dl[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const kindex row = row_lo + lane / 4 + 8 * h;
    lse2[h] = row < S ? lse[row] * kLog2e : INFINITY;
    dl[h] = row < S ? delta[row] : 0.f;
  }
  const T* sQw = sQ + warp * 16 * kLd;
  const T* sdOw = sdO + warp * 16 * kLd;
  float dq_acc[D / 8][4] = {};
  for (int j = 0; j < n_kv; ++j) {
    prefetch_next_kv<T, kBc, D, kThreads>(sK, sV, k, v, j, n_kv, S);
    __syncthreads();
    const kindex k0 = kindex(j) * kBc;
    if (k0 <= row_lo + 15) {
      const T* sKs = sK + (j % 2) * kBc * kLd;
      const T* sVs = sV + (j % 2) * kBc * kLd;
      float p[kBc / 8][4] = {};
      mma_abt<T, kBc, D>(p, sQw, kLd, sKs, kLd, lane);  // S = Q K^T
      const bool diagonal = k0 + kBc - 1 > row_lo;
#pragma unroll
      for (int nb = 0; nb < kBc / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = p[nb][e] * scale_log2 - lse2[e / 2];
          if (diagonal && k0 + elem_col(lane, nb, e) > row_lo + elem_row(lane, e)) x = -INFINITY;
          p[nb][e] = exp2f(x);
        }
      float dp[kBc / 8][4] = {};
      mma_abt<T, kBc, D>(dp, sdOw, kLd, sVs, kLd, lane);  // dP = dO V^T
#pragma unroll
      for (int nb = 0; nb < kBc / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[nb][e] = p[nb][e] * (dp[nb][e] - dl[e / 2]);  // dS / scale
      std::uint32_t a[kBc / 16][4];
      to_a_operand<T, kBc>(a, dp);
      mma_rab<T, D, kBc>(dq_acc, a, sKs, kLd, lane);  // dQ += dS K
    }
    __syncthreads();
  }
  store_rows<T, D>(dq, dq_acc, row_lo, S, scale, scale, lane);
}

// ---------------------------------------------------------------- dispatch ---

// The tilings in use: the fastest of a sweep on an H100 at B = 96..128,
// S = 1024 and 2048 (perf/bench_cuda_ops.cpp's attention cases), among
// 4 or 8 warps and blocks of 32..128. Alternatives measured (forward,
// dK/dV, dQ ms at B = 8x12, S = 1024, D = 64 | B = 8x16, D = 128):
//   forward 8 warps, Bc 64: 0.114 | 0.225; 4 warps, Bc 64: 0.101 | 0.212;
//           8 warps, Bc 128: 0.109 | 0.203
//   dK/dV   8 warps, Br 64|32: backward 0.343 | 0.768; 4 warps, same: 0.330 | 0.716;
//           4 warps, Br 128|64: 0.334 | 0.677
//   dQ      8 warps, Bc 64: backward 0.343 | 0.768; 4 warps, Bc 128|32: 0.306 | 0.772
template <int D>
using FwdTiling = std::conditional_t<D == 64, FwdTiles<64, 4, 64>, FwdTiles<D, 8, 128>>;
template <int D>
using DkDvTiling = DkDvTiles<D, 4, 64>;
template <int D>
using DqTiling = std::conditional_t<D == 64, DqTiles<64, 4, 128>, DqTiles<D, 8, 64>>;

/// Calls f(T{}, std::integral_constant<int, D>{}) for bf16/fp16 and D = 64/128.
template <class F>
void with_flash_types(DType t, index_t D, const char* op, F&& f) {
  MESH_VERIFY(t == DType::BF16 || t == DType::F16,
              op << ": the fused CUDA kernel stores bf16 or fp16, got " << dtype_name(t));
  MESH_VERIFY(D == 64 || D == 128,
              op << ": the fused CUDA kernel has head dims 64 and 128, got " << D);
  auto with_d = [&](auto zero) {
    if (D == 64)
      f(zero, std::integral_constant<int, 64>{});
    else
      f(zero, std::integral_constant<int, 128>{});
  };
  if (t == DType::BF16)
    with_d(bf16_t{});
  else
    with_d(f16_t{});
}

/// Launch with `smem` bytes of dynamic shared memory (above the 48 KiB
/// default, hence the attribute), checked like every launch.
template <class... KArgs, class... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, int threads, std::size_t smem, Args... args) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<grid, threads, smem, kStream>>>(args...);
  MESH_CUDA_LAUNCHED();
}

unsigned blocks_of(index_t S, int rows) { return unsigned((S + rows - 1) / rows); }

void check_extents(const char* op, const void* const* ptrs, int n, index_t B) {
  for (int i = 0; i < n; ++i)
    MESH_VERIFY(aligned16(ptrs[i]), op << ": operand " << i << " is not 16-byte aligned");
  MESH_VERIFY(B <= 65535, op << ": " << B << " batch x heads exceed the grid's 65535");
}

/// The three passes of the backward on one tiling, as launched below.
struct FlashArgs {
  const void *q, *k, *v, *dout, *out;
  const float* lse;
  float* delta;
  void *o, *dq, *dk, *dv;
  index_t B, S;
  double scale;
};

template <class T, class Tile>
void launch_forward(const FlashArgs& a) {
  launch(flash_forward_kernel<T, Tile>, dim3(blocks_of(a.S, Tile::kBr), unsigned(a.B)),
         Tile::kWarps * 32, Tile::kSmem, static_cast<const T*>(a.q), static_cast<const T*>(a.k),
         static_cast<const T*>(a.v), kindex(a.S), float(a.scale * kLog2e), static_cast<T*>(a.o),
         const_cast<float*>(a.lse));
}

template <class T, int D>
void launch_row_dot(const FlashArgs& a) {
  row_dot_kernel<T><<<grid_for(a.B * a.S, 8, 1LL << 31), 256, 0, kStream>>>(
      static_cast<const T*>(a.dout), static_cast<const T*>(a.out), a.B * a.S, D, a.delta);
  MESH_CUDA_LAUNCHED();
}

template <class T, class Tile>
void launch_dkdv(const FlashArgs& a) {
  launch(flash_backward_dkdv_kernel<T, Tile>, dim3(blocks_of(a.S, Tile::kBc), unsigned(a.B)),
         Tile::kWarps * 32, Tile::kSmem, static_cast<const T*>(a.q), static_cast<const T*>(a.k),
         static_cast<const T*>(a.v), static_cast<const T*>(a.dout), a.lse,
         static_cast<const float*>(a.delta), kindex(a.S), float(a.scale), float(a.scale * kLog2e),
         static_cast<T*>(a.dk), static_cast<T*>(a.dv));
}

template <class T, class Tile>
void launch_dq(const FlashArgs& a) {
  launch(flash_backward_dq_kernel<T, Tile>, dim3(blocks_of(a.S, Tile::kBr), unsigned(a.B)),
         Tile::kWarps * 32, Tile::kSmem, static_cast<const T*>(a.q), static_cast<const T*>(a.k),
         static_cast<const T*>(a.v), static_cast<const T*>(a.dout), a.lse,
         static_cast<const float*>(a.delta), kindex(a.S), float(a.scale), float(a.scale * kLog2e),
         static_cast<T*>(a.dq));
}

}  // namespace

void fused_attention_forward(DType t, const void* q, const void* k, const void* v, index_t B,
                             index_t S, index_t D, double scale, void* out, float* lse) {
  const char* op = "fused_attention_forward";
  if (B == 0 || S == 0) return;
  const void* ptrs[] = {q, k, v, out};
  check_extents(op, ptrs, 4, B);
  const FlashArgs a{q,   k,       v,       nullptr, nullptr, lse, nullptr,
                    out, nullptr, nullptr, nullptr, B,       S,   scale};
  with_flash_types(t, D, op, [&](auto zero, auto dim) {
    using T = decltype(zero);
    launch_forward<T, FwdTiling<decltype(dim)::value>>(a);
  });
}

void fused_attention_backward(DType t, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, index_t B,
                              index_t S, index_t D, double scale, float* delta, void* dq, void* dk,
                              void* dv) {
  const char* op = "fused_attention_backward";
  if (B == 0 || S == 0) return;
  const void* ptrs[] = {dout, q, k, v, out, dq, dk, dv};
  check_extents(op, ptrs, 8, B);
  const FlashArgs a{q, k, v, dout, out, lse, delta, nullptr, dq, dk, dv, B, S, scale};
  with_flash_types(t, D, op, [&](auto zero, auto dim) {
    using T = decltype(zero);
    constexpr int kD = decltype(dim)::value;
    launch_row_dot<T, kD>(a);
    launch_dkdv<T, DkDvTiling<kD>>(a);
    launch_dq<T, DqTiling<kD>>(a);
  });
}

}  // namespace meshtron::cuda
