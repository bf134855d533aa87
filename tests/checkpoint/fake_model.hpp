// A small fake GPT parameter set, sharded exactly as the model shards it, for
// checkpoint tests and the checkpoint benchmark:
//   embedding.word.weight        [V, h]  rows split over tp, padded to
//                                        V_pad = multiple of divisible_by*tp
//                                        (last tp rank(s) hold padding);
//                                        on the first AND last stage (tied)
//   embedding.position.weight    [P, h]  replicated (first stage)
//   layers.i.ln_1.weight/bias    [h]     replicated
//   layers.i.attention.qkv.weight [h, 3h] fused q|k|v, split dim 1
//   layers.i.attention.qkv.bias   [3h]    fused q|k|v, split dim 0
//                                 (grouped keys: (heads + 2 groups) x h/heads)
//   layers.i.attention.proj.weight [h, h] split dim 0;  .bias [h] replicated
//   layers.i.ln_2.weight/bias    [h]     replicated
//   layers.i.mlp.fc.weight       [h, f]  split dim 1;  .bias [f] split dim 0
//   layers.i.mlp.proj.weight     [f, h]  split dim 0;  .bias [h] replicated
//   final_norm.weight/bias       [h]     replicated (last stage)
// Layers are divided evenly over pipeline stages.
//
// Values come from a formula of (kind, name, GLOBAL element index), so any
// decomposition can check what it loaded without reference to the writer.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "model/parameter.hpp"

namespace meshtron::testing_ckpt {

struct FakeModelSpec {
  index_t vocab = 37, hidden = 8, positions = 16, layers = 4, ffn = 32;
  index_t vocab_divisible_by = 8;
  /// Grouped keys and values (0: none): qkv is q | k | v of heads, kv_groups
  /// and kv_groups heads of hidden / heads, parts of unequal widths.
  index_t heads = 4, kv_groups = 0;
};



struct FakeModel {
  int tp_rank = 0, tp = 1;
  std::deque<Parameter> params;   // deques: stable addresses
  std::deque<Tensor> exp_avg, exp_avg_sq;

  std::vector<io::CheckpointTensor> tensors(bool with_optimizer) {
    std::vector<io::CheckpointTensor> out;
    for (std::size_t i = 0; i < params.size(); ++i)
      out.push_back({&params[i], with_optimizer ? &exp_avg[i] : nullptr,
                     with_optimizer ? &exp_avg_sq[i] : nullptr});
    return out;
  }
};

inline Parameter make_param(const std::string& name, Shape global, int split_dim, int parts,
                            int tp_rank, int tp) {
  Parameter p;
  p.name = name;
  p.global_shape = global;
  p.shard.split_dim = split_dim;
  p.shard.fused_parts = parts;
  Shape local = global;
  if (split_dim >= 0) local[split_dim] /= tp;
  p.value = Tensor::zeros(local);
  return p;
}

/// The word table as make_word_embedding builds it.
inline Parameter make_word_table(const FakeModelSpec& s, int tp_rank, int tp) {
  const index_t multiple = s.vocab_divisible_by * tp;
  const index_t padded = (s.vocab + multiple - 1) / multiple * multiple;
  const index_t rows = padded / tp, begin = rows * tp_rank;
  Parameter p = make_param("embedding.word.weight", {s.vocab, s.hidden}, 0, 1, tp_rank, tp);
  p.value = Tensor::zeros({rows, s.hidden});
  p.padded_rows = std::clamp<index_t>(begin + rows - s.vocab, 0, rows);
  return p;
}

/// The fused qkv weight ([h, width], split dim 1) or bias ([width], dim 0).
inline Parameter make_qkv(const FakeModelSpec& s, const std::string& name, bool weight,
                          int tp_rank, int tp) {
  const index_t h = s.hidden, groups = s.kv_groups;
  const index_t width = groups > 0 ? (s.heads + 2 * groups) * (h / s.heads) : 3 * h;
  Parameter p = make_param(name, weight ? Shape{h, width} : Shape{width}, weight ? 1 : 0, 3,
                           tp_rank, tp);
  if (groups > 0) p.part_units = {int(s.heads / groups), 1, 1};
  return p;
}

inline FakeModel make_fake_model(const FakeModelSpec& s, int tp_rank, int tp, int pp_rank,
                                 int pp) {
  FakeModel m;
  m.tp_rank = tp_rank;
  m.tp = tp;
  auto add = [&](Parameter p) { m.params.push_back(std::move(p)); };
  const index_t h = s.hidden;
  if (pp_rank == 0) {
    add(make_word_table(s, tp_rank, tp));
    add(make_param("embedding.position.weight", {s.positions, h}, -1, 1, tp_rank, tp));
  }
  const index_t first = s.layers * pp_rank / pp, last = s.layers * (pp_rank + 1) / pp;
  for (index_t i = first; i < last; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    add(make_param(l + "ln_1.weight", {h}, -1, 1, tp_rank, tp));
    add(make_param(l + "ln_1.bias", {h}, -1, 1, tp_rank, tp));
    add(make_qkv(s, l + "attention.qkv.weight", true, tp_rank, tp));
    add(make_qkv(s, l + "attention.qkv.bias", false, tp_rank, tp));
    add(make_param(l + "attention.proj.weight", {h, h}, 0, 1, tp_rank, tp));
    add(make_param(l + "attention.proj.bias", {h}, -1, 1, tp_rank, tp));
    add(make_param(l + "ln_2.weight", {h}, -1, 1, tp_rank, tp));
    add(make_param(l + "ln_2.bias", {h}, -1, 1, tp_rank, tp));
    add(make_param(l + "mlp.fc.weight", {h, s.ffn}, 1, 1, tp_rank, tp));
    add(make_param(l + "mlp.fc.bias", {s.ffn}, 0, 1, tp_rank, tp));
    add(make_param(l + "mlp.proj.weight", {s.ffn, h}, 0, 1, tp_rank, tp));
    add(make_param(l + "mlp.proj.bias", {h}, -1, 1, tp_rank, tp));
  }
  if (pp_rank == pp - 1) {
    if (pp > 1) add(make_word_table(s, tp_rank, tp));  // tied copy for the LM head
    add(make_param("final_norm.weight", {h}, -1, 1, tp_rank, tp));
    add(make_param("final_norm.bias", {h}, -1, 1, tp_rank, tp));
  }
  for (const Parameter& p : m.params) {
    m.exp_avg.push_back(Tensor::zeros(p.value.shape()));
    m.exp_avg_sq.push_back(Tensor::zeros(p.value.shape()));
  }
  return m;
}

/// Expected value of element g of tensor `name`; kind 0 = value, 1 = exp_avg,
/// 2 = exp_avg_sq. Integers below 2^24: exact in fp32.
inline index_t name_salt(const std::string& name) {
  return index_t(std::hash<std::string>{}(name) % 97);
}
inline float expected_value(int kind, index_t salt, index_t g) {
  return float(kind * 4000000 + salt * 40000 + g % 40000);
}
inline float expected_value(int kind, const std::string& name, index_t g) {
  return expected_value(kind, name_salt(name), g);
}

/// Fill every tensor from the formula; padding rows get NaN, which must
/// never reach the file.
inline void fill(FakeModel& m, std::int64_t salt_offset = 0) {
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    Parameter& p = m.params[i];
    Tensor* kinds[3] = {&p.value, &m.exp_avg[i], &m.exp_avg_sq[i]};
    const index_t n = shape_numel(p.global_shape), salt = name_salt(p.name);
    for (int k = 0; k < 3; ++k) {
      float* data = kinds[k]->data<float>();
      for_each_global_index(p, m.tp_rank, m.tp, [&](index_t local, index_t g) {
        data[local] = g < n ? expected_value(k, salt, g) + float(salt_offset)
                            : std::numeric_limits<float>::quiet_NaN();
      });
    }
  }
}

/// Number of elements that differ from the formula (padding must be 0).
inline index_t count_mismatches(const FakeModel& m, bool with_optimizer,
                                std::string* first = nullptr, std::int64_t salt_offset = 0) {
  index_t bad = 0;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const Parameter& p = m.params[i];
    const Tensor* kinds[3] = {&p.value, &m.exp_avg[i], &m.exp_avg_sq[i]};
    const index_t n = shape_numel(p.global_shape), salt = name_salt(p.name);
    for (int k = 0; k < (with_optimizer ? 3 : 1); ++k) {
      const float* data = kinds[k]->data<float>();
      for_each_global_index(p, m.tp_rank, m.tp, [&](index_t local, index_t g) {
        const float want = g < n ? expected_value(k, salt, g) + float(salt_offset) : 0.0f;
        if (data[local] != want) {
          if (bad++ == 0 && first)
            *first = p.name + " kind " + std::to_string(k) + " global " + std::to_string(g) +
                     ": " + std::to_string(data[local]) + " != " + std::to_string(want);
        }
      });
    }
  }
  return bad;
}

/// Overwrite every tensor with -1 (before loading, so stale values cannot pass).
inline void clear(FakeModel& m) {
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    m.params[i].value.fill(-1);
    m.exp_avg[i].fill(-1);
    m.exp_avg_sq[i].fill(-1);
  }
}

}  // namespace meshtron::testing_ckpt
