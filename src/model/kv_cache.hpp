// The key/value cache of generation (src/generate/): per layer of a
// pipeline stage, k and v [slots, kv groups on this tp rank, capacity,
// head_dim]. A slot holds one sequence (a prompt, or one beam of it); under
// grouped-query attention it holds the kv groups, not the query heads.
//
// CachedRows says where each row of a cached forward sits: its slot and its
// position in that sequence. The rows of one forward may mix slots and
// lengths (a batch of prompts prefilled at once, then one row per sequence
// per decode step); positions are absolute, so learned positions and
// rotary angles continue from the cache.
#pragma once

#include <vector>

#include "tensor/tensor.hpp"

namespace meshtron {

struct CachedRows {
  std::vector<index_t> slot, position;
  /// int32 [rows] copies of `slot` and `position` where the model lives
  /// (the cached attention reads both; embedding and rotary tables read
  /// `positions`): one upload each per forward.
  Tensor slots, positions;
  /// The rows whose logits the last stage computes (the last row of each
  /// prompt in a prefill); empty: every row.
  std::vector<index_t> logit_rows;
  /// Rows of (slot, position) pairs; `slots` and `positions` made in `space`.
  static CachedRows make(std::vector<index_t> slot, std::vector<index_t> position,
                         MemorySpace space = MemorySpace::Host);
  index_t size() const { return index_t(slot.size()); }
};

struct KvCache {
  struct Layer {
    Tensor k, v;
  };
  std::vector<Layer> layers;  ///< this stage's layers, in order
  index_t bytes() const;
  /// Every row's (slot, position) is inside the cache (a device kernel
  /// cannot say which row is not).
  void require_holds(const CachedRows& rows) const;
  /// Slot to[j] of every layer becomes a copy of slot from[j] (beam
  /// reordering; every source is read before any slot is written).
  void reorder(const std::vector<index_t>& to, const std::vector<index_t>& from);
};

}  // namespace meshtron
