#include "kernels/kokkos/vector_math.hpp"

#include <bit>

// Compiled with -ffp-contract=off (CMakeLists.txt): no clone may fuse a
// multiply-add that another computes in two roundings.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MESHTRON_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MESHTRON_VECTOR_CLONES
#endif

namespace meshtron::kernels {
namespace {

/// Cephes' expf: k = round(x / ln 2) by the 1.5 * 2^23 trick, r = x - k ln 2
/// in two parts (Cody-Waite), exp(r) by a degree-6 polynomial, times 2^k
/// built in the exponent bits. Selects only, so loops calling it vectorise.
inline float exp_inline(float x) {
  const float xc = x < -87.33654475f ? -87.33654475f : (x > 88.0f ? 88.0f : x);  // NaN passes
  const float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - kf * 0.693359375f) - kf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const float e = y * std::bit_cast<float>((std::int32_t(kf) + 127) << 23);
  return x < -87.33654475f ? 0.0f : (x > 88.72283906f ? HUGE_VALF : (x != x ? x : e));
}

template <class T>
T maximum(const T* row, std::int64_t n) {
  T m = -T(HUGE_VAL);
  for (std::int64_t v = 0; v < n; ++v) m = row[v] > m ? row[v] : m;
  return m;
}

}  // namespace

float vector_exp(float x) { return exp_inline(x); }

MESHTRON_VECTOR_CLONES float row_maximum(const float* row, std::int64_t n) {
  return maximum(row, n);
}
double row_maximum(const double* row, std::int64_t n) { return maximum(row, n); }

MESHTRON_VECTOR_CLONES double row_sum_exp(const float* row, std::int64_t n, float m) {
  constexpr std::int64_t kBlock = 64, kLanes = 8;
  double total = 0;
  std::int64_t v = 0;
  for (; v + kBlock <= n; v += kBlock) {
    float e[kBlock];
    for (std::int64_t j = 0; j < kBlock; ++j) e[j] = exp_inline(row[v + j] - m);
    float lane[kLanes] = {};
    for (std::int64_t j = 0; j < kBlock; j += kLanes)
      for (std::int64_t l = 0; l < kLanes; ++l) lane[l] += e[j + l];
    float block = 0;
    for (std::int64_t l = 0; l < kLanes; ++l) block += lane[l];
    total += double(block);
  }
  for (; v < n; ++v) total += double(exp_inline(row[v] - m));
  return total;
}
double row_sum_exp(const double* row, std::int64_t n, double m) {
  double total = 0;
  for (std::int64_t v = 0; v < n; ++v) total += std::exp(row[v] - m);
  return total;
}

MESHTRON_VECTOR_CLONES void scaled_exp_row(const float* __restrict row, std::int64_t n, float m,
                                           float scale, float* __restrict out) {
  for (std::int64_t v = 0; v < n; ++v) out[v] = scale * exp_inline(row[v] - m);
}
void scaled_exp_row(const double* __restrict row, std::int64_t n, double m, double scale,
                    double* __restrict out) {
  for (std::int64_t v = 0; v < n; ++v) out[v] = scale * std::exp(row[v] - m);
}

}  // namespace meshtron::kernels
