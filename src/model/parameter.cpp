#include "model/parameter.hpp"

#include "common/hash.hpp"

#include <cmath>
#include <numbers>

namespace meshtron {

namespace {

/// Uniform in (0, 1) from 53 random bits; never exactly 0.
double uniform(std::uint64_t bits) {
  return (double(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/// Rows past the real vocabulary (padding to a multiple of 128 x tp) are
/// never read by the embedding nor by the loss, so they start at 0 and stay
/// there: a checkpoint (real rows only) then restores every row exactly.
void zero_padded_rows(const Parameter& p, Tensor& host) {
  if (p.padded_rows == 0) return;
  const index_t rows = host.dim(0), per_row = host.numel() / rows;
  for (index_t i = (rows - p.padded_rows) * per_row; i < host.numel(); ++i)
    set_element_from_double(host, i, 0.0);
}

}  // namespace

int Parameter::fused_units() const {
  int units = 0;
  for (int u : part_units) units += u;
  return part_units.empty() ? shard.fused_parts : units;
}

void init_normal(Parameter& p, std::uint64_t seed, double stddev, int tp_rank,
                 int tp_size) {
  if (!p.value.defined()) return;  // a parameter the model does not have (no position table)
  const std::uint64_t key = splitmix64(seed ^ fnv1a(p.name));
  // Values are generated on the host; a device parameter gets them by one copy.
  Tensor host = p.value.is_host() ? p.value : Tensor::empty(p.value.shape(), p.value.dtype());
  for_each_global_index(p, tp_rank, tp_size, [&](index_t local, index_t global) {
    // Box-Muller on two independent uniforms keyed by the global index.
    const std::uint64_t a = splitmix64(key ^ splitmix64(2 * std::uint64_t(global)));
    const std::uint64_t b = splitmix64(key ^ splitmix64(2 * std::uint64_t(global) + 1));
    const double z = std::sqrt(-2.0 * std::log(uniform(a))) *
                     std::cos(2.0 * std::numbers::pi * uniform(b));
    set_element_from_double(host, local, stddev * z);
  });
  zero_padded_rows(p, host);
  if (!p.value.is_host()) p.value.copy_from(host);
}

}  // namespace meshtron
