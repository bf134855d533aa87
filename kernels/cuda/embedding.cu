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
//               2. a stable radix sort of (key, n) over the key's low bits:
//                  equal rows become a contiguous run, in increasing token
//                  order. Up to 8192 tokens (a 774M micro-batch of 8) in
//                  one block (cub::BlockRadixSort, steps 1 and 2 in one
//                  launch); more with cub::DeviceRadixSort (scratch from the
//                  caching allocator, no host synchronisation), whose five
//                  launches took 33 of the backward's 53 us at 8192 tokens
//                  on an H100, its two digit passes on a single block;
//               3. one thread per (sorted position, feature); the thread at
//                  the start of a run walks it: acc = dtable[r, h], then
//                  acc += dout[n, h] token by token, one store. In fp32 this
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
#include <cub/block/block_radix_sort.cuh>
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

/// Steps 1 and 2 for N <= kBlockSortItems tokens in one block: thread t
/// keys tokens t P .. t P + P - 1, the block sorts them over end_bit bits
/// (stable, as the device sort), and writes the first N sorted pairs. Slots
/// past N get key 2^end_bit - 1 >= V and come after every real token (the
/// largest key, and the largest index among equal keys).
constexpr int kBlockSortThreads = 1024, kBlockSortPerThread = 8;
constexpr kindex kBlockSortItems = kindex(kBlockSortThreads) * kBlockSortPerThread;

__global__ void __launch_bounds__(kBlockSortThreads)
    embedding_sort_block_kernel(const std::int32_t* __restrict__ ids, kindex N, kindex V,
                                kindex vocab_begin, int end_bit, std::uint32_t* __restrict__ rows,
                                std::int32_t* __restrict__ tokens) {
  using BlockSort = cub::BlockRadixSort<std::uint32_t, kBlockSortThreads, kBlockSortPerThread,
                                        std::int32_t>;
  __shared__ typename BlockSort::TempStorage scratch;
  std::uint32_t key[kBlockSortPerThread];
  std::int32_t token[kBlockSortPerThread];
  const std::uint32_t padding = std::uint32_t((std::uint64_t(1) << end_bit) - 1);
#pragma unroll
  for (int i = 0; i < kBlockSortPerThread; ++i) {
    const kindex n = kindex(threadIdx.x) * kBlockSortPerThread + i;
    const kindex row = n < N ? kindex(ids[n]) - vocab_begin : -1;
    key[i] = n >= N ? padding : std::uint32_t(row >= 0 && row < V ? row : V);
    token[i] = std::int32_t(n);
  }
  BlockSort(scratch).SortBlockedToStriped(key, token, 0, end_bit);
#pragma unroll
  for (int i = 0; i < kBlockSortPerThread; ++i) {
    const kindex at = kindex(i) * kBlockSortThreads + threadIdx.x;  // striped: coalesced
    if (at < N) {
      rows[at] = key[i];
      tokens[at] = token[i];
    }
  }
}

/// Step 3: the first thread of each run of equal rows sums the run in token order.
template <class T, class G>
__global__ void embedding_runs_kernel(const std::uint32_t* __restrict__ rows,
                                      const std::int32_t* __restrict__ tokens, kindex N,
                                      const T* __restrict__ dout, kindex V, kindex H,
                                      G* __restrict__ dtable) {
  GRID_STRIDE(i, N * H) {
    const kindex j = i / H, h = i % H;
    const std::uint32_t row = rows[j];
    if (row >= V || (j > 0 && rows[j - 1] == row)) continue;
    float acc = load_f(dtable, kindex(row) * H + h);
    for (kindex k = j; k < N && rows[k] == row; ++k)
      acc += load_f(dout, kindex(tokens[k]) * H + h);
    store_f(dtable, kindex(row) * H + h, acc);
  }
}

/// Step 3 on 16-byte packs (H % V == 0 for V = 16 / sizeof(T), dout and
/// dtable 16-byte aligned): thread x of the block takes pack q of a row,
/// thread y a sorted position j (grid-strided), so no index division; the
/// first position of each run loads its V dtable values, adds the run's
/// dout packs in token order and stores once. Per element the same fp32
/// adds in the same order as embedding_runs_kernel: the same bits.
template <class T, class G>
__global__ void embedding_runs_packed_kernel(const std::uint32_t* __restrict__ rows,
                                             const std::int32_t* __restrict__ tokens,
                                             kindex N, const T* __restrict__ dout, kindex V,
                                             kindex row_packs, G* __restrict__ dtable) {
  constexpr int PV = kPack<T>, GP = PV / kPack<G>;  // dtable packs per dout pack
  const kindex q = kindex(blockIdx.x) * blockDim.x + threadIdx.x;
  if (q >= row_packs) return;
  const Pack<T>* dpacks = reinterpret_cast<const Pack<T>*>(dout);
  Pack<G>* tpacks = reinterpret_cast<Pack<G>*>(dtable);
  for (kindex j = kindex(blockIdx.y) * blockDim.y + threadIdx.y; j < N;
       j += kindex(gridDim.y) * blockDim.y) {
    const std::uint32_t row = rows[j];
    if (row >= V || (j > 0 && rows[j - 1] == row)) continue;
    const kindex at = (kindex(row) * row_packs + q) * GP;
    float acc[PV];
#pragma unroll
    for (int s = 0; s < GP; ++s) {
      const Pack<G> g = tpacks[at + s];
#pragma unroll
      for (int e = 0; e < kPack<G>; ++e) acc[s * kPack<G> + e] = to_f(g.v[e]);
    }
    // The run's end first (sorted keys: cache hits), so that the dout
    // loads of four tokens can be in flight together instead of one load
    // waiting on the previous loop test: frequent words make runs of
    // hundreds of tokens. The adds stay in token order.
    kindex end = j + 1;
    while (end < N && rows[end] == row) ++end;
    kindex k = j;
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
      Pack<G> g;
#pragma unroll
      for (int e = 0; e < kPack<G>; ++e) g.v[e] = from_f<G>(acc[s * kPack<G> + e]);
      tpacks[at + s] = g;
    }
  }
}

/// Bits that hold every key 0..V (V is the out-of-shard key).
int key_bits(kindex V) {
  int bits = 1;
  while (bits < 32 && (kindex(1) << bits) <= V) ++bits;
  return bits;
}

/// Sorted (row, token) pairs of the backward, in allocator scratch.
struct SortedRows {
  device::Buffer rows, tokens;
  SortedRows(const std::int32_t* ids, kindex N, kindex V, kindex vocab_begin)
      : rows(std::size_t(N) * sizeof(std::uint32_t)),
        tokens(std::size_t(N) * sizeof(std::int32_t)) {
    MESH_VERIFY(N < (kindex(1) << 31) && V < (kindex(1) << 31) - 1,
                "embedding_backward: " << N << " tokens or " << V << " rows exceed int32");
    const int end_bit = key_bits(V);
    if (N <= kBlockSortItems)
      sort_in_one_block(ids, N, V, vocab_begin, end_bit);
    else
      sort_on_device(ids, N, V, vocab_begin, end_bit);
  }

  void sort_in_one_block(const std::int32_t* ids, kindex N, kindex V, kindex vocab_begin,
                         int end_bit) {
    embedding_sort_block_kernel<<<1, kBlockSortThreads, 0, compute_stream()>>>(
        ids, N, V, vocab_begin, end_bit, rows.as<std::uint32_t>(), tokens.as<std::int32_t>());
    MESH_CUDA_LAUNCHED();
  }

  void sort_on_device(const std::int32_t* ids, kindex N, kindex V, kindex vocab_begin,
                      int end_bit) {
    device::Buffer rows_in(std::size_t(N) * sizeof(std::uint32_t));
    device::Buffer tokens_in(std::size_t(N) * sizeof(std::int32_t));
    embedding_keys_kernel<<<grid_for(N, kThreads), kThreads, 0, compute_stream()>>>(
        ids, N, V, vocab_begin, rows_in.as<std::uint32_t>(), tokens_in.as<std::int32_t>());
    MESH_CUDA_LAUNCHED();
    const int n = int(N);
    std::size_t scratch_bytes = 0;  // a size query: launches nothing
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, scratch_bytes, rows_in.as<std::uint32_t>(), rows.as<std::uint32_t>(),
        tokens_in.as<std::int32_t>(), tokens.as<std::int32_t>(), n, 0, end_bit, compute_stream()));
    device::Buffer scratch(scratch_bytes);
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        scratch.as<void>(), scratch_bytes, rows_in.as<std::uint32_t>(), rows.as<std::uint32_t>(),
        tokens_in.as<std::int32_t>(), tokens.as<std::int32_t>(), n, 0, end_bit, compute_stream()));
    // The scratch buffers go back to the allocator here, reused only by work
    // queued after the sort on the same stream (device_allocator.hpp).
  }
};

/// Block (x: packs of a row, y: sorted positions) of ~256 threads; grid y
/// capped at 65535 (the kernel grid-strides over positions).
template <class T, class G>
void launch_runs_packed(const SortedRows& sorted, kindex N, const T* dout, kindex V, kindex H,
                        G* dtable) {
  const kindex row_packs = H / kPack<T>;
  const int tx = row_packs >= kThreads ? kThreads : int((row_packs + 31) / 32 * 32);
  const int ty = kThreads / tx;
  const kindex y_blocks = (N + ty - 1) / ty;
  const dim3 grid(unsigned((row_packs + tx - 1) / tx),
                  unsigned(y_blocks < 65535 ? y_blocks : 65535));
  embedding_runs_packed_kernel<T, G><<<grid, dim3(tx, ty), 0, compute_stream()>>>(
      sorted.rows.as<std::uint32_t>(), sorted.tokens.as<std::int32_t>(), N, dout, V, row_packs,
      dtable);
  MESH_CUDA_LAUNCHED();
}

template <class T>
__global__ void position_forward_kernel(const T* __restrict__ table, kindex S, kindex N, kindex H,
                                        T* __restrict__ out) {
  GRID_STRIDE(i, N * H) {
    const kindex n = i / H, h = i % H;
    store_f(out, i, load_f(out, i) + load_f(table, (n % S) * H + h));
  }
}

template <class T, class G>
__global__ void position_backward_kernel(const T* __restrict__ dout, kindex N, kindex H, kindex S,
                                         G* __restrict__ dtable) {
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
        embedding_forward_packed_kernel<T, std::uint32_t, U>
            <<<blocks, kThreads, 0, compute_stream()>>>(ids, N, tab, V_local, H, vocab_begin, o);
      else
        embedding_forward_packed_kernel<T, std::uint64_t, U>
            <<<blocks, kThreads, 0, compute_stream()>>>(ids, N, tab, V_local, H, vocab_begin, o);
      MESH_CUDA_LAUNCHED();
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
    const SortedRows sorted(ids, N, V_local, vocab_begin);
    if (H % kPack<T> == 0 && aligned16(dout) && aligned16(dtable)) {
      launch_runs_packed<T, G>(sorted, N, static_cast<const T*>(dout), V_local, H,
                               static_cast<G*>(dtable));
      return;
    }
    embedding_runs_kernel<T, G><<<grid_for(N * H, kThreads), kThreads, 0, compute_stream()>>>(
        sorted.rows.as<std::uint32_t>(), sorted.tokens.as<std::int32_t>(), N,
        static_cast<const T*>(dout), V_local, H, static_cast<G*>(dtable));
    MESH_CUDA_LAUNCHED();
  });
}

void position_embedding_forward(DType t, const void* table, index_t seq_len, index_t N, index_t H,
                                void* out) {
  if (N * H == 0) return;
  with_storage_type(t, "position_embedding_forward", [&](auto zero) {
    using T = decltype(zero);
    position_forward_kernel<T><<<grid_for(N * H, kThreads), kThreads, 0, compute_stream()>>>(
        static_cast<const T*>(table), seq_len, N, H, static_cast<T*>(out));
    MESH_CUDA_LAUNCHED();
  });
}

void position_embedding_backward(DType t, DType g, const void* dout, index_t N, index_t H,
                                 index_t seq_len, void* dtable) {
  if (seq_len * H == 0) return;
  with_storage_and_grad_type(t, g, "position_embedding_backward", [&](auto tz, auto gz) {
    using T = decltype(tz);
    using G = decltype(gz);
    position_backward_kernel<T, G><<<grid_for(seq_len * H, kThreads), kThreads, 0, compute_stream()>>>(
        static_cast<const T*>(dout), N, H, seq_len, static_cast<G*>(dtable));
    MESH_CUDA_LAUNCHED();
  });
}

}  // namespace meshtron::cuda
