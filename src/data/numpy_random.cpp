#include "data/numpy_random.hpp"

#include <cmath>
#include <vector>

namespace meshtron::data {

std::uint32_t NumpyLegacyRandom::interval(std::uint32_t max) {
  if (max == 0) return 0;
  std::uint32_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  std::uint32_t value;
  do {
    value = std::uint32_t(engine_()) & mask;
  } while (value > max);
  return value;
}

double NumpyLegacyRandom::uniform() {
  const std::uint32_t a = std::uint32_t(engine_()) >> 5;
  const std::uint32_t b = std::uint32_t(engine_()) >> 6;
  return (double(a) * 67108864.0 + double(b)) / 9007199254740992.0;
}

std::int64_t NumpyLegacyRandom::geometric(double p) {
  if (p >= 0.333333333333333333333333) {
    const double q = 1.0 - p;
    const double u = uniform();
    double sum = p, prod = p;
    std::int64_t x = 1;
    while (u > sum) {
      prod *= q;
      sum += prod;
      ++x;
    }
    return x;
  }
  return std::int64_t(std::ceil(std::log1p(-uniform()) / std::log1p(-p)));
}

std::int64_t NumpyLegacyRandom::choice(std::span<const double> probabilities) {
  std::vector<double> cdf(probabilities.size());
  double running = 0.0;
  for (std::size_t k = 0; k < cdf.size(); ++k) cdf[k] = running += probabilities[k];
  for (double& c : cdf) c /= running;
  const double u = uniform();
  std::int64_t index = 0;
  while (std::size_t(index) < cdf.size() && cdf[std::size_t(index)] <= u) ++index;
  return index;
}

}  // namespace meshtron::data
