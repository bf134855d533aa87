// ============================================== Fused causal attention ==
//
// The reference (host) implementation of ops::fused_attention_forward and
// _backward: the same numbers as the unfused composition (scores GEMM,
// scaled causal softmax, probs @ V) without any [S, S] tensor. q, k, v, out
// are [B, S, D] (B = batch x heads), lse is [B, S].
//
// Forward, one query row i per work item (two passes over keys j <= i):
//   x_ij   = scale * q_i . k_j
//   m_i    = max_j x_ij;  l_i = sum_j exp(x_ij - m_i)
//   out_i  = sum_j exp(x_ij - m_i) v_j / l_i;   lse_i = m_i + log(l_i)
// Backward, with P_ij = exp(x_ij - lse_i) rebuilt from the saved lse:
//   dP_ij  = dout_i . v_j;   delta_i = dout_i . out_i  (= sum_j P_ij dP_ij)
//   dx_ij  = P_ij (dP_ij - delta_i)
//   dq_i   = scale sum_{j<=i} dx_ij k_j                 (per query row)
//   dk_j   = scale sum_{i>=j} dx_ij q_i,  dv_j = sum_{i>=j} P_ij dout_i
//                                                       (per key row)
// Every dot product and sum accumulates in double (accum_t); the row
// accumulators live in scratch Views of [B*S, D] doubles owned by the
// launchers, so each work item writes only its own row (no atomics).
//
// Attention dropout (p > 0): P_ij becomes P_ij z_ij with z_ij = keep_ij /
// (1 - p), keep_ij the decision dropout_apply makes for element (b, i, j) of
// the unfused probabilities [B, S, S] at the same placement. So
//   out_i  = sum_j z_ij exp(x_ij - m_i) v_j / l_i   (l_i, lse_i undropped)
//   dP_ij  = z_ij dout_i . v_j,  dx_ij = P_ij (dP_ij - delta_i),
//   dv_j   = sum_{i>=j} z_ij P_ij dout_i,
// and delta_i = dout_i . out_i still equals sum_j P_ij dP_ij.
//
// Scores (AttentionScores): the keys j <= i are visible (causal), each
// logit gaining the ALiBi bias slope_h (j - i) of the entry's head where
// slopes are given (as ops::scaled_causal_softmax_forward); or, with a key
// mask (BERT), every key of the entry's sample whose flag is non-zero (as
// ops::scaled_masked_softmax_forward). The sums above run over the visible
// keys only. A row with no visible key has out = 0, lse = +inf (so P = 0),
// and no gradient, as the unfused masked softmax's all-zero row.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/kokkos/common.hpp"
#include "kernels/kokkos/dropout.hpp"

namespace meshtron::kernels {

/// z_ij of the file comment: 1 without dropout.
struct AttentionMask {
  bool on = false;
  double p = 0.0;
  DropoutPlacement site{};

  /// For key j of query row `row` (of the B*S rows: entry S + i), whose
  /// probabilities are local elements row S + j of [B, S, S].
  KOKKOS_INLINE_FUNCTION accum_t operator()(kindex row, kindex j, kindex S) const {
    if (!on) return 1;
    return site.keep(row * S + j, p) ? accum_t(1) / (1 - p) : accum_t(0);
  }
};

/// Which keys row r (= entry S + i, entry = sample x heads + head) sees and
/// the bias of its logits; see the file comment.
struct AttentionScores {
  const float* alibi_slopes = nullptr;     ///< [alibi_heads], or none
  kindex alibi_heads = 1;
  const std::int32_t* key_mask = nullptr;  ///< [B / mask_heads, S]; none: causal
  kindex mask_heads = 1;

  KOKKOS_INLINE_FUNCTION bool causal() const { return key_mask == nullptr; }
  /// The last key any row might see: i when causal, else S - 1.
  KOKKOS_INLINE_FUNCTION kindex last_key(kindex r, kindex S) const {
    return causal() ? r % S : S - 1;
  }
  /// The first query row that might see key j (of S): j when causal, else 0.
  KOKKOS_INLINE_FUNCTION kindex first_query(kindex j) const { return causal() ? j : 0; }
  /// Whether key j <= last_key(r, S) is visible to row r.
  KOKKOS_INLINE_FUNCTION bool visible(kindex r, kindex j, kindex S) const {
    return causal() || key_mask[(r / S / mask_heads) * S + j] != 0;
  }
  KOKKOS_INLINE_FUNCTION accum_t bias(kindex r, kindex j, kindex S) const {
    if (!alibi_slopes) return 0;
    return accum_t(alibi_slopes[(r / S) % alibi_heads]) * accum_t(j - r % S);
  }
};

template <class ExecSpace>
using Scratch = Kokkos::View<accum_t**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

/// a_row . b_row over D features, in double.
template <class T>
KOKKOS_INLINE_FUNCTION accum_t row_dot(const T* a, const T* b, kindex D) {
  accum_t s = 0;
  for (kindex d = 0; d < D; ++d) s += accum_t(a[d]) * accum_t(b[d]);
  return s;
}

template <class ExecSpace, class T>
struct CausalAttentionForward {
  const T *q, *k, *v;
  kindex S, D;
  accum_t scale;
  AttentionMask z;
  AttentionScores sc;
  Scratch<ExecSpace> acc;  // [B*S, D]
  T *out, *lse;

  KOKKOS_INLINE_FUNCTION accum_t logit(const T* qi, kindex r, kindex first, kindex j) const {
    return scale * row_dot(qi, k + (first + j) * D, D) + sc.bias(r, j, S);
  }

  KOKKOS_INLINE_FUNCTION void operator()(kindex r) const {
    const kindex i = r % S, first = r - i;  // row of key 0 in this batch entry
    const kindex last = sc.last_key(r, S);
    const T* qi = q + r * D;
    accum_t m = -accum_t(INFINITY);
    for (kindex j = 0; j <= last; ++j)
      if (sc.visible(r, j, S)) m = kmath::fmax(m, logit(qi, r, first, j));
    accum_t l = 0;
    for (kindex d = 0; d < D; ++d) acc(r, d) = 0;
    for (kindex j = 0; j <= last; ++j) {
      if (!sc.visible(r, j, S)) continue;
      const accum_t e = kmath::exp(logit(qi, r, first, j) - m);
      l += e;
      const accum_t ez = e * z(r, j, S);
      const T* vj = v + (first + j) * D;
      for (kindex d = 0; d < D; ++d) acc(r, d) += ez * accum_t(vj[d]);
    }
    for (kindex d = 0; d < D; ++d) out[r * D + d] = l > 0 ? T(acc(r, d) / l) : T(0);
    lse[r] = l > 0 ? T(m + kmath::log(l)) : T(INFINITY);  // no visible key: P = 0
  }
};

/// Per query row: delta_i, then dq_i.
template <class ExecSpace, class T>
struct CausalAttentionBackwardQuery {
  const T *dout, *q, *k, *v, *out, *lse;
  kindex S, D;
  accum_t scale;
  AttentionMask z;
  AttentionScores sc;
  Scratch<ExecSpace> acc;  // [B*S, D]
  Kokkos::View<accum_t*, typename ExecSpace::memory_space> delta;
  T* dq;

  KOKKOS_INLINE_FUNCTION void operator()(kindex r) const {
    const kindex i = r % S, first = r - i, last = sc.last_key(r, S);
    const T *qi = q + r * D, *doi = dout + r * D;
    const accum_t delta_i = row_dot(doi, out + r * D, D);
    delta(r) = delta_i;
    for (kindex d = 0; d < D; ++d) acc(r, d) = 0;
    for (kindex j = 0; j <= last; ++j) {
      if (!sc.visible(r, j, S)) continue;
      const T *kj = k + (first + j) * D, *vj = v + (first + j) * D;
      const accum_t p =
          kmath::exp(scale * row_dot(qi, kj, D) + sc.bias(r, j, S) - accum_t(lse[r]));
      const accum_t dx = p * (z(r, j, S) * row_dot(doi, vj, D) - delta_i);
      for (kindex d = 0; d < D; ++d) acc(r, d) += dx * accum_t(kj[d]);
    }
    for (kindex d = 0; d < D; ++d) dq[r * D + d] = T(scale * acc(r, d));
  }
};

/// Per key row: dk_j and dv_j (after the query pass has filled delta).
template <class ExecSpace, class T>
struct CausalAttentionBackwardKey {
  const T *dout, *q, *k, *v, *lse;
  kindex S, D;
  accum_t scale;
  AttentionMask z;
  AttentionScores sc;
  Scratch<ExecSpace> acc_k, acc_v;  // [B*S, D]
  Kokkos::View<const accum_t*, typename ExecSpace::memory_space> delta;
  T *dk, *dv;

  KOKKOS_INLINE_FUNCTION void operator()(kindex r) const {
    const kindex j = r % S, first = r - j;
    const T *kj = k + r * D, *vj = v + r * D;
    for (kindex d = 0; d < D; ++d) acc_k(r, d) = acc_v(r, d) = 0;
    for (kindex i = sc.first_query(j); i < S; ++i) {
      const kindex ri = first + i;
      if (!sc.visible(ri, j, S)) continue;
      const T *qi = q + ri * D, *doi = dout + ri * D;
      const accum_t p =
          kmath::exp(scale * row_dot(qi, kj, D) + sc.bias(ri, j, S) - accum_t(lse[ri]));
      const accum_t zij = z(ri, j, S), pz = p * zij;
      const accum_t dx = p * (zij * row_dot(doi, vj, D) - delta(ri));
      for (kindex d = 0; d < D; ++d) {
        acc_k(r, d) += dx * accum_t(qi[d]);
        acc_v(r, d) += pz * accum_t(doi[d]);
      }
    }
    for (kindex d = 0; d < D; ++d) {
      dk[r * D + d] = T(scale * acc_k(r, d));
      dv[r * D + d] = T(acc_v(r, d));
    }
  }
};

// ---------------------------------------------------------------- launchers

/// q, k, v, out: [B, S, D]; lse: [B, S].
template <class ExecSpace, class T>
void causal_attention_forward(const T* q, const T* k, const T* v, kindex B, kindex S, kindex D,
                              double scale, const AttentionMask& z, const AttentionScores& sc,
                              T* out, T* lse) {
  const kindex rows = B * S;
  Scratch<ExecSpace> acc("meshtron::attention_acc", rows, D);
  CausalAttentionForward<ExecSpace, T> f{q, k, v, S, D, scale, z, sc, acc, out, lse};
  Kokkos::parallel_for("meshtron::attention_forward", Range<ExecSpace>(0, rows), f);
  Kokkos::fence();
}

template <class ExecSpace, class T>
void causal_attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out,
                               const T* lse, kindex B, kindex S, kindex D, double scale,
                               const AttentionMask& z, const AttentionScores& sc, T* dq, T* dk,
                               T* dv) {
  const kindex rows = B * S;
  Scratch<ExecSpace> acc_a("meshtron::attention_acc_a", rows, D),
      acc_b("meshtron::attention_acc_b", rows, D);
  Kokkos::View<accum_t*, typename ExecSpace::memory_space> delta("meshtron::attention_delta", rows);
  CausalAttentionBackwardQuery<ExecSpace, T> fq{dout, q,  k,     v,   out,   lse,   S,
                                                D,    scale, z, sc, acc_a, delta, dq};
  Kokkos::parallel_for("meshtron::attention_backward_dq", Range<ExecSpace>(0, rows), fq);
  CausalAttentionBackwardKey<ExecSpace, T> fk{dout, q,  k,     v,     lse,   S,  D, scale,
                                              z,    sc, acc_a, acc_b, delta, dk, dv};
  Kokkos::parallel_for("meshtron::attention_backward_dkdv", Range<ExecSpace>(0, rows), fk);
  Kokkos::fence();
}

}  // namespace meshtron::kernels
