// Which words of the stored attention dropout mask the CUDA mask kernel
// draws, and in what order: one definition for the kernel
// (kernels/cuda/flash_attention.cu, draw_attention_mask_kernel) and the host
// test that checks it (tests/attention). Row i of an entry draws its words
// w = 0 .. i / 32 (those holding its visible keys, key <= i). All the rows'
// words are numbered in one range, so that every GPU thread takes one word:
// rows 32b .. 32b + 31 (block b) have b + 1 words each, so block b starts at
// word 16 b (b + 1), and word r's block is the largest b with 16 b (b + 1)
// <= r: a square root, then an exact fix-up in integers (the root is only
// an estimate, on either side of the host/device boundary).
#pragma once

#include <math.h>

#include <cstdint>

#include "common/host_device.hpp"

namespace meshtron::ops {

/// Rows per block of the numbering (one 32-key word more per block).
inline constexpr int kMaskBlockRows = 32;

/// Words drawn for an entry of S rows: the sum over rows i of i / 32 + 1.
inline std::int64_t attention_mask_words_drawn(std::int64_t S) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < S; i += kMaskBlockRows)
    n += (S - i < kMaskBlockRows ? S - i : kMaskBlockRows) * (i / kMaskBlockRows + 1);
  return n;
}

/// Largest entry count the 32-bit search below takes (16 (b + 1) (b + 2)
/// stays below 2^32 for every r < 2^31).
inline constexpr std::int64_t kMaxMaskWordsDrawn = std::int64_t(1) << 31;

struct MaskWord {
  std::uint32_t row, word;
};

/// Row and word of the r-th word drawn (r < attention_mask_words_drawn(S)).
MESH_HOST_DEVICE inline MaskWord attention_mask_word(std::uint32_t r) {
  std::uint32_t b = std::uint32_t((sqrtf(1.f + float(r) * 0.25f) - 1.f) * 0.5f);
  while (16 * (b + 1) * (b + 2) <= r) ++b;
  while (16 * b * (b + 1) > r) --b;
  r -= 16 * b * (b + 1);  // the word within block b, whose rows have b + 1 words
  return {b * kMaskBlockRows + r / (b + 1), r % (b + 1)};
}

}  // namespace meshtron::ops
