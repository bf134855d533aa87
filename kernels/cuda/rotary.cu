// ======================================================= Rotary embedding ==
//
// RoPE on rows of `heads` heads of head_dim values: x holds tokens rows, row
// t at x + t ldx, head h at + h head_dim (the token-major layout of the qkv
// projection's output that the fused attention reads, so q and k are
// rotated where they lie; q|k side by side rotate in one call). The first
// rotary_dim values of each head rotate, the rest pass through (GPT-NeoX's
// rotary_pct). Pair i < rotary_dim / 2 of a head, at angle
//   theta_i(t) = fp32(fp32(positions[t]) inv_freq[i]),
//   inv_freq[i] = 1 / fp32(base^fp32(fp32(2 i) / fp32(rotary_dim)))   (fp32 division)
// is (i, i + rotary_dim / 2) for HalfSplit (Llama, GPT-NeoX: rotate_half)
// and (2 i, 2 i + 1) for Interleaved (GPT-J: rotate_every_two); with a, b
// the pair's values, sigma = +1 forward, -1 backward (the transpose of a
// rotation is the rotation by -theta):
//   a' = a cos - b sigma sin,   b' = b cos + a sigma sin
// These are the fp32 numbers transformers computes (_compute_default_rope_
// parameters: base ** (arange(0, dim, 2, int64).float() / dim) on the CPU,
// whose powf is within 1 ulp: here base^e is evaluated in double and
// rounded once; then 1.0 / that, the position times inv_freq in fp32, and
// cos, sin in fp32: cosf, sinf, within 2 ulp). Unlike transformers, which
// rounds cos and sin to a 16-bit x's dtype and rounds both products and
// their sum (q * cos + rotate_half(q) * sin), a', b' are fp32 sums of fp32
// products of the stored values, rounded to T once.
//
// One warp per token (grid-stride), lane i taking pairs i, i + 32, ...: the
// angle's sine and cosine are computed once per (token, pair) and applied
// to every head; inv_freq once per block into shared memory.
#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

struct RotaryShape {
  kindex tokens, ldx, ldy;
  int heads, head_dim, rotary_dim;
  float base, sigma;
  bool interleaved;
};

/// Where pair i of a head starts and how far its second value lies.
__device__ __forceinline__ int pair_first(int i, const RotaryShape& s) {
  return s.interleaved ? 2 * i : i;
}
__device__ __forceinline__ int pair_stride(const RotaryShape& s) {
  return s.interleaved ? 1 : s.rotary_dim / 2;
}

/// x and y may be the same rows (in place: ldx == ldy); each thread reads
/// a pair before it writes it, and no other thread touches it.
template <class T>
__global__ void rotary_kernel(const T* x, T* y, const std::int32_t* __restrict__ positions,
                              RotaryShape s) {
  extern __shared__ float inv_freq[];  // rotary_dim / 2
  const int half = s.rotary_dim / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double e = double(float(2 * i) / float(s.rotary_dim));
    inv_freq[i] = 1.f / float(pow(double(s.base), e));
  }
  __syncthreads();
  start_after_prior_grid();
  const int lane = threadIdx.x & 31, stride = pair_stride(s);
  const bool copy_rest = x != y;
  for (kindex t = kindex(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); t < s.tokens;
       t += kindex(gridDim.x) * kWarpsPerBlock) {
    const T* xt = x + t * s.ldx;
    T* yt = y + t * s.ldy;
    const float position = float(positions[t]);
    for (int i = lane; i < half; i += 32) {
      float sin_theta, cos_theta;
      sincosf(position * inv_freq[i], &sin_theta, &cos_theta);
      sin_theta *= s.sigma;
      const int first = pair_first(i, s);
      for (int h = 0; h < s.heads; ++h) {
        const kindex ia = kindex(h) * s.head_dim + first, ib = ia + stride;
        const float a = load_f(xt, ia), b = load_f(xt, ib);
        store_f(yt, ia, a * cos_theta - b * sin_theta);
        store_f(yt, ib, b * cos_theta + a * sin_theta);
      }
    }
    if (copy_rest)
      for (int h = 0; h < s.heads; ++h)
        for (int d = s.rotary_dim + lane; d < s.head_dim; d += 32)
          yt[kindex(h) * s.head_dim + d] = xt[kindex(h) * s.head_dim + d];
  }
}

void rotary(DType t, const void* x, index_t ldx, void* y, index_t ldy,
            const std::int32_t* positions, index_t tokens, index_t heads, index_t head_dim,
            index_t rotary_dim, double base, RotaryLayout layout, float sigma, const char* op) {
  MESH_VERIFY(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim,
              op << ": rotary_dim " << rotary_dim << " must be even, in (0, head_dim "
                 << head_dim << "]");
  MESH_VERIFY(ldx >= heads * head_dim && ldy >= heads * head_dim && (x != y || ldx == ldy),
              op << ": row strides " << ldx << ", " << ldy << " for " << heads << " heads of "
                 << head_dim);
  if (tokens == 0 || heads == 0) return;
  const RotaryShape shape{tokens,    ldx,          ldy,          int(heads),
                          int(head_dim), int(rotary_dim), float(base), sigma,
                          layout == RotaryLayout::Interleaved};
  with_storage_type(t, op, [&](auto zero) {
    using T = decltype(zero);
    launch_dependent(rotary_kernel<T>, grid_for(tokens, kWarpsPerBlock), kWarpsPerBlock * 32,
                     std::size_t(rotary_dim / 2) * sizeof(float), compute_stream(),
                     static_cast<const T*>(x), static_cast<T*>(y), positions, shape);
  });
}

}  // namespace

void rotary_forward(DType t, const void* x, index_t ldx, void* y, index_t ldy,
                    const std::int32_t* positions, index_t tokens, index_t heads,
                    index_t head_dim, index_t rotary_dim, double base, RotaryLayout layout) {
  rotary(t, x, ldx, y, ldy, positions, tokens, heads, head_dim, rotary_dim, base, layout, 1.f,
         "rotary_forward");
}

void rotary_backward(DType t, const void* dy, index_t lddy, void* dx, index_t lddx,
                     const std::int32_t* positions, index_t tokens, index_t heads,
                     index_t head_dim, index_t rotary_dim, double base, RotaryLayout layout) {
  rotary(t, dy, lddy, dx, lddx, positions, tokens, heads, head_dim, rotary_dim, base, layout,
         -1.f, "rotary_backward");
}

}  // namespace meshtron::cuda
