#include "model/kv_cache.hpp"

namespace meshtron {

CachedRows CachedRows::make(std::vector<index_t> slot, std::vector<index_t> position,
                            MemorySpace space) {
  CachedRows rows;
  Tensor host = Tensor::empty({index_t(position.size())}, DType::I32);
  auto* p = host.data<std::int32_t>();
  for (std::size_t r = 0; r < position.size(); ++r) p[r] = std::int32_t(position[r]);
  rows.positions = space == MemorySpace::Host ? host : host.to_space(space);
  rows.slot = std::move(slot);
  rows.position = std::move(position);
  return rows;
}

index_t KvCache::bytes() const {
  index_t total = 0;
  for (const Layer& l : layers)
    total += (l.k.numel() + l.v.numel()) * index_t(dtype_size(l.k.dtype()));
  return total;
}

void KvCache::reorder(const std::vector<index_t>& to, const std::vector<index_t>& from) {
  for (Layer& l : layers)
    for (Tensor* t : {&l.k, &l.v}) {
      const Tensor rows = t->reshape({t->dim(0), t->numel() / t->dim(0)});
      std::vector<Tensor> sources;
      for (index_t f : from) sources.push_back(rows.slice_rows(f, f + 1).clone());
      for (std::size_t j = 0; j < to.size(); ++j)
        rows.slice_rows(to[j], to[j] + 1).copy_from(sources[j]);
    }
}

}  // namespace meshtron
