// numpy's legacy RandomState(seed), restricted to the draws Megatron-LM's
// dataset code makes, so index arrays and samples can follow Megatron's
// numpy code draw for draw.
//
// The engine is MT19937 seeded as std::mt19937 seeds it (init_genrand, what
// RandomState does with an integer seed); the C++ standard fixes its output,
// so every platform draws the same numbers. Each method below is the
// algorithm of numpy's legacy distributions (numpy/random/src/legacy and
// distributions.c); none uses std::uniform_*_distribution, whose results
// the standard leaves to the library.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace meshtron::data {

class NumpyLegacyRandom {
 public:
  explicit NumpyLegacyRandom(std::uint32_t seed) : engine_(seed) {}

  /// Uniform integer in [0, max]: 32-bit outputs masked to the smallest
  /// 2^k - 1 covering `max`, those above `max` rejected (random_interval,
  /// and randint's masked bounded draw for ranges below 2^32).
  std::uint32_t interval(std::uint32_t max);

  /// randint(low, high): uniform in [low, high), high - low <= 2^32 - 1.
  std::int64_t randint(std::int64_t low, std::int64_t high) {
    return low + std::int64_t(interval(std::uint32_t(high - 1 - low)));
  }

  /// random(): 53-bit double in [0, 1) from two 32-bit outputs.
  double uniform();

  /// geometric(p): trials until the first success, >= 1. numpy's legacy
  /// switch: sequential search for p >= 1/3, inversion below.
  std::int64_t geometric(double p);

  /// choice(n, p=probabilities): index of the first cumulative probability
  /// above one uniform draw (cdf normalised by its last entry, searchsorted
  /// side='right').
  std::int64_t choice(std::span<const double> probabilities);

  /// shuffle(x): Fisher-Yates from the back.
  template <class T>
  void shuffle(T* first, std::size_t n) {
    for (std::size_t i = n; i-- > 1;) {
      const std::uint32_t j = interval(std::uint32_t(i));
      std::swap(first[i], first[j]);
    }
  }

 private:
  std::mt19937 engine_;
};

}  // namespace meshtron::data
