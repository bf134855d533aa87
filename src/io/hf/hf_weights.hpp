// The weights of a Hugging Face model folder, read and written as
// transformers' save_pretrained lays them out: one model.safetensors, or
// shards model-0000k-of-0000n.safetensors with model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {tensor: shard}}),
// and the shard of a global tensor a rank loads from them (every family).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.hpp"
#include "model/parameter.hpp"

namespace meshtron::io {

/// transformers' default max_shard_size ("5GB", decimal).
inline constexpr std::uint64_t kHfMaxShardBytes = 5'000'000'000;

/// Copy this rank's shard of `global` (the unsharded, unpadded logical tensor)
/// into p.value; padded vocabulary rows become zero.
void load_shard(Parameter& p, const Tensor& global, int tp_rank, int tp_size);

class HfWeights {
 public:
  /// Opens the index's shards when model.safetensors.index.json is there,
  /// else model.safetensors; UserError naming the file for a missing one, a
  /// bad index, or an index naming a tensor its shard lacks.
  explicit HfWeights(const std::string& model_dir);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// The tensor in its file's dtype; UserError naming the folder and the
  /// tensor (and `wanted_for`, when given) if absent.
  Tensor load(const std::string& name, const std::string& wanted_for = "") const;
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

/// [r, c] -> [c, r] of a host matrix, element bytes moved as they are:
/// nn.Linear's [out, in] <-> meshtron's [in, out].
Tensor transposed(const Tensor& t);

/// Host parts of one fused parameter (q | k | v, gate | up) one after the
/// other along dimension 0; the caller has checked that they share a dtype
/// and trailing shape (each family names the offending file tensor).
Tensor stacked_rows(const std::vector<Tensor>& parts);

/// Writes `tensors` (host) into `model_dir` as save_pretrained does: one
/// model.safetensors when they fit in `max_shard_bytes`, else shards filled
/// in order up to that size (a larger tensor alone in its shard) and the
/// index. Every file gets metadata {"format": "pt"}.
void write_hf_weights(const std::string& model_dir,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      std::uint64_t max_shard_bytes = kHfMaxShardBytes);

}  // namespace meshtron::io
