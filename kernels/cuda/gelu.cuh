// GPT-2's tanh GeLU and its derivative on fp32 values, shared by the GeLU
// kernels (gelu.cu) and the gated GeGLU (glu.cu). The form of
// kernels/kokkos/gelu.hpp, which avoids the cancellation of 1 + tanh(u) for
// negative x:
//   s = sigmoid(2u), u = c (x + k x^3), c = sqrt(2/pi), k = 0.044715
//   gelu(x) = x s,   gelu'(x) = s + 2 x s (1 - s) c (1 + 3 k x^2)
#pragma once

#include "kernels/cuda/common.cuh"

namespace meshtron::cuda {

inline constexpr float kSqrt2OverPi = 0.79788456080286535588f, kGeluCubic = 0.044715f;

/// x sigmoid(2u) with exp(-2u) as ex2.approx of one product and the fast
/// division (x / inf = -0 where exp overflows, as with expf): expf and an
/// IEEE division make the bf16 forward instruction-bound (0.74 of the copy
/// on an H200, perf/bench_cuda_ops memory). A few fp32 ulp from expf and /.
__device__ __forceinline__ float gelu(float v) {
  constexpr float kMinus2Log2e = -2.f * kLog2e;
  const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
  return __fdividef(v, 1.f + fast_exp2(kMinus2Log2e * u));
}

__device__ __forceinline__ float gelu_grad(float v) {
  const float s = 1.f / (1.f + expf(-2.f * kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
  const float du_dx = kSqrt2OverPi * (1.f + 3.f * kGeluCubic * v * v);
  return s + 2.f * v * s * (1.f - s) * du_dx;
}

}  // namespace meshtron::cuda
