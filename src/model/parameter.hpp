// Parameter: one trainable tensor of a layer, its gradient, and how its local
// shard sits inside the global (unsharded) logical tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/grad_store.hpp"
#include "tensor/tensor.hpp"

namespace meshtron {

/// How a parameter is laid out across the tensor-parallel group.
struct ShardSpec {
  /// Dimension split across tp ranks, or -1 when every tp rank holds all of it.
  int split_dim = -1;
  /// For fused QKV: the split dimension holds `fused_parts` equal blocks
  /// (q, k, v), each split across tp; local = [q_r | k_r | v_r].
  int fused_parts = 1;
  /// Gradient is a partial sum over tp ranks and must be all-reduced over tp
  /// before the optimizer (replicated weights applied to sequence shards).
  bool tp_partial_grad = false;
};

/// Dtype of a parameter's gradient for values of `value`: the value's own
/// on the fp32/fp64 paths; fp32 under bf16/fp16 values (Megatron's
/// main_grad: weight-gradient GEMMs accumulate into it in fp32).
inline DType grad_dtype_for(DType value) {
  return value == DType::BF16 || value == DType::F16 ? DType::F32 : value;
}

struct Parameter {
  std::string name;     ///< logical name, e.g. "layers.0.attention.qkv.weight"
  Shape global_shape;   ///< unsharded, unpadded logical shape
  Tensor value;         ///< this rank's shard (the compute copy under bf16)
  /// Same shape as value, dtype grad_dtype_for(value); accumulated over
  /// micro-batches.
  Tensor grad;
  /// Set by a deferred zero_grad() (train/optimizer.hpp): grad still holds
  /// the last step's values, which count as zero, and the first op that
  /// writes it overwrites them (take_grad_store).
  bool grad_stale = false;
  ShardSpec shard;
  /// Relative widths of the shard.fused_parts parts when they differ, one
  /// per part: {heads / groups, 1, 1} for q | k | v with grouped keys and
  /// values. Empty: equal parts. Each part is split over tp alike.
  std::vector<int> part_units;
  /// Units the split dimension is cut into: the sum of part_units, or
  /// fused_parts (every part, local or global, is a whole number of units).
  int fused_units() const;
  /// Units of part p.
  int units_of_part(int p) const { return part_units.empty() ? 1 : part_units[std::size_t(p)]; }
  bool weight_decay = true;  ///< false for biases and norm parameters
  /// A copy of a table an earlier pipeline stage holds too (T5's word table
  /// on its decoder stages, a stack's relative-bias table on the stack's
  /// later stages): its gradient is summed over the stages holding it
  /// (train/optimizer.hpp) and it counts once in the global norm.
  bool stage_copy = false;
  /// Vocabulary rows beyond the real vocabulary (padding), present only in
  /// the local shard of a vocab-parallel weight: excluded when saving.
  index_t padded_rows = 0;
  /// Elements right after this parameter that belong to it in every buffer
  /// the optimizer packs it into (values, gradients, their flat copies),
  /// kept zero: the padding rows of a linear's [in + kOnesColumnWidth, out]
  /// weight block after its bias row (ColumnParallelLinear), which its
  /// GEMMs read and write as zeros. Not saved, not in any norm's count.
  index_t trailing_padding = 0;
  /// numel() plus trailing_padding: the parameter's span in a flat buffer.
  index_t flat_span() const { return value.numel() + trailing_padding; }

  bool tp_replicated() const { return shard.split_dim < 0; }
  /// How the next write into grad stores: Overwrite for the first after a
  /// deferred zero_grad(), which it makes the gradient's value, else
  /// Accumulate.
  ops::GradStore take_grad_store() {
    const bool first = grad_stale;
    grad_stale = false;
    return first ? ops::GradStore::Overwrite : ops::GradStore::Accumulate;
  }
  /// Writes the zeros a deferred zero_grad() left out, for writers that
  /// only add (scatters) and for gradients no op wrote this step.
  void zero_stale_grad() {
    if (take_grad_store() == ops::GradStore::Overwrite) grad.fill(0.0);
  }
};

/// The store of one op that writes both gradients (a layernorm's dgamma and
/// dbeta, a linear's dA and db through the ones column): their
/// take_grad_store(), which must agree.
inline ops::GradStore take_grad_store(Parameter& weight, Parameter& bias) {
  const ops::GradStore store = weight.take_grad_store();
  MESH_VERIFY(bias.take_grad_store() == store,
              weight.name << " and " << bias.name << ": one gradient was zeroed without the other");
  return store;
}

/// A flat list of a model's parameters (pointers owned by the layers).
using ParameterList = std::vector<Parameter*>;

/// Deterministic N(0, std) initialisation keyed by (seed, name, global element
/// index): the same global tensor on every decomposition, and each rank
/// generates only its own shard.
void init_normal(Parameter& p, std::uint64_t seed, double stddev, int tp_rank, int tp_size);

/// Global linear index of each local element (row-major), for the shard map.
/// Calls f(local_index, global_index) for every local element.
template <class F>
void for_each_global_index(const Parameter& p, int tp_rank, int tp_size, F&& f);

}  // namespace meshtron

#include "model/parameter_impl.hpp"
