// Template implementation of for_each_global_index (included by parameter.hpp).
#pragma once

namespace meshtron {

template <class F>
void for_each_global_index(const Parameter& p, int tp_rank, int tp_size, F&& f) {
  const Shape& local = p.value.shape();
  const int d = p.shard.split_dim;
  if (d < 0 || tp_size == 1) {
    for (index_t i = 0; i < p.value.numel(); ++i) f(i, i);
    return;
  }
  // Split dimension d into `parts` fused blocks, each sharded over tp.
  index_t outer = 1, inner = 1;
  for (int k = 0; k < d; ++k) outer *= local[k];
  for (std::size_t k = d + 1; k < local.size(); ++k) inner *= local[k];
  const index_t local_d = local[d];
  const index_t global_d = local_d * tp_size;
  // Part k spans units [first_k, first_k + units_k) of the dimension,
  // locally and globally; this rank holds the tp_rank-th slice of each.
  const int parts = p.shard.fused_parts;
  const index_t unit_local = local_d / p.fused_units(), unit_global = unit_local * tp_size;
  index_t li = 0;
  for (index_t o = 0; o < outer; ++o) {
    index_t first = 0;
    for (int part = 0; part < parts; ++part) {
      const index_t units = p.units_of_part(part), width = units * unit_local;
      for (index_t within = 0; within < width; ++within) {
        const index_t gj = first * unit_global + tp_rank * width + within;
        for (index_t i = 0; i < inner; ++i, ++li) f(li, (o * global_d + gj) * inner + i);
      }
      first += units;
    }
  }
}

}  // namespace meshtron
