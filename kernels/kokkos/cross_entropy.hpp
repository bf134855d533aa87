// ======================================== Vocab-parallel cross-entropy ==
//
// logits [N, V_local] hold global vocabulary columns
// [vocab_begin, vocab_begin + V_local); global columns at or past vocab_valid
// are padding and take no part. With m the global row max and
// Z = sum_v exp(l[v] - m) over the whole (valid) vocabulary,
//   loss       = log Z - (l[t] - m)                 (= -log softmax[t])
//   dloss/dl_v = softmax[v] - [v == t],  softmax[v] = exp(l[v] - m) / Z.
// Megatron's three local passes, with all-reduces in between on tp > 1:
//   1. row_max        local max           -> all-reduce(max)  -> m
//   2. partials       local sum of exp(l - m), and l[t] - m where t is
//                     local (0 elsewhere) -> all-reduce(sum)  -> Z, l[t] - m
//   3. loss           log Z - (l[t] - m)
// and the backward from (m, Z). One row per work item; row sums end in
// double (accum_t). A row with no valid column on this shard
// has local max -inf and local sum 0.
#pragma once

#include <cmath>

#include "kernels/kokkos/common.hpp"
#include "kernels/kokkos/vector_math.hpp"

namespace meshtron::kernels {

/// Where this shard's columns sit in the global vocabulary.
struct VocabShard {
  kindex vocab_begin;  // global index of local column 0
  kindex valid_local;  // local columns [0, valid_local) are real tokens
};

template <class ExecSpace, class T>
struct CrossEntropyRowMax {
  Matrix<const T, ExecSpace> logits;
  VocabShard shard;
  Vector<T, ExecSpace> row_max;

  KOKKOS_INLINE_FUNCTION void operator()(kindex n) const {
    row_max(n) = row_maximum(&logits(n, 0), shard.valid_local);
  }
};

template <class ExecSpace, class T>
struct CrossEntropyPartials {
  Matrix<const T, ExecSpace> logits;
  Vector<const std::int32_t, ExecSpace> targets;
  Vector<const T, ExecSpace> row_max;
  VocabShard shard;
  Vector<T, ExecSpace> sum_exp, target_logit;

  KOKKOS_INLINE_FUNCTION void operator()(kindex n) const {
    const T m = row_max(n);
    sum_exp(n) = T(row_sum_exp(&logits(n, 0), shard.valid_local, m));
    const kindex t = kindex(targets(n)) - shard.vocab_begin;
    target_logit(n) = (t >= 0 && t < shard.valid_local) ? T(logits(n, t) - m) : T(0);
  }
};

template <class ExecSpace, class T>
struct CrossEntropyLoss {
  Vector<const T, ExecSpace> sum_exp, target_logit;
  Vector<T, ExecSpace> loss;
  KOKKOS_INLINE_FUNCTION void operator()(kindex n) const {
    loss(n) = T(kmath::log(accum_t(sum_exp(n))) - target_logit(n));
  }
};

template <class ExecSpace, class T>
struct CrossEntropyBackward {
  Matrix<const T, ExecSpace> logits;
  Vector<const std::int32_t, ExecSpace> targets;
  Vector<const T, ExecSpace> row_max, sum_exp, dloss;
  VocabShard shard;
  Matrix<T, ExecSpace> dlogits;

  KOKKOS_INLINE_FUNCTION void operator()(kindex n) const {
    const T m = row_max(n);
    const T scale = T(accum_t(dloss(n)) / accum_t(sum_exp(n)));  // dloss / Z
    const kindex t = kindex(targets(n)) - shard.vocab_begin;
    scaled_exp_row(&logits(n, 0), shard.valid_local, m, scale, &dlogits(n, 0));
    if (t >= 0 && t < shard.valid_local) dlogits(n, t) -= T(dloss(n));
    for (kindex v = shard.valid_local; v < kindex(dlogits.extent(1)); ++v) dlogits(n, v) = T(0);
  }
};

// ---------------------------------------------------------------- launchers

template <class ExecSpace, class T>
void cross_entropy_row_max(const T* logits, kindex N, kindex V_local, VocabShard shard,
                           T* row_max) {
  CrossEntropyRowMax<ExecSpace, T> f{as_matrix<ExecSpace>(logits, N, V_local), shard,
                                     as_vector<ExecSpace>(row_max, N)};
  Kokkos::parallel_for("meshtron::cross_entropy_row_max", Range<ExecSpace>(0, N), f);
}

template <class ExecSpace, class T>
void cross_entropy_partials(const T* logits, const std::int32_t* targets, const T* row_max,
                            kindex N, kindex V_local, VocabShard shard, T* sum_exp,
                            T* target_logit) {
  CrossEntropyPartials<ExecSpace, T> f{
      as_matrix<ExecSpace>(logits, N, V_local), as_vector<ExecSpace>(targets, N),
      as_vector<ExecSpace>(row_max, N),         shard,
      as_vector<ExecSpace>(sum_exp, N),         as_vector<ExecSpace>(target_logit, N)};
  Kokkos::parallel_for("meshtron::cross_entropy_partials", Range<ExecSpace>(0, N), f);
}

template <class ExecSpace, class T>
void cross_entropy_loss(const T* sum_exp, const T* target_logit, kindex N, T* loss) {
  CrossEntropyLoss<ExecSpace, T> f{as_vector<ExecSpace>(sum_exp, N),
                                   as_vector<ExecSpace>(target_logit, N),
                                   as_vector<ExecSpace>(loss, N)};
  Kokkos::parallel_for("meshtron::cross_entropy_loss", Range<ExecSpace>(0, N), f);
}

template <class ExecSpace, class T>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, const T* row_max,
                            const T* sum_exp, const T* dloss, kindex N, kindex V_local,
                            VocabShard shard, T* dlogits) {
  CrossEntropyBackward<ExecSpace, T> f{
      as_matrix<ExecSpace>(logits, N, V_local), as_vector<ExecSpace>(targets, N),
      as_vector<ExecSpace>(row_max, N),         as_vector<ExecSpace>(sum_exp, N),
      as_vector<ExecSpace>(dloss, N),           shard,
      as_matrix<ExecSpace>(dlogits, N, V_local)};
  Kokkos::parallel_for("meshtron::cross_entropy_backward", Range<ExecSpace>(0, N), f);
}

}  // namespace meshtron::kernels
