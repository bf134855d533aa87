// Small counter-based hashes for deterministic, decomposition-independent
// pseudo-random values (parameter initialisation, synthetic data): a value
// is a function of its global coordinates, never of the rank or of the
// order in which ranks ask for it.
#pragma once

#include <cstdint>
#include <string_view>

namespace meshtron {

/// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijective mix of 64 bits.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// FNV-1a of a string (names as keys).
constexpr std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace meshtron
