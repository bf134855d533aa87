// The vocab-parallel cross-entropy ops (ops.hpp: Cross-entropy).
#include <algorithm>
#include <cstdint>

#include "kernels/kokkos/cross_entropy.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

// ------------------------------------------- Cross-entropy (vocab-parallel) ---

namespace {
kernels::VocabShard vocab_shard(const char* op, const Arg& logits, index_t vocab_begin,
                                index_t vocab_valid) {
  MESH_VERIFY(vocab_begin >= 0 && vocab_valid > 0, op << ": vocab_begin = " << vocab_begin
                                                      << " and vocab_valid = " << vocab_valid
                                                      << " must be >= 0 and > 0");
  const index_t V = logits.t.dim(-1);
  const index_t valid_local = std::clamp<index_t>(vocab_valid - vocab_begin, 0, V);
  return {vocab_begin, valid_local};
}

/// Every target names a real (unpadded) token of the global vocabulary.
/// Host targets only: a host copy of device targets would make the host wait
/// for the device twice per micro-batch. The kernels read only the logit of
/// a target inside their shard, so any int32 is memory-safe there, and the
/// training data is checked where it is read (data_source.cpp).
void check_targets(const char* op, const Tensor& targets, index_t vocab_valid) {
  if (!targets.is_host()) return;
  const std::int32_t* t = targets.data<std::int32_t>();
  for (index_t n = 0; n < targets.numel(); ++n)
    MESH_VERIFY(t[n] >= 0 && t[n] < vocab_valid, op << ": targets[" << n << "] = " << t[n]
                                                    << " is outside the vocabulary [0, "
                                                    << vocab_valid << ")");
}
}  // namespace

void cross_entropy_row_max(const Tensor& logits, index_t vocab_begin, index_t vocab_valid,
                           Tensor& row_max) {
  const char* op = "cross_entropy_row_max";
  const Arg al{"logits", logits}, am{"row_max", row_max};
  on_device(op, {al, am});
  const bool device = require_float_args(op, {al});
  require_stat_args(op, device, al, {am});
  const index_t N = rows_of(op, al);
  require_per_row(op, am, N, al);
  const kernels::VocabShard shard = vocab_shard(op, al, vocab_begin, vocab_valid);
  if (device) {
    ON_CUDA(cuda::cross_entropy_row_max(logits.dtype(), logits.raw(), N, logits.dim(-1),
                                        shard.valid_local, row_max.data<float>()));
    return;
  }
  with_float_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_row_max<Host>(logits.data<T>(), N, logits.dim(-1), shard,
                                         row_max.data<T>());
  });
}

namespace {

/// The checks of cross_entropy_partials and cross_entropy_row_stats (the
/// logits, the targets and three per-row statistics).
struct PartialsCall {
  index_t N;
  kernels::VocabShard shard;
  bool device;
};
PartialsCall check_partials_args(const char* op, const Tensor& logits, const Tensor& targets,
                                 const Tensor& row_max, const Tensor& sum_exp,
                                 const Tensor& target_logit, index_t vocab_begin,
                                 index_t vocab_valid) {
  const Arg al{"logits", logits}, at{"targets", targets}, am{"row_max", row_max},
      as{"sum_exp", sum_exp}, atl{"target_logit", target_logit};
  on_device(op, {al, at, am, as, atl});
  const bool device = require_float_args(op, {al});
  require_stat_args(op, device, al, {am, as, atl});
  require_index_arg(op, at);
  const index_t N = rows_of(op, al);
  for (const Arg& a : {at, am, as, atl}) require_per_row(op, a, N, al);
  const kernels::VocabShard shard = vocab_shard(op, al, vocab_begin, vocab_valid);
  check_targets(op, targets, vocab_valid);
  return {N, shard, device};
}

}  // namespace

void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            index_t vocab_begin, index_t vocab_valid, Tensor& sum_exp,
                            Tensor& target_logit) {
  const auto [N, shard, device] =
      check_partials_args("cross_entropy_partials", logits, targets, row_max, sum_exp,
                          target_logit, vocab_begin, vocab_valid);
  if (device) {
    ON_CUDA(cuda::cross_entropy_partials(logits.dtype(), logits.raw(), targets.data<std::int32_t>(),
                                         row_max.data<float>(), N, logits.dim(-1), vocab_begin,
                                         shard.valid_local, sum_exp.data<float>(),
                                         target_logit.data<float>()));
    return;
  }
  with_float_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_partials<Host>(logits.data<T>(), targets.data<std::int32_t>(),
                                          row_max.data<T>(), N, logits.dim(-1), shard,
                                          sum_exp.data<T>(), target_logit.data<T>());
  });
}

void cross_entropy_row_stats(const Tensor& logits, const Tensor& targets, index_t vocab_begin,
                             index_t vocab_valid, Tensor& row_max, Tensor& sum_exp,
                             Tensor& target_logit) {
  const auto [N, shard, device] =
      check_partials_args("cross_entropy_row_stats", logits, targets, row_max, sum_exp,
                          target_logit, vocab_begin, vocab_valid);
  if (device) {
    ON_CUDA(cuda::cross_entropy_row_stats(logits.dtype(), logits.raw(),
                                          targets.data<std::int32_t>(), N, logits.dim(-1),
                                          vocab_begin, shard.valid_local, row_max.data<float>(),
                                          sum_exp.data<float>(), target_logit.data<float>()));
    return;
  }
  cross_entropy_row_max(logits, vocab_begin, vocab_valid, row_max);
  cross_entropy_partials(logits, targets, row_max, vocab_begin, vocab_valid, sum_exp,
                         target_logit);
}

void cross_entropy_loss(const Tensor& sum_exp, const Tensor& target_logit, Tensor& loss) {
  const char* op = "cross_entropy_loss";
  const Arg as{"sum_exp", sum_exp}, at{"target_logit", target_logit}, al{"loss", loss};
  const bool device = require_float_args(op, {as, at, al});
  if (device)
    MESH_VERIFY(sum_exp.dtype() == DType::F32,
                op << ": per-row statistics are fp32 on the device, got " << describe(as));
  require_same_numel(op, as, at);
  require_same_numel(op, as, al);
  if (device) {
    ON_CUDA(cuda::cross_entropy_loss(sum_exp.data<float>(), target_logit.data<float>(), sum_exp.numel(),
                                     loss.data<float>()));
    return;
  }
  with_float_type(sum_exp.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_loss<Host>(sum_exp.data<T>(), target_logit.data<T>(), sum_exp.numel(),
                                      loss.data<T>());
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            const Tensor& sum_exp, const Tensor& dloss, index_t vocab_begin,
                            index_t vocab_valid, Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  const Arg al{"logits", logits}, at{"targets", targets}, am{"row_max", row_max},
      as{"sum_exp", sum_exp}, ad{"dloss", dloss}, adl{"dlogits", dlogits};
  on_device(op, {al, at, am, as, ad, adl});
  const bool device = require_float_args(op, {al});
  // On the device fp32 logits may give 16-bit dlogits directly (the operand
  // dtype of the LM head's backward GEMMs): no fp32 gradient, no cast pass.
  const bool narrowed = device && logits.dtype() == DType::F32 &&
                        (dlogits.dtype() == DType::BF16 || dlogits.dtype() == DType::F16);
  if (!narrowed) require_float_args(op, {al, adl});
  require_stat_args(op, device, al, {am, as, ad});
  require_index_arg(op, at);
  const index_t N = rows_of(op, al);
  for (const Arg& a : {at, am, as, ad}) require_per_row(op, a, N, al);
  MESH_VERIFY(dlogits.shape() == logits.shape(),
              op << ": " << describe(adl) << " must match " << describe(al));
  const kernels::VocabShard shard = vocab_shard(op, al, vocab_begin, vocab_valid);
  check_targets(op, targets, vocab_valid);
  if (device) {
    ON_CUDA(cuda::cross_entropy_backward(logits.dtype(), dlogits.dtype(), logits.raw(),
                                         targets.data<std::int32_t>(),
                                         row_max.data<float>(), sum_exp.data<float>(),
                                         dloss.data<float>(), N, logits.dim(-1), vocab_begin,
                                         shard.valid_local, dlogits.raw()));
    return;
  }
  with_float_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_backward<Host>(logits.data<T>(), targets.data<std::int32_t>(),
                                          row_max.data<T>(), sum_exp.data<T>(), dloss.data<T>(), N,
                                          logits.dim(-1), shard, dlogits.data<T>());
  });
}

}  // namespace meshtron::ops
