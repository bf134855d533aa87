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
  const int parts = p.shard.fused_parts;
  const index_t part_local = local_d / parts, part_global = global_d / parts;
  index_t li = 0;
  for (index_t o = 0; o < outer; ++o)
    for (index_t j = 0; j < local_d; ++j) {
      const index_t part = j / part_local, within = j % part_local;
      const index_t gj = part * part_global + tp_rank * part_local + within;
      for (index_t i = 0; i < inner; ++i, ++li) f(li, (o * global_d + gj) * inner + i);
    }
}

}  // namespace meshtron
