// ================================================================= Dropout ==
//
// Counter-based dropout: the keep decision of an element is a pure function
// of (seed, step, stream, global element index), computed with the
// Philox4x32-10 generator, so it depends on where the element sits in the
// global (unsharded) tensor and never on the rank that holds it or on the
// order of evaluation. The backward recomputes the mask instead of storing it.
//
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as
// easy as 1, 2, 3", SC 2011) maps a 128-bit counter and a 64-bit key to 128
// random bits by 10 rounds of
//   (hi0, lo0) = M0 * c0,  (hi1, lo1) = M1 * c2          (32x32 -> 64 bit)
//   c <- (hi1 ^ c1 ^ k0,  lo1,  hi0 ^ c3 ^ k1,  lo0)
// with M0 = 0xD2511F53, M1 = 0xCD9E8D57, and the key bumped between rounds
// by the Weyl constants k0 += 0x9E3779B9, k1 += 0xBB67AE85.
//
// meshtron's use: one Philox call serves the 8 consecutive global indices
// 8q .. 8q + 7 (q = index >> 3), each taking its own 16-bit half of an
// output word:
//   key     = {seed lo32, seed hi32}
//   counter = {q lo32, q hi32, step, stream}          q = index >> 3
//   h       = half (index & 1) of output word ((index >> 1) & 3)
//             (half 0: bits 0..15, half 1: bits 16..31)
//   u       = h * 2^-16                                (16 bits -> [0, 1))
//   keep    = u >= p
//   y       = x * keep / (1 - p)
// The decision is still a function of the global index alone (the group
// and the half-word are both derived from it), so any split of the tensor
// gives the same mask; a GPU thread that owns 8 aligned consecutive elements
// generates their 8 decisions with one call instead of 8 (the generator,
// not memory, bounds the attention mask's kernel). 16 bits per decision
// quantise p to a multiple of 2^-16 (0.1 -> 6554 / 65536 = 0.1000061), as
// FlashAttention's 8-bit decisions quantise it to 2^-8.
// The tensor is viewed as [A, B, C] placed at (a_off, b_off, c_off) inside a
// global [*, B_global, C_global] tensor; the global index of local (a, b, c) is
//   ((a + a_off) * B_global + (b + b_off)) * C_global + (c + c_off).
#pragma once

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

// ------------------------------------------------------ Philox4x32-10 ----

struct Philox4x32Block {
  std::uint32_t w[4];
};

namespace philox_constants {
inline constexpr std::uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
inline constexpr std::uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
}  // namespace philox_constants

KOKKOS_INLINE_FUNCTION Philox4x32Block philox4x32_round(const Philox4x32Block& c, std::uint32_t k0,
                                                        std::uint32_t k1) {
  const std::uint64_t p0 = std::uint64_t(philox_constants::M0) * c.w[0];
  const std::uint64_t p1 = std::uint64_t(philox_constants::M1) * c.w[2];
  const std::uint32_t hi0 = std::uint32_t(p0 >> 32), lo0 = std::uint32_t(p0);
  const std::uint32_t hi1 = std::uint32_t(p1 >> 32), lo1 = std::uint32_t(p1);
  return {{hi1 ^ c.w[1] ^ k0, lo1, hi0 ^ c.w[3] ^ k1, lo0}};
}

/// Philox4x32 with 10 rounds: 128 random bits for (counter, key).
KOKKOS_INLINE_FUNCTION Philox4x32Block philox4x32_10(Philox4x32Block counter, std::uint32_t k0,
                                                     std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // key schedule: bump before every round but the first
      k0 += philox_constants::W0;
      k1 += philox_constants::W1;
    }
    counter = philox4x32_round(counter, k0, k1);
  }
  return counter;
}

/// Indices per Philox call (see the file comment).
inline constexpr int kDropoutGroup = 8;

/// Half-word j (0..7) of a call's output: j & 1 picks the half of word j >> 1.
KOKKOS_INLINE_FUNCTION std::uint32_t half_word(const Philox4x32Block& r, unsigned j) {
  return (r.w[(j >> 1) & 3u] >> (16u * (j & 1u))) & 0xffffu;
}

/// A 16-bit half-word as a uniform number in [0, 1) (exact).
KOKKOS_INLINE_FUNCTION double uniform_from_half(std::uint32_t half) {
  return double(half) * (1.0 / 65536.0);
}

/// Random bits of the group of 8 global indices 8 q .. 8 q + 7 (see the file
/// comment): half_word j belongs to index 8 q + j.
KOKKOS_INLINE_FUNCTION Philox4x32Block dropout_bits(std::uint64_t seed, std::uint32_t step,
                                                    std::uint32_t stream, std::uint64_t q) {
  const Philox4x32Block counter{{std::uint32_t(q), std::uint32_t(q >> 32), step, stream}};
  return philox4x32_10(counter, std::uint32_t(seed), std::uint32_t(seed >> 32));
}

/// Keep decision of one element (see the file comment).
KOKKOS_INLINE_FUNCTION bool dropout_keep(std::uint64_t seed, std::uint32_t step,
                                         std::uint32_t stream, std::uint64_t index, double p) {
  const Philox4x32Block r = dropout_bits(seed, step, stream, index / kDropoutGroup);
  return uniform_from_half(half_word(r, unsigned(index % kDropoutGroup))) >= p;
}

// ------------------------------------------------------------ the kernel ---

/// Placement of a local [A, B, C] view inside the global tensor.
struct DropoutPlacement {
  std::uint64_t seed;
  std::uint32_t step, stream;
  kindex b, c;  // local extents (A is the range length)
  kindex a_offset, b_offset, c_offset;
  kindex b_global, c_global;

  /// Global index of local linear index i = (a B + b) C + c.
  KOKKOS_INLINE_FUNCTION std::uint64_t global_index(kindex i) const {
    const kindex cc = i % c, bb = (i / c) % b, aa = i / (c * b);
    return std::uint64_t(((aa + a_offset) * b_global + (bb + b_offset)) * c_global +
                         (cc + c_offset));
  }
  /// Keep decision of local linear index i.
  KOKKOS_INLINE_FUNCTION bool keep(kindex i, double p) const {
    return dropout_keep(seed, step, stream, global_index(i), p);
  }
};

/// out = in * keep / (1 - p): the forward (in = x) and the backward
/// (in = dy) are the same operation with the same mask.
template <class ExecSpace, class T>
struct DropoutApply {
  Vector<const T, ExecSpace> in;
  DropoutPlacement site;
  double p;
  T keep_scale;  // 1 / (1 - p)
  Vector<T, ExecSpace> out;

  /// Element i dropped and scaled, in T.
  KOKKOS_INLINE_FUNCTION T dropped(kindex i) const {
    return site.keep(i, p) ? in(i) * keep_scale : T(0);
  }
  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const { out(i) = dropped(i); }
};

/// out = residual + dropout(in), the dropped value rounded to T before the
/// add (as dropout then add round it).
template <class ExecSpace, class T>
struct DropoutAdd {
  DropoutApply<ExecSpace, T> apply;
  Vector<const T, ExecSpace> residual;

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const T d = apply.dropped(i);
    apply.out(i) = residual(i) + d;
  }
};

/// p == 0: no mask, no scaling (out may alias in).
template <class ExecSpace, class T>
struct DropoutCopy {
  Vector<const T, ExecSpace> in;
  Vector<T, ExecSpace> out;
  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const { out(i) = in(i); }
};

// ---------------------------------------------------------------- launchers

/// n = A * B * C elements; p in [0, 1). p == 0 is a plain copy.
/// out = dropout(in); with `residual`, out = residual + dropout(in).
template <class ExecSpace, class T>
void dropout_apply(const T* in, kindex n, double p, const DropoutPlacement& site, T* out,
                   const T* residual = nullptr) {
  if (residual) {  // p = 0 included: keeps everything, scale 1
    DropoutApply<ExecSpace, T> f{as_vector<ExecSpace>(in, n), site, p, T(1.0 / (1.0 - p)),
                                 as_vector<ExecSpace>(out, n)};
    Kokkos::parallel_for("meshtron::dropout_add", Range<ExecSpace>(0, n),
                         DropoutAdd<ExecSpace, T>{f, as_vector<ExecSpace>(residual, n)});
    return;
  }
  if (p == 0.0) {
    Kokkos::parallel_for(
        "meshtron::dropout_copy", Range<ExecSpace>(0, n),
        DropoutCopy<ExecSpace, T>{as_vector<ExecSpace>(in, n), as_vector<ExecSpace>(out, n)});
    return;
  }
  DropoutApply<ExecSpace, T> f{as_vector<ExecSpace>(in, n), site, p, T(1.0 / (1.0 - p)),
                               as_vector<ExecSpace>(out, n)};
  Kokkos::parallel_for("meshtron::dropout", Range<ExecSpace>(0, n), f);
}

}  // namespace meshtron::kernels
