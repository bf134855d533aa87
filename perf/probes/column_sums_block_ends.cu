// Build: nvcc -O3 -arch=sm_90 -std=c++17 column_sums_block_ends.cu
// Probe: where does the bf16 column-sum kernel's per-call time go?
// Reads x [N, C] bf16 (N = 8192, C = 3072) like column_partials_packed_kernel (32 packs x 8 row
// lanes per block, rows split among gridDim.y groups, 8 rows in flight + 8 next), records per block
// start/end (globaltimer) and SM id. Variants: static (one wave, 2 blocks/SM), 4 waves (more, smaller
// blocks), dynamic (persistent blocks take chunks from a counter).
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
struct __align__(16) P8 { __nv_bfloat16 v[8]; };
__device__ unsigned long long now() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
__device__ unsigned smid() { unsigned s; asm volatile("mov.u32 %0, %smid;" : "=r"(s)); return s; }
__device__ unsigned g_counter;

__device__ void chunk(const __nv_bfloat16* x, long N, long C, long r0, long r1, int cb, float* partial, long slot) {
  __shared__ float tile[8][257];
  const long c0 = (long(cb) * 32 + threadIdx.x) * 8;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  constexpr int U = 8;
  P8 cur[U], next[U];
  auto load = [&](long r, P8 (&p)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) if (r + u * 8 < r1) p[u] = *reinterpret_cast<const P8*>(x + (r + u * 8) * C + c0);
  };
  long r = r0 + threadIdx.y;
  if (r < r1) load(r, cur);
  for (; r < r1; r += U * 8) {
    if (r + U * 8 < r1) load(r + U * 8, next);
#pragma unroll
    for (int u = 0; u < U; ++u) if (r + u * 8 < r1)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += __bfloat162float(cur[u].v[j]);
#pragma unroll
    for (int u = 0; u < U; ++u) cur[u] = next[u];
  }
  for (int j = 0; j < 8; ++j) tile[threadIdx.y][threadIdx.x * 8 + j] = acc[j];
  __syncthreads();
  for (int q = threadIdx.y * 32 + threadIdx.x; q < 256; q += 256) {
    float s = 0; for (int y = 0; y < 8; ++y) s += tile[y][q];
    partial[slot * C + long(cb) * 256 + q] = s;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(256, 2) static_kernel(const __nv_bfloat16* x, long N, long C, long rows, float* partial, unsigned long long* rec) {
  unsigned long long t0 = now();
  long r0 = long(blockIdx.y) * rows, r1 = min(r0 + rows, N);
  chunk(x, N, C, r0, r1, blockIdx.x, partial, blockIdx.y);
  if (threadIdx.x == 0 && threadIdx.y == 0) { long b = blockIdx.y * gridDim.x + blockIdx.x; rec[3 * b] = t0; rec[3 * b + 1] = now(); rec[3 * b + 2] = smid(); }
}
// persistent: gridDim.x blocks take (column block, chunk) items in order from a counter
__global__ void __launch_bounds__(256, 2) dynamic_kernel(const __nv_bfloat16* x, long N, long C, long rows, int col_blocks, int items, float* partial, unsigned long long* rec) {
  unsigned long long t0 = now();
  __shared__ unsigned item;
  for (;;) {
    if (threadIdx.x == 0 && threadIdx.y == 0) item = atomicAdd(&g_counter, 1u);
    __syncthreads();
    const unsigned it = item;
    __syncthreads();
    if (it >= unsigned(items)) break;
    const int cb = it % col_blocks; const long ch = it / col_blocks;
    chunk(x, N, C, ch * rows, min(ch * rows + rows, N), cb, partial, ch);
  }
  if (threadIdx.x == 0 && threadIdx.y == 0) { rec[3 * blockIdx.x] = t0; rec[3 * blockIdx.x + 1] = now(); rec[3 * blockIdx.x + 2] = smid(); }
}
__global__ void reset() { g_counter = 0; }

int main() {
  const long N = 8192, C = 3072; const int col_blocks = 12;
  __nv_bfloat16* x; cudaMalloc(&x, N * C * 2); cudaMemset(x, 0, N * C * 2);
  float* partial; cudaMalloc(&partial, 1024 * C * 4);
  unsigned long long* rec; cudaMalloc(&rec, 3 * 8192 * 8);
  char* scratch; cudaMalloc(&scratch, 256 << 20);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  auto flush = [&] { cudaMemset(scratch, 1, 256 << 20); };
  struct V { const char* name; int splits; bool dyn; int blocks; };
  std::vector<V> vs = {{"static 22 splits (main)", 22, false, 0}, {"static 44 splits (2 waves)", 44, false, 0},
                       {"static 88 splits (4 waves)", 88, false, 0}, {"dynamic 264 blocks, 88 chunks", 88, true, 264},
                       {"dynamic 264 blocks, 176 chunks", 176, true, 264}};
  for (int rep = 0; rep < 2; ++rep)
  for (auto& v : vs) {
    const long rows = (N + v.splits - 1) / v.splits;
    const int nblocks = v.dyn ? v.blocks : col_blocks * v.splits;
    // back to back: 20 calls, then one timed alone with the record
    auto launch = [&] {
      if (v.dyn) { reset<<<1, 1>>>(); dynamic_kernel<<<v.blocks, dim3(32, 8)>>>(x, N, C, rows, col_blocks, col_blocks * v.splits, partial, rec); }
      else static_kernel<<<dim3(col_blocks, v.splits), dim3(32, 8)>>>(x, N, C, rows, partial, rec);
    };
    for (int i = 0; i < 5; ++i) launch();
    cudaEventRecord(a); for (int i = 0; i < 20; ++i) launch(); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    flush(); launch(); cudaDeviceSynchronize();
    std::vector<unsigned long long> h(3 * nblocks); cudaMemcpy(h.data(), rec, h.size() * 8, cudaMemcpyDeviceToHost);
    unsigned long long t0 = ~0ull, t1 = 0; std::vector<double> ends;
    for (int i = 0; i < nblocks; ++i) { t0 = std::min(t0, h[3 * i]); t1 = std::max(t1, h[3 * i + 1]); }
    for (int i = 0; i < nblocks; ++i) ends.push_back((h[3 * i + 1] - t0) / 1000.0);
    std::sort(ends.begin(), ends.end());
    const double per_call = ms * 1000 / 20;
    std::printf("%-34s per call b2b %6.2f us (%.2f TB/s) | alone span %6.2f us, block ends: min %6.2f p10 %6.2f p50 %6.2f p90 %6.2f max %6.2f\n",
                v.name, per_call, N * C * 2 / per_call / 1e6, (t1 - t0) / 1000.0, ends.front(), ends[ends.size() / 10],
                ends[ends.size() / 2], ends[ends.size() * 9 / 10], ends.back());
    if (rep == 1 && !v.dyn && v.splits == 22) {  // per-SM end time spread for main's shape
      std::vector<double> sm_end(200, 0);
      for (int i = 0; i < nblocks; ++i) sm_end[h[3 * i + 2]] = std::max(sm_end[h[3 * i + 2]], (h[3 * i + 1] - t0) / 1000.0);
      std::printf("  per-SM last block end (us), SM 0..: ");
      for (int s = 0; s < 132; ++s) std::printf("%.1f ", sm_end[s]);
      std::printf("\n");
    }
  }
  // reference: contiguous read (sum) grid-stride, many blocks
  return 0;
}
