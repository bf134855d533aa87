// =============================================================== Embedding ==
//
// As kernels/kokkos/embedding.hpp, with one thread per (token, feature):
//   forward   out[n, h] = table[ids[n] - vocab_begin, h] if in this shard,
//             else 0 (the tp all-reduce sums the one non-zero row)
//   backward  dtable[r, h] += sum_{n: ids[n] - vocab_begin = r} dout[n, h],
//             deterministic: repeated ids add in token order, every run.
//             Atomics would make the order (so the fp32 rounding) depend on
//             thread scheduling, and a recompute run could not reproduce a
//             plain one bit for bit. Instead:
//               1. key[n] = shard row of ids[n] (V for ids outside the
//                  shard), value[n] = n;
//               2. a stable sort of (key, n) by key: equal rows become a
//                  contiguous run, in increasing token order. Up to 8192
//                  tokens (a 774M micro-batch of 8) in one launch of
//                  embedding_sort_ranges_kernel (steps 1 and 2; each block
//                  sorts a range of keys, see there); more tokens with
//                  cub::DeviceRadixSort over the key's low bits (scratch from
//                  the caching allocator, no host synchronisation), whose
//                  five launches would take 33 of the backward's 53 us at 8192
//                  tokens on an H100, its two digit passes on a single block;
//               3. one thread per (sorted position, feature); the thread at
//                  the start of a run (the sort writes runs[j] = (row,
//                  length) there, length 0 elsewhere, so no thread compares
//                  neighbouring rows or searches for the run's end) walks
//                  it: acc = dtable[r, h], then acc += dout[n, h] token by
//                  token, one store. Launched as the sort's programmatic
//                  dependent. In fp32 this
//                  is the host's order and rounding exactly; a bf16/fp16
//                  dtable is rounded once, at the store. Packed (H a
//                  multiple of V = 16 / sizeof(T), dout and dtable 16-byte
//                  aligned): one thread per (sorted position, 16-byte pack
//                  of dout), positions on grid y, so no per-element 64-bit
//                  division (emulated on the GPU: dozens of instructions)
//                  and 16-byte instead of 2- or 4-byte loads; the same adds
//                  in the same order per element, so the same bits.
//             Used for word ids and, through the model, for positions.
// Forward, packed (H a multiple of V = 16 / sizeof(T), table and out
// 16-byte aligned): four 16-byte packs of output per thread (all four ids
// loads, then all four table loads, then the stores: 64 bytes in flight per
// thread where one pack behind a dependent ids load left ~16), 32-bit
// index math when the pack count fits; each element goes through the same
// load_f / store_f conversions as the scalar kernel (an exact round trip
// for every finite value), so the same bits. Otherwise the scalar kernel.
// Learned positions, out [N = batch * S, H]:
//   forward   out[n, h] += table[n mod S, h]
//   backward  dtable[s, h] += sum_{n mod S = s} dout[n, h], one thread per
//             (s, h) walking the batch in order (no collisions, no atomics)
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "tensor/device_allocator.hpp"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kForwardPacksPerThread = 4;  // 64 bytes of loads in flight per thread
constexpr int kRunUnroll = 4;              // dout loads in flight per run walk

template <class T>
__global__ void embedding_forward_kernel(const std::int32_t* __restrict__ ids, kindex N,
                                         const T* __restrict__ table, kindex V, kindex H,
                                         kindex vocab_begin, T* __restrict__ out) {
  GRID_STRIDE(i, N * H) {
    const kindex n = i / H, h = i % H;
    const kindex row = kindex(ids[n]) - vocab_begin;
    store_f(out, i, row >= 0 && row < V ? load_f(table, row * H + h) : 0.f);
  }
}

/// Pack k of the output: row n = k / row_packs, pack q of it.
template <class T, class I, int U>
__global__ void embedding_forward_packed_kernel(const std::int32_t* __restrict__ ids, kindex N,
                                                const T* __restrict__ table, kindex V,
                                                kindex H, kindex vocab_begin,
                                                T* __restrict__ out) {
  start_after_prior_grid();
  const I row_packs = I(H / kPack<T>);
  const kindex packs = N * kindex(row_packs);
  const kindex stride = kindex(gridDim.x) * blockDim.x;
  for (kindex k0 = kindex(blockIdx.x) * blockDim.x + threadIdx.x; k0 < packs; k0 += U * stride) {
    // U packs per thread, stride apart: all ids loads, then all table
    // loads, then the stores, so U independent 16-byte loads are in flight.
    kindex row[U];
    I q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const kindex k = k0 + u * stride;
      row[u] = -1;
      q[u] = 0;
      if (k < packs) {
        const I n = I(k) / row_packs;
        q[u] = I(k) - n * row_packs;
        row[u] = kindex(ids[n]) - vocab_begin;
      }
    }
    Pack<T> t[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (row[u] >= 0 && row[u] < V)
        t[u] = reinterpret_cast<const Pack<T>*>(table)[row[u] * kindex(row_packs) + q[u]];
      else
#pragma unroll
        for (int j = 0; j < kPack<T>; ++j) t[u].v[j] = from_f<T>(0.f);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const kindex k = k0 + u * stride;
      if (k >= packs) continue;
      Pack<T> o;
#pragma unroll
      for (int j = 0; j < kPack<T>; ++j) o.v[j] = from_f<T>(to_f(t[u].v[j]));
      reinterpret_cast<Pack<T>*>(out)[k] = o;
    }
  }
}

/// Step 1: sort keys (shard row, or V for "not in this shard") and token indices.
__global__ void embedding_keys_kernel(const std::int32_t* __restrict__ ids, kindex N, kindex V,
                                      kindex vocab_begin, std::uint32_t* __restrict__ rows,
                                      std::int32_t* __restrict__ tokens) {
  GRID_STRIDE(n, N) {
    const kindex row = kindex(ids[n]) - vocab_begin;
    rows[n] = std::uint32_t(row >= 0 && row < V ? row : V);
    tokens[n] = std::int32_t(n);
  }
}

/// Steps 1 and 2 for N <= kRangeSortTokens tokens, spread over the GPU:
/// block b owns the keys [b R, b R + R) (R = rows_per_block; key V means
/// "not in this shard"). Every block reads all N ids (32 KB, coalesced; L2
/// hits after the first block), so it knows without talking to other blocks
/// how many keys fall below its range (where its pairs start in the sorted
/// arrays) and which tokens are its own. It lists those in token order
/// (warp w of 32 reads tokens w 256 .. w 256 + 255 in rounds of 32; ballots
/// give each its place), counts them per key in shared memory, and one warp places
/// them in rounds of 32 (stable: lanes of one key by lane, rounds in list
/// order). So the output is the (key, token) order of a stable sort by key:
/// the order cub's one-block radix sort gave, which took four dependent
/// 4-bit passes on a single SM.
constexpr int kRangeThreads = 1024, kRangeWarps = kRangeThreads / 32;
constexpr int kRangeRounds = 8;  // of 32 ids per warp
constexpr kindex kRangeSortTokens = kindex(kRangeWarps) * kRangeRounds * 32;  // 8192
constexpr kindex kRangeMinRowsPerBlock = 256;
constexpr kindex kRangeMaxRowsPerBlock = 16384;  // 64 KB of counters beside the 32 KB list
constexpr std::uint32_t kNotMine = 0xffffffffu;

__global__ void __launch_bounds__(kRangeThreads)
    embedding_sort_ranges_kernel(const std::int32_t* __restrict__ ids, int N, int V,
                                 int vocab_begin, int rows_per_block,
                                 uint2* __restrict__ runs, std::int32_t* __restrict__ tokens) {
  // Steps 1-3 read only ids and shared memory, so they run before the wait
  // for the previous kernel (the last call's accumulation, when calls come
  // back to back, which lets this kernel start once it has waited itself):
  // it cannot have written ids, which the forward read after their writer
  // (common.cuh). The writes of steps 4-5 (runs and tokens may be scratch
  // the previous kernel still reads) come after the wait. H200,
  // embedding_backward bf16 [8192, 768] 0.87 of the copy against 0.82-0.83
  // with steps 1-3 after the wait, fp32 768 0.81 against 0.77-0.78, 1280
  // 0.78-0.79 against 0.76-0.78 (perf/bench_cuda_ops memory).
  __shared__ std::uint32_t list[kRangeSortTokens];  // (key - first) << 16 | token, token order
  __shared__ int warp_listed[kRangeWarps], warp_below[kRangeWarps];
  __shared__ typename cub::BlockScan<int, kRangeThreads>::TempStorage scan_scratch;
  extern __shared__ int cursor[];  // per key of the range: its count, then its next slot
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const unsigned lanes_before = (1u << lane) - 1u;
  const int first = int(blockIdx.x) * rows_per_block;
  const int range = V + 1 - first < rows_per_block ? V + 1 - first : rows_per_block;
  for (int c = threadIdx.x; c < range; c += kRangeThreads) cursor[c] = 0;
  // 1. This warp's ids: which are in the range (local key), how many are
  //    below it. All loads first, then the ballots. (256 threads of 32
  //    rounds each, one load behind each round's ballot, take 12.8-15.7 us
  //    for 8192 ids on an H100, Nsight Compute: a chain of ~1900 dependent
  //    instructions per warp with 3 warps per scheduler to hide them.)
  std::int32_t id[kRangeRounds];
#pragma unroll
  for (int r = 0; r < kRangeRounds; ++r) {
    const int n = (warp * kRangeRounds + r) * 32 + lane;
    id[r] = n < N ? ids[n] : 0;
  }
  std::uint32_t local[kRangeRounds];
  int listed = 0, below = 0;
#pragma unroll
  for (int r = 0; r < kRangeRounds; ++r) {
    const int n = (warp * kRangeRounds + r) * 32 + lane;
    const int row = id[r] - vocab_begin;
    const int key = n >= N ? V + 1 : row >= 0 && row < V ? row : V;  // V + 1: padding
    below += key < first;
    const bool mine = key >= first && key < first + range;
    local[r] = mine ? std::uint32_t(key - first) : kNotMine;
    listed += __popc(__ballot_sync(0xffffffffu, mine));
  }
  below = warp_sum(below);
  if (lane == 0) warp_listed[warp] = listed, warp_below[warp] = below;
  __syncthreads();
  int list_at = 0, start = 0, total = 0;  // start: pairs of keys below this range
  for (int w = 0; w < kRangeWarps; ++w) {
    list_at += w < warp ? warp_listed[w] : 0;
    total += warp_listed[w];
    start += warp_below[w];
  }
  // 2. The list in token order, and the counts per key.
#pragma unroll
  for (int r = 0; r < kRangeRounds; ++r) {
    const bool mine = local[r] != kNotMine;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (mine) {
      const int n = (warp * kRangeRounds + r) * 32 + lane;
      list[list_at + __popc(ballot & lanes_before)] = local[r] << 16 | std::uint32_t(n);
      atomicAdd(&cursor[local[r]], 1);  // a count: the same whatever the order
    }
    list_at += __popc(ballot);
  }
  __syncthreads();
  // 3. Exclusive scan of the counts: thread t owns keys t C .. t C + C - 1.
  const int per_thread = (range + kRangeThreads - 1) / kRangeThreads;
  const int c0 = int(threadIdx.x) * per_thread, c1 = c0 + per_thread < range ? c0 + per_thread : range;
  int count = 0;
  for (int c = c0; c < c1; ++c) count += cursor[c];
  int slot = 0;
  cub::BlockScan<int, kRangeThreads>(scan_scratch).ExclusiveSum(count, slot);
  for (int c = c0; c < c1; ++c) {
    const int k = cursor[c];
    cursor[c] = slot;
    slot += k;
  }
  __syncthreads();
  start_after_prior_grid();  // and the accumulation's blocks start up while this places
  // 4. Stable placement by warp 0, 32 list entries per round.
  for (int base = 0; warp == 0 && base < total; base += 32) {
    const int i = base + lane;
    const bool valid = i < total;
    const std::uint32_t entry = valid ? list[i] : 0u;
    const std::uint32_t key = valid ? entry >> 16 : 0x10000u + lane;  // no real key is >= 2^16
    const unsigned peers = __match_any_sync(0xffffffffu, key);
    const int rank = __popc(peers & lanes_before);
    if (valid) {
      const int at = start + cursor[key] + rank;
      runs[at] = make_uint2(std::uint32_t(first) + key, 0u);
      tokens[at] = std::int32_t(entry & 0xffffu);
    }
    __syncwarp();
    if (valid && rank == 0) cursor[key] += __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  // 5. Run lengths at run starts (the cursors now hold each key's end, the
  //    next key's start); key V (outside the shard) keeps length 0. By all
  //    threads, after step 4's barrier (by warp 0 alone it takes ~12 rounds
  //    at GPT-2's 381 keys per block): with the accumulation's early first
  //    token, embedding_backward bf16 [8192, 768] 0.93 of an H200's copy
  //    against 0.87 by warp 0, bf16 1280 0.82 against 0.79, fp32 768 0.84
  //    against 0.81, fp32 1280 0.80 against 0.78 (perf/bench_cuda_ops
  //    memory).
  for (int c = threadIdx.x; c < range && first + c < V; c += kRangeThreads) {
    const int begin = c > 0 ? cursor[c - 1] : 0, length = cursor[c] - begin;
    if (length > 0) runs[start + begin] = make_uint2(std::uint32_t(first + c), std::uint32_t(length));
  }
}

/// runs[j] for the device-wide sort's sorted rows: (row, run length) where
/// a run of a row < V starts at j, else (row, 0).
__global__ void embedding_mark_runs_kernel(const std::uint32_t* __restrict__ rows, kindex N,
                                           kindex V, uint2* __restrict__ runs) {
  GRID_STRIDE(j, N) {
    const std::uint32_t row = rows[j];
    kindex end = j;
    if (row < V && (j == 0 || rows[j - 1] != row))
      while (end < N && rows[end] == row) ++end;
    runs[j] = make_uint2(row, std::uint32_t(end - j));
  }
}

/// Step 3: the first thread of each run of equal rows sums the run in token order.
template <class T, class G>
__global__ void embedding_runs_kernel(const uint2* __restrict__ runs,
                                      const std::int32_t* __restrict__ tokens, kindex N,
                                      const T* __restrict__ dout, kindex H,
                                      G* __restrict__ dtable) {
  start_after_prior_grid();  // the sort (when launched as its dependent)
  GRID_STRIDE(i, N * H) {
    const kindex j = i / H, h = i % H;
    const uint2 run = runs[j];
    if (run.y == 0) continue;
    float acc = load_f(dtable, kindex(run.x) * H + h);
    for (kindex k = j; k < j + run.y; ++k) acc += load_f(dout, kindex(tokens[k]) * H + h);
    store_f(dtable, kindex(run.x) * H + h, acc);
  }
}

/// Step 3 on 16-byte packs (H % V == 0 for V = 16 / sizeof(T), dout and
/// dtable 16-byte aligned): thread x of the block takes pack q of a row,
/// thread y a sorted position j (grid-strided), so no index division; the
/// first position of each run loads its V dtable values, adds the run's
/// dout packs in token order and stores once. Per element the same fp32
/// adds in the same order as embedding_runs_kernel: the same bits.
template <class T, class G>
__global__ void embedding_runs_packed_kernel(const uint2* __restrict__ runs,
                                             const std::int32_t* __restrict__ tokens,
                                             kindex N, const T* __restrict__ dout,
                                             kindex row_packs, G* __restrict__ dtable) {
  constexpr int PV = kPack<T>, GP = PV / kPack<G>;  // dtable packs per dout pack
  // 16-bit rows load a run's first token beside the run itself, not after
  // it (where the compiler sinks a plain load, below the branch): the first
  // dout load then waits for one L2 round trip, not two. Not fp32's: its
  // kernel takes 43 registers with it instead of 32, 4 blocks of 320 threads
  // per SM instead of 6 (fp32 [8192, 1280] 0.70 of the copy against 0.78
  // without), and capped at 32 it spills (0.59; perf/bench_cuda_ops
  // memory).
  constexpr bool kEarlyToken = sizeof(T) < 4;
  // The sort (when launched as its dependent); then the next call's sort
  // may start its reads of ids while this kernel runs.
  start_after_prior_grid();
  const kindex q = kindex(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= row_packs) return;
  const Pack<T>* dpacks = reinterpret_cast<const Pack<T>*>(dout);
  Pack<G>* tpacks = reinterpret_cast<Pack<G>*>(dtable);
  for (kindex j = kindex(blockIdx.y) * blockDim.y + threadIdx.y; j < N;
       j += kindex(gridDim.y) * blockDim.y) {
    const uint2 run = runs[j];
    std::int32_t first_token = 0;
    if constexpr (kEarlyToken) first_token = load_unconditionally(tokens + j);
    if (run.y == 0) continue;
    const kindex at = (kindex(run.x) * row_packs + q) * GP, end = j + run.y;
    // The dtable loads and the run's first dout loads go out together;
    // frequent words make runs of hundreds of tokens, walked four dout
    // loads at a time. The adds stay in token order.
    Pack<G> g[GP];
#pragma unroll
    for (int s = 0; s < GP; ++s) g[s] = tpacks[at + s];
    float acc[PV];
#pragma unroll
    for (int s = 0; s < GP; ++s)
#pragma unroll
      for (int e = 0; e < kPack<G>; ++e) acc[s * kPack<G> + e] = to_f(g[s].v[e]);
    kindex k = j;
    if constexpr (kEarlyToken) {
      const Pack<T> d = dpacks[kindex(first_token) * row_packs + q];
#pragma unroll
      for (int e = 0; e < PV; ++e) acc[e] += to_f(d.v[e]);
      ++k;
    }
    for (; k + kRunUnroll <= end; k += kRunUnroll) {
      Pack<T> d[kRunUnroll];
#pragma unroll
      for (int u = 0; u < kRunUnroll; ++u) d[u] = dpacks[kindex(tokens[k + u]) * row_packs + q];
#pragma unroll
      for (int u = 0; u < kRunUnroll; ++u)
#pragma unroll
        for (int e = 0; e < PV; ++e) acc[e] += to_f(d[u].v[e]);
    }
    for (; k < end; ++k) {
      const Pack<T> d = dpacks[kindex(tokens[k]) * row_packs + q];
#pragma unroll
      for (int e = 0; e < PV; ++e) acc[e] += to_f(d.v[e]);
    }
#pragma unroll
    for (int s = 0; s < GP; ++s) {
#pragma unroll
      for (int e = 0; e < kPack<G>; ++e) g[s].v[e] = from_f<G>(acc[s * kPack<G> + e]);
      tpacks[at + s] = g[s];
    }
  }
}

/// Bits that hold every key 0..V (V is the out-of-shard key).
int key_bits(kindex V) {
  int bits = 1;
  while (bits < 32 && (kindex(1) << bits) <= V) ++bits;
  return bits;
}

/// Keys (rows 0 .. V - 1 and V) per block of the range sort: at most one
/// block per SM (a block of 1024 threads holds an SM), at least 256 keys.
kindex range_rows_per_block(kindex V) {
  static const kindex sms = multiprocessor_count();  // one GPU per process
  const kindex per_sm = (V + 1 + sms - 1) / sms;
  return per_sm > kRangeMinRowsPerBlock ? per_sm : kRangeMinRowsPerBlock;
}

/// The backward's tokens sorted by row (stable) and their runs: runs[j] =
/// (row, length) where a run of a row of the shard starts at j, (row, 0)
/// elsewhere. In allocator scratch.
struct SortedRuns {
  device::Buffer runs, tokens;
  SortedRuns(const std::int32_t* ids, kindex N, kindex V, kindex vocab_begin)
      : runs(std::size_t(N) * sizeof(uint2)), tokens(std::size_t(N) * sizeof(std::int32_t)) {
    MESH_VERIFY(N < (kindex(1) << 31) && V < (kindex(1) << 31) - 1,
                "embedding_backward: " << N << " tokens or " << V << " rows exceed int32");
    const kindex rows_per_block = range_rows_per_block(V);
    if (N <= kRangeSortTokens && rows_per_block <= kRangeMaxRowsPerBlock &&
        vocab_begin < (kindex(1) << 31) - V)  // int32 key arithmetic
      sort_by_ranges(ids, N, V, vocab_begin, rows_per_block);
    else
      sort_on_device(ids, N, V, vocab_begin);
  }

  void sort_by_ranges(const std::int32_t* ids, kindex N, kindex V, kindex vocab_begin,
                      kindex rows_per_block) {
    const kindex keys = V + 1;  // V: not in this shard
    const unsigned blocks = unsigned((keys + rows_per_block - 1) / rows_per_block);
    const std::size_t cursor_bytes = std::size_t(rows_per_block) * sizeof(int);
    // Beside its ~37 KB of static shared memory, counters past 8 KB take it
    // past the 48 KB default.
    opt_in_max_shared_memory<embedding_sort_ranges_kernel>();
    launch_dependent(embedding_sort_ranges_kernel, blocks, kRangeThreads, cursor_bytes,
                     compute_stream(), ids, int(N), int(V), int(vocab_begin), int(rows_per_block),
                     runs.as<uint2>(), tokens.as<std::int32_t>());
  }

  void sort_on_device(const std::int32_t* ids, kindex N, kindex V, kindex vocab_begin) {
    device::Buffer rows_in(std::size_t(N) * sizeof(std::uint32_t));
    device::Buffer tokens_in(std::size_t(N) * sizeof(std::int32_t));
    device::Buffer rows(std::size_t(N) * sizeof(std::uint32_t));
    embedding_keys_kernel<<<grid_for(N, kThreads), kThreads, 0, compute_stream()>>>(
        ids, N, V, vocab_begin, rows_in.as<std::uint32_t>(), tokens_in.as<std::int32_t>());
    MESH_CUDA_LAUNCHED();
    const int n = int(N), end_bit = key_bits(V);
    std::size_t scratch_bytes = 0;  // a size query: launches nothing
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, scratch_bytes, rows_in.as<std::uint32_t>(), rows.as<std::uint32_t>(),
        tokens_in.as<std::int32_t>(), tokens.as<std::int32_t>(), n, 0, end_bit, compute_stream()));
    device::Buffer scratch(scratch_bytes);
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        scratch.as<void>(), scratch_bytes, rows_in.as<std::uint32_t>(), rows.as<std::uint32_t>(),
        tokens_in.as<std::int32_t>(), tokens.as<std::int32_t>(), n, 0, end_bit, compute_stream()));
    embedding_mark_runs_kernel<<<grid_for(N, kThreads), kThreads, 0, compute_stream()>>>(
        rows.as<std::uint32_t>(), N, V, runs.as<uint2>());
    MESH_CUDA_LAUNCHED();
    // The scratch buffers go back to the allocator here, reused only by work
    // queued after the sort on the same stream (device_allocator.hpp).
  }
};

/// Most threads of one block along a row's packs (x) in the packed walk.
constexpr kindex kMaxRunRowThreads = 512;

/// Block (x: packs of a row, y: sorted positions) of ~256 threads, or one
/// row of up to kMaxRunRowThreads packs (wider rows: the fewest x blocks,
/// split evenly); grid y capped at 65535 (the kernel grid-strides over
/// positions). Launched as the sort's programmatic dependent. (Rows cut
/// into 256-thread x blocks would give fp32 H = 1280, 320 packs, two blocks
/// per position with 192 of their 512 threads idle.)
template <class T, class G>
void launch_runs_packed(const SortedRuns& sorted, kindex N, const T* dout, kindex H, G* dtable) {
  const kindex row_packs = H / kPack<T>;
  const kindex x_blocks = (row_packs + kMaxRunRowThreads - 1) / kMaxRunRowThreads;
  const int tx = int(((row_packs + x_blocks - 1) / x_blocks + 31) / 32 * 32);
  const int ty = tx >= kThreads ? 1 : kThreads / tx;
  const kindex y_blocks = (N + ty - 1) / ty;
  const dim3 grid(unsigned((row_packs + tx - 1) / tx),
                  unsigned(y_blocks < 65535 ? y_blocks : 65535));
  launch_dependent(embedding_runs_packed_kernel<T, G>, grid, dim3(tx, ty), 0, compute_stream(),
                   sorted.runs.as<uint2>(), sorted.tokens.as<std::int32_t>(), N, dout,
                   row_packs, dtable);
}

template <class T>
__global__ void position_forward_kernel(const T* __restrict__ table, kindex S, kindex N, kindex H,
                                        T* __restrict__ out) {
  start_after_prior_grid();
  GRID_STRIDE(i, N * H) {
    const kindex n = i / H, h = i % H;
    store_f(out, i, load_f(out, i) + load_f(table, (n % S) * H + h));
  }
}

template <class T, class G>
__global__ void position_backward_kernel(const T* __restrict__ dout, kindex N, kindex H, kindex S,
                                         G* __restrict__ dtable) {
  start_after_prior_grid();
  GRID_STRIDE(i, S * H) {
    const kindex s = i / H, h = i % H;
    float sum = 0.f;
    for (kindex n = s; n < N; n += S) sum += load_f(dout, n * H + h);
    store_f(dtable, i, load_f(dtable, i) + sum);
  }
}

}  // namespace

void embedding_forward(DType t, const std::int32_t* ids, index_t N, const void* table,
                       index_t V_local, index_t H, index_t vocab_begin, void* out) {
  if (N * H == 0) return;
  with_storage_type(t, "embedding_forward", [&](auto zero) {
    using T = decltype(zero);
    if (H % kPack<T> == 0 && aligned16(table) && aligned16(out)) {
      const kindex packs = N * (H / kPack<T>);
      const auto* tab = static_cast<const T*>(table);
      T* o = static_cast<T*>(out);
      constexpr int U = kForwardPacksPerThread;
      const unsigned blocks = grid_for((packs + U - 1) / U, kThreads);
      if (packs < kindex(UINT32_MAX))  // 32-bit index division where it fits
        launch_dependent(embedding_forward_packed_kernel<T, std::uint32_t, U>, blocks, kThreads, 0,
                         compute_stream(), ids, N, tab, V_local, H, vocab_begin, o);
      else
        launch_dependent(embedding_forward_packed_kernel<T, std::uint64_t, U>, blocks, kThreads, 0,
                         compute_stream(), ids, N, tab, V_local, H, vocab_begin, o);
      return;
    }
    embedding_forward_kernel<T><<<grid_for(N * H, kThreads), kThreads, 0, compute_stream()>>>(
        ids, N, static_cast<const T*>(table), V_local, H, vocab_begin, static_cast<T*>(out));
    MESH_CUDA_LAUNCHED();
  });
}

void embedding_backward(DType t, DType g, const std::int32_t* ids, index_t N, const void* dout,
                        index_t V_local, index_t H, index_t vocab_begin, void* dtable) {
  if (N * H == 0) return;
  with_storage_and_grad_type(t, g, "embedding_backward", [&](auto tz, auto gz) {
    using T = decltype(tz);
    using G = decltype(gz);
    const SortedRuns sorted(ids, N, V_local, vocab_begin);
    if (H % kPack<T> == 0 && aligned16(dout) && aligned16(dtable)) {
      launch_runs_packed<T, G>(sorted, N, static_cast<const T*>(dout), H, static_cast<G*>(dtable));
      return;
    }
    embedding_runs_kernel<T, G><<<grid_for(N * H, kThreads), kThreads, 0, compute_stream()>>>(
        sorted.runs.as<uint2>(), sorted.tokens.as<std::int32_t>(), N,
        static_cast<const T*>(dout), H, static_cast<G*>(dtable));
    MESH_CUDA_LAUNCHED();
  });
}

void position_embedding_forward(DType t, const void* table, index_t seq_len, index_t N, index_t H,
                                void* out) {
  if (N * H == 0) return;
  with_storage_type(t, "position_embedding_forward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(position_forward_kernel<T>, grid_for(N * H, kThreads), kThreads, 0,
                     compute_stream(), static_cast<const T*>(table), seq_len, N, H,
                     static_cast<T*>(out));
  });
}

void position_embedding_backward(DType t, DType g, const void* dout, index_t N, index_t H,
                                 index_t seq_len, void* dtable) {
  if (seq_len * H == 0) return;
  with_storage_and_grad_type(t, g, "position_embedding_backward", [&](auto tz, auto gz) {
    using T = decltype(tz);
    using G = decltype(gz);
    launch_dependent(position_backward_kernel<T, G>, grid_for(seq_len * H, kThreads), kThreads, 0,
                     compute_stream(), static_cast<const T*>(dout), N, H, seq_len,
                     static_cast<G*>(dtable));
  });
}

}  // namespace meshtron::cuda
