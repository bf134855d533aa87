// Probe (standalone; build: nvcc -O3 -arch=sm_90 -std=c++17 column_sums_shapes.cu).
// Read floors and finishes for bf16 column sums of [8192, 3072], each back to back 50 times.
// cluster_kernel<12> sums 21 columns per rank, 252 of the block's 256 (timing only; only the
// strips have their sums checked). The memcpy row's TB/s column divides 50 MB, not its 2 GiB: 2 GiB / 713.5 us
// = 3.01 TB/s.
// Column strips (strip_kernel, strip24_kernel: a block owns whole columns, so no finish at all),
// checked once against the ticket kernel's sums on a non-zero input.
// The streaming loop is column_partials_packed_kernel's (8 rows in flight + 8 next per thread);
// the block-end timing of the static / wave / dynamic shapes is column_sums_block_ends.cu.
#include <cuda_bf16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#include <cmath>
#include <cstdio>
struct __align__(16) P8 { __nv_bfloat16 v[8]; };

// acc[w][j] += column c0 + 256 w + j over rows r, r + step, ... < re: U rows' loads in flight per
// thread, and the next U rows' loads issued before this batch is added.
template <int U, int W>
__device__ void stream_rows(const __nv_bfloat16* x, long C, long c0, long r, long re, long step, float (&acc)[W][8]) {
  P8 cur[U][W], next[U][W];
  auto load = [&](long r, P8 (&p)[U][W]) {
#pragma unroll
    for (int u = 0; u < U; ++u) if (r + u * step < re)
#pragma unroll
      for (int w = 0; w < W; ++w) p[u][w] = *reinterpret_cast<const P8*>(x + (r + u * step) * C + c0 + w * 256);
  };
  if (r < re) load(r, cur);
  for (; r < re; r += U * step) {
    if (r + U * step < re) load(r + U * step, next);
#pragma unroll
    for (int u = 0; u < U; ++u) if (r + u * step < re)
#pragma unroll
      for (int w = 0; w < W; ++w)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[w][j] += __bfloat162float(cur[u][w].v[j]);
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int w = 0; w < W; ++w) cur[u][w] = next[u][w];
  }
}
// acc[w][j] = sum over this thread's rows of [r0, r1) of column cb * 256 W + 8 threadIdx.x + 256 w + j.
template <int W, int LAYOUT>
__device__ void stream_columns(const __nv_bfloat16* x, long C, long r0, long r1, int cb, float (&acc)[W][8]) {
  const long cbase = long(cb) * 256 * W + threadIdx.x * 8;
  long step = 8, rs = r0 + threadIdx.y, re = r1;
  if (LAYOUT == 1) { long per = (r1 - r0 + 7) / 8; rs = r0 + threadIdx.y * per; re = min(rs + per, r1); step = 1; }
  stream_rows<8 / W, W>(x, C, cbase, rs, re, step, acc);
}
template <int W, int LAYOUT>
__device__ void chunkw(const __nv_bfloat16* x, long N, long C, long r0, long r1, int cb, float* partial, long slot) {
  float acc[W][8] = {};
  stream_columns<W, LAYOUT>(x, C, r0, r1, cb, acc);
  __shared__ float tile[8][257];
  for (int w = 0; w < W; ++w) {
    for (int j = 0; j < 8; ++j) tile[threadIdx.y][threadIdx.x * 8 + j] = acc[w][j];
    __syncthreads();
    for (int q = threadIdx.y * 32 + threadIdx.x; q < 256; q += 256) {
      float s = 0; for (int y = 0; y < 8; ++y) s += tile[y][q];
      partial[slot * C + long(cb) * 256 * W + w * 256 + q] = s;
    }
    __syncthreads();
  }
}
template <int W, int LAYOUT>
__global__ void __launch_bounds__(256, 2) static_w(const __nv_bfloat16* x, long N, long C, long rows, float* partial) {
  long r0 = long(blockIdx.y) * rows, r1 = min(r0 + rows, N);
  chunkw<W, LAYOUT>(x, N, C, r0, r1, blockIdx.x, partial, blockIdx.y);
}
__global__ void contiguous_sum(const P8* x, long n, float* out) {
  float acc = 0;
  const long stride = long(gridDim.x) * blockDim.x;
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n; i += 8 * stride) {
    P8 p[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) p[u] = x[i + u * stride];
#pragma unroll
    for (int u = 0; u < 8; ++u) for (int j = 0; j < 8; ++j) acc += __bfloat162float(p[u].v[j]);
  }
  for (; i < n; i += stride) for (int j = 0; j < 8; ++j) acc += __bfloat162float(x[i].v[j]);
  if (acc == 12345.f) out[0] = acc;
}


// Main's fused kernel logic (ticket): partial per split into global, last block per column block sums.
__device__ unsigned g_tickets[64];
template <int FU>
__global__ void __launch_bounds__(256, 2) ticket_kernel(const __nv_bfloat16* x, long N, long C, long rows, float* partial, float* out) {
  long r0 = long(blockIdx.y) * rows, r1 = min(r0 + rows, N);
  chunkw<1, 0>(x, N, C, r0, r1, blockIdx.x, partial, blockIdx.y);
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) last = atomicAdd(&g_tickets[blockIdx.x], 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int q = threadIdx.y * 32 + threadIdx.x;
  const long c = long(blockIdx.x) * 256 + q;
  float s = 0.f;
  for (int k = 0; k < int(gridDim.y); k += FU) {
    float p[FU];
#pragma unroll
    for (int u = 0; u < FU; ++u) p[u] = k + u < int(gridDim.y) ? __ldcg(partial + (k + u) * C + c) : 0.f;
#pragma unroll
    for (int u = 0; u < FU; ++u) if (k + u < int(gridDim.y)) s += p[u];
  }
  out[c] = s;
  if (q == 0) g_tickets[blockIdx.x] = 0;
}
// Cluster of CS blocks along y = all the row splits of one column block: partial tiles reduced through
// distributed shared memory, no global partials, fences or tickets.
template <int CS>
__global__ void __launch_bounds__(256, 2) cluster_kernel(const __nv_bfloat16* x, long N, long C, long rows, float* out) {
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ float tile[8][257];
  __shared__ float part[256];
  long r0 = long(blockIdx.y) * rows, r1 = min(r0 + rows, N);
  float acc[1][8] = {};
  stream_columns<1, 0>(x, C, r0, r1, blockIdx.x, acc);
  for (int j = 0; j < 8; ++j) tile[threadIdx.y][threadIdx.x * 8 + j] = acc[0][j];
  __syncthreads();
  const int q = threadIdx.y * 32 + threadIdx.x;
  { float s = 0; for (int y = 0; y < 8; ++y) s += tile[y][q]; part[q] = s; }
  cluster.sync();
  const unsigned rank = cluster.block_rank();
  constexpr int cols = 256 / CS;
  if (q < cols) {
    const int cq = int(rank) * cols + q;
    float p[CS];
#pragma unroll
    for (int k = 0; k < CS; ++k) p[k] = cluster.map_shared_rank(part, k)[cq];
    float s = 0;
#pragma unroll
    for (int k = 0; k < CS; ++k) s += p[k];
    out[long(blockIdx.x) * 256 + cq] = s;
  }
  cluster.sync();
}
template <int CS>
void launch_cluster(const __nv_bfloat16* x, long N, long C, float* out) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(12, CS); cfg.blockDim = dim3(32, 8);
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension; at[0].val.clusterDim.x = 1; at[0].val.clusterDim.y = CS; at[0].val.clusterDim.z = 1;
  cfg.attrs = at; cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, cluster_kernel<CS>, x, N, C, (N + CS - 1) / CS, out);
}
template <int CS>
void report_clusters() {
  if (CS > 8) cudaFuncSetAttribute(cluster_kernel<CS>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(12, CS); cfg.blockDim = dim3(32, 8);
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension; at[0].val.clusterDim.x = 1; at[0].val.clusterDim.y = CS; at[0].val.clusterDim.z = 1;
  cfg.attrs = at; cfg.numAttrs = 1;
  int n = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&n, cluster_kernel<CS>, &cfg);
  std::printf("cluster %2d: max active clusters %d (%s)\n", CS, n, cudaGetErrorString(e));
}

// Column strips: a block owns CW columns for ALL rows, so there is no cross-block finish at all.
// TPR = CW / 8 threads read a row's 16-byte packs, THREADS / TPR row lanes; U rows in flight
// (+ U next). Lanes of a warp are added by shuffles, the warps in order through shared memory.
template <int CW, int THREADS, int U>
__global__ void __launch_bounds__(THREADS) strip_kernel(const __nv_bfloat16* x, long N, long C, float* out) {
  constexpr int TPR = CW / 8, LANES = THREADS / TPR, WARPS = THREADS / 32;
  const int t = threadIdx.x, pack = t % TPR, lane = t / TPR;
  const long c0 = long(blockIdx.x) * CW + pack * 8;
  float acc2[1][8] = {};
  stream_rows<U, 1>(x, C, c0, lane, N, LANES, acc2);
  float (&acc)[8] = acc2[0];
#pragma unroll
  for (int off = TPR; off < 32; off <<= 1)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], off);
  __shared__ float ws[WARPS][CW];
  const int warp = t / 32, wl = t % 32;
  if (wl < TPR)
#pragma unroll
    for (int j = 0; j < 8; ++j) ws[warp][wl * 8 + j] = acc[j];
  __syncthreads();
  if (t < CW) {
    float s = 0.f;
#pragma unroll 8
    for (int w = 0; w < WARPS; ++w) s += ws[w][t];
    out[blockIdx.x * CW + t] = s;
  }
}

// 24 columns (3 threads x 16 bytes per row): C / 24 = 128 blocks, one per SM on 128 of 132. A warp
// holds 10 rows (lanes 0-29; 30, 31 idle); WARPS warps, row lanes 10 w + l / 3.
template <int WARPS, int U>
__global__ void __launch_bounds__(WARPS * 32) strip24_kernel(const __nv_bfloat16* x, long N, long C, float* out) {
  constexpr int LANES = WARPS * 10;
  const int t = threadIdx.x, warp = t / 32, wl = t % 32;
  const bool active = wl < 30;
  const int pack = wl % 3, lane = warp * 10 + wl / 3;
  const long c0 = long(blockIdx.x) * 24 + pack * 8;
  float acc2[1][8] = {};
  stream_rows<U, 1>(x, C, c0, active ? lane : N, N, LANES, acc2);
  float (&acc)[8] = acc2[0];
  __shared__ float ws[LANES][25];
  if (active)
#pragma unroll
    for (int j = 0; j < 8; ++j) ws[lane][pack * 8 + j] = acc[j];
  __syncthreads();
  __shared__ float ws2[WARPS][24];
  if (t < WARPS * 24) {
    const int c = t % 24, g = t / 24;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 10; ++k) s += ws[g * 10 + k][c];
    ws2[g][c] = s;
  }
  __syncthreads();
  if (t < 24) {
    float s = 0.f;
#pragma unroll
    for (int g = 0; g < WARPS; ++g) s += ws2[g][t];
    out[blockIdx.x * 24 + t] = s;
  }
}

int main() {
  const long N = 8192, C = 3072;
  __nv_bfloat16* x; cudaMalloc(&x, N * C * 2); cudaMemset(x, 0, N * C * 2);
  float* partial; cudaMalloc(&partial, 1024 * C * 4);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  auto time = [&](const char* name, auto launch) {
    for (int i = 0; i < 5; ++i) launch();
    cudaEventRecord(a); for (int i = 0; i < 50; ++i) launch(); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    const double us = ms * 1000 / 50;
    std::printf("%-46s %6.2f us  %.2f TB/s  %s\n", name, us, N * C * 2 / us / 1e6, cudaGetErrorString(cudaGetLastError()));
  };
  char* big; cudaMalloc(&big, 2l << 30);
  report_clusters<8>(); report_clusters<12>(); report_clusters<16>();
  float* out; cudaMalloc(&out, C * 4);
  // a non-zero input, and a check of one variant's sums against the ticket kernel's
  {
    __nv_bfloat16* h = new __nv_bfloat16[N * C];
    for (long i = 0; i < N * C; ++i) h[i] = __float2bfloat16(float((i * 2654435761u) % 1000) / 1000.f - 0.5f);
    cudaMemcpy(x, h, N * C * 2, cudaMemcpyHostToDevice); delete[] h;
  }
  float* out2; cudaMalloc(&out2, C * 4);
  ticket_kernel<8><<<dim3(12, 22), dim3(32, 8)>>>(x, N, C, 373, partial, out);
  auto check = [&](const char* name) {  // out2 against the ticket kernel's out
    float* a = new float[C]; float* b2 = new float[C];
    cudaMemcpy(a, out, C * 4, cudaMemcpyDeviceToHost); cudaMemcpy(b2, out2, C * 4, cudaMemcpyDeviceToHost);
    double worst = 0; for (long c = 0; c < C; ++c) worst = fmax(worst, fabs(a[c] - b2[c]) / (1e-3 + fabs(a[c])));
    std::printf("%s vs ticket: worst relative difference %.3g (sums %g %g)\n", name, worst, a[C - 1], b2[C - 1]);
    delete[] a; delete[] b2;
  };
  strip_kernel<32, 1024, 2><<<96, 1024>>>(x, N, C, out2);
  check("strip 32");
  strip24_kernel<16, 8><<<128, 512>>>(x, N, C, out2);
  check("strip 24");
  for (int rep = 0; rep < 2; ++rep) {
    time("ticket (main's fused), 22 splits, finish 8", [&] { ticket_kernel<8><<<dim3(12, 22), dim3(32, 8)>>>(x, N, C, 373, partial, out); });
    time("ticket, 22 splits, finish 32", [&] { ticket_kernel<32><<<dim3(12, 22), dim3(32, 8)>>>(x, N, C, 373, partial, out); });
    time("cluster 16 (192 blocks), DSMEM finish", [&] { launch_cluster<16>(x, N, C, out); });
    time("cluster 8 (96 blocks), DSMEM finish", [&] { launch_cluster<8>(x, N, C, out); });
    time("cluster 12 (144 blocks), DSMEM finish", [&] { launch_cluster<12>(x, N, C, out); });
    time("memcpy 1 GiB (r+w counted)", [&] { cudaMemcpyAsync(big, big + (1l << 30), 1l << 30, cudaMemcpyDeviceToDevice); });
    time("contiguous sum, 264 x 256", [&] { contiguous_sum<<<264, 256>>>((const P8*)x, N * C / 8, partial); });
    time("contiguous sum, 528 x 256", [&] { contiguous_sum<<<528, 256>>>((const P8*)x, N * C / 8, partial); });
    time("contiguous sum, 1056 x 256", [&] { contiguous_sum<<<1056, 256>>>((const P8*)x, N * C / 8, partial); });
    time("tile W1 interleaved (main), 12 x 22", [&] { static_w<1, 0><<<dim3(12, 22), dim3(32, 8)>>>(x, N, C, 373, partial); });
    time("tile W1 lane subranges, 12 x 22", [&] { static_w<1, 1><<<dim3(12, 22), dim3(32, 8)>>>(x, N, C, 373, partial); });
    time("tile W2 interleaved (1 KB/warp-row), 6 x 44", [&] { static_w<2, 0><<<dim3(6, 44), dim3(32, 8)>>>(x, N, C, 187, partial); });
    time("tile W2 lane subranges, 6 x 44", [&] { static_w<2, 1><<<dim3(6, 44), dim3(32, 8)>>>(x, N, C, 187, partial); });
    time("tile W4 interleaved (2 KB/warp-row), 3 x 88", [&] { static_w<4, 0><<<dim3(3, 88), dim3(32, 8)>>>(x, N, C, 94, partial); });
    time("strip 32 cols, 512 thr, U8 (96 blocks)", [&] { strip_kernel<32, 512, 8><<<96, 512>>>(x, N, C, out2); });
    time("strip 32 cols, 1024 thr, U2 (96 blocks)", [&] { strip_kernel<32, 1024, 2><<<96, 1024>>>(x, N, C, out2); });
    time("strip 24 cols, 32 warps, U2 (128 blocks)", [&] { strip24_kernel<32, 2><<<128, 1024>>>(x, N, C, out2); });
    time("strip 16 cols, 1024 thr, U2 (192 blocks)", [&] { strip_kernel<16, 1024, 2><<<192, 1024>>>(x, N, C, out2); });
    time("strip 64 cols, 1024 thr, U2 (48 blocks)", [&] { strip_kernel<64, 1024, 2><<<48, 1024>>>(x, N, C, out2); });
  }
  return 0;
}
