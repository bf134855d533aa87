// ==================================================================== GeLU ==
//
// GPT-2's tanh GeLU (gelu.cuh: the formula and its derivative), fp32
// arithmetic for either storage type. bias_gelu_forward fuses the bias
// add of the MLP's first linear layer into the same pass (one read and one
// or two writes instead of two reads and two writes).
#include "kernels/cuda/gelu.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

struct GeluForward {
  __device__ float operator()(float x, float, float) const { return gelu(x); }
};
struct GeluBackward {
  __device__ float operator()(float dy, float x, float) const { return dy * gelu_grad(x); }
};

template <class T>
__global__ void bias_gelu_forward_kernel(const T* __restrict__ x, const T* __restrict__ bias,
                                         kindex N, kindex C, T* __restrict__ pre,
                                         T* __restrict__ y) {
  start_after_prior_grid();
  GRID_STRIDE(i, N * C) {
    const float v = load_f(x, i) + load_f(bias, i % C);
    if (pre) store_f(pre, i, v);
    // Round the pre-activation to storage first, so that y = gelu(pre)
    // exactly as the unfused bias_add then gelu_forward would compute it.
    store_f(y, i, gelu(round_to<T>(v)));
  }
}

constexpr int kThreads = 256;

}  // namespace

void gelu_forward(DType t, const void* x, index_t n, void* y) {
  if (n == 0) return;
  with_storage_type(t, "gelu_forward", [&](auto zero) {
    using T = decltype(zero);
    map3(GeluForward{}, static_cast<const T*>(x), static_cast<const T*>(nullptr),
         static_cast<const T*>(nullptr), n, static_cast<T*>(y));
  });
}

void gelu_backward(DType t, const void* dy, const void* x, index_t n, void* dx) {
  if (n == 0) return;
  with_storage_type(t, "gelu_backward", [&](auto zero) {
    using T = decltype(zero);
    map3(GeluBackward{}, static_cast<const T*>(dy), static_cast<const T*>(x),
         static_cast<const T*>(nullptr), n, static_cast<T*>(dx));
  });
}

void bias_gelu_forward(DType t, const void* x, const void* bias, index_t N, index_t C, void* pre,
                       void* y) {
  if (N * C == 0) return;
  with_storage_type(t, "bias_gelu_forward", [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(bias_gelu_forward_kernel<T>, grid_for(N * C, kThreads), kThreads, 0,
                     compute_stream(), static_cast<const T*>(x), static_cast<const T*>(bias), N, C,
                     static_cast<T*>(pre), static_cast<T*>(y));
  });
}

}  // namespace meshtron::cuda
