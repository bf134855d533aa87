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
// pointer is 16-byte aligned and a row fits in 32 * 8 packs: H <= 1024
// fp32 / 2048 bf16, and H <= 1536 for the backward of 16-bit types): still
// one warp per row, but lane l loads packs l, l + 32, ... (K of them, K a
// template constant) with 16-byte loads and keeps the row in registers, so
// DRAM sees each row once and the loads are wide. Both packed kernels run
// a grid that fits on the GPU at once, each warp looping over rows with the
// next row's loads in flight while it works on the current one (forward:
// in registers; backward: cp.async into a per-warp shared-memory ring). The formulas and the
// points where values round to T are the scalar kernels' (same
// expressions, fp32 statistics); only the order in which each lane adds
// its elements before the warp reduction differs (lane l owns elements
// l V .. l V + V - 1, l V + 32 V, ... instead of l, l + 32, ...), so the
// results agree with the scalar path to fp32 rounding, not bit for bit,
// and every run gives the same bits.
// The packed backward also fuses dgamma and dbeta: each lane owns the same
// columns in every row, so it accumulates its columns' terms over the rows
// of its warp in registers; a block adds its 8 or 16 warps in warp order
// through shared memory and writes one fp32 partial row per block (132
// blocks at most), and column_sums_one_pass adds the partials (row lane y
// takes blocks y, y + 8, ... in order, then the lanes in order) into the
// gradients in one launch. The grid is a function of (N, H, dtype) only, the orders
// are fixed, there are no atomics: deterministic. dy and x are read once
// instead of twice.
// Packable rows wider than the packed kernels take (fp32 H > 1024, 16-bit
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

template <class T>
__global__ void layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                         const T* __restrict__ beta, kindex N, kindex H,
                                         float eps, T* __restrict__ y, float* __restrict__ mean,
                                         float* __restrict__ rstd) {
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
  T* yr = y + row * H;
  for (kindex h = lane; h < H; h += 32)
    store_f(yr, h, (load_f(xr, h) - mu) * rs * load_f(gamma, h) + load_f(beta, h));
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

/// dx as stored: the layernorm gradient rounded to T, plus the residual
/// branch's gradient at element i when there is one (the rounding add()
/// does). __fadd_rn keeps the compiler from contracting the last product of
/// dx and this sum into one FMA, which would round differently.
template <class T>
__device__ __forceinline__ float with_residual(float dx, const T* residual, kindex i) {
  return residual ? __fadd_rn(round_to<T>(dx), load_f(residual, i)) : dx;
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

constexpr int kMaxPacksPerLane = 8;
// The packed backward holds dy, x and 2 K V fp32 column sums per lane:
// 128 registers for bf16 at K = 3 (H = 768), so one 512-thread block per
// SM is resident (backward_warps); 132 blocks are one wave of an H100 and
// 132 partial rows. 16-bit rows with K = 8 would spill (ptxas: 192 bytes),
// so rows wider than 32 x 6 packs (H > 1536 in bf16/fp16) stay scalar. K = 5
// (8-warp blocks, no spills) is GPT-2 774M's H = 1280 exactly (`4210b80`:
// forward 0.74 -> 0.76 of copy against K = 6, whose sixth load per lane
// idled).
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

/// Warp w of the grid takes rows w, w + (warps in the grid), ...; the grid
/// is what fits on the GPU at once (forward_blocks), so every warp is
/// resident from the start, and while a warp normalises one row the next
/// row's loads are already in flight (`next`): no warp waits a full DRAM
/// latency between its rows. Per row the same expressions as before.
template <class T, int K>
__global__ void layernorm_forward_packed_kernel(const T* __restrict__ x,
                                                const T* __restrict__ gamma,
                                                const T* __restrict__ beta, kindex N, kindex H,
                                                float eps, T* __restrict__ y,
                                                float* __restrict__ mean,
                                                float* __restrict__ rstd) {
  constexpr int V = kPack<T>;
  const int lane = threadIdx.x & 31, P = int(H / V);
  const kindex warps = kindex(gridDim.x) * kWarpsPerBlock;
  kindex row = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;
  Pack<T> next[K];
  load_row(x + row * H, P, lane, next);
  for (; row < N; row += warps) {
    Pack<T> xr[K];
#pragma unroll
    for (int k = 0; k < K; ++k) xr[k] = next[k];
    if (row + warps < N) load_row(x + (row + warps) * H, P, lane, next);
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < P)
#pragma unroll
        for (int j = 0; j < V; ++j) sum += to_f(xr[k].v[j]);
    const float mu = warp_sum(sum) / float(H);
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < P)
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = to_f(xr[k].v[j]) - mu;
          sq += d * d;
        }
    const float rs = rsqrtf(warp_sum(sq) / float(H) + eps);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int p = lane + 32 * k;
      if (p >= P) continue;
      const Pack<T> g = reinterpret_cast<const Pack<T>*>(gamma)[p];
      const Pack<T> b = reinterpret_cast<const Pack<T>*>(beta)[p];
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < V; ++j)
        out.v[j] = from_f<T>((to_f(xr[k].v[j]) - mu) * rs * to_f(g.v[j]) + to_f(b.v[j]));
      reinterpret_cast<Pack<T>*>(y + row * H)[p] = out;
    }
    if (lane == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
  }
}

/// Grid of the packed forward: one block per kWarpsPerBlock rows, at most
/// one full wave. bf16 H = 768 before: 48 registers, 5 blocks per SM, the
/// 1024 one-row-per-warp blocks in 1.55 waves, the second wave's loads
/// issued only as first-wave warps exited; now 65 registers, 3 blocks per
/// SM (396 on an H100), 2-3 rows per warp, the next row always in flight.
/// Looked up once per kernel (one GPU per process).
template <class T, int K>
kindex forward_blocks(kindex N) {
  static const kindex resident =
      resident_blocks(layernorm_forward_packed_kernel<T, K>, kWarpsPerBlock * 32);
  const kindex row_blocks = (N + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return row_blocks < resident ? row_blocks : resident;
}

/// Warps per block of the packed backward: 16 (512 threads, so at most 128
/// registers) where ptxas (nvcc 13, sm_90) fits the kernel in 128 registers
/// without spills (bf16/fp16 K <= 3, fp32 K <= 6: H <= 768 either way),
/// else 8. Either way one block per SM is resident.
constexpr int backward_warps(std::size_t type_bytes, int K) {
  return (type_bytes == 2 ? K <= 3 : K <= 6) ? 16 : 8;
}

/// Shared memory one block may hold on sm_90 (the opt-in maximum, 227 KiB).
constexpr std::size_t kMaxSharedPerBlock = 227 * 1024;

/// Rows streamed through the packed backward's ring: dy, x and, where the
/// ring for three still fits next to the static stage, the residual
/// gradient (when the call has one); else the residual is read directly.
/// Only fp32 K = 6 (16 warps) needs the fallback: 288 KiB for three.
template <class T, int K, int W>
__host__ __device__ constexpr int ring_tensors() {
  const std::size_t stage = std::size_t(2) * W * 32 * kPack<T> * sizeof(float);
  const std::size_t three = std::size_t(W) * 2 * 3 * 32 * K * sizeof(Pack<T>);
  return stage + three <= kMaxSharedPerBlock ? 3 : 2;
}

/// Dynamic shared memory of the packed backward: per warp two buffers
/// (this row, next row) of ring_tensors() rows, 32 K packs each.
template <class T, int K, int W>
__host__ __device__ constexpr std::size_t backward_ring_bytes() {
  return std::size_t(W) * 2 * ring_tensors<T, K, W>() * 32 * K * sizeof(Pack<T>);
}

/// dx as layernorm_backward_dx_kernel, plus per-block partial column sums
/// partial[(block * 2 + 0) * H + c] (dgamma terms) and [... + 1] (dbeta).
/// Warp w of the grid takes rows w, w + (warps in the grid), ... gamma is
/// re-read per row (an L1 hit) rather than held, to save 4 K registers.
/// Rows arrive through a per-warp ring in shared memory: at the top of an
/// iteration the warp issues cp.async copies of its NEXT row's dy and x,
/// then waits for the current row's (issued one iteration earlier), so the
/// loads of one row overlap the reductions, dx stores and column sums of
/// the previous one. (Before, each warp loaded its row into registers and
/// waited a full DRAM latency per row, about 4 rows per warp at N = 8192,
/// with only 16 warps per SM to hide it: the 128 registers of the column
/// sums leave no room for a register prefetch, shared memory has room.)
/// Each lane copies and reads back only its own packs, so no barrier; the
/// buffer refilled at the top of an iteration was last read in the
/// previous one, by loads whose values that iteration's stores consumed.
template <class T, int K, int W = backward_warps(sizeof(T), K)>
__global__ void __launch_bounds__(W * 32)
    layernorm_backward_packed_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                     const T* __restrict__ gamma,
                                     const float* __restrict__ mean,
                                     const float* __restrict__ rstd, kindex N, kindex H,
                                     T* __restrict__ dx, const T* __restrict__ residual,
                                     float* __restrict__ partial) {
  constexpr int V = kPack<T>;
  __shared__ float stage[2][W][32 * V];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, P = int(H / V);
  float acc_dgamma[K][V], acc_dbeta[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int j = 0; j < V; ++j) acc_dgamma[k][j] = acc_dbeta[k][j] = 0.f;

  constexpr int R = ring_tensors<T, K, W>();
  const bool ring_residual = R == 3 && residual != nullptr;
  extern __shared__ __align__(16) unsigned char ring_bytes[];
  Pack<T>* ring = reinterpret_cast<Pack<T>*>(ring_bytes) + warp * (2 * R * 32 * K);
  // ring[(buf R + t) 32 K + p]: buffer buf, t = 0 dy / 1 x / 2 residual, pack p.
  const auto slot = [&](int buf, int t, int p) { return ring + (buf * R + t) * 32 * K + p; };
  const auto fetch = [&](kindex r, int buf) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int p = lane + 32 * k;
      if (p < P) {
        cp_async16(slot(buf, 0, p), dy + r * H + kindex(p) * V);
        cp_async16(slot(buf, 1, p), x + r * H + kindex(p) * V);
        if (ring_residual) cp_async16(slot(buf, R - 1, p), residual + r * H + kindex(p) * V);
      }
    }
  };

  const kindex warps = kindex(gridDim.x) * W;
  kindex row = kindex(blockIdx.x) * W + warp;
  float next_mu = 0.f, next_rs = 0.f;  // the statistics ride along with the row
  if (row < N) {
    fetch(row, 0);
    next_mu = mean[row];
    next_rs = rstd[row];
  }
  cp_async_commit();
  for (int buf = 0; row < N; row += warps, buf ^= 1) {
    const float mu = next_mu, rs = next_rs;
    if (row + warps < N) {
      fetch(row + warps, buf ^ 1);
      next_mu = mean[row + warps];
      next_rs = rstd[row + warps];
    }
    cp_async_commit();  // possibly empty: one group per iteration either way
    cp_async_wait<1>();  // this row's group (the older one) has landed
    Pack<T> dyr[K], xr[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int p = lane + 32 * k;
      if (p < P) {
        dyr[k] = *slot(buf, 0, p);
        xr[k] = *slot(buf, 1, p);
      }
    }
    float sum_g = 0.f, sum_g_xhat = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (lane + 32 * k < P) {
        const Pack<T> gp = reinterpret_cast<const Pack<T>*>(gamma)[lane + 32 * k];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = to_f(dyr[k].v[j]), xv = to_f(xr[k].v[j]);
          const float g = d * to_f(gp.v[j]);
          sum_g += g;
          sum_g_xhat += g * (xv - mu) * rs;
          acc_dgamma[k][j] += d * (xv - mu) * rs;  // LayerNormParamTerms' terms
          acc_dbeta[k][j] += d;
        }
      }
    const float mean_g = warp_sum(sum_g) / float(H);
    const float mean_g_xhat = warp_sum(sum_g_xhat) / float(H);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int p = lane + 32 * k;
      if (p >= P) continue;
      const Pack<T> gp = reinterpret_cast<const Pack<T>*>(gamma)[p];
      Pack<T> res{};
      if (ring_residual)
        res = *slot(buf, R - 1, p);
      else if (residual)
        res = reinterpret_cast<const Pack<T>*>(residual + row * H)[p];
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float g = to_f(dyr[k].v[j]) * to_f(gp.v[j]);
        const float xhat = (to_f(xr[k].v[j]) - mu) * rs;
        const float d = rs * (g - mean_g - xhat * mean_g_xhat);
        out.v[j] = from_f<T>(residual ? __fadd_rn(round_to<T>(d), to_f(res.v[j])) : d);
      }
      reinterpret_cast<Pack<T>*>(dx + row * H)[p] = out;
    }
  }

  cp_async_wait<0>();  // nothing left in flight (only empty groups remain)

  // Block partials, pack slot by pack slot: column c = 32 V k + q for the
  // q-th value of slot k (q = lane V + j). Warps are added in warp order.
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      stage[0][warp][lane * V + j] = acc_dgamma[k][j];
      stage[1][warp][lane * V + j] = acc_dbeta[k][j];
    }
    __syncthreads();
    for (int q = threadIdx.x; q < 32 * V; q += W * 32) {
      const kindex c = kindex(32 * V) * k + q;
      if (c >= H) continue;
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        float s = 0.f;
        for (int w = 0; w < W; ++w) s += stage[v][w][q];
        partial[(kindex(blockIdx.x) * 2 + v) * H + c] = s;
      }
    }
    __syncthreads();  // stage is rewritten for the next slot
  }
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
// Nsight Compute on the packed backward (session 9, bf16 H = 1280): 241
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
// Used, with the forward below, for 16-byte-packable rows wider than the
// packed kernels take (fp32 H > 1024, 16-bit backward H > 1536: the scalar
// kernels before, 0.38-0.45 of copy at fp32 [8192, 1280], now 0.64-0.82).
// At the widths the packed kernels take they were slower on an H100
// (bf16 H = 768: forward 0.55 vs 0.89 of copy, backward 0.43 vs 0.57), and
// R = 4 rows per tile slower than R = 2 (perf/RESULTS.md, session 11).
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
                                G* dgamma, G* dbeta) {
  constexpr int R = kColumnsTileRows;
  const dim3 block = columns_block<T>(H);
  if (block.x == 0) return false;
  const std::size_t shared = std::size_t(block.y) * 2 * H * sizeof(float);
  const kindex blocks = columns_grid(layernorm_backward_columns_kernel<T, R>, block, shared, N, R);
  device::Buffer partial(std::size_t(blocks * 2 * H) * sizeof(float));
  layernorm_backward_columns_kernel<T, R><<<unsigned(blocks), block, shared, compute_stream()>>>(
      dy, x, gamma, mean, rstd, N, H, dx, residual, partial.as<float>());
  MESH_CUDA_LAUNCHED();
  column_sums_one_pass<2>(BlockPartialTerms{partial.as<float>(), H}, blocks, H, dgamma, dbeta);
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
                                     T* __restrict__ y, float* __restrict__ mean,
                                     float* __restrict__ rstd) {
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
      reinterpret_cast<Pack<T>*>(y + row * H)[p] = out;
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
                               float eps, T* y, float* mean, float* rstd) {
  constexpr int R = kColumnsTileRows;
  const dim3 block = columns_block<T>(H);
  if (block.x == 0) return false;
  const kindex blocks = columns_grid(layernorm_forward_columns_kernel<T, R>, block, 0, N, R);
  layernorm_forward_columns_kernel<T, R><<<unsigned(blocks), block, 0, compute_stream()>>>(
      x, gamma, beta, N, H, eps, y, mean, rstd);
  MESH_CUDA_LAUNCHED();
  return true;
}

/// Smallest instantiated K >= packs / 32, or 0 when it exceeds max_k.
int packs_per_lane(kindex packs, int max_k) {
  const kindex need = (packs + 31) / 32;
  for (int k : {1, 2, 3, 4, 5, 6, kMaxPacksPerLane})
    if (need <= k) return k <= max_k ? k : 0;
  return 0;
}

/// Calls f(std::integral_constant<int, K>{}) for K = packs_per_lane(...).
template <class F>
void with_packs_per_lane(int k, F&& f) {
  switch (k) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    default: f(std::integral_constant<int, kMaxPacksPerLane>{}); break;
  }
}

/// Whether this GPU lets one block of the packed backward for K hold its
/// static stage and ring (H100 / H200: always; smaller parts may not).
template <class T>
bool backward_shared_fits(int k) {
  static const int optin = [] {
    int device = 0, bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return bytes;
  }();
  std::size_t need = 0;
  with_packs_per_lane(k, [&](auto kc) {
    constexpr int K = decltype(kc)::value, W = backward_warps(sizeof(T), K);
    need = std::size_t(2) * W * 32 * kPack<T> * sizeof(float) + backward_ring_bytes<T, K, W>();
  });
  return need <= std::size_t(optin);
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
                       index_t H, double eps, void* y, float* mean, float* rstd) {
  if (N == 0) return;
  with_storage_type(t, "layernorm_forward", [&](auto zero) {
    using T = decltype(zero);
    const unsigned blocks = grid_for(N, kWarpsPerBlock, 1LL << 31);
    if (const int k = packed_k<T>(H, {x, gamma, beta, y}, kMaxPacksPerLane)) {
      with_packs_per_lane(k, [&](auto kc) {
        constexpr int K = decltype(kc)::value;
        layernorm_forward_packed_kernel<T, K>
            <<<unsigned(forward_blocks<T, K>(N)), kWarpsPerBlock * 32, 0, compute_stream()>>>(
                static_cast<const T*>(x), static_cast<const T*>(gamma),
                static_cast<const T*>(beta), N, H, float(eps), static_cast<T*>(y), mean, rstd);
        MESH_CUDA_LAUNCHED();
      });
      return;
    }
    // Packable rows too wide for the packed kernel (fp32 H > 1024).
    if (packable<T>(H, {x, gamma, beta, y}) &&
        layernorm_forward_columns(static_cast<const T*>(x), static_cast<const T*>(gamma),
                                  static_cast<const T*>(beta), N, H, float(eps),
                                  static_cast<T*>(y), mean, rstd))
      return;
    layernorm_forward_kernel<T><<<blocks, kWarpsPerBlock * 32, 0, compute_stream()>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta), N, H,
        float(eps), static_cast<T*>(y), mean, rstd);
    MESH_CUDA_LAUNCHED();
  });
}

void layernorm_backward(DType t, DType g, const void* dy, const void* x, const void* gamma,
                        const float* mean, const float* rstd, index_t N, index_t H, void* dx,
                        void* dgamma, void* dbeta, const void* residual_grad) {
  with_storage_and_grad_type(t, g, "layernorm_backward", [&](auto tz, auto gz) {
    using T = decltype(tz);
    using G = decltype(gz);
    const int max_k = sizeof(T) == 4 ? kMaxPacksPerLane : 6;  // 16-bit K = 8 spills
    const T* residual = static_cast<const T*>(residual_grad);
    const std::initializer_list<const void*> rows = {dy, x, gamma, dx,
                                                     residual_grad ? residual_grad : dx};
    const int k = N > 0 ? packed_k<T>(H, rows, max_k) : 0;
    if (k != 0 && backward_shared_fits<T>(k)) {
      const int W = backward_warps(sizeof(T), k);
      const kindex row_blocks = (N + W - 1) / W;
      const kindex blocks = row_blocks < kBackwardBlocks ? row_blocks : kBackwardBlocks;
      device::Buffer partial(std::size_t(blocks * 2 * H) * sizeof(float));
      with_packs_per_lane(k, [&](auto kc) {
        constexpr int K = decltype(kc)::value;
        constexpr int WK = backward_warps(sizeof(T), K);
        static_assert(WK * 32 <= 1024);
        constexpr std::size_t ring = backward_ring_bytes<T, K, WK>();
        static const bool opted_in = [] {  // once per kernel: > 48 KiB needs the opt-in
          CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_packed_kernel<T, K>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(ring)));
          return true;
        }();
        (void)opted_in;
        layernorm_backward_packed_kernel<T, K><<<unsigned(blocks), WK * 32, ring, compute_stream()>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(gamma),
            mean, rstd, N, H, static_cast<T*>(dx), residual, partial.as<float>());
        MESH_CUDA_LAUNCHED();
      });
      // blocks <= 132 partial rows: one launch (two for column_sums).
      column_sums_one_pass<2>(BlockPartialTerms{partial.as<float>(), H}, blocks, H,
                              static_cast<G*>(dgamma), static_cast<G*>(dbeta));
      return;
    }
    // Packable rows too wide for the packed kernel (fp32 H > 1024, 16-bit
    // H > 1536).
    if (N > 0 && packable<T>(H, rows) &&
        layernorm_backward_columns(static_cast<const T*>(dy), static_cast<const T*>(x),
                                   static_cast<const T*>(gamma), mean, rstd, N, H,
                                   static_cast<T*>(dx), residual, static_cast<G*>(dgamma),
                                   static_cast<G*>(dbeta)))
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
                   N, H, static_cast<G*>(dgamma), static_cast<G*>(dbeta));
  });
}

}  // namespace meshtron::cuda
