// =================================================================== AdamW ==
//
// torch.optim.AdamW as kernels/kokkos/adamw.hpp, on fp32 master weights,
// fp32 gradients (main_grad) and fp32 moments: one thread per element, the
// update in double and each stored quantity rounded to fp32 once, so the
// device and host optimisers agree to the last bit or two. The bias
// corrections come precomputed from the host (AdamWCoefficients).
// Memory-bound (16 bytes read, 12 written per element): double arithmetic
// costs nothing measurable here.
#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad,
                             float* __restrict__ m, float* __restrict__ v, kindex n,
                             AdamWCoefficients k) {
  GRID_STRIDE(i, n) {
    const double g = grad[i];
    const double p = double(param[i]) * (1.0 - k.lr * k.weight_decay);
    const double m_new = k.beta1 * m[i] + (1.0 - k.beta1) * g;
    const double v_new = k.beta2 * v[i] + (1.0 - k.beta2) * g * g;
    const double denom = sqrt(v_new) * k.inv_sqrt_bias2 + k.eps;
    param[i] = float(p - k.step_size * m_new / denom);
    m[i] = float(m_new);
    v[i] = float(v_new);
  }
}

}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, index_t n,
                const AdamWCoefficients& k) {
  if (n == 0) return;
  adamw_kernel<<<grid_for(n, 256), 256, 0, kStream>>>(param, grad, m, v, n, k);
  MESH_CUDA_LAUNCHED();
}

}  // namespace meshtron::cuda
