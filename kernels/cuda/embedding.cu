// =============================================================== Embedding ==
//
// As kernels/kokkos/embedding.hpp, with one thread per (token, feature):
//   forward   out[n, h] = table[ids[n] - vocab_begin, h] if in this shard,
//             else 0 (the tp all-reduce sums the one non-zero row)
//   backward  dtable[ids[n] - vocab_begin, h] += dout[n, h]. Repeated tokens
//             collide on a row, so the adds are fp32 atomics: the sum is
//             exact up to the order of rounding, which varies between runs
//             (the host walks tokens in order). A bf16/fp16 dtable is never the
//             target of the atomics (each bf16 add would round, and a row
//             hit k times would lose ~k/2 bf16 ulps): the sums go to an fp32
//             scratch table, added to dtable with one rounding at the end.
// Learned positions, out [N = batch * S, H]:
//   forward   out[n, h] += table[n mod S, h]
//   backward  dtable[s, h] += sum_{n mod S = s} dout[n, h], one thread per
//             (s, h) walking the batch in order (no collisions, no atomics)
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "tensor/device_allocator.hpp"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kThreads = 256;

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

template <class T>
__global__ void embedding_backward_kernel(const std::int32_t* __restrict__ ids, kindex N,
                                          const T* __restrict__ dout, kindex V, kindex H,
                                          kindex vocab_begin, float* __restrict__ dtable) {
  GRID_STRIDE(i, N * H) {
    const kindex n = i / H, h = i % H;
    const kindex row = kindex(ids[n]) - vocab_begin;
    if (row >= 0 && row < V) atomicAdd(dtable + row * H + h, load_f(dout, i));
  }
}

template <class T>
__global__ void add_fp32_into_half_kernel(const float* __restrict__ sums, kindex n,
                                          T* __restrict__ dtable) {
  GRID_STRIDE(i, n) store_f(dtable, i, load_f(dtable, i) + sums[i]);
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
    embedding_forward_kernel<T><<<grid_for(N * H, kThreads), kThreads, 0, kStream>>>(
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
    const unsigned grid = grid_for(N * H, kThreads);
    if constexpr (std::is_same_v<G, float>) {
      embedding_backward_kernel<T><<<grid, kThreads, 0, kStream>>>(
          ids, N, static_cast<const T*>(dout), V_local, H, vocab_begin, static_cast<float*>(dtable));
      MESH_CUDA_LAUNCHED();
    } else {
      const kindex n = V_local * H;
      device::Buffer sums(std::size_t(n) * sizeof(float));
      device::zero_bytes(sums.as<float>(), std::size_t(n) * sizeof(float));
      embedding_backward_kernel<T><<<grid, kThreads, 0, kStream>>>(
          ids, N, static_cast<const T*>(dout), V_local, H, vocab_begin, sums.as<float>());
      MESH_CUDA_LAUNCHED();
      add_fp32_into_half_kernel<G><<<grid_for(n, kThreads), kThreads, 0, kStream>>>(
          sums.as<float>(), n, static_cast<G*>(dtable));
      MESH_CUDA_LAUNCHED();
    }
  });
}

void position_embedding_forward(DType t, const void* table, index_t seq_len, index_t N, index_t H,
                                void* out) {
  if (N * H == 0) return;
  with_storage_type(t, "position_embedding_forward", [&](auto zero) {
    using T = decltype(zero);
    position_forward_kernel<T><<<grid_for(N * H, kThreads), kThreads, 0, kStream>>>(
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
    position_backward_kernel<T, G><<<grid_for(seq_len * H, kThreads), kThreads, 0, kStream>>>(
        static_cast<const T*>(dout), N, H, seq_len, static_cast<G*>(dtable));
    MESH_CUDA_LAUNCHED();
  });
}

}  // namespace meshtron::cuda
