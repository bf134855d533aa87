#include "model/kv_cache.hpp"

#include "common/error.hpp"

namespace meshtron {

namespace {

Tensor int32_tensor(const std::vector<index_t>& values, MemorySpace space) {
  Tensor host = Tensor::empty({index_t(values.size())}, DType::I32);
  auto* p = host.data<std::int32_t>();
  for (std::size_t r = 0; r < values.size(); ++r) p[r] = std::int32_t(values[r]);
  return space == MemorySpace::Host ? host : host.to_space(space);
}

}  // namespace

CachedRows CachedRows::make(std::vector<index_t> slot, std::vector<index_t> position,
                            MemorySpace space) {
  MESH_VERIFY(slot.size() == position.size(), "CachedRows: " << slot.size() << " slots for "
                                                             << position.size() << " positions");
  CachedRows rows;
  rows.slots = int32_tensor(slot, space);
  rows.positions = int32_tensor(position, space);
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

void KvCache::require_holds(const CachedRows& rows) const {
  if (layers.empty()) return;
  const index_t slots = layers.front().k.dim(0), capacity = layers.front().k.dim(2);
  for (index_t r = 0; r < rows.size(); ++r)
    MESH_VERIFY(rows.slot[std::size_t(r)] >= 0 && rows.slot[std::size_t(r)] < slots &&
                    rows.position[std::size_t(r)] >= 0 &&
                    rows.position[std::size_t(r)] < capacity,
                "KvCache: row " << r << " at slot " << rows.slot[std::size_t(r)] << ", position "
                                << rows.position[std::size_t(r)] << " is outside the cache of "
                                << slots << " slots x " << capacity << " positions");
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
