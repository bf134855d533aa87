// ============================================ Vocab-parallel cross-entropy ==
//
// Megatron's three local passes of kernels/kokkos/cross_entropy.hpp (see its
// comment for the math and where the tp all-reduces go), on logits
// [N, V_local] in fp32 or bf16 with fp32 per-row statistics:
//   row_max    m = max of the valid local columns (-inf if none)
//   partials   sum_exp = sum exp(l - m) (0 if none), target_logit = l[t] - m
//              if the target is local, else 0
//   loss       log(sum_exp) - target_logit
//   backward   dlogits = dloss exp(l - m) / Z - dloss [v == t], 0 in padding;
//              written in bf16/fp16 straight from fp32 logits when asked
// One block per row: a row is a whole vocabulary shard (thousands of
// columns), read with coalesced strides by 256 threads and reduced through
// shared memory.
#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void row_max_kernel(const T* __restrict__ logits, kindex V, kindex valid,
                               float* __restrict__ row_max) {
  __shared__ float scratch[32];
  const T* l = logits + kindex(blockIdx.x) * V;
  float m = -INFINITY;
  for (kindex v = threadIdx.x; v < valid; v += blockDim.x) m = fmaxf(m, load_f(l, v));
  m = block_max(m, scratch);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <class T>
__global__ void partials_kernel(const T* __restrict__ logits,
                                const std::int32_t* __restrict__ targets,
                                const float* __restrict__ row_max, kindex V, kindex vocab_begin,
                                kindex valid, float* __restrict__ sum_exp,
                                float* __restrict__ target_logit) {
  __shared__ float scratch[32];
  const kindex n = blockIdx.x;
  const T* l = logits + n * V;
  const float m = row_max[n];
  float sum = 0.f;
  for (kindex v = threadIdx.x; v < valid; v += blockDim.x) sum += expf(load_f(l, v) - m);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    const kindex t = kindex(targets[n]) - vocab_begin;
    sum_exp[n] = sum;
    target_logit[n] = (t >= 0 && t < valid) ? load_f(l, t) - m : 0.f;
  }
}

__global__ void loss_kernel(const float* __restrict__ sum_exp,
                            const float* __restrict__ target_logit, kindex N,
                            float* __restrict__ loss) {
  GRID_STRIDE(n, N) loss[n] = float(log(double(sum_exp[n])) - double(target_logit[n]));
}

template <class T, class O>
__global__ void backward_kernel(const T* __restrict__ logits,
                                const std::int32_t* __restrict__ targets,
                                const float* __restrict__ row_max,
                                const float* __restrict__ sum_exp,
                                const float* __restrict__ dloss, kindex V, kindex vocab_begin,
                                kindex valid, O* __restrict__ dlogits) {
  const kindex n = blockIdx.x;
  const T* l = logits + n * V;
  O* d = dlogits + n * V;
  const float m = row_max[n], dl = dloss[n];
  const float scale = float(double(dl) / double(sum_exp[n]));  // dloss / Z
  const kindex t = kindex(targets[n]) - vocab_begin;
  for (kindex v = threadIdx.x; v < V; v += blockDim.x) {
    float g = 0.f;
    if (v < valid) g = scale * expf(load_f(l, v) - m) - (v == t ? dl : 0.f);
    store_f(d, v, g);
  }
}

}  // namespace

void cross_entropy_row_max(DType t, const void* logits, index_t N, index_t V_local,
                           index_t valid_local, float* row_max) {
  if (N == 0) return;
  with_storage_type(t, "cross_entropy_row_max", [&](auto zero) {
    using T = decltype(zero);
    row_max_kernel<T><<<unsigned(N), kThreads, 0, kStream>>>(static_cast<const T*>(logits),
                                                             V_local, valid_local, row_max);
    MESH_CUDA_LAUNCHED();
  });
}

void cross_entropy_partials(DType t, const void* logits, const std::int32_t* targets,
                            const float* row_max, index_t N, index_t V_local, index_t vocab_begin,
                            index_t valid_local, float* sum_exp, float* target_logit) {
  if (N == 0) return;
  with_storage_type(t, "cross_entropy_partials", [&](auto zero) {
    using T = decltype(zero);
    partials_kernel<T><<<unsigned(N), kThreads, 0, kStream>>>(
        static_cast<const T*>(logits), targets, row_max, V_local, vocab_begin, valid_local,
        sum_exp, target_logit);
    MESH_CUDA_LAUNCHED();
  });
}

void cross_entropy_loss(const float* sum_exp, const float* target_logit, index_t N, float* loss) {
  if (N == 0) return;
  loss_kernel<<<grid_for(N, kThreads), kThreads, 0, kStream>>>(sum_exp, target_logit, N, loss);
  MESH_CUDA_LAUNCHED();
}

void cross_entropy_backward(DType t, DType out, const void* logits, const std::int32_t* targets,
                            const float* row_max, const float* sum_exp, const float* dloss,
                            index_t N, index_t V_local, index_t vocab_begin, index_t valid_local,
                            void* dlogits) {
  if (N == 0) return;
  // dlogits in the logits' dtype, or 16-bit from fp32 logits (rounded once).
  with_storage_type(t, "cross_entropy_backward", [&](auto zero) {
    using T = decltype(zero);
    with_storage_type(out, "cross_entropy_backward", [&](auto out_zero) {
      using O = decltype(out_zero);
      backward_kernel<T, O><<<unsigned(N), kThreads, 0, kStream>>>(
          static_cast<const T*>(logits), targets, row_max, sum_exp, dloss, V_local, vocab_begin,
          valid_local, static_cast<O*>(dlogits));
      MESH_CUDA_LAUNCHED();
    });
  });
}

}  // namespace meshtron::cuda
