// ======================================================== Philox dropout ==
//
// The counter-based dropout decision of kernels/kokkos/dropout.hpp on the
// GPU, shared by the dropout kernels (dropout.cu) and the attention dropout
// inside the fused attention kernels (flash_attention.cu): one
// Philox4x32-10 call serves the 8 consecutive global indices 8q .. 8q + 7,
//   key     = {seed lo32, seed hi32}
//   counter = {q lo32, q hi32, step, stream}        q = global index >> 3
//   keep    = (half-word (global index & 7)) * 2^-16 >= p
// half-word j being bits 16 (j & 1) .. + 15 of output word j >> 1.
// The Kokkos header cannot be shared (its functions are host-only in the
// Serial build), so the generator is restated here with the same constants;
// tests/gpu checks the masks against the host's, element by element.
// __umulhi gives the high half of the 32x32 products in one instruction.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"

namespace meshtron::cuda::philox {

constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

/// Philox4x32-10: the four output words of counter (c0, c1, c2, c3), key (k0, k1).
__device__ __forceinline__ uint4 philox4x32_10(std::uint32_t c0, std::uint32_t c1,
                                               std::uint32_t c2, std::uint32_t c3,
                                               std::uint32_t k0, std::uint32_t k1) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // key schedule: bump before every round but the first
      k0 += kW0;
      k1 += kW1;
    }
    const std::uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const std::uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return make_uint4(c0, c1, c2, c3);
}

/// philox4x32_10 of N counters c[i] = (x, y, z, w) in place, the rounds
/// outermost: N independent chains side by side in program order, so one
/// thread's calls hide each other's multiply latency.
template <int N>
__device__ __forceinline__ void philox4x32_10_batch(uint4 (&c)[N], std::uint32_t k0,
                                                    std::uint32_t k1) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const std::uint32_t hi0 = __umulhi(kM0, c[i].x), lo0 = kM0 * c[i].x;
      const std::uint32_t hi1 = __umulhi(kM1, c[i].z), lo1 = kM1 * c[i].z;
      c[i] = make_uint4(hi1 ^ c[i].y ^ k0, lo1, hi0 ^ c[i].w ^ k1, lo0);
    }
  }
}

/// `s` with the step and sample offset of this launch: the device words of
/// s.live when set (CUDA graphs: one captured launch, many steps), else as is.
__device__ __forceinline__ DropoutPlacement resolved(DropoutPlacement s) {
  if (s.live == nullptr) return s;
  s.step = s.live[0];
  const kindex sample = kindex(std::uint64_t(s.live[1]) | (std::uint64_t(s.live[2]) << 32));
  (s.sample_axis == 0 ? s.a_offset : s.b_offset) += sample;
  return s;
}

/// Indices per call (kernels/kokkos/dropout.hpp's kDropoutGroup).
constexpr int kGroup = 8;

/// The call's group of a global index, and the index's half-word in it.
__device__ __forceinline__ std::uint64_t group_of(std::uint64_t index) { return index / kGroup; }
__device__ __forceinline__ int half_of(std::uint64_t index) { return int(index % kGroup); }

/// Whether rows of `row_length` indices, each starting at a multiple of
/// row_length, consist of whole groups (the fused attention's query rows of
/// S keys): then no group straddles two rows and none needs per-element calls.
__host__ __device__ constexpr bool whole_groups(kindex row_length) {
  return row_length % kGroup == 0;
}

/// The four words of group q (global indices 8q .. 8q + 7).
__device__ __forceinline__ uint4 group_bits(const DropoutPlacement& s, std::uint64_t q) {
  return philox4x32_10(std::uint32_t(q), std::uint32_t(q >> 32), s.step, s.stream,
                       std::uint32_t(s.seed), std::uint32_t(s.seed >> 32));
}

/// The Philox counter of group q, for the batched form below.
__device__ __forceinline__ uint4 group_counter(const DropoutPlacement& s, std::uint64_t q) {
  return make_uint4(std::uint32_t(q), std::uint32_t(q >> 32), s.step, s.stream);
}

/// group_bits of N groups as one batch (philox4x32_10_batch): c[i] =
/// group_counter(s, q_i) in, the words of group q_i out.
template <int N>
__device__ __forceinline__ void group_bits(const DropoutPlacement& s, uint4 (&c)[N]) {
  philox4x32_10_batch(c, std::uint32_t(s.seed), std::uint32_t(s.seed >> 32));
}

/// Word j of r (j a constant after unrolling: no select left).
__device__ __forceinline__ std::uint32_t word(const uint4& r, int j) {
  return j == 0 ? r.x : j == 1 ? r.y : j == 2 ? r.z : r.w;
}

/// keep iff half-word h (16 bits, as an integer) has h 2^-16 >= p, i.e. iff
/// h >= ceil(p 2^16): the same decision in integers (p 2^16 is exact in
/// double), computed once per launch.
__device__ __forceinline__ bool keep_half(std::uint32_t half, std::uint32_t threshold) {
  return half >= threshold;
}

/// The integer threshold of keep_half for p in [0, 1) (<= 2^16).
inline std::uint32_t keep_threshold(double p) { return std::uint32_t(std::ceil(p * 65536.0)); }

/// Half-word j of r (a select chain where j is not a constant).
__device__ __forceinline__ std::uint32_t half_word(const uint4& r, int j) {
  return (j & 1) ? word(r, j >> 1) >> 16 : word(r, j >> 1) & 0xffffu;
}

/// Decision of one element on its own: its group's call, its half-word.
__device__ __forceinline__ bool keep_element(const DropoutPlacement& s, std::uint64_t index,
                                             std::uint32_t threshold) {
  return keep_half(half_word(group_bits(s, group_of(index)), half_of(index)), threshold);
}

/// Bit j set iff half-word j of r is kept: the 8 decisions of a whole group.
__device__ __forceinline__ unsigned keep_bits(const uint4& r, std::uint32_t threshold) {
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < kGroup; ++j) bits |= unsigned(keep_half(half_word(r, j), threshold)) << j;
  return bits;
}

}  // namespace meshtron::cuda::philox
