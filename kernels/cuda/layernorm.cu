// =============================================================== LayerNorm ==
//
// Same math as kernels/kokkos/layernorm.hpp, with fp32 statistics:
//   forward  mean, var by two passes over the row (no E[x^2] - E[x]^2
//            cancellation), rstd = 1/sqrt(var + eps), y = xhat gamma + beta
//   backward dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma
//            dgamma += sum_n dy xhat, dbeta += sum_n dy (column_sums.cuh:
//            deterministic, no atomics)
// One warp per row: rows of a transformer are 768..12288 wide, enough work
// for 32 lanes, and a warp reduces with shuffles alone (no shared memory, no
// block barrier). The second and third passes re-read the row from L1/L2.
//
// Packed paths (taken when H is a multiple of V = 16 / sizeof(T), every
// pointer is 16-byte aligned and a row fits in 32 * 10 fp32 packs (H <=
// 1280) or 32 * 8 16-bit ones (H <= 2048); the backward: fp32 H <= 1280,
// 16-bit H <= 1536): 16-byte
// loads, each row read from DRAM once. The packed forward keeps one warp
// per row, lane l holding packs l, l + 32, ... (K of them, K a template
// constant) in registers, each warp looping over rows with the next row's
// loads in flight. The packed backward streams tiles of rows through a
// shared-memory ring and splits the work between row warps (dx) and column
// warps (dgamma, dbeta partial rows, added by column_sums_one_pass): see
// "packed backward" below. The formulas and the points where values round
// to T are the scalar kernels'; only the order of the fp32 sums differs
// (lanes own packs, not single elements; the backward forms x - mu and
// folds rstd in once per row), so the results agree with the scalar path
// to fp32 rounding, not bit for bit, and every run gives the same bits.
// Packable rows wider than the packed kernels take (fp32 H > 1280, 16-bit
// backward H > 1536) take the column-owner kernels further down; other
// shapes (odd H, views from slice_rows that are not 16-byte aligned, rows
// wider still) the scalar kernels.
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/column_sums.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

/// A forward output wider than its rows (ldy > H: the ones column of
/// ops::layernorm_forward, kOnesColumnWidth elements): y[row, H] = 1 and
/// y[row, H + 1 .. ldy) = 0, element H + t by thread t of the row's owners.
/// With the ones column the packed bf16 [8192, 768] forward moves its bytes
/// at 0.72 of the copy, 0.80 without (perf/bench_cuda_ops memory); neither
/// 16-byte-pack stores nor a 16-wide column (32-byte rows) change that: the
/// cost is occupancy (layernorm_forward_packed_kernel_4_blocks).
template <class T>
__device__ __forceinline__ void store_ones_column(T* y_row, kindex H, kindex ldy, int t) {
  if (t < ldy - H) store_f(y_row, H + t, t == 0 ? 1.f : 0.f);
}

template <class T>
__global__ void layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                         const T* __restrict__ beta, kindex N, kindex H,
                                         float eps, T* __restrict__ y, kindex ldy,
                                         float* __restrict__ mean, float* __restrict__ rstd) {
  const kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* xr = x + row * H;
  float sum = 0.f;
  for (kindex h = lane; h < H; h += 32) sum += load_f(xr, h);
  const float mu = warp_sum(sum) / float(H);
  float sq = 0.f;
  for (kindex h = lane; h < H; h += 32) {
    const float d = load_f(xr, h) - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(warp_sum(sq) / float(H) + eps);
  T* yr = y + row * ldy;
  for (kindex h = lane; h < H; h += 32)
    store_f(yr, h, (load_f(xr, h) - mu) * rs * load_f(gamma, h) + load_f(beta, h));
  store_ones_column(yr, H, ldy, lane);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

template <class T>
__global__ void layernorm_backward_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                             const T* __restrict__ gamma,
                                             const float* __restrict__ mean,
                                             const float* __restrict__ rstd, kindex N, kindex H,
                                             T* __restrict__ dx, const T* __restrict__ residual) {
  const kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const T* dyr = dy + row * H;
  const T* xr = x + row * H;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.f, sum_g_xhat = 0.f;
  for (kindex h = lane; h < H; h += 32) {
    const float g = load_f(dyr, h) * load_f(gamma, h);
    sum_g += g;
    sum_g_xhat += g * (load_f(xr, h) - mu) * rs;
  }
  const float mean_g = warp_sum(sum_g) / float(H);
  const float mean_g_xhat = warp_sum(sum_g_xhat) / float(H);
  T* dxr = dx + row * H;
  for (kindex h = lane; h < H; h += 32) {
    const float g = load_f(dyr, h) * load_f(gamma, h);
    const float xhat = (load_f(xr, h) - mu) * rs;
    store_f(dxr, h, with_residual<T>(rs * (g - mean_g - xhat * mean_g_xhat), residual, row * H + h));
  }
}

/// Column terms of dgamma (acc[0]) and dbeta (acc[1]).
template <class T>
struct LayerNormParamTerms {
  const T* dy;
  const T* x;
  const float* mean;
  const float* rstd;
  kindex H;
  __device__ void operator()(kindex r, kindex c, float* acc) const {
    const float d = load_f(dy, r * H + c);
    acc[0] += d * (load_f(x, r * H + c) - mean[r]) * rstd[r];
    acc[1] += d;
  }
};

// ------------------------------------------------------------ packed paths ---

constexpr int kMaxPacksPerLane = 8, kMaxBackwardPacksPerLane = 10;
/// The forward takes fp32 rows up to K = 10 as well (H <= 1280: 120
/// registers, two blocks per SM): fp32 [8192, 1280] at 0.81-0.82 of an
/// H200's copy, the column-owner kernel 0.68 (perf/bench_cuda_ops memory).
template <class T>
constexpr int kMaxForwardPacksPerLane =
    sizeof(T) == 4 ? kMaxBackwardPacksPerLane : kMaxPacksPerLane;
// The backward takes fp32 rows up to K = 10 (H <= 1280, in 4-row tiles: see
// kSplitRows); 16-bit backward rows stop at K = 6 (H <= 1536): wider ones
// have not been measured against the column-owner kernel. K = 5 is GPT-2
// 774M's H = 1280 exactly (forward at 0.76 of the copy, against 0.74 with
// K = 6, whose sixth load per lane idles: perf/bench_cuda_ops memory).
/// Blocks of the packed backward: one per SM of an H100 / H200 (its ring
/// holds most of an SM's shared memory), so also its partial rows.
constexpr kindex kBackwardBlocks = 132;

/// Loads packs lane, lane + 32, ... (< P) of a row into r.
template <class T, int K>
__device__ __forceinline__ void load_row(const T* row, int P, int lane, Pack<T> (&r)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int p = lane + 32 * k;
    if (p < P) r[k] = reinterpret_cast<const Pack<T>*>(row)[p];
  }
}

/// Shared memory of one row vector of 32 K packs of T staged as fp32
/// (stage_row_fp32).
template <class T, int K>
__host__ __device__ constexpr std::size_t staged_row_bytes() {
  return std::size_t(32) * K * (kPack<T> / 4) * sizeof(float4);
}

/// A row vector of P packs of T (gamma, beta) converted to fp32 into shared
/// memory for the packed kernels' lane-ordered reads: float4 (k Q + q) 32 + l
/// holds values 4 q .. 4 q + 3 of pack l + 32 k (Q = V / 4; zeros past P),
/// so a warp's lanes read consecutive float4s (no bank conflicts). The
/// block's threads share the work; the caller synchronises before reading.
template <class T, int K>
__device__ void stage_row_fp32(const T* __restrict__ v, int P, float4* out) {
  constexpr int Q = kPack<T> / 4;
  static_assert(kPack<T> % 4 == 0, "rows are staged as float4");
  for (int i = threadIdx.x; i < 32 * K * Q; i += blockDim.x) {
    const int p = (i / (32 * Q)) * 32 + i % 32, q = (i / 32) % Q;
    float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
    if (p < P) {
      const Pack<T> pack = reinterpret_cast<const Pack<T>*>(v)[p];
#pragma unroll
      for (int u = 0; u < Q; ++u)  // compile-time indices: no local-memory copy of the pack
        if (u == q)
          f = make_float4(to_f(pack.v[4 * u]), to_f(pack.v[4 * u + 1]), to_f(pack.v[4 * u + 2]),
                          to_f(pack.v[4 * u + 3]));
    }
    out[i] = f;
  }
}

/// Warp w of the grid takes rows w, w + (warps in the grid), ...; the grid
/// is what fits on the GPU at once (forward_blocks), so every warp is
/// resident from the start, and while a warp normalises one row the next
/// row's loads are already in flight (`next`): no warp waits a full DRAM
/// latency between its rows. gamma and beta are converted to fp32 once per
/// block into shared memory (lane-consecutive float4s, no bank conflicts)
/// instead of loaded and converted for every row, and the row's sum and sum
/// of squares each add into two partial sums (even and odd packs) to halve
/// the dependent chains: bf16 [8192, 1280] 0.79-0.81 of the copy against
/// 0.75-0.76 without these, fp32 [8192, 768] 0.89-0.90 against 0.77-0.81
/// (H100, perf/bench_cuda_ops memory). Per element the same expressions as
/// the scalar kernel. kOnes: y has the ones column (rows ldy apart);
/// otherwise ldy is H, known to be (a run-time ldy there takes bf16
/// [8192, 768] without the ones column from 0.80 to 0.73 of an H200's copy,
/// perf/bench_cuda_ops memory).
template <class T, int K, bool kOnes>
__device__ __forceinline__ void layernorm_forward_packed_rows(
    const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta, kindex N,
    kindex H, float eps, T* __restrict__ y, kindex y_ld, float* __restrict__ mean,
    float* __restrict__ rstd) {
  constexpr int V = kPack<T>, Q = V / 4;
  const kindex ldy = kOnes ? y_ld : H;
  const int lane = threadIdx.x & 31, P = int(H / V);
  // gamma and beta are staged before the wait for the previous kernel, while it
  // ends: bf16 [8192, 768] 0.82-0.83 of the copy back to back against 0.78
  // staged after the wait, 0.91 against 0.83 from a graph; fp32 [8192, 768]
  // 0.91 against 0.84 (H200, perf/bench_cuda_ops memory). Safe because the
  // kernel queued just before a layernorm forward never writes them
  // (ops::layernorm_forward's contract): parameters are written by the
  // optimizer, by collectives the stream waits on by event, or by uploads, and
  // a model's forward runs its embedding (or receives its input by event)
  // before any layernorm. x may be the previous kernel's output: after the
  // wait.
  extern __shared__ float4 affine[];  // gamma, then beta (stage_row_fp32)
  stage_row_fp32<T, K>(gamma, P, affine);
  stage_row_fp32<T, K>(beta, P, affine + 32 * K * Q);
  start_after_prior_grid();
  const kindex warps = kindex(gridDim.x) * kWarpsPerBlock;
  kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  Pack<T> next[K];
  if (row < N) load_row(x + row * H, P, lane, next);
  __syncthreads();
  for (; row < N; row += warps) {
    Pack<T> xr[K];
#pragma unroll
    for (int k = 0; k < K; ++k) xr[k] = next[k];
    if (row + warps < N) load_row(x + (row + warps) * H, P, lane, next);
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < P)
#pragma unroll
        for (int j = 0; j < V; ++j) sum[k & 1] += to_f(xr[k].v[j]);
    const float mu = warp_sum(sum[0] + sum[1]) / float(H);
    float sq[2] = {0.f, 0.f};
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < P)
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = to_f(xr[k].v[j]) - mu;
          sq[k & 1] += d * d;
        }
    const float rs = rsqrtf(warp_sum(sq[0] + sq[1]) / float(H) + eps);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int p = lane + 32 * k;
      if (p >= P) continue;
      Pack<T> out;
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        const float4 g4 = affine[(k * Q + q) * 32 + lane];
        const float4 b4 = affine[32 * K * Q + (k * Q + q) * 32 + lane];
        const float g[4] = {g4.x, g4.y, g4.z, g4.w}, b[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          out.v[4 * q + e] = from_f<T>((to_f(xr[k].v[4 * q + e]) - mu) * rs * g[e] + b[e]);
      }
      reinterpret_cast<Pack<T>*>(y + row * ldy)[p] = out;
    }
    if (lane == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
  }
  // The ones columns after the row loop: stored inside it they keep 5-10
  // more registers live in most instantiations (ptxas -v).
  if constexpr (kOnes)
    for (row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); row < N; row += warps)
      store_ones_column(y + row * ldy, H, ldy, lane);
}

// The two entry points' parameters, layernorm_forward_packed_rows's.
#define MESHTRON_LN_FORWARD_PACKED_PARAMS                                                     \
  const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta, kindex N, \
      kindex H, float eps, T* __restrict__ y, kindex y_ld, float* __restrict__ mean,          \
      float* __restrict__ rstd
template <class T, int K, bool kOnes>
__global__ void layernorm_forward_packed_kernel(MESHTRON_LN_FORWARD_PACKED_PARAMS) {
  layernorm_forward_packed_rows<T, K, kOnes>(x, gamma, beta, N, H, eps, y, y_ld, mean, rstd);
}
/// The same, compiled for 4 blocks (32 warps) an SM: the ones column at
/// 16-bit K = 3 (512 < H <= 768). Its plain sibling fits in 64 registers, 4
/// blocks an SM; the ones column's row stride took 71 (66 with its stores
/// after the row loop), 3 blocks: bf16 [8192, 768] at 0.72 of the copy
/// against the plain rows' 0.80; held to 64 registers (no spills) 0.75-0.76,
/// 0.83 from a graph (Nsight Compute and perf/bench_cuda_ops memory, an
/// H200). Only there: `__launch_bounds__` changes
/// ptxas's allocation of every kernel it is put on.
template <class T, int K, bool kOnes>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, 4)
    layernorm_forward_packed_kernel_4_blocks(MESHTRON_LN_FORWARD_PACKED_PARAMS) {
  layernorm_forward_packed_rows<T, K, kOnes>(x, gamma, beta, N, H, eps, y, y_ld, mean, rstd);
}
#undef MESHTRON_LN_FORWARD_PACKED_PARAMS

/// The packed forward's entry point for <T, K, kOnes>.
template <class T, int K, bool kOnes>
constexpr auto forward_packed_kernel() {
  if constexpr (kOnes && sizeof(T) == 2 && K == 3)
    return layernorm_forward_packed_kernel_4_blocks<T, K, kOnes>;
  else
    return layernorm_forward_packed_kernel<T, K, kOnes>;
}

/// Dynamic shared memory of the packed forward: gamma and beta as fp32.
template <class T, int K>
constexpr std::size_t forward_shared_bytes() {
  return 2 * staged_row_bytes<T, K>();
}

/// Grid of the packed forward: one block per kWarpsPerBlock rows, at most
/// one full wave. bf16 H = 768 with one block per 8 rows instead: 48
/// registers, 5 blocks per SM, the 1024 one-row-per-warp blocks in 1.55
/// waves, the second wave's loads issued only as first-wave warps exit;
/// with the wave, 64 registers, 4 blocks per SM (528 on an H200), about 2
/// rows per warp, the next row always in flight.
/// Looked up once per kernel (one GPU per process).
template <class T, int K, bool kOnes>
kindex forward_blocks(kindex N) {
  static const kindex resident = resident_blocks(forward_packed_kernel<T, K, kOnes>(),
                                                 kWarpsPerBlock * 32, forward_shared_bytes<T, K>());
  const kindex row_blocks = (N + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return row_blocks < resident ? row_blocks : resident;
}

// --------------------------------- packed backward: row and column warps ---
//
// The backward of 16-byte-packable rows up to 32 K packs (16-bit H <= 1536,
// fp32 H <= 1280). Its work is split between two kinds of warps of one block
// so that neither holds the other's registers: with one warp per row doing
// both, each lane keeps 2 K V dgamma/dbeta sums next to its row, 241
// registers at bf16 H = 1280, 8 warps per SM and ~32 instructions per element
// (Nsight Compute), 0.55-0.60 of the copy's bandwidth.
// - A block takes tiles of kSplitRows consecutive rows (tile b, b + grid,
//   ...). All its threads copy a tile's dy, x (and residual) and statistics
//   with cp.async into a ring of D shared-memory slots, D - 1 tiles ahead.
// - Row warp w (w < kSplitRows) computes row w of the tile: the row sums of
//   g = dy gamma and g (x - mu) (gamma converted to fp32 once per block),
//   then dx; g and x - mu stay in registers between the two passes where
//   they fit (K V <= 40), else the second pass re-reads the slot.
// - Column thread c (K column warps) owns pack c of every row and adds
//   dy xhat and dy over the tile's rows into 2 V registers; after the last
//   tile it writes them as the block's partial row, and column_sums_one_pass
//   adds the blocks' rows into dgamma, dbeta; or, where the call is one of
//   an ops::LayerNormGradChain, the chain's next call's split kernel adds
//   them (add_partial_rows_slice, the same bits) before its first tile, and
//   the call saves that kernel: bf16 [8192, 768] 0.81-0.82 of an H200's
//   copy chained as GPT-2 124M's backward against 0.72 unchained, bf16 1280
//   0.83-0.84 against 0.71 as 774M's (perf/bench_cuda_ops memory).
// One block barrier per tile. kSplitRows + K warps per SM instead of 8,
// about as many instructions as one warp per row (Nsight, bf16 H = 1280:
// 10.0 M against 10.45 M), and more of the copy's bandwidth than its
// 0.55-0.60 (perf/bench_cuda_ops memory).
// Column thread c adds its rows in order and its tiles in order, the grid is
// a function of N only: deterministic, no atomics.
// K = 10 (fp32 H <= 1280) takes tiles of 4 rows: three 8-row slots of
// three fp32 tensors would be 368 KB, two 246 KB, past an SM's 227 KB.
// kResidual (whether the residual branch's gradient is added into dx) is a
// template parameter, and a thread's copies of a tile a fixed, unrolled
// count: with a run-time residual flag and a strided copy loop, Nsight
// Compute (H200, bf16 H = 768) counts 45 % of the kernel's instructions as
// integer, predicate and branch work (IMAD, LOP3, ISETP, BRA, IADD3, LEA,
// BSSY/BSYNC), much of it the loop's trip count and the per-element
// residual select. Against that form: bf16 [8192, 768] 0.68-0.69 of the
// copy against 0.64-0.65 (+ residual 0.72 against 0.66), + residual at 1280
// 0.74 against 0.72, fp32 [8192, 1280] 0.79 against 0.77-0.78
// (perf/bench_cuda_ops memory).
// K = 5 (bf16 H = 1280, GPT-2 774M) takes tiles of 7 rows: 7 row warps + 5
// column warps = 12 warps, 3 on each of an SM's 4 schedulers, whose register
// file of 16384 then allows 168 registers a thread (151 used, no spills);
// 8-row tiles made 13 warps, 4 on the busiest scheduler, a cap of 128 with
// 4-8 bytes of spills. bf16 [8192, 1280] 0.70 of an H200's copy against
// 0.64 with 8-row tiles, + residual 0.74-0.75 against 0.74
// (perf/bench_cuda_ops memory).
// Other shapes measured and dropped: 4- and 6-row tiles (0.07-0.15
// of the copy lost to the per-tile barrier and bookkeeping, with or without
// a second block per SM), 16 rows at K = 3 (+0.01), two groups of column
// warps (more warps: -0.06); docs/performance-notes.md. Whole
// rows per warp with each lane's column sums in registers (no column warps,
// no per-tile barrier) ran 8-15 % fewer instructions but lost the overlap
// of row and column work: bf16 768 0.65 of the copy against 0.68, 1280 0.63
// against 0.71 (docs/performance-notes.md).
template <int K>
inline constexpr int kSplitRows = K == 5 ? 7 : K <= 8 ? 8 : 4;

/// Shared memory of one ring slot: kSplitRows<K> rows of `tensors` row
/// tensors of H values of T, then the rows' mean and rstd.
template <class T, int K>
__host__ __device__ constexpr std::size_t split_slot_bytes(kindex H, int tensors) {
  // Rounded up to 16 bytes: every slot's packs are cp.async16 targets
  // (7-row tiles leave 2 x 7 statistics, 56 bytes).
  const std::size_t bytes = std::size_t(kSplitRows<K>) * std::size_t(H) * sizeof(T) * tensors +
                            2 * kSplitRows<K> * sizeof(float);
  return (bytes + 15) / 16 * 16;
}

template <class T, int K, int D, bool kResidual>
__global__ void __launch_bounds__((kSplitRows<K> + K) * 32, 1)
    layernorm_backward_split_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                    const T* __restrict__ gamma, const float* __restrict__ mean,
                                    const float* __restrict__ rstd, kindex N, kindex H,
                                    T* __restrict__ dx, const T* __restrict__ residual,
                                    float* __restrict__ partial, PartialRowsToAdd earlier) {
  constexpr int V = kPack<T>, Q = V / 4, WR = kSplitRows<K>, threads = (WR + K) * 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, P = int(H / V);
  constexpr int tensors = kResidual ? 3 : 2;
  extern __shared__ __align__(16) unsigned char smem[];
  float4* gamma4 = reinterpret_cast<float4*>(smem);  // stage_row_fp32
  unsigned char* ring = smem + staged_row_bytes<T, K>();
  const std::size_t slot_bytes = split_slot_bytes<T, K>(H, tensors);
  const auto tile_rows = [&](int s, int t) {  // tensor t of slot s, as packs
    return reinterpret_cast<Pack<T>*>(ring + s * slot_bytes) + std::size_t(t) * WR * P;
  };
  const auto tile_stats = [&](int s) {  // [0, WR) mean, [WR, 2 WR) rstd
    return reinterpret_cast<float*>(ring + s * slot_bytes + slot_bytes - 2 * WR * sizeof(float));
  };
  // Tile indices in 32 bits (the launcher checks that they fit), the last
  // tile's rows computed once and the ring slot a rotating counter (below),
  // rather than 64-bit arithmetic and a modulo per tile: bf16 [8192, 768]
  // 0.72-0.73 of an H200's copy against 0.68, the other rows the same or
  // +0.01 (perf/bench_cuda_ops memory).
  const int tiles = int((N + WR - 1) / WR), grid = int(gridDim.x);
  const int last_rows = int(N - kindex(tiles - 1) * WR);
  const auto rows_in = [&](int t) {  // tile t's rows: WR, fewer in the last
    return t == tiles - 1 ? last_rows : WR;
  };
  // Copies tensor u (0 dy, 1 x, 2 residual) of tile t into slot s.
  const auto fetch_rows = [&](int t, int s, int u) {
    const kindex first = kindex(t) * WR;
    const int packs = rows_in(t) * P;
    const T* source = u == 0 ? dy : u == 1 ? x : residual;
    const Pack<T>* src = reinterpret_cast<const Pack<T>*>(source + first * H);
    Pack<T>* dst = tile_rows(s, u);
    // A tile is at most WR x 32 K packs: a fixed number of copies per
    // thread, unrolled (a strided loop cost more integer and branch
    // instructions than the copies themselves).
    constexpr int kCopies = (WR * 32 * K + threads - 1) / threads;
#pragma unroll
    for (int j = 0; j < kCopies; ++j)
      if (const int i = tid + j * threads; i < packs) cp_async16(dst + i, src + i);
  };
  const auto fetch = [&](int t, int s, bool with_x) {
    for (int u = 0; u < tensors; ++u)
      if (u != 1 || with_x) fetch_rows(t, s, u);
    const kindex first = kindex(t) * WR;
    if (tid < rows_in(t)) {
      cp_async4(tile_stats(s) + tid, mean + first + tid);
      cp_async4(tile_stats(s) + WR + tid, rstd + first + tid);
    }
  };
  // Before the wait for the previous kernel: the x of the block's first D
  // tiles (one per ring slot; one cp.async group, older than every tile's)
  // and gamma, read while the previous kernel ends (in back-to-back calls,
  // the last call's dgamma/dbeta finish): +0.03-0.04 of the copy at bf16
  // (perf/bench_cuda_ops memory). Safe because the previous kernel cannot
  // have written them: the forward that made mean and rstd read x and gamma
  // after their writers, and every kernel before the previous one has
  // finished (common.cuh). dy, the residual and the statistics may be the
  // previous kernel's output: after the wait.
#pragma unroll
  for (int i = 0; i < D; ++i) {
    const int t = int(blockIdx.x) + i * grid;
    if (t < tiles) fetch_rows(t, i, 1);
  }
  cp_async_commit();
  stage_row_fp32<T, K>(gamma, P, gamma4);  // read after the first tile's barrier
  start_after_prior_grid();  // and the partial-row sums may queue up behind us
#pragma unroll
  for (int i = 0; i < D - 1; ++i) {
    const int t = int(blockIdx.x) + i * grid;
    if (t < tiles) fetch(t, i, false);
    cp_async_commit();
  }
  // An earlier call's dgamma/dbeta (ops::LayerNormGradChain): its partial
  // rows added here while the first tiles' copies fly, instead of by a
  // kernel of their own. The dy of the last ring slot is not copied before
  // the first tile's barrier: its room holds the lane sums until then.
  if (earlier.rows > 0)
    add_partial_rows_slice(earlier, reinterpret_cast<float*>(tile_rows(D - 1, 0)), tid, threads);

  float acc_dgamma[V], acc_dbeta[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc_dgamma[j] = acc_dbeta[j] = 0.f;
  const int column = (warp - WR) * 32 + lane;  // column threads: their pack
  const float inv_h = 1.f / float(H);
  // Column thread: dy xhat and dy of one row of its pack into the sums,
  // xhat = x rs - mu rs in one FMA (the row warps form x - mu instead).
  const auto add_column_terms = [&](const Pack<T>& dp, const Pack<T>& xp, float rs, float mu_rs) {
    const Widened<T> dw = widen(dp), xw = widen(xp);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = dw.v[j];
      acc_dgamma[j] += d * fmaf(xw.v[j], rs, -mu_rs);
      acc_dbeta[j] += d;
    }
  };

  // One barrier per tile: after it, tile i has landed for every thread's
  // copies AND every warp has finished tile i - 1, so its slot is refilled
  // (with tile i + D - 1) only now.
  // s: tile i's slot (i mod D), refill: the slot of tile i + D - 1, the one
  // before s in the ring.
  for (int i = 0, t = int(blockIdx.x), s = 0; t < tiles; ++i, t += grid, s = s == D - 1 ? 0 : s + 1) {
    cp_async_wait<D - 2>();
    __syncthreads();
    const int ahead = t + (D - 1) * grid;
    if (ahead < tiles) fetch(ahead, s == 0 ? D - 1 : s - 1, /*with_x=*/i > 0);
    cp_async_commit();  // possibly empty: one group per iteration either way
    const int rows = rows_in(t);
    const float* stats = tile_stats(s);
    if (warp < WR) {
      if (warp < rows) {
        const Pack<T>* dyr = tile_rows(s, 0) + warp * P;
        const Pack<T>* xr = tile_rows(s, 1) + warp * P;
        const float mu = stats[warp], rs = stats[WR + warp];
        // sum g xhat = rs sum g (x - mu); dx = rs (g - mean(g) - (x - mu) c)
        // with c = rs^2 mean(g (x - mu)).
        // g and x - mu kept in registers between the passes where they fit:
        // ptxas sm_90, bf16 K = 6 would spill; fp32 K = 10 does (128
        // registers, 16 bytes) and re-reads its slot instead (93-96
        // registers): fp32 [8192, 1280] + residual 0.83-0.84 of an H200's
        // copy against 0.80-0.81 kept, plain 0.77-0.78 against 0.76
        // (perf/bench_cuda_ops memory, with the fold below).
        constexpr bool kKeep = K * V <= 40 && !(sizeof(T) == 4 && K == 10);
        // dx = rs g - rs mean(g) - rs c (x - mu) as two FMAs per element (an
        // add, an FMA and a multiply otherwise) and the row means by one
        // reciprocal of H instead of two IEEE divisions per row: bf16
        // [8192, 768] 0.64-0.65 of an H200's copy against 0.61-0.62
        // (perf/bench_cuda_ops memory, with the re-read above). (At 16-bit
        // K = 5 it spills in 8-row tiles, 8-24 bytes at 128 registers,
        // + residual 0.69 against 0.72; the 7-row tiles have the registers.)
        constexpr int KK = kKeep ? K : 1;
        float g[KK][V], xm[KK][V];
        float sum_g = 0.f, sum_g_xm = 0.f;
        const auto terms = [&](int k, int q, const Widened<T>& dw, const Widened<T>& xw, int e,
                               float& gv, float& xv) {
          const float4 gm = gamma4[(k * Q + q) * 32 + lane];
          const float gj[4] = {gm.x, gm.y, gm.z, gm.w};
          xv = xw.v[4 * q + e] - mu;
          gv = dw.v[4 * q + e] * gj[e];
        };
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const int p = lane + 32 * k;
          if (p >= P) continue;
          const Widened<T> dw = widen(dyr[p]), xw = widen(xr[p]);
#pragma unroll
          for (int q = 0; q < Q; ++q)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float gv, xv;
              terms(k, q, dw, xw, e, gv, xv);
              sum_g += gv;
              sum_g_xm += gv * xv;
              if constexpr (kKeep) g[k][4 * q + e] = gv, xm[k][4 * q + e] = xv;
            }
        }
        const float row_sum_g = warp_sum(sum_g), row_sum_g_xm = warp_sum(sum_g_xm);
        const float mean_g = row_sum_g * inv_h;
        const float c = rs * rs * (row_sum_g_xm * inv_h);
        const float minus_rs_c = -rs * c, minus_rs_mean_g = -rs * mean_g;
        const kindex row = kindex(t) * WR + warp;
        const Pack<T>* res = kResidual ? tile_rows(s, 2) + warp * P : nullptr;
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const int p = lane + 32 * k;
          if (p >= P) continue;
          Pack<T> rp{}, dp{}, xp{};
          if constexpr (kResidual) rp = res[p];
          if constexpr (!kKeep) dp = dyr[p], xp = xr[p];
          const Widened<T> rw = widen(rp), dw = widen(dp), xw = widen(xp);
          float out[V];
#pragma unroll
          for (int j = 0; j < V; ++j) {
            float gv, xv;
            if constexpr (kKeep)
              gv = g[k][j], xv = xm[k][j];
            else
              terms(k, j / 4, dw, xw, j % 4, gv, xv);
            out[j] = fmaf(gv, rs, fmaf(xv, minus_rs_c, minus_rs_mean_g));
          }
          // Rounded to T a pair at a time (narrow: half the conversions);
          // with the residual, round(dx) + residual rounded again: the bits
          // of the per-value round_to and from_f. bf16 [8192, 768] +
          // residual 0.73-0.74 of an H200's copy against 0.71 a value at a
          // time, the other rows the same (perf/bench_cuda_ops memory).
          if constexpr (kResidual) {
            const Widened<T> rounded = widen(narrow<T>(out));
#pragma unroll
            for (int j = 0; j < V; ++j) out[j] = __fadd_rn(rounded.v[j], rw.v[j]);
          }
          reinterpret_cast<Pack<T>*>(dx + row * H)[p] = narrow<T>(out);
        }
      }
    } else if (column < P) {
      const Pack<T>* dys = tile_rows(s, 0) + column;
      const Pack<T>* xs = tile_rows(s, 1) + column;
      if (rows == WR) {  // every tile but possibly the last: all loads first
        Pack<T> dp[WR], xp[WR];
#pragma unroll
        for (int r = 0; r < WR; ++r) dp[r] = dys[r * P], xp[r] = xs[r * P];
#pragma unroll
        for (int r = 0; r < WR; ++r) add_column_terms(dp[r], xp[r], stats[WR + r], stats[r] * stats[WR + r]);
      } else {
        for (int r = 0; r < rows; ++r)
          add_column_terms(dys[r * P], xs[r * P], stats[WR + r], stats[r] * stats[WR + r]);
      }
    }
  }
  cp_async_wait<0>();

  if (warp >= WR && column < P) {
    float4* out_g = reinterpret_cast<float4*>(partial + (kindex(blockIdx.x) * 2) * H + column * V);
    float4* out_b = reinterpret_cast<float4*>(partial + (kindex(blockIdx.x) * 2 + 1) * H + column * V);
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      out_g[q] = make_float4(acc_dgamma[4 * q], acc_dgamma[4 * q + 1], acc_dgamma[4 * q + 2],
                             acc_dgamma[4 * q + 3]);
      out_b[q] = make_float4(acc_dbeta[4 * q], acc_dbeta[4 * q + 1], acc_dbeta[4 * q + 2],
                             acc_dbeta[4 * q + 3]);
    }
  }
}

/// Dynamic shared memory of the split kernel with a ring of `depth` slots:
/// gamma staged as fp32, then the slots.
template <class T, int K>
std::size_t split_shared_bytes(kindex H, bool with_residual, int depth) {
  return staged_row_bytes<T, K>() + depth * split_slot_bytes<T, K>(H, with_residual ? 3 : 2);
}

/// Row r of the partials as column_sums' source (acc[0] dgamma, acc[1] dbeta).
struct BlockPartialTerms {
  const float* partial;
  kindex H;
  __device__ void operator()(kindex r, kindex c, float* acc) const {
    acc[0] += partial[(r * 2) * H + c];
    acc[1] += partial[(r * 2 + 1) * H + c];
  }
};

// ------------------------------------------------- column-owner kernels ---
//
// Nsight Compute on a one-warp-per-row packed backward (bf16 H = 1280): 241
// registers per thread (the K x V dgamma and dbeta sums of every lane), so 8
// warps per SM, and ~32 instructions per element; the SMs wait on their own
// instruction latencies, not on DRAM (50 % busy). This layout turns the work
// around: thread p of a row group owns column pack p for every row the group
// takes, so its dgamma/dbeta sums are 2 V registers, gamma is converted
// once, and a row's two sums (g, g xhat) are reduced across the group's
// warps through shared memory, R rows at a time (one barrier per R rows).
// A block is Y row groups of ceil32(P) threads; group y takes the tiles of R
// rows t Y + y, t = blockIdx.x, blockIdx.x + gridDim.x, ... The loop's trip
// count is the block's (a group past the last tile computes nothing), so
// every thread reaches every barrier. The sums of a row are taken in a fixed
// order (the pack's V values, the warp's lanes by warp_sum, the group's warps
// in order), and the block adds its groups in order into one partial row:
// deterministic; rounds differently from the packed kernel (another order).
// Used, with the forward below, for 16-byte-packable rows wider than the packed
// kernels take (kMaxForwardPacksPerLane, kMaxBackwardPacksPerLane packs a
// lane), where they move 0.64-0.82 of the copy's bandwidth against the scalar
// kernels' 0.38-0.45 (fp32 [8192, 1280]). At the widths the packed kernels take
// they are slower on an H100 (bf16 H = 768: forward 0.55 vs 0.89 of copy,
// backward 0.43 vs 0.57), and R = 4 rows per tile slower than R = 2
// (perf/bench_cuda_ops memory).
constexpr int kColumnsTileRows = 2;

constexpr int kColumnsBlockThreads = 512;

template <class T, int R>
__global__ void __launch_bounds__(kColumnsBlockThreads)
    layernorm_backward_columns_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      const T* __restrict__ gamma,
                                      const float* __restrict__ mean,
                                      const float* __restrict__ rstd, kindex N, kindex H,
                                      T* __restrict__ dx, const T* __restrict__ residual,
                                      float* __restrict__ partial) {
  start_after_prior_grid();
  constexpr int V = kPack<T>;
  extern __shared__ float group_sums[];  // [Y][2][H]: each group's dgamma and dbeta sums
  __shared__ float row_sums[2][32][2 * R];  // [parity][warp][g sums of R rows, g xhat sums]
  const int P = int(H / V), group_threads = int(blockDim.x), Y = int(blockDim.y);
  const int p = int(threadIdx.x), y = int(threadIdx.y), lane = p & 31;
  const int group_warps = group_threads / 32, warp = y * group_warps + (p >> 5);
  const bool owner = p < P;
  const kindex tiles = (N + R - 1) / R;

  float gam[V], acc_dgamma[V], acc_dbeta[V];
  {
    Pack<T> gp{};
    if (owner) gp = reinterpret_cast<const Pack<T>*>(gamma)[p];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      gam[j] = to_f(gp.v[j]);
      acc_dgamma[j] = acc_dbeta[j] = 0.f;
    }
  }
  const auto row_of = [&](kindex block_tile, int r) { return (block_tile * Y + y) * R + r; };
  const auto load_tile = [&](kindex block_tile, Pack<T> (&a)[R], Pack<T> (&b)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const kindex row = row_of(block_tile, r);
      if (owner && row < N) {
        a[r] = reinterpret_cast<const Pack<T>*>(dy + row * H)[p];
        b[r] = reinterpret_cast<const Pack<T>*>(x + row * H)[p];
      }
    }
  };

  Pack<T> next_dy[R], next_x[R];
  kindex t = blockIdx.x;
  if (t * Y < tiles) load_tile(t, next_dy, next_x);
  for (int parity = 0; t * Y < tiles; t += gridDim.x, parity ^= 1) {
    Pack<T> dyr[R], xr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      dyr[r] = next_dy[r];
      xr[r] = next_x[r];
    }
    if ((t + gridDim.x) * Y < tiles) load_tile(t + gridDim.x, next_dy, next_x);
    float mu[R], rs[R], sums[2 * R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const kindex row = row_of(t, r);
      const bool live = owner && row < N;
      mu[r] = row < N ? mean[row] : 0.f;
      rs[r] = row < N ? rstd[row] : 0.f;
      float sum_g = 0.f, sum_g_xhat = 0.f;
      if (live)
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = to_f(dyr[r].v[j]), xv = to_f(xr[r].v[j]);
          const float g = d * gam[j];
          sum_g += g;
          sum_g_xhat += g * (xv - mu[r]) * rs[r];
          acc_dgamma[j] += d * (xv - mu[r]) * rs[r];  // LayerNormParamTerms' terms
          acc_dbeta[j] += d;
        }
      sums[r] = warp_sum(sum_g);
      sums[R + r] = warp_sum(sum_g_xhat);
    }
    if (lane == 0)
#pragma unroll
      for (int i = 0; i < 2 * R; ++i) row_sums[parity][warp][i] = sums[i];
    __syncthreads();  // row_sums[parity] is rewritten two tiles on, after the next barrier
#pragma unroll
    for (int i = 0; i < 2 * R; ++i) {
      float s = 0.f;
      for (int w = 0; w < group_warps; ++w) s += row_sums[parity][y * group_warps + w][i];
      sums[i] = s / float(H);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const kindex row = row_of(t, r);
      if (!owner || row >= N) continue;
      Pack<T> res{};
      if (residual) res = reinterpret_cast<const Pack<T>*>(residual + row * H)[p];
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float g = to_f(dyr[r].v[j]) * gam[j];
        const float xhat = (to_f(xr[r].v[j]) - mu[r]) * rs[r];
        const float d = rs[r] * (g - sums[r] - xhat * sums[R + r]);
        out.v[j] = from_f<T>(residual ? __fadd_rn(round_to<T>(d), to_f(res.v[j])) : d);
      }
      reinterpret_cast<Pack<T>*>(dx + row * H)[p] = out;
    }
  }

  // The block's partial row: its groups' sums added in group order.
  if (owner)
#pragma unroll
    for (int j = 0; j < V; ++j) {
      group_sums[(y * 2 + 0) * H + p * V + j] = acc_dgamma[j];
      group_sums[(y * 2 + 1) * H + p * V + j] = acc_dbeta[j];
    }
  __syncthreads();
  for (int q = y * group_threads + p; q < 2 * H; q += group_threads * Y) {
    float s = 0.f;
    for (int g = 0; g < Y; ++g) s += group_sums[g * 2 * H + q];
    partial[kindex(blockIdx.x) * 2 * H + q] = s;  // q = v H + c: row (block 2 + v), column c
  }
}

/// Block of the column-owner kernels for rows of H values of T: a row group
/// of ceil32(H / V) threads (x), as many groups as fit 512 threads (y).
/// Zero threads where a row does not fit one group.
template <class T>
dim3 columns_block(kindex H) {
  const kindex group_threads = (H / kPack<T> + 31) / 32 * 32;
  if (group_threads > kColumnsBlockThreads) return dim3(0, 0);
  return dim3(unsigned(group_threads), unsigned(kColumnsBlockThreads / group_threads));
}

/// Grid of a column-owner kernel over N rows in tiles of R: what fits on the
/// GPU at once, at most one tile per row group.
template <class Kernel>
kindex columns_grid(Kernel kernel, dim3 block, std::size_t shared, kindex N, int R) {
  const kindex tiles = (N + R - 1) / R, block_tiles = (tiles + block.y - 1) / block.y;
  const kindex resident = resident_blocks(kernel, int(block.x * block.y), shared);
  return resident < block_tiles ? resident : block_tiles;
}

/// The column-owner backward where a row fits one group (ceil32(H / V) <=
/// 512 threads), its blocks' partial rows then added into dgamma, dbeta;
/// false otherwise (nothing launched). Its dynamic shared memory (Y x 2 x H
/// floats, Y H <= 512 V) is at most 32 KiB: no opt-in needed.
template <class T, class G>
bool layernorm_backward_columns(const T* dy, const T* x, const T* gamma, const float* mean,
                                const float* rstd, kindex N, kindex H, T* dx, const T* residual,
                                G* dgamma, G* dbeta, bool accumulate) {
  constexpr int R = kColumnsTileRows;
  const dim3 block = columns_block<T>(H);
  if (block.x == 0) return false;
  const std::size_t shared = std::size_t(block.y) * 2 * H * sizeof(float);
  const kindex blocks = columns_grid(layernorm_backward_columns_kernel<T, R>, block, shared, N, R);
  device::Buffer partial(std::size_t(blocks * 2 * H) * sizeof(float));
  launch_dependent(layernorm_backward_columns_kernel<T, R>, unsigned(blocks), block, shared,
                   compute_stream(), dy, x, gamma, mean, rstd, N, H, dx, residual,
                   partial.as<float>());
  column_sums_one_pass<2>(BlockPartialTerms{partial.as<float>(), H}, blocks, H, accumulate, dgamma,
                          dbeta);
  return true;
}

/// The forward in the same layout: thread p of a row group owns column pack
/// p (gamma and beta converted once), a tile's R row sums cross the group's
/// warps through shared memory, then the R sums of squares about the mean
/// (two passes, as every forward here: no E[x^2] - E[x]^2), two barriers
/// per tile. row_sums[0] and [1] alternate: a thread reads [0] before it
/// reaches the barrier after [1] is written, and [1] before the next tile's
/// barrier after [0], so neither is rewritten while read. Thread 0 of a
/// group writes the tile's mean and rstd.
template <class T, int R>
__global__ void __launch_bounds__(kColumnsBlockThreads)
    layernorm_forward_columns_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                     const T* __restrict__ beta, kindex N, kindex H, float eps,
                                     T* __restrict__ y, kindex ldy, float* __restrict__ mean,
                                     float* __restrict__ rstd) {
  start_after_prior_grid();
  constexpr int V = kPack<T>;
  __shared__ float row_sums[2][32][R];  // [sum, sum of squares][warp][row of the tile]
  const int P = int(H / V), group_threads = int(blockDim.x), Y = int(blockDim.y);
  const int p = int(threadIdx.x), g = int(threadIdx.y), lane = p & 31;
  const int group_warps = group_threads / 32, warp = g * group_warps + (p >> 5);
  const bool owner = p < P;
  const kindex tiles = (N + R - 1) / R;

  float gam[V], bet[V];
  {
    Pack<T> gp{}, bp{};
    if (owner) {
      gp = reinterpret_cast<const Pack<T>*>(gamma)[p];
      bp = reinterpret_cast<const Pack<T>*>(beta)[p];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      gam[j] = to_f(gp.v[j]);
      bet[j] = to_f(bp.v[j]);
    }
  }
  const auto row_of = [&](kindex block_tile, int r) { return (block_tile * Y + g) * R + r; };
  const auto load_tile = [&](kindex block_tile, Pack<T> (&a)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const kindex row = row_of(block_tile, r);
      if (owner && row < N) a[r] = reinterpret_cast<const Pack<T>*>(x + row * H)[p];
    }
  };
  // Adds each of the R values across the group (lanes by warp_sum, then the
  // group's warps in order) through row_sums[k]; every thread gets the sums.
  const auto group_sums = [&](float (&v)[R], int k) {
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = warp_sum(v[r]);
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) row_sums[k][warp][r] = v[r];
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float s = 0.f;
      for (int w = 0; w < group_warps; ++w) s += row_sums[k][g * group_warps + w][r];
      v[r] = s;
    }
  };

  Pack<T> next[R];
  kindex t = blockIdx.x;
  if (t * Y < tiles) load_tile(t, next);
  for (; t * Y < tiles; t += gridDim.x) {
    Pack<T> xr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) xr[r] = next[r];
    if ((t + gridDim.x) * Y < tiles) load_tile(t + gridDim.x, next);
    float mu[R], rs[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float sum = 0.f;
      if (owner && row_of(t, r) < N)
#pragma unroll
        for (int j = 0; j < V; ++j) sum += to_f(xr[r].v[j]);
      mu[r] = sum;
    }
    group_sums(mu, 0);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      mu[r] /= float(H);
      float sq = 0.f;
      if (owner && row_of(t, r) < N)
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = to_f(xr[r].v[j]) - mu[r];
          sq += d * d;
        }
      rs[r] = sq;
    }
    group_sums(rs, 1);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const kindex row = row_of(t, r);
      rs[r] = rsqrtf(rs[r] / float(H) + eps);
      if (!owner || row >= N) continue;
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < V; ++j)
        out.v[j] = from_f<T>((to_f(xr[r].v[j]) - mu[r]) * rs[r] * gam[j] + bet[j]);
      reinterpret_cast<Pack<T>*>(y + row * ldy)[p] = out;
      store_ones_column(y + row * ldy, H, ldy, p);
      if (p == 0) {
        mean[row] = mu[r];
        rstd[row] = rs[r];
      }
    }
  }
}

/// The column-owner forward where a row fits one group; false otherwise
/// (nothing launched).
template <class T>
bool layernorm_forward_columns(const T* x, const T* gamma, const T* beta, kindex N, kindex H,
                               float eps, T* y, kindex ldy, float* mean, float* rstd) {
  constexpr int R = kColumnsTileRows;
  const dim3 block = columns_block<T>(H);
  if (block.x == 0) return false;
  const kindex blocks = columns_grid(layernorm_forward_columns_kernel<T, R>, block, 0, N, R);
  launch_dependent(layernorm_forward_columns_kernel<T, R>, unsigned(blocks), block, 0,
                   compute_stream(), x, gamma, beta, N, H, eps, y, ldy, mean, rstd);
  return true;
}

/// Smallest instantiated K >= packs / 32, or 0 when it exceeds max_k.
int packs_per_lane(kindex packs, int max_k) {
  const kindex need = (packs + 31) / 32;
  for (int k : {1, 2, 3, 4, 5, 6, kMaxPacksPerLane, kMaxBackwardPacksPerLane})
    if (need <= k) return k <= max_k ? k : 0;
  return 0;
}

/// Calls f(std::integral_constant<int, K>{}) for K = packs_per_lane(...)
/// <= MaxK (the largest K instantiated).
template <int MaxK, class F>
void with_packs_per_lane(int k, F&& f) {
  switch (k) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case kMaxPacksPerLane: f(std::integral_constant<int, kMaxPacksPerLane>{}); break;
    default:
      if constexpr (MaxK >= kMaxBackwardPacksPerLane)
        f(std::integral_constant<int, kMaxBackwardPacksPerLane>{});
      break;
  }
}

/// What a split kernel of `blocks` blocks, with `room` bytes for the lane
/// sums (its last ring slot's dy), adds of pending's partial rows; rows 0
/// where they do not fit (pending is then left as it is).
PartialRowsToAdd foldable(const LayerNormPendingSums& pending, kindex blocks, std::size_t room) {
  PartialRowsToAdd add;
  if (!pending.partial) return add;
  MESH_VERIFY(pending.H % 2 == 0,
              "layernorm_backward: held partial rows of odd width " << pending.H);
  const kindex per_block = ((2 * pending.H + blocks - 1) / blocks + 3) / 4 * 4;
  if (std::size_t(kOnePassLanes * per_block) * sizeof(float) > room) return add;
  add.partial = static_cast<const float*>(pending.partial);
  add.rows = int(pending.rows);
  add.H = int(pending.H);
  add.per_block = int(per_block);
  add.accumulate = pending.accumulate;
  add.dgamma = pending.dgamma;
  add.dbeta = pending.dbeta;
  return add;
}

/// The split backward for K packs per lane; false where its ring does not
/// fit this GPU's shared memory (nothing launched). With `pending` (fp32
/// gradients only), the kernel first adds the partial rows pending holds
/// (an earlier call's) and leaves its own there instead of launching their
/// sum.
template <class T, class G>
bool layernorm_backward_split(int k, const T* dy, const T* x, const T* gamma, const float* mean,
                              const float* rstd, kindex N, kindex H, T* dx, const T* residual,
                              G* dgamma, G* dbeta, bool accumulate,
                              LayerNormPendingSums* pending) {
  static const int optin = max_shared_per_block_optin();
  bool launched = false;
  with_packs_per_lane<kMaxBackwardPacksPerLane>(k, [&](auto kc) {
    constexpr int K = decltype(kc)::value, WR = kSplitRows<K>;
    const kindex tiles = (N + WR - 1) / WR;
    MESH_VERIFY(tiles + (kindex(3) * kBackwardBlocks) < (kindex(1) << 31),
                "layernorm_backward: " << N << " rows exceed the split kernel's 32-bit tile indices");
    const kindex blocks = tiles < kBackwardBlocks ? tiles : kBackwardBlocks;
    device::Buffer partial(std::size_t(blocks * 2 * H) * sizeof(float));
    const auto launch = [&](auto depth, std::size_t bytes) {
      PartialRowsToAdd earlier;
      if (pending) {
        earlier = foldable(*pending, blocks, std::size_t(WR) * std::size_t(H) * sizeof(T));
        if (earlier.rows == 0) layernorm_add_pending(*pending);
      }
      const auto run = [&](auto with_residual) {
        constexpr auto kernel = layernorm_backward_split_kernel<T, K, decltype(depth)::value,
                                                                decltype(with_residual)::value>;
        opt_in_max_shared_memory<kernel>();
        launch_dependent(kernel, unsigned(blocks), (WR + K) * 32, bytes, compute_stream(), dy,
                         x, gamma, mean, rstd, N, H, dx, residual, partial.as<float>(), earlier);
      };
      if (residual)
        run(std::true_type{});
      else
        run(std::false_type{});
      if (earlier.rows > 0) layernorm_drop_pending(*pending);  // added by the kernel just queued
      launched = true;
      if constexpr (std::is_same_v<G, float>) {
        if (pending) {  // this call's partial rows: for the next call, or flush
          *pending = LayerNormPendingSums{partial.release(), blocks, H, accumulate, dgamma, dbeta};
          return;
        }
      }
      // The partial rows, added by the kernel's programmatic dependent (which
      // reads dgamma, dbeta after its wait when the kernel wrote an earlier
      // call's: they may be this call's own).
      column_sums_one_pass<2>(BlockPartialTerms{partial.as<float>(), H}, blocks, H, accumulate,
                              dgamma, dbeta, /*out_after_wait=*/earlier.rows > 0);
    };
    const std::size_t three = split_shared_bytes<T, K>(H, residual != nullptr, 3);
    const std::size_t two = split_shared_bytes<T, K>(H, residual != nullptr, 2);
    if (three <= std::size_t(optin))
      launch(std::integral_constant<int, 3>{}, three);
    else if (two <= std::size_t(optin))
      launch(std::integral_constant<int, 2>{}, two);
  });
  return launched;
}

/// Whether rows of H values of T can be read in 16-byte packs: H a multiple
/// of V and every pointer 16-byte aligned.
template <class T>
bool packable(kindex H, std::initializer_list<const void*> pointers) {
  if (H % kPack<T> != 0) return false;
  for (const void* p : pointers)
    if (!aligned16(p)) return false;
  return true;
}

/// K for the packed kernels, or 0 for the scalar ones.
template <class T>
int packed_k(kindex H, std::initializer_list<const void*> pointers, int max_k) {
  return packable<T>(H, pointers) ? packs_per_lane(H / kPack<T>, max_k) : 0;
}

}  // namespace

void layernorm_forward(DType t, const void* x, const void* gamma, const void* beta, index_t N,
                       index_t H, double eps, void* y, index_t ldy, float* mean, float* rstd) {
  if (N == 0) return;
  with_storage_type(t, "layernorm_forward", [&](auto zero) {
    using T = decltype(zero);
    const unsigned blocks = grid_for(N, kWarpsPerBlock, 1LL << 31);
    constexpr int max_k = kMaxForwardPacksPerLane<T>;
    // Packed rows need y's rows 16-byte aligned too (ldy a whole number of packs).
    const bool rows_packed = ldy % kPack<T> == 0;
    if (const int k = rows_packed ? packed_k<T>(H, {x, gamma, beta, y}, max_k) : 0) {
      with_packs_per_lane<max_k>(k, [&](auto kc) {
        constexpr int K = decltype(kc)::value;
        auto launch = [&](auto kernel, kindex blocks) {
          launch_dependent(kernel, unsigned(blocks), kWarpsPerBlock * 32,
                           forward_shared_bytes<T, K>(), compute_stream(),
                           static_cast<const T*>(x), static_cast<const T*>(gamma),
                           static_cast<const T*>(beta), N, H, float(eps), static_cast<T*>(y),
                           ldy, mean, rstd);
        };
        if (ldy == H)
          launch(forward_packed_kernel<T, K, false>(), forward_blocks<T, K, false>(N));
        else
          launch(forward_packed_kernel<T, K, true>(), forward_blocks<T, K, true>(N));
      });
      return;
    }
    // Packable rows too wide for the packed kernel (fp32 H > 1280).
    if (rows_packed && packable<T>(H, {x, gamma, beta, y}) &&
        layernorm_forward_columns(static_cast<const T*>(x), static_cast<const T*>(gamma),
                                  static_cast<const T*>(beta), N, H, float(eps),
                                  static_cast<T*>(y), ldy, mean, rstd))
      return;
    layernorm_forward_kernel<T><<<blocks, kWarpsPerBlock * 32, 0, compute_stream()>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta), N, H,
        float(eps), static_cast<T*>(y), ldy, mean, rstd);
    MESH_CUDA_LAUNCHED();
  });
}

void layernorm_backward(DType t, DType g, const void* dy, const void* x, const void* gamma,
                        const float* mean, const float* rstd, index_t N, index_t H, void* dx,
                        void* dgamma, void* dbeta, const void* residual_grad, bool accumulate,
                        LayerNormPendingSums* pending) {
  with_storage_and_grad_type(t, g, "layernorm_backward", [&](auto tz, auto gz) {
    using T = decltype(tz);
    using G = decltype(gz);
    const int max_k = sizeof(T) == 4 ? kMaxBackwardPacksPerLane : 6;  // see kMaxPacksPerLane
    const T* residual = static_cast<const T*>(residual_grad);
    const std::initializer_list<const void*> rows = {dy, x, gamma, dx,
                                                     residual_grad ? residual_grad : dx};
    const int k = N > 0 ? packed_k<T>(H, rows, max_k) : 0;
    if (k != 0 && layernorm_backward_split<T>(k, static_cast<const T*>(dy),
                                              static_cast<const T*>(x),
                                              static_cast<const T*>(gamma), mean, rstd, N, H,
                                              static_cast<T*>(dx), residual,
                                              static_cast<G*>(dgamma), static_cast<G*>(dbeta),
                                              accumulate, pending))
      return;
    // The other kernels add their own partial rows: an earlier call's first.
    if (pending) layernorm_add_pending(*pending);
    // Packable rows too wide for the packed kernel (fp32 H > 1280, 16-bit
    // H > 1536).
    if (N > 0 && packable<T>(H, rows) &&
        layernorm_backward_columns(static_cast<const T*>(dy), static_cast<const T*>(x),
                                   static_cast<const T*>(gamma), mean, rstd, N, H,
                                   static_cast<T*>(dx), residual, static_cast<G*>(dgamma),
                                   static_cast<G*>(dbeta), accumulate))
      return;
    if (N > 0) {
      layernorm_backward_dx_kernel<T><<<grid_for(N, kWarpsPerBlock, 1LL << 31),
                                        kWarpsPerBlock * 32, 0, compute_stream()>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(gamma), mean,
          rstd, N, H, static_cast<T*>(dx), residual);
      MESH_CUDA_LAUNCHED();
    }
    column_sums<2>(LayerNormParamTerms<T>{static_cast<const T*>(dy), static_cast<const T*>(x),
                                          mean, rstd, H},
                   N, H, accumulate, static_cast<G*>(dgamma), static_cast<G*>(dbeta));
  });
}

void layernorm_add_pending(LayerNormPendingSums& pending) {
  if (!pending.partial) return;
  // The kernel before may be a split kernel that added an earlier call's
  // rows into these same dgamma, dbeta (one layernorm twice in a row):
  // they are read after the wait.
  column_sums_one_pass<2>(BlockPartialTerms{static_cast<const float*>(pending.partial),
                                            pending.H},
                          pending.rows, pending.H, pending.accumulate, pending.dgamma,
                          pending.dbeta, /*out_after_wait=*/true);
  layernorm_drop_pending(pending);
}

void layernorm_drop_pending(LayerNormPendingSums& pending) {
  // The kernels queued before are the last to read the rows (one stream).
  if (pending.partial) device::deallocate(pending.partial);
  pending = LayerNormPendingSums{};
}

}  // namespace meshtron::cuda
