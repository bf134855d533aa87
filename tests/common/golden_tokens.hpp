// What the golden-model checks (tests/common/gpt2_golden.hpp,
// tests/common/family_golden.hpp, tests/common/family_convert_golden.hpp)
// share: where a family's golden folders are and how to make them, the batch
// of the validation/make_*_golden.py scripts, their tokens in meshtron's
// [s, b] order, and one relative error per tensor.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace meshtron::golden {
constexpr int kBatch = 2, kSeq = 16;

/// validation/<family>-golden: "gpt-neox" names validation/gpt-neox-golden
/// (and its shards in validation/gpt-neox-golden-sharded).
inline std::string golden_folder(const std::string& family) {
  return std::string(MESHTRON_SOURCE_DIR) + "/validation/" + family + "-golden";
}

/// The failure message of an absent golden folder: the command of
/// validation/make_<family>_golden.py ("gpt-neox" runs make_gpt_neox_golden.py).
inline std::string how_to_make_golden(const std::string& family) {
  std::string script = family;
  std::replace(script.begin(), script.end(), '-', '_');
  return "golden model absent: on a machine with torch and transformers run\n"
         "  python3 validation/make_" + script + "_golden.py --out validation/" + family +
         "-golden --sharded-out validation/" + family + "-golden-sharded\n"
         "and commit both folders (see the script's docstring)";
}

/// max |a - b| / max(|b|_inf, tiny): one relative error per tensor.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / std::max(scale, 1e-30);
}

/// Golden tokens of step k as [s, b]-ordered ids and targets.
inline void step_tokens(const Tensor& tokens, int k, Tensor& ids, Tensor& targets) {
  ids = Tensor::empty({kSeq * kBatch}, DType::I32);
  targets = Tensor::empty({kSeq * kBatch}, DType::I32);
  const auto* t = tokens.data<std::int32_t>() + k * kBatch * (kSeq + 1);
  for (int b = 0; b < kBatch; ++b)
    for (int s = 0; s < kSeq; ++s) {
      ids.data<std::int32_t>()[s * kBatch + b] = t[b * (kSeq + 1) + s];
      targets.data<std::int32_t>()[s * kBatch + b] = t[b * (kSeq + 1) + s + 1];
    }
}

/// Our logits [s*b, V_pad] in [s, b] order as transformers' [b, s, V]
/// (padded vocabulary columns dropped).
inline std::vector<double> logits_in_hf_order(const Tensor& logits, index_t vocab,
                                              index_t padded_vocab) {
  const std::vector<double> all = logits.to_doubles();
  std::vector<double> out;
  out.reserve(std::size_t(kBatch * kSeq * vocab));
  for (int b = 0; b < kBatch; ++b)
    for (int s = 0; s < kSeq; ++s)
      for (index_t v = 0; v < vocab; ++v) out.push_back(all[(s * kBatch + b) * padded_vocab + v]);
  return out;
}

}  // namespace meshtron::golden
