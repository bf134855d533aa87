// Column sums of an [N, C] matrix, deterministic and without atomics.
//
// Parameter gradients (dbias, dgamma, dbeta) are sums over all N tokens of
// each column. One block per 32 columns would leave most of the GPU idle for
// C = 768, so the rows are also split: pass 1 writes one fp32 partial sum
// per (split, column), pass 2 adds the partials of each column in a fixed
// order and accumulates into the gradient. Same inputs, same bits, every run
// (atomics would make the order, and so the rounding, vary).
#pragma once

#include "kernels/cuda/common.cuh"
#include "tensor/device_allocator.hpp"

namespace meshtron::cuda {

inline constexpr int kColTile = 32, kRowLanes = 8;

/// partial[(split * NV + v) * C + c] = sum_{rows r of split} src(r, c)[v].
template <int NV, class Source>
__global__ void column_partials_kernel(Source src, kindex N, kindex C, kindex rows_per_split,
                                       float* partial) {
  __shared__ float tile[NV][kRowLanes][kColTile + 1];
  const kindex c = kindex(blockIdx.x) * kColTile + threadIdx.x;
  const kindex r0 = kindex(blockIdx.y) * rows_per_split;
  const kindex r1 = r0 + rows_per_split < N ? r0 + rows_per_split : N;
  float acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = 0.f;
  if (c < C)
    for (kindex r = r0 + threadIdx.y; r < r1; r += kRowLanes) src(r, c, acc);
  for (int v = 0; v < NV; ++v) tile[v][threadIdx.y][threadIdx.x] = acc[v];
  __syncthreads();
  if (threadIdx.y == 0 && c < C)
    for (int v = 0; v < NV; ++v) {
      float s = 0.f;
      for (int y = 0; y < kRowLanes; ++y) s += tile[v][y][threadIdx.x];
      partial[(kindex(blockIdx.y) * NV + v) * C + c] = s;
    }
}

/// What a column sum s leaves in out[c]: out[c] + s where it accumulates,
/// else 0 + s (the bits of zeroing out first, -0 included).
template <class G>
__device__ __forceinline__ float stored_sum(const G* out, kindex c, float s, bool accumulate) {
  return (accumulate ? load_f(out, c) : 0.f) + s;
}

/// Loads in flight per thread where a loop adds a column's values in order.
inline constexpr int kFinalizeUnroll = 8;

/// sum_{k < splits} at(k), added in k order from 0.f. The loads of Unroll
/// splits are issued before their adds (which stay in split order: the same
/// bits as one load and add at a time, whatever Unroll).
template <int Unroll = kFinalizeUnroll, class At>
__device__ __forceinline__ float sum_splits_in_order(kindex splits, const At& at) {
  float s = 0.f;
  for (kindex k = 0; k < splits; k += Unroll) {
    float p[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) p[u] = k + u < splits ? at(k + u) : 0.f;
#pragma unroll
    for (int u = 0; u < Unroll; ++u)
      if (k + u < splits) s += p[u];
  }
  return s;
}

/// out_v[c] (+)= sum_split partial[(split * NV + v) * C + c], in split order
/// (added to out with `accumulate`, else written).
template <int NV, class G>
__global__ void column_finalize_kernel(const float* partial, kindex splits, kindex C, G* out0,
                                       G* out1, bool accumulate) {
  const kindex c = kindex(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  G* outs[2] = {out0, out1};
  for (int v = 0; v < NV; ++v) {
    const float s =
        sum_splits_in_order(splits, [&](kindex k) { return partial[(k * NV + v) * C + c]; });
    store_f(outs[v], c, stored_sum(outs[v], c, s, accumulate));
  }
}

/// acc[0] += x[r, c] (plain column sums).
template <class T>
struct ColumnTerms {
  const T* x;
  kindex C;
  __device__ void operator()(kindex r, kindex c, float* acc) const { acc[0] += load_f(x, r * C + c); }
};

/// How column_sums splits the rows: `splits` groups of `rows_per_split`.
struct ColumnSplit {
  kindex splits = 1, rows_per_split = 1;
};
/// As many row groups as keep the whole grid (col_blocks x splits) resident
/// at once (`resident`: resident_blocks of the partials kernel), so it runs
/// in one wave. (Rounding the group count up to a fixed 4 x 132 blocks made
/// grids of 530-540 blocks where the bf16 packed kernel, at 104 registers,
/// holds 264: two waves and a third of a few blocks, each a whole block's
/// time; the bias gradients read at ~1.8 TB/s on an H100.)
inline ColumnSplit column_split(kindex N, kindex col_blocks, kindex resident) {
  kindex splits = resident / col_blocks;
  const kindex max_splits = (N + kRowLanes - 1) / kRowLanes;
  if (splits > max_splits) splits = max_splits;
  if (splits < 1) splits = 1;
  kindex rows_per_split = (N + splits - 1) / splits;
  if (rows_per_split < 1) rows_per_split = 1;
  splits = N > 0 ? (N + rows_per_split - 1) / rows_per_split : 1;
  return {splits, rows_per_split};
}

template <int NV, class G>
void column_finalize(const device::Buffer& partial, kindex splits, kindex C, G* out0, G* out1,
                     bool accumulate) {
  column_finalize_kernel<NV><<<grid_for(C, 256), 256, 0, compute_stream()>>>(
      partial.as<float>(), splits, C, out0, out1, accumulate);
  MESH_CUDA_LAUNCHED();
}

/// out_v[c] += sum_r src(r, c)[v] for r < N, c < C (src adds into acc[NV]);
/// = instead of += without `accumulate`.
template <int NV, class Source, class G>
void column_sums(const Source& src, kindex N, kindex C, bool accumulate, G* out0,
                 G* out1 = nullptr) {
  if (C == 0) return;
  static const kindex resident =
      resident_blocks(column_partials_kernel<NV, Source>, kColTile * kRowLanes);
  const kindex col_blocks = (C + kColTile - 1) / kColTile;
  const ColumnSplit split = column_split(N, col_blocks, resident);
  device::Buffer partial(std::size_t(split.splits * NV * C) * sizeof(float));
  column_partials_kernel<NV><<<dim3(unsigned(col_blocks), unsigned(split.splits)),
                               dim3(kColTile, kRowLanes), 0, compute_stream()>>>(
      src, N, C, split.rows_per_split, partial.as<float>());
  MESH_CUDA_LAUNCHED();
  column_finalize<NV>(partial, split.splits, C, out0, out1, accumulate);
}

/// out_v[c] += sum_r src(r, c)[v] in ONE launch, for short N (a few hundred
/// rows: the per-block partial rows of a fused backward kernel). A block
/// takes kOnePassCols columns with kOnePassLanes row lanes: lane y adds rows
/// y, y + kOnePassLanes, ... in order, then lane 0 adds the lanes in order
/// and accumulates into out. Deterministic; rounds differently from the
/// two-pass column_sums (another order of the same adds). Narrow tiles and
/// many lanes because the work is latency, not bytes: 132 partial rows x 768
/// columns as blocks of 32 columns x 8 lanes would be 24 blocks with 17 rounds
/// of loads per thread; 8 columns x 32 lanes are 96 blocks with 4-5, and a
/// lane issues the loads of kOnePassBatch rows before adding them (one round
/// of L2 latency for up to 256 rows). Launched as a dependent (see
/// column_sums_one_pass) it reads out before waiting for the partial rows.
inline constexpr int kOnePassCols = 8, kOnePassLanes = 32, kOnePassBatch = 8;

template <int NV, class Source, class G>
__global__ void __launch_bounds__(kOnePassCols * kOnePassLanes)
    column_sums_one_pass_kernel(Source src, kindex N, kindex C, bool accumulate, G* out0,
                                G* out1, bool out_after_wait) {
  __shared__ float tile[NV][kOnePassLanes][kOnePassCols + 1];
  const kindex c = kindex(blockIdx.x) * kOnePassCols + threadIdx.x;
  G* outs[2] = {out0, out1};
  float before[NV];
  const auto read_before = [&] {
    if (threadIdx.y == 0 && c < C)
#pragma unroll
      for (int v = 0; v < NV; ++v) before[v] = accumulate ? load_f(outs[v], c) : 0.f;
  };
  if (!out_after_wait) read_before();
  wait_for_prior_grid();  // the partial rows (when launched as a dependent)
  allow_dependent_launch();
  if (out_after_wait) read_before();
  float acc[NV];
#pragma unroll
  for (int v = 0; v < NV; ++v) acc[v] = 0.f;
  if (c < C) {
    for (kindex r0 = threadIdx.y; r0 < N; r0 += kOnePassBatch * kOnePassLanes) {
      float row[kOnePassBatch][NV];  // src adds into zeros: row = the values, exactly
#pragma unroll
      for (int u = 0; u < kOnePassBatch; ++u) {
#pragma unroll
        for (int v = 0; v < NV; ++v) row[u][v] = 0.f;
        if (r0 + u * kOnePassLanes < N) src(r0 + u * kOnePassLanes, c, row[u]);
      }
#pragma unroll
      for (int u = 0; u < kOnePassBatch; ++u)
        if (r0 + u * kOnePassLanes < N)
#pragma unroll
          for (int v = 0; v < NV; ++v) acc[v] += row[u][v];
    }
  }
#pragma unroll
  for (int v = 0; v < NV; ++v) tile[v][threadIdx.y][threadIdx.x] = acc[v];
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
#pragma unroll
  for (int v = 0; v < NV; ++v) {
    float s = 0.f;
    for (int y = 0; y < kOnePassLanes; ++y) s += tile[v][y][threadIdx.x];
    store_f(outs[v], c, before[v] + s);
  }
}

/// Launched as the programmatic dependent of the kernel that wrote what src
/// reads, which must not write out and, if it allows dependents early at
/// all, only after its own wait_for_prior_grid() (as start_after_prior_grid
/// does): then whatever wrote out before it has finished when this kernel
/// starts, and out is read before the wait. `out_after_wait`: the previous
/// kernel may have written out (a layernorm backward that added an earlier
/// call's partial rows into it, add_partial_rows_slice), so out is read
/// after the wait. It lets its own dependent start after that wait (the
/// next call's layernorm backward then reads its x while this kernel runs).
template <int NV, class Source, class G>
void column_sums_one_pass(const Source& src, kindex N, kindex C, bool accumulate, G* out0,
                          G* out1 = nullptr, bool out_after_wait = false) {
  if (C == 0) return;
  launch_dependent(column_sums_one_pass_kernel<NV, Source, G>,
                   dim3(unsigned((C + kOnePassCols - 1) / kOnePassCols)),
                   dim3(kOnePassCols, kOnePassLanes), 0, compute_stream(), src, N, C, accumulate,
                   out0, out1, out_after_wait);
}

/// Partial rows [rows, 2 H] (fp32: row r's H dgamma sums, then its H dbeta
/// sums, as the split layernorm backward writes them; 16-byte aligned, H
/// even) whose column sums a later kernel adds into dgamma (columns
/// [0, H)) and dbeta ([H, 2 H)): each of its blocks takes `per_block` (a
/// multiple of 4) consecutive columns of the 2 H. rows == 0: nothing to add.
/// The kernel's view of a host-side cuda::LayerNormPendingSums (which owns
/// the rows' memory and counts in index_t): a kernel parameter with 32-bit
/// counts and the per-block split, filled by layernorm.cu's foldable().
struct PartialRowsToAdd {
  const float* partial = nullptr;
  int rows = 0, H = 0, per_block = 0;
  bool accumulate = false;  ///< add into dgamma, dbeta (else write them)
  float* dgamma = nullptr;
  float* dbeta = nullptr;
};

/// This block's columns of `add`, summed in column_sums_one_pass_kernel's
/// order (lane y of 32 adds rows y, y + 32, ... in order from 0; the 32
/// lane sums added in lane order from 0; then before + sum), so the bits
/// equal a column_sums_one_pass<2>(BlockPartialTerms) launch's. Every thread
/// of the block calls it after its wait_for_prior_grid() (the partial rows,
/// and dgamma / dbeta, may be the previous kernel's output); `tile` is 32 x
/// per_block floats of shared memory (16-byte aligned) nothing else uses
/// until this returns.
__device__ __forceinline__ void add_partial_rows_slice(const PartialRowsToAdd& add, float* tile,
                                                       int tid, int threads) {
  const int columns = 2 * add.H, first = int(blockIdx.x) * add.per_block;
  const int cols = columns - first < add.per_block ? columns - first : add.per_block;
  if (cols <= 0) return;  // the same for every thread of the block
  // The adding threads' outputs read first and the lane sums taken from
  // shared memory all at once (unrolled), so neither latency stands in
  // line: the block's tiles wait for these threads at their first barrier.
  const int c_out = first + tid;
  float* out = tid >= cols    ? nullptr
               : c_out < add.H ? add.dgamma + c_out
                               : add.dbeta + (c_out - add.H);
  const float before = out && add.accumulate ? *out : 0.f;
  // Four columns a load (16 bytes: 2 H, first and cols are multiples of 4),
  // so that a (lane, 4 columns) item per thread covers the block's columns
  // in one round of loads at GPT-2's widths (32 x 12 / 4 at 768 and 132
  // blocks; two rounds of single columns take 0.5 us more a call).
  const int quads = cols / 4, row_quads = columns / 4;
  const float4* rows = reinterpret_cast<const float4*>(add.partial + first);
  for (int i = tid; i < kOnePassLanes * quads; i += threads) {
    const int y = i / quads, q = i % quads;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int r = y; r < add.rows; r += kOnePassLanes) {
      const float4 v = rows[kindex(r) * row_quads + q];
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    reinterpret_cast<float4*>(tile + y * cols)[q] = acc;  // [y][column - first]
  }
  __syncthreads();
  if (out) {
    float lane_sums[kOnePassLanes];
#pragma unroll
    for (int y = 0; y < kOnePassLanes; ++y) lane_sums[y] = tile[y * cols + tid];
    float s = 0.f;
#pragma unroll
    for (int y = 0; y < kOnePassLanes; ++y) s += lane_sums[y];
    *out = before + s;
  }
}

/// Tickets of the fused column sums (column_partials_packed_kernel with
/// kFused): one per column block, taken by each of its row-split blocks
/// after writing its partial row; the block that takes the last finishes
/// the column block and sets the ticket back to 0 (for the next call and
/// for graph replays). Calls run one after another on the compute stream.
inline constexpr int kMaxFusedColumnBlocks = 1024;
/// Split loads in flight per thread in the fused finish. At the residual's
/// widths the 16-byte packs make few column blocks, so the wave is filled
/// with many row splits (bf16 768: 3 column blocks x 88 splits), and the
/// finishing block's adds are 11 rounds of L2 latency at 8 a round: 32 a
/// round (no spills, sm_90) times bias_backward bf16 [8192, 768] at 8.3 us
/// against 9.0 with 8, 1280 8.6 against 9.0, fp32 768 7.6 against 7.8, 1280
/// 9.1 against 9.4 (H200, perf/bench_cuda_ops, alternated rounds); at 3072
/// (22 splits) it changes nothing and at bf16 5120 (13) it is 24.7 us
/// against 24.3.
inline constexpr int kFusedFinishUnroll = 32;
static __device__ unsigned int g_column_tickets[kMaxFusedColumnBlocks];

/// column_partials_kernel for plain column sums of x [N, C] (NV = 1), with
/// each thread reading a 16-byte pack of V = 16 / sizeof(T) columns per row
/// (C % V == 0, x 16-byte aligned): a warp moves 512 bytes per row instead
/// of 64. A block covers V times the columns, so the rows are split into
/// more (smaller) groups than the scalar kernel's: the sums are fixed-order
/// and deterministic, but round differently from the scalar path's.
/// kFused: the last block of each column block (a ticket) adds that column
/// block's partial rows in split order into out, as column_finalize_kernel
/// does (the same adds, so the same bits), instead of a second launch: 0.70
/// of copy instead of 0.65 at bf16 [8192, 3072] on an H100
/// (perf/bench_cuda_ops memory). Two blocks per SM (ptxas, sm_90, bf16: 128
/// registers, no spills); three (80 registers and ~230 bytes of spills) are
/// slower (0.49 of copy), and 16 rows in flight per thread take 220
/// registers (one block per SM). A thread issues the next 8 rows' loads before adding the current
/// 8 (128 registers, against 117 without): bf16 [8192, 3072] 0.78 of copy
/// against 0.77, 0.80 against 0.78 replayed from a graph (H100,
/// perf/bench_cuda_ops memory).
template <class T, bool kFused, class G>
__global__ void __launch_bounds__(kColTile * kRowLanes, 2)
    column_partials_packed_kernel(const T* __restrict__ x, kindex N, kindex C,
                                  kindex rows_per_split, float* partial, G* out,
                                  bool accumulate) {
  start_after_prior_grid();
  constexpr int V = kPack<T>;
  __shared__ float tile[kRowLanes][kColTile * V + 1];
  const kindex c0 = (kindex(blockIdx.x) * kColTile + threadIdx.x) * V;
  const kindex r0 = kindex(blockIdx.y) * rows_per_split;
  const kindex r1 = r0 + rows_per_split < N ? r0 + rows_per_split : N;
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0.f;
  if (c0 < C) {
    // U rows' loads in flight per thread (128 bytes; rows past r1 not
    // loaded), then added in row order: the same order, so the same bits,
    // as one row at a time.
    constexpr int U = 8;
    Pack<T> cur[U], next[U];
    const auto load = [&](kindex r, Pack<T>(&p)[U]) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (r + u * kRowLanes < r1)
          p[u] = *reinterpret_cast<const Pack<T>*>(x + (r + u * kRowLanes) * C + c0);
    };
    kindex r = r0 + threadIdx.y;
    if (r < r1) load(r, cur);
    for (; r < r1; r += U * kRowLanes) {
      // The next U rows' loads are issued before this batch is added.
      if (r + U * kRowLanes < r1) load(r + U * kRowLanes, next);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (r + u * kRowLanes < r1)
#pragma unroll
          for (int j = 0; j < V; ++j) acc[j] += to_f(cur[u].v[j]);
#pragma unroll
      for (int u = 0; u < U; ++u) cur[u] = next[u];
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) tile[threadIdx.y][threadIdx.x * V + j] = acc[j];
  __syncthreads();
  for (int q = threadIdx.y * kColTile + threadIdx.x; q < kColTile * V;
       q += kColTile * kRowLanes) {
    const kindex c = kindex(blockIdx.x) * kColTile * V + q;
    if (c >= C) continue;
    float s = 0.f;
    for (int y = 0; y < kRowLanes; ++y) s += tile[y][q];
    partial[kindex(blockIdx.y) * C + c] = s;
  }
  if constexpr (kFused) {
    if (!last_block_to_finish(&g_column_tickets[blockIdx.x], gridDim.y)) return;
    const kindex splits = gridDim.y;
    for (int q = threadIdx.y * kColTile + threadIdx.x; q < kColTile * V;
         q += kColTile * kRowLanes) {
      const kindex c = kindex(blockIdx.x) * kColTile * V + q;
      if (c >= C) continue;
      // column_finalize_kernel's adds in the same order (L2 loads: other
      // blocks wrote the partials).
      const float s =
          sum_splits_in_order<kFusedFinishUnroll>(splits, [&](kindex k) { return __ldcg(partial + k * C + c); });
      store_f(out, c, stored_sum(out, c, s, accumulate));
    }
    if (threadIdx.x == 0 && threadIdx.y == 0) g_column_tickets[blockIdx.x] = 0;
  }
}

template <bool kFused, class T, class G>
void launch_packed_column_sums(const T* x, kindex N, kindex C, G* out, bool accumulate) {
  constexpr int V = kPack<T>;
  static const kindex resident =
      resident_blocks(column_partials_packed_kernel<T, kFused, G>, kColTile * kRowLanes);
  const kindex col_blocks = (C / V + kColTile - 1) / kColTile;
  const ColumnSplit split = column_split(N, col_blocks, resident);
  device::Buffer partial(std::size_t(split.splits * C) * sizeof(float));
  launch_dependent(column_partials_packed_kernel<T, kFused, G>,
                   dim3(unsigned(col_blocks), unsigned(split.splits)), dim3(kColTile, kRowLanes), 0,
                   compute_stream(), x, N, C, split.rows_per_split, partial.as<float>(), out,
                   accumulate);
  if (!kFused)
    column_finalize<1>(partial, split.splits, C, out, static_cast<G*>(nullptr), accumulate);
}

/// out[c] += sum_r x[r, c] (= without `accumulate`): the packed kernel
/// where it applies, else the scalar one.
template <class T, class G>
void plain_column_sums(const T* x, kindex N, kindex C, G* out, bool accumulate) {
  if (C == 0) return;
  constexpr int V = kPack<T>;
  if (C % V != 0 || !aligned16(x)) {
    column_sums<1>(ColumnTerms<T>{x, C}, N, C, accumulate, out);
    return;
  }
  if ((C / V + kColTile - 1) / kColTile <= kMaxFusedColumnBlocks)
    launch_packed_column_sums<true>(x, N, C, out, accumulate);
  else  // more column blocks than tickets
    launch_packed_column_sums<false>(x, N, C, out, accumulate);
}

}  // namespace meshtron::cuda
