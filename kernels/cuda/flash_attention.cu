// ====================================================== Flash attention ==
//
// Fused causal attention, FlashAttention-2 style (Dao, 2023), for bf16 and
// fp16 storage with fp32 accumulation, head dims 64 and 128. Same math as
// kernels/kokkos/attention.hpp; q, k, v, out, dq, dk, dv are [B, S, D] (B =
// batch x heads) and lse [B, S] fp32 (natural log). Nothing of size S x S
// ever reaches memory.
//
// Tensor cores: mma.sync.m16n8k16 (bf16/fp16 in, fp32 out), operands read
// from shared memory with ldmatrix. Every warp owns 16 or 32 rows (one or
// two m16 tiles: with two, each B fragment read feeds two MMAs) of the
// output tile; operands the warp reuses in every step of its walk (Q, or K
// and V, or Q and dO) may stay in registers. A score tile's fp32
// accumulator fragment has exactly the layout of the A operand of the next
// mma, so P (or dS) goes from one GEMM to the next in registers, rounded to
// the storage type. Shared tiles have rows of
// D + 8 elements, so the 8 rows one ldmatrix reads fall in distinct banks.
// Global -> shared copies are cp.async (16 bytes, zero-filled past S),
// double-buffered: the next tile loads while the current one is used.
//
// Forward: one CTA per block of query rows (16 or 32 per warp); it walks the
// key/value blocks up to the causal diagonal only, keeping the running row
// max m and sum l (log2 domain, ex2.approx; the softmax scale folded into the
// exponent's fma) in registers; lse = (m + log2 l) ln 2. The causal mask is
// applied only to the blocks the diagonal crosses.
//
// Attention dropout (training): the same kernels with kDrop (a template
// switch, so the kernels without it are unchanged) drop P with the unfused
// path's Philox mask; see "attention dropout" below.
//
// Backward, deterministic (no atomics; the same bits every run):
//   1. delta_i = dout_i . out_i                    (D / 8 lanes per row)
//   2. dK, dV: one CTA per block of keys (16 or 32 per warp), walking the query
//      blocks from the diagonal to the end; P^T, dP^T and dS^T are rebuilt
//      per tile from the saved lse; dV += P^T dO, dK += dS^T Q stay in
//      registers.
//   3. dQ: one CTA per block of queries, walking the key blocks up to the
//      diagonal (rebuilding S and dP once more); dQ += dS K in registers.
// Step 3 repeats two of step 2's GEMMs (7 GEMMs in all instead of 5 with
// fp32 atomics into dQ) for a result that does not depend on scheduling.
//
// Grids run the heaviest CTAs (longest causal walk) first.
//
// Scores (the kScores template switch; see "scores" below): causal as
// above; causal with ALiBi (Press et al., 2022), the bias slope_h (j - i)
// added to each score tile before the softmax; or bidirectional over a
// per-sample key mask (BERT), every key block walked, the masked keys and
// those past S at -inf. The backward needs no bias gradient.
//
// Backend choice (the token-major entry points, what the model calls): where
// meshtron is built with cuDNN, cuDNN loads, and it plans the shape
// (kernels/cuda/cudnn_attention.cu), its fused attention runs instead of
// these kernels, unless training.fused_attention_kernels = own
// (set_fused_attention_kernels). The choice is made once per (device, dtype,
// shape) and cached, so a shape's forward and backward use the same backend;
// a shape whose forward cuDNN plans but whose backward it has no
// deterministic engine for runs cuDNN forward + our backward (our backward
// reads the same natural-log lse). A one-time stderr line (rank 0)
// names the choice. flash_attention_*_token_major always run these kernels,
// and so does every call with attention dropout (cuDNN's dropout mask is
// drawn from its own generator, not the unfused path's Philox bits), unless
// the call asks for cuDNN's generator (AttentionDropoutSite::cudnn_rng,
// training.attention_dropout_rng = cudnn): then cuDNN runs it, seeded per
// call by cudnn_dropout_seed_kernel, or the job stops.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/philox.cuh"
#include "ops/attention_mask_layout.hpp"
#include "ops/ops_cuda.hpp"
#include "tensor/device_allocator.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kPad = 8;  // elements of padding per shared row (16 bytes)
constexpr float kLn2 = 0.6931471805599453f;

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


// ------------------------------------------------------- warp-level GEMMs ---
//
// A warp's accumulator acc[M][N/8][4] is a 16M x N fp32 tile made of M
// m-tiles of 16 rows: in m-tile mi, lane (g = lane/4, t = lane%4) holds rows
// 16 mi + g (elements 0, 1) and 16 mi + g + 8 (elements 2, 3) of columns
// nb*8 + 2t and nb*8 + 2t + 1 of each 8-column block nb. With M = 2 every B
// fragment read from shared memory feeds two MMAs instead of one: at these
// shapes the kernels are bound by ldmatrix bandwidth, not by the MMAs.

/// A-operand fragments of the 16M x K tile at `a` (row-major, stride lda).
template <class T, int M, int K>
__device__ __forceinline__ void load_a(std::uint32_t (&af)[M][K / 16][4], const T* a, int lda,
                                       int lane) {
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk)
      ldsm_x4(af[mi][kk], a + (mi * 16 + lane % 16) * lda + kk * 16 + (lane / 16) * 8);
}

/// acc (16M x N) += A B^T: A in registers (16M x K, from load_a), B is N x K
/// at `b` (row-major, stride ldb): e.g. S = Q K^T.
template <class T, int M, int N, int K>
__device__ __forceinline__ void mma_rabt(float (&acc)[M][N / 8][4],
                                         const std::uint32_t (&af)[M][K / 16][4], const T* b,
                                         int ldb, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      std::uint32_t bf[4];
      ldsm_x4(bf, b + (nb * 16 + lane % 8 + (lane / 16) * 8) * ldb + kk * 16 + (lane / 8 % 2) * 8);
#pragma unroll
      for (int mi = 0; mi < M; ++mi) {
        mma16816<T>(acc[mi][2 * nb], af[mi][kk], bf[0], bf[1]);
        mma16816<T>(acc[mi][2 * nb + 1], af[mi][kk], bf[2], bf[3]);
      }
    }
}

/// acc (16M x N) += A B^T with A read from shared memory (stride lda) one
/// 16-column step at a time (fewer registers than mma_rabt).
template <class T, int M, int N, int K>
__device__ __forceinline__ void mma_abt(float (&acc)[M][N / 8][4], const T* a, int lda, const T* b,
                                        int ldb, int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    std::uint32_t af[M][1][4];
    load_a<T, M, 16>(af, a + kk * 16, lda, lane);
    mma_rabt<T, M, N, 16>(acc, af, b + kk * 16, ldb, lane);
  }
}

/// acc (16M x N) += A B: A in registers (16M x K, from to_a_operand), B is
/// K x N at `b` (row-major, stride ldb): e.g. O += P V.
template <class T, int M, int N, int K>
__device__ __forceinline__ void mma_rab(float (&acc)[M][N / 8][4],
                                        const std::uint32_t (&a)[M][K / 16][4], const T* b, int ldb,
                                        int lane) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int nb = 0; nb < N / 16; ++nb) {
      std::uint32_t bf[4];
      ldsm_x4_trans(
          bf, b + (kk * 16 + lane % 8 + (lane / 8 % 2) * 8) * ldb + nb * 16 + (lane / 16) * 8);
#pragma unroll
      for (int mi = 0; mi < M; ++mi) {
        mma16816<T>(acc[mi][2 * nb], a[mi][kk], bf[0], bf[1]);
        mma16816<T>(acc[mi][2 * nb + 1], a[mi][kk], bf[2], bf[3]);
      }
    }
}

/// The 16M x N accumulator tile as the A operand (16M x K = N) of the next mma.
template <class T, int M, int N>
__device__ __forceinline__ void to_a_operand(std::uint32_t (&a)[M][N / 16][4],
                                             const float (&c)[M][N / 8][4]) {
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      a[mi][kk][0] = pack2<T>(c[mi][2 * kk][0], c[mi][2 * kk][1]);
      a[mi][kk][1] = pack2<T>(c[mi][2 * kk][2], c[mi][2 * kk][3]);
      a[mi][kk][2] = pack2<T>(c[mi][2 * kk + 1][0], c[mi][2 * kk + 1][1]);
      a[mi][kk][3] = pack2<T>(c[mi][2 * kk + 1][2], c[mi][2 * kk + 1][3]);
    }
}

/// Where the [S, D] matrix of (sample x head) bh starts and how far apart
/// its rows are, in elements: row s of bh is at base(bh) + s * ld. The
/// head-major layout [B * heads, S, D] is {ld D, batch S D, head 0, heads 1};
/// the linear layers' token-major [s * b, parts * heads * D] (rows in
/// [s, b] order) is read in place with {ld b parts heads D, batch parts
/// heads D, head D, heads}, so no split/merge copies are needed.
struct HeadStrides {
  kindex ld = 0, batch = 0, head = 0;
  int heads = 1;
  __host__ __device__ kindex base(kindex bh) const {
    return (bh / heads) * batch + (bh % heads) * head;
  }
};

/// Rows [row0, row0 + R) of a [S, D] matrix (rows ld apart) into a shared
/// tile of stride D + kPad; rows at or past S become zeros. All threads of
/// the CTA take part.
template <class T, int R, int D, int kThreads>
__device__ __forceinline__ void load_tile(T* tile, const T* g, kindex row0, kindex S, kindex ld) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = threadIdx.x; c < R * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = row0 + r < S;
    cp_async16(tile + r * (D + kPad) + col, g + (valid ? row0 + r : 0) * ld + col, valid);
  }
}

/// Double buffering of the key/value blocks in the loops over key blocks
/// (forward and dQ pass): start block j + 1 into the other stage of sK/sV
/// ([2][Bc][D + kPad] each), then wait until block j has landed.
template <class T, int Bc, int D, int kThreads>
__device__ __forceinline__ void prefetch_next_kv(T* sK, T* sV, const T* k, const T* v, int j,
                                                 int n_kv, kindex S, kindex ld) {
  if (j + 1 < n_kv) {
    const int stage = (j + 1) % 2;
    load_tile<T, Bc, D, kThreads>(sK + stage * Bc * (D + kPad), k, kindex(j + 1) * Bc, S, ld);
    load_tile<T, Bc, D, kThreads>(sV + stage * Bc * (D + kPad), v, kindex(j + 1) * Bc, S, ld);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

/// Stores a warp's 16M x D fp32 tile (rows row_lo + ..., row r of m-tile mi
/// times mul[mi][r >= 8]) as T, rows at or past S skipped.
template <class T, int M, int D>
__device__ __forceinline__ void store_rows(T* g, kindex ld, const float (&acc)[M][D / 8][4],
                                           kindex row_lo, kindex S, const float (&mul)[M][2],
                                           int lane) {
  const int r = lane / 4, c = (lane % 4) * 2;
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const kindex row = row_lo + mi * 16 + r + 8 * h;
      if (row >= S) continue;
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb)
        *reinterpret_cast<std::uint32_t*>(g + row * ld + nb * 8 + c) =
            pack2<T>(acc[mi][nb][2 * h] * mul[mi][h], acc[mi][nb][2 * h + 1] * mul[mi][h]);
    }
}

template <int M>
struct Uniform {  // mul of store_rows: the same factor on every row
  float v[M][2];
  __device__ explicit Uniform(float x) {
#pragma unroll
    for (int mi = 0; mi < M; ++mi) v[mi][0] = v[mi][1] = x;
  }
};

/// Row (within the m-tile: h = 0: g, h = 1: g + 8) and column offsets of
/// accumulator element e.
__device__ __forceinline__ int elem_row(int lane, int e) { return lane / 4 + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int elem_col(int lane, int nb, int e) {
  return nb * 8 + (lane % 4) * 2 + (e & 1);
}

// ------------------------------------------------------ attention dropout ---
//
// With attention dropout (the kDrop kernels) P_ij of entry bh (= sample x
// local head) is kept with the unfused path's decision: the probabilities
// [B, S, S] are the dropout site's view [b, heads, S*S], so P_ij has the
// global index base(bh) + i S + j, base(bh) = ((sample + a_offset) b_global
// + head + b_offset) S^2, and one Philox call decides the 8 keys j = 8u ..
// 8u + 7 of a query i (philox.cuh). The forward multiplies P by keep / (1 -
// p) after the row sums (lse stays the undropped softmax's); the backward
// uses dV += (P o Z)^T dO and dS = P o (Z o dP - delta), delta = dO . O with
// the dropped O.
//
// Where S % 8 == 0 a group of 8 keys is one row of an m16n8 tile (its
// columns start at multiples of 8, base(bh) is a multiple of 8), and a
// tile's 16 rows take 16 Philox calls: the lanes that share a group take
// one group each and trade the decisions by shuffles. Otherwise each
// element makes its own call. The forward draws an m-tile's calls of a key
// block as one batch, the rounds outermost (philox4x32_10_batch): 4 (D =
// 64) or 8 independent chains side by side, whose multiplies hide each
// other's latency (H100, perf/bench_cuda_ops attention, with 4 keys per
// call: forward with dropout 0.176-0.179 ms at D = 64 against 0.193-0.198
// one chain at a time, 0.336 ms against 0.374-0.378 at D = 128; the 10
// serial rounds, not issue slots or memory, bound it).
//
// Where the caller gives a keep_bits buffer (the model does), the mask is
// drawn once per step and all three passes read it (kReadMask): for S % 8
// == 0 by its own kernel ahead of the forward (draw_attention_mask_kernel:
// the Philox calls at full occupancy instead of between the forward's
// GEMMs; H100, perf/bench_cuda_ops attention: forward with dropout
// 0.166-0.167 ms at D = 64 against 0.177-0.181 drawing in the forward,
// 0.293-0.294 against 0.329-0.332 at D = 128), otherwise by the forward,
// which stores its decisions. At D = 64 the drawing forward and the reading
// dQ use one m-tile per warp (FwdDropoutTiling, DqDropoutTiling): fewer
// registers, so more warps hide the Philox rounds (perf/bench_cuda_ops
// attention).

/// The kernels' dropout modes (their kDrop template argument).
constexpr int kNoDropout = 0;  // no attention dropout: the kernels as without it
constexpr int kDrawMask = 1;   // Philox per tile (the forward also stores it where asked)
constexpr int kReadMask = 2;   // the pass reads the stored decisions

/// The attention dropout of a launch (see ops_cuda.hpp's AttentionDropoutSite).
struct FlashDropout {
  DropoutPlacement site{};
  std::uint32_t threshold = 0;
  float keep_scale = 1.f;
  std::uint32_t* keep_bits = nullptr;  // [B, S, words]: the stored decisions, or null
  kindex words = 0;
};

/// The dropout of one entry (a CTA's blockIdx.y): the site with the live
/// step and sample offset resolved, and the global index of P_00.
struct EntryDropout {
  DropoutPlacement site;
  std::uint64_t base;
  kindex S;
  std::uint32_t threshold;
  std::uint32_t* keep_bits;  // this entry's [S, words] decisions, or null
  kindex words;

  __device__ EntryDropout(const FlashDropout& d, kindex bh, kindex S_)
      : site(philox::resolved(d.site)),
        S(S_),
        threshold(d.threshold),
        keep_bits(d.keep_bits == nullptr ? nullptr : d.keep_bits + bh * S_ * d.words),
        words(d.words) {
    const kindex sample = bh / site.b, head = bh % site.b;
    base = std::uint64_t(((sample + site.a_offset) * site.b_global + head + site.b_offset) *
                         site.c_global);
  }
  /// Stored word `word` (32 keys) of query row `query`; 0 past S.
  __device__ std::uint32_t stored(kindex query, kindex word) const {
    return query < S ? keep_bits[query * words + word] : 0u;
  }
  __device__ bool grouped() const { return philox::whole_groups(S); }
  __device__ std::uint64_t index(kindex query, kindex key) const {
    return base + std::uint64_t(query * S + key);
  }
  /// Per element: bit e for element e at (query(e), key(e)).
  template <class Query, class Key>
  __device__ unsigned bits_per_element(Query query, Key key) const {
    unsigned bits = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      bits |= unsigned(philox::keep_element(site, index(query(e), key(e)), threshold)) << e;
    return bits;
  }
};

/// Accumulator element e with keep bits `bits`: x where kept, else 0,
/// unscaled. The kernels apply the keep scale 1 / (1 - p) from their
/// FlashDropout parameter: the backward where it costs no multiply per
/// element (dV at its store, dS in the fma with delta: dz_minus_delta), the
/// forward per element (folded into its 1 / l, the D = 64 dropout forward
/// spills at its 3-CTA register bound).
__device__ __forceinline__ float kept(float x, unsigned bits, int e) {
  return (bits >> e) & 1u ? x : 0.f;
}

/// A quad's trade (grouped tiles, see keep_bits_query_rows): lane t of the
/// quad drew `own`, the group (8 decisions) of row g + 8 (t & 1) of tile
/// t >> 1 of a pair of tiles; after two shuffles every lane holds all four
/// groups, lane t's in byte t. Warp-uniform call (shuffles).
__device__ __forceinline__ std::uint32_t quad_groups(unsigned own, int lane) {
  std::uint32_t x = own << (8 * (lane % 4));
  x |= __shfl_xor_sync(0xffffffffu, x, 1);
  x |= __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

/// The lane's 4 element bits (keys 2t, 2t + 1 of rows g and g + 8) of tile
/// `tile` (0 or 1) of the pair, from quad_groups' bytes.
__device__ __forceinline__ unsigned tile_of_quad(std::uint32_t groups, int tile, int lane) {
  const int shift = 16 * tile + 2 * (lane % 4);
  return ((groups >> shift) & 3u) | (((groups >> (shift + 8)) & 3u) << 2);
}

/// Keep bits (bit e: accumulator element e) of the N m16n8 tiles (N even)
/// whose row r, column c is query row0 + r, key col0 + 8 nb + c (forward and
/// dQ). Grouped: the quad of lanes g holds keys 8 nb + 2t, 2t + 1 of rows g
/// and g + 8, one group per row and tile; of each pair of tiles (2m, 2m +
/// 1), lane t draws row g + 8 (t & 1) of tile 2m + (t >> 1) (the N / 2 calls
/// as one batch: philox4x32_10_batch) and quad_groups trades them.
/// Warp-uniform call (shuffles).
template <int N>
__device__ __forceinline__ void keep_bits_query_rows(const EntryDropout& d, kindex row0,
                                                     kindex col0, int lane, unsigned (&bits)[N]) {
  static_assert(N % 2 == 0, "tiles are drawn in pairs");
  if (!d.grouped()) {
#pragma unroll
    for (int nb = 0; nb < N; ++nb)
      bits[nb] = d.bits_per_element([&](int e) { return row0 + elem_row(lane, e); },
                                    [&](int e) { return col0 + elem_col(lane, nb, e); });
    return;
  }
  const int g = lane / 4, t = lane % 4;
  const kindex row = row0 + g + ((t & 1) ? 8 : 0), col = col0 + 8 * (t >> 1);
  uint4 c[N / 2];
#pragma unroll
  for (int m = 0; m < N / 2; ++m)
    c[m] = philox::group_counter(d.site, philox::group_of(d.index(row, col + 16 * m)));
  philox::group_bits(d.site, c);
#pragma unroll
  for (int m = 0; m < N / 2; ++m) {
    const std::uint32_t groups = quad_groups(philox::keep_bits(c[m], d.threshold), lane);
    bits[2 * m] = tile_of_quad(groups, 0, lane);
    bits[2 * m + 1] = tile_of_quad(groups, 1, lane);
  }
}

/// Keep bits of the N m16n8 tiles (N even) whose row r, column c is key
/// row0 + r, query col0 + 8 nb + c (dK/dV: P^T). Grouped: the eight lanes g
/// (same t) hold keys row0 + g and + 8 at queries 8 nb + 2t and + 1, i.e.
/// bit g of the four groups (h, c) = keys row0 + 8h .. + 7 at query col0 +
/// 8 nb + 2t + c; of each pair of tiles (2m, 2m + 1), lane g draws group
/// e = 2h + c = g % 4 of tile 2m + g / 4 (the N / 2 calls as one batch), and
/// each lane takes bit g of its groups from the lanes that drew them.
/// Warp-uniform call (shuffles).
template <int N>
__device__ __forceinline__ void keep_bits_key_rows(const EntryDropout& d, kindex row0, kindex col0,
                                                   int lane, unsigned (&bits)[N]) {
  static_assert(N % 2 == 0, "tiles are drawn in pairs");
  const int g = lane / 4, t = lane % 4, r = g % 4;
  if (!d.grouped()) {
#pragma unroll
    for (int nb = 0; nb < N; ++nb)
      bits[nb] = d.bits_per_element([&](int e) { return col0 + elem_col(lane, nb, e); },
                                    [&](int e) { return row0 + elem_row(lane, e); });
    return;
  }
  const kindex key = row0 + 8 * (r >> 1), query = col0 + 8 * (g / 4) + 2 * t + (r & 1);
  uint4 c[N / 2];
#pragma unroll
  for (int m = 0; m < N / 2; ++m)
    c[m] = philox::group_counter(d.site, philox::group_of(d.index(query + 16 * m, key)));
  philox::group_bits(d.site, c);
#pragma unroll
  for (int m = 0; m < N / 2; ++m) {
    const unsigned own = philox::keep_bits(c[m], d.threshold);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      bits[2 * m + j] = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // bit g of tile 2m + j's group e, from lane g' = 4j + e
        const unsigned theirs = __shfl_sync(0xffffffffu, own, ((4 * j + e) << 2) | t);
        bits[2 * m + j] |= ((theirs >> g) & 1u) << e;
      }
    }
  }
}

// The stored mask (the forward's decisions, read by both backward passes
// instead of two more Philox passes): per entry a row-major bit matrix,
// bit j % 32 of word j / 32 of query row i is P_ij's decision. Only the
// tiles a pass visits are written (every visible P_ij's is); bits of
// invisible elements are never used (P = 0 there).

/// Adds tile (mi, nb)'s decisions (keep bits as keep_bits_query_rows gives
/// them) to this lane's row words: w[mi][h][k] is row g + 8h, keys 32k .. of
/// the 16M x N tile, where the lane holds keys 8nb + 2t and + 1.
template <int M, int N>
__device__ __forceinline__ void add_row_bits(std::uint32_t (&w)[M][2][N / 32], int mi, int nb,
                                             unsigned bits, int lane) {
  const int shift = (nb % 4) * 8 + 2 * (lane % 4);
  w[mi][0][nb / 4] |= (bits & 3u) << shift;
  w[mi][1][nb / 4] |= ((bits >> 2) & 3u) << shift;
}

/// f(mi, h, k, row) for each of this lane's row words w[mi][h][k] of the
/// 16M x N tile at row_lo: row g + 8h of m-tile mi, keys 32k .. 32k + 31.
template <int M, int N, class F>
__device__ __forceinline__ void for_each_row_word(kindex row_lo, int lane, const F& f) {
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int k = 0; k < N / 32; ++k) f(mi, h, k, row_lo + mi * 16 + lane / 4 + 8 * h);
}

/// Writes a warp's row words of the 16M x N tile at (row_lo, k0): the four
/// lanes of a quad OR theirs together, then lane t writes the words k with
/// k % 4 == t of rows past S skipped. Warp-uniform call (shuffles).
template <int M, int N>
__device__ __forceinline__ void store_row_bits(const EntryDropout& d,
                                               std::uint32_t (&w)[M][2][N / 32], kindex row_lo,
                                               kindex k0, int lane) {
  for_each_row_word<M, N>(row_lo, lane, [&](int mi, int h, int k, kindex row) {
    std::uint32_t x = w[mi][h][k];
    x |= __shfl_xor_sync(0xffffffffu, x, 1);
    x |= __shfl_xor_sync(0xffffffffu, x, 2);
    if (k % 4 == lane % 4 && row < d.S) d.keep_bits[row * d.words + k0 / 32 + k] = x;
  });
}

/// This lane's stored row words of the 16M x N tile at (row_lo, k0) (forward
/// layout: rows are queries), for row_tile_bits.
template <int M, int N>
__device__ __forceinline__ void load_row_bits(const EntryDropout& d,
                                              std::uint32_t (&w)[M][2][N / 32], kindex row_lo,
                                              kindex k0, int lane) {
  for_each_row_word<M, N>(row_lo, lane, [&](int mi, int h, int k, kindex row) {
    w[mi][h][k] = d.stored(row, k0 / 32 + k);
  });
}

/// Keep bits of tile (mi, nb) from load_row_bits' words (as keep_bits_query_rows).
template <int M, int N>
__device__ __forceinline__ unsigned row_tile_bits(const std::uint32_t (&w)[M][2][N / 32], int mi,
                                                  int nb, int lane) {
  const int shift = (nb % 4) * 8 + 2 * (lane % 4);
  return ((w[mi][0][nb / 4] >> shift) & 3u) | (((w[mi][1][nb / 4] >> shift) & 3u) << 2);
}

/// The dK/dV pass stages the stored words of each query block with its Q and
/// dO tiles (cp.async, double buffered): one word per 32 keys of the CTA's Bc
/// for each of the block's Br queries, [Br][Bc / 32], zeros past S. Read
/// from shared memory, a tile's bits cost two loads at fixed offsets instead
/// of two bounds-checked global loads with their address arithmetic
/// (H100, perf/bench_cuda_ops attention).
template <int Br, int Bc, int kThreads>
__device__ __forceinline__ void load_key_block_words(std::uint32_t* sMask, const EntryDropout& d,
                                                     kindex q0, kindex k0) {
  constexpr int kWords = Bc / 32;
#pragma unroll
  for (int c = threadIdx.x; c < Br * kWords; c += kThreads) {
    const kindex query = q0 + c / kWords;
    const bool valid = query < d.S;
    cp_async4(sMask + c, d.keep_bits + (valid ? query * d.words + k0 / 32 + c % kWords : 0), valid);
  }
}

/// Keep bits of the dK/dV tile whose row r, column c is key k0 + key + r,
/// query q0 + query + c (as keep_bits_key_rows), from load_key_block_words'
/// words of the block (k0, q0): the lane's keys g and g + 8 of queries
/// query + 2t (+ 1) are two bits of one word per query (key is a multiple
/// of 16).
template <int Bc>
__device__ __forceinline__ unsigned stored_bits_key_rows(const std::uint32_t* sMask, int key,
                                                         int query, int lane) {
  const int shift = key % 32 + lane / 4;
  unsigned bits = 0;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const std::uint32_t w = sMask[(query + 2 * (lane % 4) + c) * (Bc / 32) + key / 32];
    bits |= ((w >> shift) & 1u) << c | ((w >> (shift + 8)) & 1u) << (2 + c);
  }
  return bits;
}

/// dz - delta, the bracket of dS = P o (dP o Z - delta) for accumulator
/// element e of dP with keep bits `bits`: with dropout, Z's keep scale and
/// the subtraction are one fma.
template <int kDrop>
__device__ __forceinline__ float dz_minus_delta(float keep_scale, float dp, unsigned bits, int e,
                                                float delta) {
  if constexpr (kDrop == kNoDropout)
    return dp - delta;
  else
    return fmaf(kept(dp, bits, e), keep_scale, -delta);
}

// ------------------------------------------------------------------ scores ---
//
// The kernels' score modes (their kScores template argument). kAlibi adds
// slope / scale (j - i) to the raw score q_i . k_j, so that the softmax
// scale the kernels fold into the exponent's fma scales the score alone and
// the bias comes out as slope (j - i): the unfused path's
// scale q.k + slope (j - i) (kernels/kokkos/softmax.hpp). kKeyMask walks every
// key block (no diagonal) and sets the score of a key past S or with a zero
// flag to -inf; a row with no visible key ends with l = 0: out = 0 and
// lse = +inf, so that the backward's P = exp(x - lse) is 0 on it.

constexpr int kCausal = 0;   // j <= i, no bias: the kernels as without scores
constexpr int kAlibi = 1;    // j <= i, plus slope_h (j - i)
constexpr int kKeyMask = 2;  // every real key of the entry's sample

/// The scores of one entry (a CTA's blockIdx.y).
struct EntryScores {
  float alibi = 0.f;                       // slope / scale of the entry's head (kAlibi)
  const std::int32_t* key_mask = nullptr;  // the entry's sample's [S] flags (kKeyMask)
  kindex S;

  __device__ EntryScores(const FlashScores& f, kindex bh, kindex S_, float scale) : S(S_) {
    if (f.alibi_slopes != nullptr) alibi = f.alibi_slopes[bh % f.alibi_heads] / scale;
    if (f.key_mask != nullptr) key_mask = f.key_mask + (bh / f.mask_heads) * S_;
  }
  __device__ bool real_key(kindex key) const { return key < S && key_mask[key] != 0; }
};

/// The scores of a warp's raw 16M x N tile s before its softmax: row r,
/// column c of m-tile mi is row0 + 16 mi + r and col0 + c, queries and keys
/// (or keys and queries: kKeyRows, the dK/dV pass's S^T). kAlibi adds the
/// bias (the causal mask stays the caller's); kKeyMask sets the masked
/// keys to -inf. kCausal: nothing.
template <int kScores, bool kKeyRows, int M, int N>
__device__ __forceinline__ void apply_scores(float (&s)[M][N / 8][4], const EntryScores& sc,
                                             kindex row0, kindex col0, int lane) {
  if constexpr (kScores == kAlibi) {
#pragma unroll
    for (int mi = 0; mi < M; ++mi)
#pragma unroll
      for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const kindex row = row0 + mi * 16 + elem_row(lane, e), col = col0 + elem_col(lane, nb, e);
          const kindex key_minus_query = kKeyRows ? row - col : col - row;
          s[mi][nb][e] = fmaf(sc.alibi, float(key_minus_query), s[mi][nb][e]);
        }
  } else if constexpr (kScores == kKeyMask && kKeyRows) {
#pragma unroll
    for (int mi = 0; mi < M; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // this lane's keys: rows g and g + 8
        if (sc.real_key(row0 + mi * 16 + lane / 4 + 8 * h)) continue;
#pragma unroll
        for (int nb = 0; nb < N / 8; ++nb) s[mi][nb][2 * h] = s[mi][nb][2 * h + 1] = -INFINITY;
      }
  } else if constexpr (kScores == kKeyMask) {
#pragma unroll
    for (int nb = 0; nb < N / 8; ++nb)
#pragma unroll
      for (int c = 0; c < 2; ++c) {  // this lane's keys: columns 8 nb + 2t + c
        if (sc.real_key(col0 + elem_col(lane, nb, c))) continue;
#pragma unroll
        for (int mi = 0; mi < M; ++mi) s[mi][nb][c] = s[mi][nb][2 + c] = -INFINITY;
      }
  }
}

/// Key blocks of Bc a query block [q0, q0 + Br) walks: up to the diagonal,
/// or (kKeyMask) all of them.
template <int kScores, int Br, int Bc>
__device__ __forceinline__ int key_blocks(kindex q0, kindex S) {
  if constexpr (kScores == kKeyMask) return int((S + Bc - 1) / Bc);
  return int(((q0 + Br < S ? q0 + Br : S) + Bc - 1) / Bc);
}

// ----------------------------------------------------------------- forward ---

/// Tiling of the forward: `Warps` warps of 16 M query rows each, key blocks
/// of `Bc`; QRegs keeps the warp's Q fragments in registers for the whole
/// walk (instead of re-reading them from shared memory per key block);
/// MinBlocks CTAs per SM bound the registers (__launch_bounds__).
template <int D, int Warps, int M, int Bc, bool QRegs, int MinBlocks = 1>
struct FwdTiles {
  static constexpr int kD = D, kWarps = Warps, kM = M, kRows = 16 * M, kBr = kRows * Warps,
                       kBc = Bc, kLd = D + kPad, kMinBlocks = MinBlocks;
  static constexpr bool kQRegs = QRegs;
  static constexpr std::size_t kSmem = std::size_t(kBr + 4 * kBc) * kLd * 2;  // Q, 2 x (K, V)
};

template <class T, class Tile, int kDrop, int kScores>
__global__ void __launch_bounds__(Tile::kWarps * 32, Tile::kMinBlocks)
    flash_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         HeadStrides in, kindex S, float scale_log2, T* __restrict__ out,
                         HeadStrides os, float* __restrict__ lse, FlashDropout drop,
                         FlashScores scores) {
  constexpr int D = Tile::kD, M = Tile::kM, kRows = Tile::kRows, kBr = Tile::kBr,
                kBc = Tile::kBc, kLd = Tile::kLd, kThreads = Tile::kWarps * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kBr * kLd;      // [2][kBc][kLd]
  T* sV = sK + 2 * kBc * kLd;  // [2][kBc][kLd]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const kindex q0 = kindex(gridDim.x - 1 - blockIdx.x) * kBr;  // last (longest) blocks first
  const kindex base = in.base(blockIdx.y);
  q += base, k += base, v += base, out += os.base(blockIdx.y), lse += kindex(blockIdx.y) * S;
  const int n_kv = key_blocks<kScores, kBr, kBc>(q0, S);
  const EntryDropout dropout(drop, blockIdx.y, S);
  const EntryScores sc(scores, blockIdx.y, S, scale_log2 / kLog2e);

  load_tile<T, kBr, D, kThreads>(sQ, q, q0, S, in.ld);
  load_tile<T, kBc, D, kThreads>(sK, k, 0, S, in.ld);
  load_tile<T, kBc, D, kThreads>(sV, v, 0, S, in.ld);
  cp_async_commit();

  const kindex row_lo = q0 + warp * kRows;  // this warp's rows row_lo .. row_lo + kRows - 1
  const T* sQw = sQ + warp * kRows * kLd;
  std::uint32_t qf[M][Tile::kQRegs ? D / 16 : 1][4];
  float o[M][D / 8][4] = {};
  // Running max (of the raw scores, times scale_log2) and sum of rows g, g + 8.
  float m[M][2], l[M][2];
#pragma unroll
  for (int mi = 0; mi < M; ++mi) m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.f;
  for (int j = 0; j < n_kv; ++j) {
    prefetch_next_kv<T, kBc, D, kThreads>(sK, sV, k, v, j, n_kv, S, in.ld);
    __syncthreads();
    if constexpr (Tile::kQRegs)
      if (j == 0) load_a<T, M, D>(qf, sQw, kLd, lane);
    const kindex k0 = kindex(j) * kBc;
    // some key of the block is visible to some row of the warp
    if (kScores == kKeyMask || k0 <= row_lo + kRows - 1) {
      const T* sKs = sK + (j % 2) * kBc * kLd;
      const T* sVs = sV + (j % 2) * kBc * kLd;
      [[maybe_unused]] std::uint32_t stored[M][2][kDrop == kReadMask ? kBc / 32 : 1];
      if constexpr (kDrop == kReadMask)  // loads first: their latency under the GEMMs
        load_row_bits<M, kBc>(dropout, stored, row_lo, k0, lane);
      float s[M][kBc / 8][4] = {};
      if constexpr (Tile::kQRegs)
        mma_rabt<T, M, kBc, D>(s, qf, sKs, kLd, lane);
      else
        mma_abt<T, M, kBc, D>(s, sQw, kLd, sKs, kLd, lane);
      apply_scores<kScores, false, M, kBc>(s, sc, row_lo, k0, lane);
      if (kScores != kKeyMask && k0 + kBc - 1 > row_lo) {  // the diagonal crosses the warp's tile
#pragma unroll
        for (int mi = 0; mi < M; ++mi)
#pragma unroll
          for (int nb = 0; nb < kBc / 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (k0 + elem_col(lane, nb, e) > row_lo + mi * 16 + elem_row(lane, e))
                s[mi][nb][e] = -INFINITY;
      }
#pragma unroll
      for (int mi = 0; mi < M; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // online softmax of rows g (h = 0) and g + 8 (h = 1)
          float mx = -INFINITY;
#pragma unroll
          for (int nb = 0; nb < kBc / 8; ++nb)
            mx = fmaxf(mx, fmaxf(s[mi][nb][2 * h], s[mi][nb][2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[mi][h], mx * scale_log2);
          const float ref = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet
          const float alpha = fast_exp2(m[mi][h] - ref);
          m[mi][h] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int nb = 0; nb < kBc / 8; ++nb)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float& x = s[mi][nb][2 * h + c];
              x = fast_exp2(fmaf(x, scale_log2, -ref));
              sum += x;
            }
          l[mi][h] = l[mi][h] * alpha + sum;  // this lane's columns; the quad is summed at the end
#pragma unroll
          for (int nb = 0; nb < D / 8; ++nb) o[mi][nb][2 * h] *= alpha, o[mi][nb][2 * h + 1] *= alpha;
        }
      if constexpr (kDrop == kReadMask) {  // drawn ahead (draw_attention_mask_kernel)
#pragma unroll
        for (int mi = 0; mi < M; ++mi)
#pragma unroll
          for (int nb = 0; nb < kBc / 8; ++nb) {
            const unsigned bits = row_tile_bits<M, kBc>(stored, mi, nb, lane);
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mi][nb][e] = kept(s[mi][nb][e], bits, e) * drop.keep_scale;
          }
      }
      if constexpr (kDrop == kDrawMask) {  // after the row sums: l, lse stay undropped
        std::uint32_t rows[M][2][kBc / 32] = {};
#pragma unroll
        for (int mi = 0; mi < M; ++mi) {
          unsigned bits[kBc / 8];
          keep_bits_query_rows(dropout, row_lo + mi * 16, k0, lane, bits);
#pragma unroll
          for (int nb = 0; nb < kBc / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mi][nb][e] = kept(s[mi][nb][e], bits[nb], e) * drop.keep_scale;
            add_row_bits<M, kBc>(rows, mi, nb, bits[nb], lane);
          }
        }
        if (dropout.keep_bits != nullptr) store_row_bits<M, kBc>(dropout, rows, row_lo, k0, lane);
      }
      std::uint32_t p[M][kBc / 16][4];
      to_a_operand<T, M, kBc>(p, s);
      mma_rab<T, M, D, kBc>(o, p, sVs, kLd, lane);
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  float inv_l[M][2];
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[mi][h] += __shfl_xor_sync(0xffffffffu, l[mi][h], 1);
      l[mi][h] += __shfl_xor_sync(0xffffffffu, l[mi][h], 2);
      inv_l[mi][h] = 1.f / l[mi][h];
      if constexpr (kScores == kKeyMask)  // no visible key: out = 0
        if (l[mi][h] == 0.f) inv_l[mi][h] = 0.f;
    }
  store_rows<T, M, D>(out, os.ld, o, row_lo, S, inv_l, lane);
  if (lane % 4 == 0)
#pragma unroll
    for (int mi = 0; mi < M; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const kindex row = row_lo + mi * 16 + lane / 4 + 8 * h;
        float row_lse = (m[mi][h] + log2f(l[mi][h])) * kLn2;
        if constexpr (kScores == kKeyMask)
          if (l[mi][h] == 0.f) row_lse = INFINITY;  // P = 0 in the backward
        if (row < S) lse[row] = row_lse;
      }
}

/// The stored mask drawn ahead of the forward, which then reads it
/// (kReadMask) instead of drawing it between its GEMMs: there the ten
/// serial Philox rounds leave the forward latency-bound at the few warps its
/// registers allow; here nothing else holds registers, so the SMs fill with
/// warps and the draws run at the integer units' throughput. One thread per
/// word (keys 32w .. 32w + 31 of query row i; its four group calls as one
/// batch), the words w <= i / 32 of row i: those holding its visible keys (key
/// <= i). A pass that reads a word past them (its key block reaches beyond the
/// diagonal) applies it only to P = 0, so what those words hold does not
/// matter. The words of an entry are numbered in one range so that every thread
/// has the same work, a thread's (row, word) found by a square root
/// (ops/attention_mask_layout.hpp; H100, perf/bench_cuda_ops attention, 124M
/// shape: 34.5 us, against 45.5 us drawing through the end of each 128-row
/// block and 62.5 us finding 32-row blocks by a loop). Grouped entries only (S
/// % 8 == 0); the bits of keep_bits_query_rows.
__global__ void __launch_bounds__(256)
    draw_attention_mask_kernel(FlashDropout drop, kindex S, std::uint32_t entry_words) {
  const std::uint32_t r = blockIdx.x * blockDim.x + threadIdx.x;  // 32-bit: cheap divisions
  if (r >= entry_words) return;
  const ops::MaskWord at = ops::attention_mask_word(r);
  const kindex row = at.row, w = at.word;
  const EntryDropout d(drop, blockIdx.y, S);
  constexpr int kCalls = 32 / philox::kGroup;
  uint4 calls[kCalls];
#pragma unroll
  for (int j = 0; j < kCalls; ++j)
    calls[j] = philox::group_counter(d.site,
                                     philox::group_of(d.index(row, 32 * w + philox::kGroup * j)));
  philox::group_bits(d.site, calls);
  std::uint32_t word = 0;
#pragma unroll
  for (int j = 0; j < kCalls; ++j)
    word |= philox::keep_bits(calls[j], d.threshold) << (philox::kGroup * j);
  d.keep_bits[row * d.words + w] = word;
}

// ---------------------------------------------------------------- backward ---

/// delta[r] = dout[r, :] . out[r, :] in fp32 for rows r = bh S + s (both
/// laid out by os): D / 8 lanes per row, each reading 16 bytes of both.
template <class T, int D>
__global__ void row_dot_kernel(const T* __restrict__ dout, const T* __restrict__ out,
                               HeadStrides os, kindex S, kindex rows, float* __restrict__ delta) {
  constexpr int kLanes = D / 8;
  const kindex r = (kindex(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int c = int(threadIdx.x % kLanes) * 8;
  float sum = 0.f;
  if (r < rows) {
    const kindex at = os.base(r / S) + (r % S) * os.ld + c;
    const uint4 a = *reinterpret_cast<const uint4*>(dout + at);
    const uint4 b = *reinterpret_cast<const uint4*>(out + at);
    const T* ea = reinterpret_cast<const T*>(&a);
    const T* eb = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int i = 0; i < 8; ++i) sum += load_f(ea, i) * load_f(eb, i);
  }
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (r < rows && c == 0) delta[r] = sum;
}

/// Tiling of the dK/dV pass: `Warps` warps of 16 M keys each, query blocks
/// of `Br`; KVRegs keeps the warp's K and V fragments in registers.
template <int D, int Warps, int M, int Br, bool KVRegs>
struct DkDvTiles {
  static constexpr int kD = D, kWarps = Warps, kM = M, kRows = 16 * M, kBc = kRows * Warps,
                       kBr = Br, kLd = D + kPad;
  static constexpr bool kKVRegs = KVRegs;
  // K, V, then 2 stages of (Q, dO) and 2 stages of (lse, delta); reading
  // the stored dropout mask, then 2 stages of its words (load_key_block_words).
  static constexpr std::size_t kSmem =
      std::size_t(2 * kBc + 4 * kBr) * kLd * 2 + std::size_t(4 * kBr) * sizeof(float);
  static constexpr std::size_t kMaskSmem = std::size_t(2 * kBr) * (kBc / 32) * 4;
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

template <class T, class Tile, int kDrop, int kScores>
__global__ void __launch_bounds__(Tile::kWarps * 32)
    flash_backward_dkdv_kernel(const T* __restrict__ q, const T* __restrict__ k,
                               const T* __restrict__ v, const T* __restrict__ dout,
                               const float* __restrict__ lse, const float* __restrict__ delta,
                               HeadStrides in, HeadStrides os, kindex S, float scale,
                               float scale_log2, T* __restrict__ dk, T* __restrict__ dv,
                               FlashDropout drop, FlashScores scores) {
  constexpr int D = Tile::kD, M = Tile::kM, kRows = Tile::kRows, kBr = Tile::kBr,
                kBc = Tile::kBc, kLd = Tile::kLd, kThreads = Tile::kWarps * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kBc * kLd;
  T* sQ = sV + kBc * kLd;                                     // [2][kBr][kLd]
  T* sdO = sQ + 2 * kBr * kLd;                                // [2][kBr][kLd]
  float* sL = reinterpret_cast<float*>(sdO + 2 * kBr * kLd);  // [2][kBr]
  float* sDelta = sL + 2 * kBr;                               // [2][kBr]
  auto* sMask = reinterpret_cast<std::uint32_t*>(sDelta + 2 * kBr);  // [2][kBr][kBc / 32]
  constexpr int kMaskStage = kBr * (kBc / 32);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const kindex k0 = kindex(blockIdx.x) * kBc;  // first key blocks see the most queries
  const kindex base = in.base(blockIdx.y);
  q += base, k += base, v += base, dout += os.base(blockIdx.y), dk += base, dv += base;
  lse += kindex(blockIdx.y) * S, delta += kindex(blockIdx.y) * S;
  // From the diagonal on (every query block under a key mask).
  const int qb_begin = kScores == kKeyMask ? 0 : int(k0 / kBr), qb_end = int((S + kBr - 1) / kBr);
  const EntryDropout dropout(drop, blockIdx.y, S);
  const EntryScores sc(scores, blockIdx.y, S, scale);

  load_tile<T, kBc, D, kThreads>(sK, k, k0, S, in.ld);
  load_tile<T, kBc, D, kThreads>(sV, v, k0, S, in.ld);
  load_tile<T, kBr, D, kThreads>(sQ, q, kindex(qb_begin) * kBr, S, in.ld);
  load_tile<T, kBr, D, kThreads>(sdO, dout, kindex(qb_begin) * kBr, S, os.ld);
  if constexpr (kDrop == kReadMask)
    load_key_block_words<kBr, kBc, kThreads>(sMask, dropout, kindex(qb_begin) * kBr, k0);
  cp_async_commit();
  load_row_stats<kBr>(sL, sDelta, lse, delta, kindex(qb_begin) * kBr, S);

  const kindex key_lo = k0 + warp * kRows;  // this warp's keys key_lo .. key_lo + kRows - 1
  const T* sKw = sK + warp * kRows * kLd;
  const T* sVw = sV + warp * kRows * kLd;
  std::uint32_t kf[M][Tile::kKVRegs ? D / 16 : 1][4], vf[M][Tile::kKVRegs ? D / 16 : 1][4];
  float dk_acc[M][D / 8][4] = {}, dv_acc[M][D / 8][4] = {};
  for (int qb = qb_begin; qb < qb_end; ++qb) {
    const int st = (qb - qb_begin) % 2;
    if (qb + 1 < qb_end) {
      const kindex next = kindex(qb + 1) * kBr;
      load_tile<T, kBr, D, kThreads>(sQ + (1 - st) * kBr * kLd, q, next, S, in.ld);
      load_tile<T, kBr, D, kThreads>(sdO + (1 - st) * kBr * kLd, dout, next, S, os.ld);
      if constexpr (kDrop == kReadMask)
        load_key_block_words<kBr, kBc, kThreads>(sMask + (1 - st) * kMaskStage, dropout, next, k0);
      cp_async_commit();
      load_row_stats<kBr>(sL + (1 - st) * kBr, sDelta + (1 - st) * kBr, lse, delta, next, S);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (Tile::kKVRegs)
      if (qb == qb_begin) load_a<T, M, D>(kf, sKw, kLd, lane), load_a<T, M, D>(vf, sVw, kLd, lane);
    const kindex q0 = kindex(qb) * kBr;
    // some query of the block sees some key of the warp
    if (kScores == kKeyMask || q0 + kBr - 1 >= key_lo) {
      const T* sQs = sQ + st * kBr * kLd;
      const T* sdOs = sdO + st * kBr * kLd;
      const float* sLs = sL + st * kBr;
      const float* sDs = sDelta + st * kBr;
      [[maybe_unused]] unsigned keep[M][kDrop != kNoDropout ? kBr / 8 : 1];
      if constexpr (kDrop == kReadMask)
#pragma unroll
        for (int mi = 0; mi < M; ++mi)
#pragma unroll
          for (int nb = 0; nb < kBr / 8; ++nb)
            keep[mi][nb] = stored_bits_key_rows<kBc>(sMask + st * kMaskStage,
                                                     int(key_lo - k0) + mi * 16, nb * 8, lane);
      // P^T = exp2(scale log2e K Q^T - lse log2e), keys as rows.
      float pt[M][kBr / 8][4] = {};
      if constexpr (Tile::kKVRegs)
        mma_rabt<T, M, kBr, D>(pt, kf, sQs, kLd, lane);
      else
        mma_abt<T, M, kBr, D>(pt, sKw, kLd, sQs, kLd, lane);
      apply_scores<kScores, true, M, kBr>(pt, sc, key_lo, q0, lane);
      const bool diagonal = kScores != kKeyMask && key_lo + kRows - 1 > q0;
#pragma unroll
      for (int mi = 0; mi < M; ++mi)
#pragma unroll
        for (int nb = 0; nb < kBr / 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = elem_col(lane, nb, e);
            float x = fmaf(pt[mi][nb][e], scale_log2, -sLs[col]);
            if (diagonal && key_lo + mi * 16 + elem_row(lane, e) > q0 + col) x = -INFINITY;
            pt[mi][nb][e] = fast_exp2(x);
          }
      std::uint32_t a[M][kBr / 16][4];
      if constexpr (kDrop != kNoDropout) {
        float ptz[M][kBr / 8][4];  // (P o Z)^T
#pragma unroll
        for (int mi = 0; mi < M; ++mi)
#pragma unroll
          for (int nb = 0; nb < kBr / 8; ++nb) {
            if constexpr (kDrop == kDrawMask)
              if (nb % 2 == 0) {  // a pair of tiles per call (keep_bits_key_rows)
                unsigned pair[2];
                keep_bits_key_rows(dropout, key_lo + mi * 16, q0 + nb * 8, lane, pair);
                keep[mi][nb] = pair[0], keep[mi][nb + 1] = pair[1];
              }
#pragma unroll
            for (int e = 0; e < 4; ++e)  // unscaled: dV's store applies the keep scale
              ptz[mi][nb][e] = kept(pt[mi][nb][e], keep[mi][nb], e);
          }
        to_a_operand<T, M, kBr>(a, ptz);
      } else {
        to_a_operand<T, M, kBr>(a, pt);
      }
      mma_rab<T, M, D, kBr>(dv_acc, a, sdOs, kLd, lane);  // dV += (P o Z)^T dO
      float dpt[M][kBr / 8][4] = {};
      if constexpr (Tile::kKVRegs)
        mma_rabt<T, M, kBr, D>(dpt, vf, sdOs, kLd, lane);
      else
        mma_abt<T, M, kBr, D>(dpt, sVw, kLd, sdOs, kLd, lane);  // dP^T = V dO^T
#pragma unroll
      for (int mi = 0; mi < M; ++mi)
#pragma unroll
        for (int nb = 0; nb < kBr / 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {  // dS^T / scale
            const unsigned bits = kDrop == kNoDropout ? 0u : keep[mi][nb];
            dpt[mi][nb][e] = pt[mi][nb][e] * dz_minus_delta<kDrop>(drop.keep_scale,
                                                                   dpt[mi][nb][e], bits, e,
                                                                   sDs[elem_col(lane, nb, e)]);
          }
      to_a_operand<T, M, kBr>(a, dpt);
      mma_rab<T, M, D, kBr>(dk_acc, a, sQs, kLd, lane);  // dK += dS^T Q
    }
    __syncthreads();
  }
  store_rows<T, M, D>(dk, in.ld, dk_acc, key_lo, S, Uniform<M>(scale).v, lane);
  store_rows<T, M, D>(dv, in.ld, dv_acc, key_lo, S,
                      Uniform<M>(kDrop == kNoDropout ? 1.f : drop.keep_scale).v, lane);
}

/// Tiling of the dQ pass: `Warps` warps of 16 M query rows each, key blocks
/// of `Bc`; QRegs keeps the warp's Q and dO fragments in registers.
template <int D, int Warps, int M, int Bc, bool QRegs>
struct DqTiles {
  static constexpr int kD = D, kWarps = Warps, kM = M, kRows = 16 * M, kBr = kRows * Warps,
                       kBc = Bc, kLd = D + kPad;
  static constexpr bool kQRegs = QRegs;
  static constexpr std::size_t kSmem =
      std::size_t(2 * kBr + 4 * kBc) * kLd * 2;  // Q, dO, 2 x (K, V)
};

template <class T, class Tile, int kDrop, int kScores>
__global__ void __launch_bounds__(Tile::kWarps * 32)
    flash_backward_dq_kernel(const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, const T* __restrict__ dout,
                             const float* __restrict__ lse, const float* __restrict__ delta,
                             HeadStrides in, HeadStrides os, kindex S, float scale,
                             float scale_log2, T* __restrict__ dq, FlashDropout drop,
                             FlashScores scores) {
  constexpr int D = Tile::kD, M = Tile::kM, kRows = Tile::kRows, kBr = Tile::kBr,
                kBc = Tile::kBc, kLd = Tile::kLd, kThreads = Tile::kWarps * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kBr * kLd;
  T* sK = sdO + kBr * kLd;     // [2][kBc][kLd]
  T* sV = sK + 2 * kBc * kLd;  // [2][kBc][kLd]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const kindex q0 = kindex(gridDim.x - 1 - blockIdx.x) * kBr;
  const kindex base = in.base(blockIdx.y);
  q += base, k += base, v += base, dout += os.base(blockIdx.y), dq += base;
  lse += kindex(blockIdx.y) * S, delta += kindex(blockIdx.y) * S;
  const int n_kv = key_blocks<kScores, kBr, kBc>(q0, S);
  const EntryDropout dropout(drop, blockIdx.y, S);
  const EntryScores sc(scores, blockIdx.y, S, scale);

  load_tile<T, kBr, D, kThreads>(sQ, q, q0, S, in.ld);
  load_tile<T, kBr, D, kThreads>(sdO, dout, q0, S, os.ld);
  load_tile<T, kBc, D, kThreads>(sK, k, 0, S, in.ld);
  load_tile<T, kBc, D, kThreads>(sV, v, 0, S, in.ld);
  cp_async_commit();

  const kindex row_lo = q0 + warp * kRows;
  float lse2[M][2], dl[M][2];
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const kindex row = row_lo + mi * 16 + lane / 4 + 8 * h;
      lse2[mi][h] = row < S ? lse[row] * kLog2e : INFINITY;
      dl[mi][h] = row < S ? delta[row] : 0.f;
    }
  const T* sQw = sQ + warp * kRows * kLd;
  const T* sdOw = sdO + warp * kRows * kLd;
  std::uint32_t qf[M][Tile::kQRegs ? D / 16 : 1][4], dof[M][Tile::kQRegs ? D / 16 : 1][4];
  float dq_acc[M][D / 8][4] = {};
  for (int j = 0; j < n_kv; ++j) {
    prefetch_next_kv<T, kBc, D, kThreads>(sK, sV, k, v, j, n_kv, S, in.ld);
    __syncthreads();
    if constexpr (Tile::kQRegs)
      if (j == 0) load_a<T, M, D>(qf, sQw, kLd, lane), load_a<T, M, D>(dof, sdOw, kLd, lane);
    const kindex k0 = kindex(j) * kBc;
    if (kScores == kKeyMask || k0 <= row_lo + kRows - 1) {
      const T* sKs = sK + (j % 2) * kBc * kLd;
      const T* sVs = sV + (j % 2) * kBc * kLd;
      [[maybe_unused]] std::uint32_t stored[M][2][kDrop == kReadMask ? kBc / 32 : 1];
      if constexpr (kDrop == kReadMask)  // loads first: their latency under the GEMMs
        load_row_bits<M, kBc>(dropout, stored, row_lo, k0, lane);
      float p[M][kBc / 8][4] = {};
      if constexpr (Tile::kQRegs)
        mma_rabt<T, M, kBc, D>(p, qf, sKs, kLd, lane);
      else
        mma_abt<T, M, kBc, D>(p, sQw, kLd, sKs, kLd, lane);  // S = Q K^T
      apply_scores<kScores, false, M, kBc>(p, sc, row_lo, k0, lane);
      const bool diagonal = kScores != kKeyMask && k0 + kBc - 1 > row_lo;
#pragma unroll
      for (int mi = 0; mi < M; ++mi)
#pragma unroll
        for (int nb = 0; nb < kBc / 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = fmaf(p[mi][nb][e], scale_log2, -lse2[mi][e / 2]);
            if (diagonal && k0 + elem_col(lane, nb, e) > row_lo + mi * 16 + elem_row(lane, e))
              x = -INFINITY;
            p[mi][nb][e] = fast_exp2(x);
          }
      float dp[M][kBc / 8][4] = {};
      if constexpr (Tile::kQRegs)
        mma_rabt<T, M, kBc, D>(dp, dof, sVs, kLd, lane);
      else
        mma_abt<T, M, kBc, D>(dp, sdOw, kLd, sVs, kLd, lane);  // dP = dO V^T
      unsigned drawn[2] = {};  // kDrawMask: the keep bits of tiles nb, nb + 1 (nb even)
#pragma unroll
      for (int mi = 0; mi < M; ++mi)
#pragma unroll
        for (int nb = 0; nb < kBc / 8; ++nb) {
          unsigned keep = 0;
          if constexpr (kDrop == kDrawMask) {  // a pair of tiles per call
            if (nb % 2 == 0) keep_bits_query_rows(dropout, row_lo + mi * 16, k0 + nb * 8, lane, drawn);
            keep = drawn[nb % 2];
          }
          if constexpr (kDrop == kReadMask) keep = row_tile_bits<M, kBc>(stored, mi, nb, lane);
#pragma unroll
          for (int e = 0; e < 4; ++e)  // dS / scale
            dp[mi][nb][e] =
                p[mi][nb][e] *
                dz_minus_delta<kDrop>(drop.keep_scale, dp[mi][nb][e], keep, e, dl[mi][e / 2]);
        }
      std::uint32_t a[M][kBc / 16][4];
      to_a_operand<T, M, kBc>(a, dp);
      mma_rab<T, M, D, kBc>(dq_acc, a, sKs, kLd, lane);  // dQ += dS K
    }
    __syncthreads();
  }
  store_rows<T, M, D>(dq, in.ld, dq_acc, row_lo, S, Uniform<M>(scale).v, lane);
}

// ---------------------------------------------------------------- dispatch ---

// The tilings in use: the fastest of two sweeps on an H100 at B = 96..128,
// S = 1024 and 2048 (perf/bench_cuda_ops.cpp's attention cases). Times are
// ms at B = 8x12, S = 1024, D = 64 | B = 8x16, S = 1024, D = 128; Wn = n
// warps, Mm = 16m rows (or keys) per warp, +regs = the loop-invariant A
// operand (Q; K and V; Q and dO) held in registers.
// First sweep (16 rows per warp, A operands re-read from shared memory, the
// scale applied by a separate multiply, exp2f):
//   forward W8 Bc64: 0.114 | 0.225; W4 Bc64: 0.101 | 0.212; W8 Bc128: 0.109 | 0.203
//   dK/dV   W8 Br64|32: backward 0.343 | 0.768; W4, same: 0.330 | 0.716;
//           W4 Br128|64: 0.334 | 0.677
//   dQ      W8 Bc64: backward 0.343 | 0.768; W4 Bc128|32: 0.306 | 0.772
// Second sweep (scale folded into one fma, ex2.approx, 16-byte row_dot; the
// backward column with the other pass at its default):
//   forward D64: W4 M1 Bc64 0.088; +regs 0.089; W4 M2 Bc64 +regs 0.085 (S = 2048:
//           0.143 against 0.157); W4 M2 Bc64 0.088; W8 M2 Bc64 +regs 0.096;
//           W4 M2 Bc32 +regs 0.104; W4 M1 Bc128 +regs 0.091
//           D128: W8 M1 Bc128 0.194; W4 M2 Bc32 0.192; W8 M2 Bc32 0.211;
//           W8 M1 Bc64 +regs 0.218; W8 M1 Bc32 +regs 0.237
//   dK/dV   D64: W4 M1 Br64 0.273; +regs 0.276; W4 M2 Br32 0.288; W8 M2 Br32 0.318;
//           W2 M2 Br32 0.285; W4 M1 Br32 +regs 0.278
//           D128: W4 M1 Br64 0.615; W4 M1 Br32 0.656; +regs 0.652; W8 M1 Br16 0.874
//   dQ      D64: W4 M1 Bc128 0.272; W4 M1 Bc64 +regs 0.284; W4 M2 Bc64 0.269;
//           W4 M2 Bc32 +regs 0.280; W8 M2 Bc64 0.282; W4 M2 Bc32 0.274;
//           W8 M2 Bc32 +regs 0.293
//           D128: W8 M1 Bc64 0.615; W4 M2 Bc32 0.618; W8 M2 Bc32 0.613;
//           W8 M1 Bc32 +regs 0.618; W4 M1 Bc64 +regs 0.577
// Two m-tiles per warp halve the B-fragment reads per MMA but cost occupancy
// (220-255 registers: 2 CTAs of 4 warps per SM); only the D = 64 forward and
// dQ gain from them.
template <int D>
using FwdTiling = std::conditional_t<D == 64, FwdTiles<64, 4, 2, 64, true>,
                                     FwdTiles<D, 8, 1, 128, false>>;
template <int D>
using DkDvTiling = DkDvTiles<D, 4, 1, 64, false>;
template <int D>
using DqTiling =
    std::conditional_t<D == 64, DqTiles<64, 4, 2, 64, false>, DqTiles<D, 4, 1, 64, true>>;
// With attention dropout at D = 64: one m-tile per warp (fewer registers, so
// more warps to hide the forward's Philox rounds and no spills in dQ), held
// to 3 CTAs per SM: the batched Philox calls of a key block (one m-tile's 8
// tiles side by side) would take 172 registers and leave room for 2.
template <int D>
using FwdDropoutTiling =
    std::conditional_t<D == 64, FwdTiles<64, 4, 1, 64, true, 3>, FwdTiling<D>>;
// Reading the mask drawn ahead at D = 64: one m-tile per warp (164
// registers; two spill 48 bytes and are no faster on an H100,
// perf/bench_cuda_ops attention).
template <int D>
using FwdReadMaskTiling =
    std::conditional_t<D == 64, FwdTiles<64, 4, 1, 64, true>, FwdTiling<D>>;
template <int D>
using DqDropoutTiling = std::conditional_t<D == 64, DqTiles<64, 4, 1, 64, true>, DqTiling<D>>;

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
template <auto Kernel, class... Args>
void launch(dim3 grid, int threads, std::size_t smem, Args... args) {
  opt_in_max_shared_memory<Kernel>();
  Kernel<<<grid, threads, smem, compute_stream()>>>(args...);
  MESH_CUDA_LAUNCHED();
}

unsigned blocks_of(index_t S, int rows) { return unsigned((S + rows - 1) / rows); }

void check_extents(const char* op, const void* const* ptrs, int n, index_t B) {
  for (int i = 0; i < n; ++i)
    MESH_VERIFY(aligned16(ptrs[i]), op << ": operand " << i << " is not 16-byte aligned");
  MESH_VERIFY(B <= 65535, op << ": " << B << " batch x heads exceed the grid's 65535");
}

/// The three passes of the backward on one tiling, as launched below. q, k,
/// v, dq, dk, dv are laid out by `in`; out (o) and dout by `os`.
struct FlashArgs {
  const void *q, *k, *v, *dout, *out;
  const float* lse;
  float* delta;
  void *o, *dq, *dk, *dv;
  index_t B, S;
  double scale;
  HeadStrides in, os;
  bool dropout = false;  // the kDrawMask / kReadMask kernels with `drop`
  FlashDropout drop{};
  bool mask_drawn = false;  // drop.keep_bits already drawn (draw_attention_mask)
  FlashScores scores{};     // the kAlibi / kKeyMask kernels
};

template <class T, class Tile, int kDrop, int kScores>
void launch_forward(const FlashArgs& a) {
  launch<flash_forward_kernel<T, Tile, kDrop, kScores>>(
         dim3(blocks_of(a.S, Tile::kBr), unsigned(a.B)),
         Tile::kWarps * 32, Tile::kSmem, static_cast<const T*>(a.q), static_cast<const T*>(a.k),
         static_cast<const T*>(a.v), a.in, kindex(a.S), float(a.scale * kLog2e),
         static_cast<T*>(a.o), a.os, const_cast<float*>(a.lse), a.drop, a.scores);
}

void launch_draw_mask(const FlashArgs& a, cudaStream_t stream = compute_stream()) {
  const kindex entry_words = ops::attention_mask_words_drawn(a.S);
  MESH_VERIFY(entry_words < ops::kMaxMaskWordsDrawn,
              "fused attention: S = " << a.S << " is too long for the dropout mask kernel");
  const dim3 grid(unsigned((entry_words + 255) / 256), unsigned(a.B));
  draw_attention_mask_kernel<<<grid, 256, 0, stream>>>(a.drop, kindex(a.S),
                                                        std::uint32_t(entry_words));
  MESH_CUDA_LAUNCHED();
}

template <class T, int D>
void launch_row_dot(const FlashArgs& a) {
  const kindex rows = a.B * a.S;
  row_dot_kernel<T, D><<<unsigned((rows * (D / 8) + 255) / 256), 256, 0, compute_stream()>>>(
      static_cast<const T*>(a.dout), static_cast<const T*>(a.out), a.os, kindex(a.S), rows,
      a.delta);
  MESH_CUDA_LAUNCHED();
}

template <class T, class Tile, int kDrop, int kScores>
void launch_dkdv(const FlashArgs& a) {
  launch<flash_backward_dkdv_kernel<T, Tile, kDrop, kScores>>(
         dim3(blocks_of(a.S, Tile::kBc), unsigned(a.B)),
         Tile::kWarps * 32, Tile::kSmem + (kDrop == kReadMask ? Tile::kMaskSmem : 0),
         static_cast<const T*>(a.q), static_cast<const T*>(a.k),
         static_cast<const T*>(a.v), static_cast<const T*>(a.dout), a.lse,
         static_cast<const float*>(a.delta), a.in, a.os, kindex(a.S), float(a.scale),
         float(a.scale * kLog2e), static_cast<T*>(a.dk), static_cast<T*>(a.dv), a.drop,
         a.scores);
}

template <class T, class Tile, int kDrop, int kScores>
void launch_dq(const FlashArgs& a) {
  launch<flash_backward_dq_kernel<T, Tile, kDrop, kScores>>(
         dim3(blocks_of(a.S, Tile::kBr), unsigned(a.B)),
         Tile::kWarps * 32, Tile::kSmem, static_cast<const T*>(a.q), static_cast<const T*>(a.k),
         static_cast<const T*>(a.v), static_cast<const T*>(a.dout), a.lse,
         static_cast<const float*>(a.delta), a.in, a.os, kindex(a.S), float(a.scale),
         float(a.scale * kLog2e), static_cast<T*>(a.dq), a.drop, a.scores);
}

}  // namespace

namespace {

/// Calls f(std::integral_constant<int, kScores>{}) for the scores of `a`.
template <class F>
void with_score_mode(const FlashArgs& a, F&& f) {
  if (a.scores.key_mask != nullptr)
    f(std::integral_constant<int, kKeyMask>{});
  else if (a.scores.alibi_slopes != nullptr)
    f(std::integral_constant<int, kAlibi>{});
  else
    f(std::integral_constant<int, kCausal>{});
}

void forward(DType t, const FlashArgs& a, index_t D) {
  with_flash_types(t, D, "fused_attention_forward", [&](auto zero, auto dim) {
    using T = decltype(zero);
    constexpr int kD = decltype(dim)::value;
    with_score_mode(a, [&](auto mode) {
      constexpr int kS = decltype(mode)::value;
      // The mask kernel draws the causal rows' words only: under a key mask
      // the forward draws (and stores) its decisions itself.
      if constexpr (kS != kKeyMask)
        if (a.dropout && a.drop.keep_bits != nullptr && philox::whole_groups(a.S)) {
          if (!a.mask_drawn) launch_draw_mask(a);
          launch_forward<T, FwdReadMaskTiling<kD>, kReadMask, kS>(a);
          return;
        }
      if (a.dropout)
        launch_forward<T, FwdDropoutTiling<kD>, kDrawMask, kS>(a);
      else
        launch_forward<T, FwdTiling<kD>, kNoDropout, kS>(a);
    });
  });
}

void backward(DType t, const FlashArgs& a, index_t D) {
  with_flash_types(t, D, "fused_attention_backward", [&](auto zero, auto dim) {
    using T = decltype(zero);
    constexpr int kD = decltype(dim)::value;
    launch_row_dot<T, kD>(a);
    with_score_mode(a, [&](auto mode) {
      constexpr int kS = decltype(mode)::value;
      if (a.dropout && a.drop.keep_bits != nullptr) {  // the forward's stored decisions
        launch_dkdv<T, DkDvTiling<kD>, kReadMask, kS>(a);
        launch_dq<T, DqDropoutTiling<kD>, kReadMask, kS>(a);
      } else if (a.dropout) {
        launch_dkdv<T, DkDvTiling<kD>, kDrawMask, kS>(a);
        launch_dq<T, DqTiling<kD>, kDrawMask, kS>(a);
      } else {
        launch_dkdv<T, DkDvTiling<kD>, kNoDropout, kS>(a);
        launch_dq<T, DqTiling<kD>, kNoDropout, kS>(a);
      }
    });
  });
}

HeadStrides head_major(index_t S, index_t D) { return {D, S * D, 0, 1}; }

/// `a` with the attention dropout of `d` over B entries of S x S
/// probabilities (checked against the site the host built).
FlashArgs with_dropout(FlashArgs a, const AttentionDropoutSite& d) {
  if (d.p == 0.0) return a;
  const DropoutPlacement& s = d.site;
  MESH_VERIFY(d.p > 0.0 && d.p < 1.0, "fused attention: dropout p must be in [0, 1), got " << d.p);
  MESH_VERIFY(s.b > 0 && a.B % s.b == 0 && s.c == a.S * a.S && s.c_global == s.c &&
                  s.c_offset == 0,
              "fused attention: the dropout site must view the probabilities as [b, heads, S*S]");
  a.dropout = true;
  // The forward stores whole key blocks (up to 128 keys) of every row.
  MESH_VERIFY(d.keep_bits == nullptr || d.keep_bits_words * 32 >= (a.S + 127) / 128 * 128,
              "fused attention: " << d.keep_bits_words << " words per row of stored dropout "
                                  "decisions cannot hold S = " << a.S << " keys in blocks of 128");
  a.drop = {s, philox::keep_threshold(d.p), float(1.0 / (1.0 - d.p)), d.keep_bits,
            d.keep_bits_words};
  a.mask_drawn = d.mask_drawn;
  return a;
}

/// `a` with `scores` (checked: not both; a mask drawn ahead is causal only).
FlashArgs with_scores(FlashArgs a, const FlashScores& scores) {
  MESH_VERIFY(scores.alibi_slopes == nullptr || scores.key_mask == nullptr,
              "fused attention: ALiBi and a key mask together are not built");
  MESH_VERIFY(scores.key_mask == nullptr || !a.mask_drawn,
              "fused attention: a dropout mask drawn ahead is causal only, not for a key mask");
  MESH_VERIFY(scores.alibi_heads > 0 && a.B % scores.alibi_heads == 0 &&
                  scores.mask_heads > 0 && a.B % scores.mask_heads == 0,
              "fused attention: the scores' heads must divide " << a.B << " entries");
  a.scores = scores;
  return a;
}

/// The token-major layout [s * b, parts * heads * D] (rows in [s, b] order).
HeadStrides token_major(index_t b, int parts, index_t heads, index_t D) {
  return {b * parts * heads * D, parts * heads * D, D, int(heads)};
}

}  // namespace

void draw_attention_mask(const AttentionDropoutSite& dropout, index_t B, index_t S,
                         void* stream) {
  MESH_VERIFY(dropout.p > 0 && dropout.keep_bits != nullptr && philox::whole_groups(S),
              "draw_attention_mask: needs p > 0, stored-decision words and S % 8 == 0");
  FlashArgs a{};
  a.B = B;
  a.S = S;
  launch_draw_mask(with_dropout(a, dropout),
                   stream ? static_cast<cudaStream_t>(stream) : compute_stream());
}

void fused_attention_forward(DType t, const void* q, const void* k, const void* v, index_t B,
                             index_t S, index_t D, double scale, void* out, float* lse,
                             const AttentionDropoutSite& dropout, const FlashScores& scores) {
  if (B == 0 || S == 0) return;
  const void* ptrs[] = {q, k, v, out};
  check_extents("fused_attention_forward", ptrs, 4, B);
  const HeadStrides hm = head_major(S, D);
  forward(t,
          with_scores(with_dropout({q, k, v, nullptr, nullptr, lse, nullptr, out, nullptr, nullptr,
                                    nullptr, B, S, scale, hm, hm},
                                   dropout),
                      scores),
          D);
}

void fused_attention_backward(DType t, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, index_t B,
                              index_t S, index_t D, double scale, float* delta, void* dq, void* dk,
                              void* dv, const AttentionDropoutSite& dropout,
                              const FlashScores& scores) {
  if (B == 0 || S == 0) return;
  const void* ptrs[] = {dout, q, k, v, out, dq, dk, dv};
  check_extents("fused_attention_backward", ptrs, 8, B);
  const HeadStrides hm = head_major(S, D);
  backward(t,
           with_scores(with_dropout({q, k, v, dout, out, lse, delta, nullptr, dq, dk, dv, B, S,
                                     scale, hm, hm},
                                    dropout),
                       scores),
           D);
}

void flash_attention_forward_token_major(DType t, const void* qkv, index_t s, index_t b,
                                         index_t heads, index_t D, double scale, void* context,
                                         float* lse, const AttentionDropoutSite& dropout,
                                         const FlashScores& scores) {
  if (s == 0 || b == 0 || heads == 0) return;
  const char* base = static_cast<const char*>(qkv);
  const std::size_t part = std::size_t(heads * D) * dtype_size(t);
  const void* ptrs[] = {qkv, base + part, base + 2 * part, context};
  check_extents("fused_attention_forward", ptrs, 4, b * heads);
  forward(t,
          with_scores(with_dropout({base, base + part, base + 2 * part, nullptr, nullptr, lse,
                                    nullptr, context, nullptr, nullptr, nullptr, b * heads, s,
                                    scale, token_major(b, 3, heads, D),
                                    token_major(b, 1, heads, D)},
                                   dropout),
                      scores),
          D);
}

void flash_attention_backward_token_major(DType t, const void* dcontext, const void* qkv,
                                          const void* context, const float* lse, index_t s,
                                          index_t b, index_t heads, index_t D, double scale,
                                          float* delta, void* dqkv,
                                          const AttentionDropoutSite& dropout,
                                          const FlashScores& scores) {
  if (s == 0 || b == 0 || heads == 0) return;
  const char* in = static_cast<const char*>(qkv);
  char* grad = static_cast<char*>(dqkv);
  const std::size_t part = std::size_t(heads * D) * dtype_size(t);
  const void* ptrs[] = {dcontext, qkv, context, dqkv, in + part, grad + part};
  check_extents("fused_attention_backward", ptrs, 6, b * heads);
  backward(t,
           with_scores(with_dropout({in, in + part, in + 2 * part, dcontext, context, lse, delta,
                                     nullptr, grad, grad + part, grad + 2 * part, b * heads, s,
                                     scale, token_major(b, 3, heads, D),
                                     token_major(b, 1, heads, D)},
                                    dropout),
                       scores),
           D);
}

// ---------------------------------------------------------- backend choice ---

namespace {

struct Backends {
  bool cudnn_forward = false, cudnn_backward = false;
  std::string describe(const std::string& library) const {
    if (cudnn_forward && cudnn_backward) return library + " fused attention";
    if (cudnn_forward) return library + " fused attention forward, meshtron's backward";
    return "meshtron's flash attention kernels";
  }
};

/// The backends chosen per (device, dtype, shape), and whether cuDNN may be
/// chosen at all (set_fused_attention_kernels).
struct BackendChoices {
  std::mutex mutex;
  FusedAttentionKernels kernels = FusedAttentionKernels::Auto;
  std::map<std::tuple<int, DType, index_t, index_t, index_t, index_t>, Backends> chosen;
};

BackendChoices& backend_choices() {
  static BackendChoices choices;
  return choices;
}

/// One stderr line (rank 0) per distinct choice: "meshtron: attention: ...".
void announce(const std::string& line, const std::string& why) {
  static std::mutex mutex;
  static std::set<std::string> announced;
  std::lock_guard<std::mutex> lock(mutex);
  if (world_rank_or_minus_one() <= 0 && announced.insert(line + why).second)
    std::fprintf(stderr, "meshtron: attention: %s%s%s\n", line.c_str(), why.empty() ? "" : " -- ",
                 why.c_str());
}

/// The backends of one (device, dtype, shape), decided on first use.
Backends backends_for(DType t, index_t s, index_t b, index_t heads, index_t D) {
  BackendChoices& choices = backend_choices();
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(choices.mutex);
  const auto key = std::make_tuple(device, t, s, b, heads, D);
  if (auto it = choices.chosen.find(key); it != choices.chosen.end()) return it->second;
  Backends use;
  std::string library, why;
  if (choices.kernels == FusedAttentionKernels::Own) {
    why = "training.fused_attention_kernels = own";
  } else {
    const CudnnAttentionSupport cudnn = cudnn_attention_support(t, s, b, heads, D);
    use.cudnn_forward = cudnn.forward;
    use.cudnn_backward = cudnn.forward && cudnn.backward;
    library = cudnn.library;
    why = cudnn.why_not;
  }
  announce(use.describe(library), why);
  return choices.chosen.emplace(key, use).first->second;
}

/// The seed of one call's cuDNN-drawn attention dropout (the offset stays
/// 0): Philox4x32-10 under the run's seed of (sample offset, first local
/// head, step, stream), so every step, layer, micro-batch, dp rank's samples
/// and tp rank's heads get their own stream of cuDNN's generator, and a
/// backward redraws its forward's mask. Reads the step and the sample offset
/// at run time under CUDA graphs (philox::resolved).
__global__ void cudnn_dropout_seed_kernel(DropoutPlacement site, std::int64_t* seed_offset) {
  const DropoutPlacement s = philox::resolved(site);
  const std::uint64_t sample = std::uint64_t(s.a_offset), head = std::uint64_t(s.b_offset);
  const uint4 r = philox::philox4x32_10(
      std::uint32_t(sample), std::uint32_t(sample >> 32) ^ (std::uint32_t(head) << 16), s.step,
      s.stream, std::uint32_t(s.seed), std::uint32_t(s.seed >> 32));
  seed_offset[0] = std::int64_t((std::uint64_t(r.y) << 32) | r.x);
  seed_offset[1] = 0;
}

/// training.attention_dropout_rng = cudnn: cuDNN's fused attention with its
/// own dropout, the seed drawn for this call on the compute stream ahead of
/// it. Stops the job (on every rank: they run the same shapes) where cuDNN
/// cannot run the shape, rather than silently drawing another mask.
class CudnnDropoutCall {
 public:
  CudnnDropoutCall(const AttentionDropoutSite& d, DType t, index_t s, index_t b, index_t heads,
                   index_t D)
      : words_(2 * sizeof(std::int64_t)) {
    const CudnnAttentionSupport cudnn = cudnn_attention_support(t, s, b, heads, D, d.p);
    MESH_REQUIRE(cudnn.forward && cudnn.backward,
                 "training.attention_dropout_rng = cudnn, but cuDNN cannot run this attention ("
                     << dtype_name(t) << ", s " << s << ", b " << b << ", heads " << heads
                     << ", head dim " << D << ", dropout " << d.p << "): "
                     << (cudnn.why_not.empty() ? "cuDNN is not available" : cudnn.why_not));
    announce("cuDNN's fused attention (" + cudnn.library + ") with its own dropout generator",
             "training.attention_dropout_rng = cudnn");
    std::int64_t* words = words_.as<std::int64_t>();
    cudnn_dropout_seed_kernel<<<1, 1, 0, compute_stream()>>>(d.site, words);
    CUDA_CHECK(cudaGetLastError());
    dropout_.p = d.p;
    dropout_.seed = words;
    dropout_.offset = words + 1;
  }
  const CudnnDropout& dropout() const { return dropout_; }

 private:
  device::Buffer words_;  ///< {seed, offset}, freed in stream order after the call
  CudnnDropout dropout_;
};

}  // namespace

void set_fused_attention_kernels(FusedAttentionKernels kernels) {
  BackendChoices& choices = backend_choices();
  std::lock_guard<std::mutex> lock(choices.mutex);
  choices.kernels = kernels;
  choices.chosen.clear();
}

std::string attention_backend(DType t, index_t s, index_t b, index_t heads, index_t D) {
  const Backends use = backends_for(t, s, b, heads, D);
  if (use.cudnn_forward && use.cudnn_backward) return "cudnn";
  if (use.cudnn_forward) return "cudnn forward, own backward";
  return "own";
}

void fused_attention_forward_token_major(DType t, const void* qkv, index_t s, index_t b,
                                         index_t heads, index_t D, double scale, void* context,
                                         float* lse, const AttentionDropoutSite& dropout,
                                         const FlashScores& scores) {
  if (s == 0 || b == 0 || heads == 0) return;
  if (!scores.plain()) {
    MESH_VERIFY(!(dropout.p > 0.0 && dropout.cudnn_rng),
                "fused attention: cuDNN's dropout generator runs without ALiBi or a key mask");
    announce(Backends{}.describe(""), "ALiBi or a key mask");
    flash_attention_forward_token_major(t, qkv, s, b, heads, D, scale, context, lse, dropout,
                                        scores);
  } else if (dropout.p > 0.0 && dropout.cudnn_rng) {
    const CudnnDropoutCall call(dropout, t, s, b, heads, D);
    cudnn_attention_forward_token_major(t, qkv, s, b, heads, D, scale, context, lse,
                                        call.dropout());
  } else if (dropout.p > 0.0) {
    announce(Backends{}.describe(""), "attention dropout (cuDNN's draws other bits)");
    flash_attention_forward_token_major(t, qkv, s, b, heads, D, scale, context, lse, dropout);
  } else if (backends_for(t, s, b, heads, D).cudnn_forward)
    cudnn_attention_forward_token_major(t, qkv, s, b, heads, D, scale, context, lse);
  else
    flash_attention_forward_token_major(t, qkv, s, b, heads, D, scale, context, lse);
}

void fused_attention_backward_token_major(DType t, const void* dcontext, const void* qkv,
                                          const void* context, const float* lse, index_t s,
                                          index_t b, index_t heads, index_t D, double scale,
                                          float* delta, void* dqkv,
                                          const AttentionDropoutSite& dropout,
                                          const FlashScores& scores) {
  if (s == 0 || b == 0 || heads == 0) return;
  if (!scores.plain()) {  // as the forward
    MESH_VERIFY(!(dropout.p > 0.0 && dropout.cudnn_rng),
                "fused attention: cuDNN's dropout generator runs without ALiBi or a key mask");
    flash_attention_backward_token_major(t, dcontext, qkv, context, lse, s, b, heads, D, scale,
                                         delta, dqkv, dropout, scores);
  } else if (dropout.p > 0.0 && dropout.cudnn_rng) {
    const CudnnDropoutCall call(dropout, t, s, b, heads, D);
    cudnn_attention_backward_token_major(t, dcontext, qkv, context, lse, s, b, heads, D, scale,
                                         delta, dqkv, call.dropout());
  } else if (dropout.p > 0.0)
    flash_attention_backward_token_major(t, dcontext, qkv, context, lse, s, b, heads, D, scale,
                                         delta, dqkv, dropout);
  else if (backends_for(t, s, b, heads, D).cudnn_backward)
    cudnn_attention_backward_token_major(t, dcontext, qkv, context, lse, s, b, heads, D, scale,
                                         delta, dqkv);
  else
    flash_attention_backward_token_major(t, dcontext, qkv, context, lse, s, b, heads, D, scale,
                                         delta, dqkv);
}

}  // namespace meshtron::cuda
