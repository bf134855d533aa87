// ======================================= MLP activations: GeLU, ReLU, GLUs ==
//
// A plain MLP's activation (the erf GeLU, ReLU) elementwise through map3:
//   y = act(x),  dx = dy act'(x)
// and the gated MLP activations on the fused up-projection's output x [N, 2 F]:
// gate = x[:, :F], up = x[:, F:] (Megatron's --swiglu: chunk(x, 2, -1)),
//   y [N, F] = act(gate) up
//   backward dgate = dy up act'(gate), dup = dy act(gate)   (dx [N, 2 F])
// act: SiLU (SwiGLU)        silu(v) = v s, s = 1 / (1 + exp(-v)),
//                           silu'(v) = s (1 + v (1 - s))
//      tanh GeLU (GeGLU)    gelu.cuh's gelu, gelu_grad
//      erf GeLU (GeGLU)     v Phi(v), Phi(v) = (1 + erf(v / sqrt 2)) / 2,
//                           gelu'(v) = Phi(v) + v exp(-v^2 / 2) / sqrt(2 pi)
//      ReLU (ReGLU)         max(v, 0), relu'(v) = 1 for v > 0, else 0
//      tanh (BERT's pooler) tanh(v), tanh'(v) = 1 - tanh(v)^2
// fp32 arithmetic on the stored values, each output rounded to T once
// (PyTorch on a 16-bit x rounds act(gate) to it before the product).
//
// Elementwise: rows of F values whose pointers are 16-byte aligned, F a
// multiple of the pack width, move in 16-byte packs; other shapes element
// by element.
#include "kernels/cuda/gelu.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

struct Silu {
  __device__ static float value(float v) { return v / (1.f + expf(-v)); }
  __device__ static float grad(float v) {
    const float s = 1.f / (1.f + expf(-v));
    return s * (1.f + v * (1.f - s));
  }
};
struct GeluTanh {
  __device__ static float value(float v) { return gelu(v); }
  __device__ static float grad(float v) { return gelu_grad(v); }
};
struct GeluErf {
  static constexpr float kInvSqrt2 = 0.70710678118654752440f;
  static constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  __device__ static float cdf(float v) { return 0.5f * (1.f + erff(v * kInvSqrt2)); }
  __device__ static float value(float v) { return v * cdf(v); }
  __device__ static float grad(float v) { return cdf(v) + v * kInvSqrt2Pi * expf(-0.5f * v * v); }
};
struct Tanh {
  __device__ static float value(float v) { return tanhf(v); }
  __device__ static float grad(float v) {
    const float t = tanhf(v);
    return 1.f - t * t;
  }
};
struct Relu {
  __device__ static float value(float v) { return v > 0.f ? v : 0.f; }
  __device__ static float grad(float v) { return v > 0.f ? 1.f : 0.f; }
};

template <class Act>
struct ActForward {
  __device__ float operator()(float x, float, float) const { return Act::value(x); }
};
template <class Act>
struct ActBackward {
  __device__ float operator()(float dy, float x, float) const { return dy * Act::grad(x); }
};

/// Unit k of the [N, F / W] output in units of W values: its row, and its
/// gate unit in x (the up unit lies F / W units further).
struct GluUnit {
  kindex row, gate;
};
__device__ __forceinline__ GluUnit glu_unit(kindex k, kindex units_per_row) {
  const kindex row = k / units_per_row;
  return {row, row * 2 * units_per_row + k % units_per_row};
}

template <class Act, class T, int W>
__global__ void glu_forward_kernel(const T* __restrict__ x, kindex N, kindex F,
                                   T* __restrict__ y) {
  start_after_prior_grid();
  using U = Values<T, W>;
  const kindex units = F / W;
  const U* xu = reinterpret_cast<const U*>(x);
  GRID_STRIDE(k, N * units) {
    const GluUnit at = glu_unit(k, units);
    const U gate = xu[at.gate], up = xu[at.gate + units];
    U out;
#pragma unroll
    for (int j = 0; j < W; ++j) out.v[j] = from_f<T>(Act::value(to_f(gate.v[j])) * to_f(up.v[j]));
    reinterpret_cast<U*>(y)[k] = out;
  }
}

template <class Act, class T, int W>
__global__ void glu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x, kindex N,
                                    kindex F, T* __restrict__ dx) {
  start_after_prior_grid();
  using U = Values<T, W>;
  const kindex units = F / W;
  const U* xu = reinterpret_cast<const U*>(x);
  U* dxu = reinterpret_cast<U*>(dx);
  GRID_STRIDE(k, N * units) {
    const GluUnit at = glu_unit(k, units);
    const U gate = xu[at.gate], up = xu[at.gate + units], d = reinterpret_cast<const U*>(dy)[k];
    U dgate, dup;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float g = to_f(gate.v[j]), dv = to_f(d.v[j]);
      dgate.v[j] = from_f<T>(dv * to_f(up.v[j]) * Act::grad(g));
      dup.v[j] = from_f<T>(dv * Act::value(g));
    }
    dxu[at.gate] = dgate;
    dxu[at.gate + units] = dup;
  }
}

template <class F>
void with_activation(GluActivation act, F&& f) {
  switch (act) {
    case GluActivation::Silu: f(Silu{}); return;
    case GluActivation::GeluTanh: f(GeluTanh{}); return;
    case GluActivation::GeluErf: f(GeluErf{}); return;
    case GluActivation::Relu: f(Relu{}); return;
    case GluActivation::Tanh: f(Tanh{}); return;
  }
  MESH_VERIFY(false, "glu: unknown activation " << int(act));
}

constexpr int kThreads = 256;

}  // namespace

void activation_forward(DType t, GluActivation act, const void* x, index_t n, void* y) {
  if (n == 0) return;
  with_storage_type(t, "activation_forward", [&](auto zero) {
    using T = decltype(zero);
    with_activation(act, [&](auto a) {
      map3(ActForward<decltype(a)>{}, static_cast<const T*>(x), static_cast<const T*>(nullptr),
           static_cast<const T*>(nullptr), n, static_cast<T*>(y));
    });
  });
}

void activation_backward(DType t, GluActivation act, const void* dy, const void* x, index_t n,
                         void* dx) {
  if (n == 0) return;
  with_storage_type(t, "activation_backward", [&](auto zero) {
    using T = decltype(zero);
    with_activation(act, [&](auto a) {
      map3(ActBackward<decltype(a)>{}, static_cast<const T*>(dy), static_cast<const T*>(x),
           static_cast<const T*>(nullptr), n, static_cast<T*>(dx));
    });
  });
}

void glu_forward(DType t, GluActivation act, const void* x, index_t N, index_t F, void* y) {
  if (N * F == 0) return;
  with_storage_type(t, "glu_forward", [&](auto zero) {
    using T = decltype(zero);
    with_activation(act, [&](auto a) {
      using Act = decltype(a);
      with_pack_width<T>(F, {x, y}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        launch_dependent(glu_forward_kernel<Act, T, W>, grid_for(N * F / W, kThreads), kThreads,
                         0, compute_stream(), static_cast<const T*>(x), N, F, static_cast<T*>(y));
      });
    });
  });
}

void glu_backward(DType t, GluActivation act, const void* dy, const void* x, index_t N, index_t F,
                  void* dx) {
  if (N * F == 0) return;
  with_storage_type(t, "glu_backward", [&](auto zero) {
    using T = decltype(zero);
    with_activation(act, [&](auto a) {
      using Act = decltype(a);
      with_pack_width<T>(F, {dy, x, dx}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        launch_dependent(glu_backward_kernel<Act, T, W>, grid_for(N * F / W, kThreads), kThreads,
                         0, compute_stream(), static_cast<const T*>(dy), static_cast<const T*>(x),
                         N, F, static_cast<T*>(dx));
      });
    });
  });
}

}  // namespace meshtron::cuda
