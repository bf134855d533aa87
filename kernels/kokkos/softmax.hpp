// ==================================================== Scaled causal softmax ==
//
// Attention scores [B, S, S] (B = batch x heads) are viewed as B*S rows of S
// columns; row r is query position i = r mod S and may attend to keys
// j = 0..i only. One row per work item:
//   m        = max_{j<=i} scale * s[j]                (for exp stability)
//   p[j]     = exp(scale * s[j] - m) / sum_{k<=i} exp(scale * s[k] - m)
//   p[j > i] = 0 exactly (never exp(-inf) arithmetic)
// The normaliser sums the stored (rounded) exponentials in double so that
// each row sums to 1 to the output precision.
//
// With ALiBi slopes (Press et al., 2022; slopes fp32 [H], the matrix b of
// the B being head b mod H) each logit scale * s[j] gains slope * (j - i):
// at most 0, 0 on the diagonal, so the row max stays near the unbiased one.
//
// Backward (softmax Jacobian, then the chain rule through the scale):
//   ds[j] = scale * p[j] * (dp[j] - sum_k dp[k] p[k]),  0 for j > i.
// The ALiBi bias is a constant: the backward is the same with or without it.
#pragma once

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

template <class ExecSpace, class T>
struct ScaledCausalSoftmaxForward {
  Matrix<const T, ExecSpace> scores;  // [B*S, S]
  T scale;
  Matrix<T, ExecSpace> probs;
  const float* alibi_slopes = nullptr;  ///< [heads], or none
  kindex heads = 1;

  /// scale * s[r, j], plus the ALiBi bias of row r's head.
  KOKKOS_INLINE_FUNCTION T logit(kindex r, kindex j, kindex last) const {
    if (!alibi_slopes) return scale * scores(r, j);
    const T slope = T(alibi_slopes[(r / scores.extent(1)) % heads]);
    return scale * scores(r, j) + slope * T(j - last);
  }

  KOKKOS_INLINE_FUNCTION void operator()(kindex r) const {
    const kindex S = scores.extent(1);
    const kindex last = r % S;  // query position: keys 0..last are visible
    T row_max = logit(r, 0, last);
    for (kindex j = 1; j <= last; ++j) row_max = kmath::fmax(row_max, logit(r, j, last));
    accum_t sum = 0;
    for (kindex j = 0; j <= last; ++j) {
      const T e = kmath::exp(logit(r, j, last) - row_max);
      probs(r, j) = e;
      sum += e;
    }
    const T inv_sum = T(1.0 / sum);
    for (kindex j = 0; j <= last; ++j) probs(r, j) *= inv_sum;
    for (kindex j = last + 1; j < S; ++j) probs(r, j) = T(0);
  }
};

template <class ExecSpace, class T>
struct ScaledCausalSoftmaxBackward {
  Matrix<const T, ExecSpace> dprobs, probs;  // [B*S, S]
  T scale;
  Matrix<T, ExecSpace> dscores;

  KOKKOS_INLINE_FUNCTION void operator()(kindex r) const {
    const kindex S = probs.extent(1);
    const kindex last = r % S;
    accum_t dot = 0;
    for (kindex j = 0; j <= last; ++j) dot += accum_t(dprobs(r, j)) * probs(r, j);
    for (kindex j = 0; j <= last; ++j)
      dscores(r, j) = T(scale * (probs(r, j) * (dprobs(r, j) - dot)));
    for (kindex j = last + 1; j < S; ++j) dscores(r, j) = T(0);
  }
};

// ==================================================== Scaled masked softmax ==
//
// Bidirectional attention with a key-padding mask (BERT, T5's encoder): row
// r of matrix m = r / S sees every key j whose key_mask[m / heads, j] is
// non-zero (matrix m belongs to sample m / heads, B being [batch, heads]
// flattened). Padding keys get exactly 0, as transformers' additive
// finfo.min mask gives after exp(); a row with no real key is all zeros.
// Backward: the row's full softmax Jacobian; p = 0 at padding keys makes
// their ds 0 without reading the mask.

template <class ExecSpace, class T>
struct ScaledMaskedSoftmaxForward {
  Matrix<const T, ExecSpace> scores;  // [B*S, S]
  const std::int32_t* key_mask;       ///< [batch, S]
  kindex heads;
  T scale;
  Matrix<T, ExecSpace> probs;

  KOKKOS_INLINE_FUNCTION void operator()(kindex r) const {
    const kindex S = scores.extent(1);
    const std::int32_t* real = key_mask + (r / S / heads) * S;
    bool any = false;
    T row_max = T(0);
    for (kindex j = 0; j < S; ++j) {
      if (!real[j]) continue;
      row_max = any ? kmath::fmax(row_max, scale * scores(r, j)) : scale * scores(r, j);
      any = true;
    }
    accum_t sum = 0;
    for (kindex j = 0; j < S; ++j) {
      const T e = real[j] ? T(kmath::exp(scale * scores(r, j) - row_max)) : T(0);
      probs(r, j) = e;
      sum += e;
    }
    const T inv_sum = any ? T(1.0 / sum) : T(0);
    for (kindex j = 0; j < S; ++j) probs(r, j) *= inv_sum;
  }
};

template <class ExecSpace, class T>
struct ScaledSoftmaxBackward {
  Matrix<const T, ExecSpace> dprobs, probs;  // [B*S, S]
  T scale;
  Matrix<T, ExecSpace> dscores;

  KOKKOS_INLINE_FUNCTION void operator()(kindex r) const {
    const kindex S = probs.extent(1);
    accum_t dot = 0;
    for (kindex j = 0; j < S; ++j) dot += accum_t(dprobs(r, j)) * probs(r, j);
    for (kindex j = 0; j < S; ++j)
      dscores(r, j) = T(scale * (probs(r, j) * (dprobs(r, j) - dot)));
  }
};

// ======================================================= Attention softmax ==
//
// The general form (T5; any Sq, Sk): scores [B, Sq, Sk] as B*Sq rows of Sk
// columns; row r is query i = r mod Sq of matrix m = r / Sq (sample
// m / heads, head m % heads). Key j is visible unless key_mask[sample, j]
// is 0 or, causal, j > i + (Sk - Sq) (the queries are the last Sq of Sk
// positions: decoding after a prefix). Over the visible keys
//   logit[j] = scale * s[j] + bias[head, i, j]      (bias optional)
//   p[j]     = exp(logit[j] - max) / sum exp(logit[k] - max)
// and p = 0 exactly elsewhere; a row without a visible key is all 0.
// Backward over whole rows (p = 0 where masked): the softmax Jacobian,
// dlogit[j] = p[j] (dp[j] - sum_k dp[k] p[k]) (ScaledSoftmaxBackward, scale
// 1); the bias gradient sums dlogit over the samples, one work item per
// (head, i, j) walking the samples in order (no atomics).

template <class ExecSpace, class T, class Bias>
struct AttentionSoftmaxForward {
  Matrix<const T, ExecSpace> scores;  // [B*Sq, Sk]
  T scale;
  kindex Sq, heads;
  const Bias* bias;                   ///< [heads, Sq, Sk], or null
  const std::int32_t* key_mask;       ///< [B / heads, Sk], or null
  kindex causal_shift;                ///< Sk - Sq; negative: no causal mask
  bool causal;
  Matrix<T, ExecSpace> probs;

  KOKKOS_INLINE_FUNCTION bool visible(kindex r, kindex j) const {
    if (causal && j > r % Sq + causal_shift) return false;
    return !key_mask || key_mask[(r / Sq / heads) * kindex(scores.extent(1)) + j] != 0;
  }
  KOKKOS_INLINE_FUNCTION T logit(kindex r, kindex j) const {
    const kindex Sk = scores.extent(1);
    if (!bias) return scale * scores(r, j);
    const kindex head = (r / Sq) % heads, i = r % Sq;
    return scale * scores(r, j) + T(bias[(head * Sq + i) * Sk + j]);
  }

  KOKKOS_INLINE_FUNCTION void operator()(kindex r) const {
    const kindex Sk = scores.extent(1);
    bool any = false;
    T row_max = T(0);
    for (kindex j = 0; j < Sk; ++j) {
      if (!visible(r, j)) continue;
      const T x = logit(r, j);
      row_max = any ? kmath::fmax(row_max, x) : x;
      any = true;
    }
    accum_t sum = 0;
    for (kindex j = 0; j < Sk; ++j) {
      const T e = visible(r, j) ? T(kmath::exp(logit(r, j) - row_max)) : T(0);
      probs(r, j) = e;
      sum += e;
    }
    const T inv_sum = any ? T(1.0 / sum) : T(0);
    for (kindex j = 0; j < Sk; ++j) probs(r, j) *= inv_sum;
  }
};

template <class ExecSpace, class T, class Bias>
struct AttentionBiasBackward {
  Matrix<const T, ExecSpace> dlogits;  // [B, Sq * Sk]
  kindex heads;
  Matrix<Bias, ExecSpace> dbias;       // [heads, Sq * Sk]

  KOKKOS_INLINE_FUNCTION void operator()(kindex k) const {
    const kindex n = dbias.extent(1), h = k / n, e = k % n;
    accum_t sum = 0;
    for (kindex m = h; m < kindex(dlogits.extent(0)); m += heads) sum += dlogits(m, e);
    dbias(h, e) += Bias(sum);
  }
};

// ---------------------------------------------------------------- launchers

/// scores, probs: [batch_heads, S, S]; alibi_slopes [heads] or null.
template <class ExecSpace, class T>
void scaled_causal_softmax_forward(const T* scores, kindex batch_heads, kindex S, double scale,
                                   T* probs, const float* alibi_slopes = nullptr,
                                   kindex heads = 1) {
  const kindex rows = batch_heads * S;
  ScaledCausalSoftmaxForward<ExecSpace, T> f{as_matrix<ExecSpace>(scores, rows, S), T(scale),
                                             as_matrix<ExecSpace>(probs, rows, S), alibi_slopes,
                                             heads};
  Kokkos::parallel_for("meshtron::softmax_forward", Range<ExecSpace>(0, rows), f);
}

template <class ExecSpace, class T>
void scaled_causal_softmax_backward(const T* dprobs, const T* probs, kindex batch_heads, kindex S,
                                    double scale, T* dscores) {
  const kindex rows = batch_heads * S;
  ScaledCausalSoftmaxBackward<ExecSpace, T> f{as_matrix<ExecSpace>(dprobs, rows, S),
                                              as_matrix<ExecSpace>(probs, rows, S), T(scale),
                                              as_matrix<ExecSpace>(dscores, rows, S)};
  Kokkos::parallel_for("meshtron::softmax_backward", Range<ExecSpace>(0, rows), f);
}

/// scores, probs: [batch_heads, S, S]; key_mask int32 [batch_heads / heads, S].
template <class ExecSpace, class T>
void scaled_masked_softmax_forward(const T* scores, const std::int32_t* key_mask,
                                   kindex batch_heads, kindex heads, kindex S, double scale,
                                   T* probs) {
  const kindex rows = batch_heads * S;
  ScaledMaskedSoftmaxForward<ExecSpace, T> f{as_matrix<ExecSpace>(scores, rows, S), key_mask,
                                             heads, T(scale), as_matrix<ExecSpace>(probs, rows, S)};
  Kokkos::parallel_for("meshtron::masked_softmax_forward", Range<ExecSpace>(0, rows), f);
}

template <class ExecSpace, class T>
void scaled_masked_softmax_backward(const T* dprobs, const T* probs, kindex batch_heads, kindex S,
                                    double scale, T* dscores) {
  const kindex rows = batch_heads * S;
  ScaledSoftmaxBackward<ExecSpace, T> f{as_matrix<ExecSpace>(dprobs, rows, S),
                                        as_matrix<ExecSpace>(probs, rows, S), T(scale),
                                        as_matrix<ExecSpace>(dscores, rows, S)};
  Kokkos::parallel_for("meshtron::masked_softmax_backward", Range<ExecSpace>(0, rows), f);
}

/// scores, probs: [batch_heads, Sq, Sk]; bias [heads, Sq, Sk] or null;
/// key_mask [batch_heads / heads, Sk] or null.
template <class ExecSpace, class T, class Bias>
void attention_softmax_forward(const T* scores, kindex batch_heads, kindex Sq, kindex Sk,
                               double scale, kindex heads, const Bias* bias,
                               const std::int32_t* key_mask, bool causal, T* probs) {
  const kindex rows = batch_heads * Sq;
  AttentionSoftmaxForward<ExecSpace, T, Bias> f{as_matrix<ExecSpace>(scores, rows, Sk),
                                                T(scale),
                                                Sq,
                                                heads,
                                                bias,
                                                key_mask,
                                                Sk - Sq,
                                                causal,
                                                as_matrix<ExecSpace>(probs, rows, Sk)};
  Kokkos::parallel_for("meshtron::attention_softmax_forward", Range<ExecSpace>(0, rows), f);
}

/// dprobs, probs, dlogits: [rows, cols] (scale 1: the logits' gradient).
template <class ExecSpace, class T>
void attention_softmax_backward(const T* dprobs, const T* probs, kindex rows, kindex cols,
                                T* dlogits) {
  ScaledSoftmaxBackward<ExecSpace, T> f{as_matrix<ExecSpace>(dprobs, rows, cols),
                                        as_matrix<ExecSpace>(probs, rows, cols), T(1),
                                        as_matrix<ExecSpace>(dlogits, rows, cols)};
  Kokkos::parallel_for("meshtron::attention_softmax_backward", Range<ExecSpace>(0, rows), f);
}

/// dlogits [batch_heads, n = Sq * Sk], dbias [heads, n] (accumulate).
template <class ExecSpace, class T, class Bias>
void attention_bias_backward(const T* dlogits, kindex batch_heads, kindex n, kindex heads,
                             Bias* dbias) {
  AttentionBiasBackward<ExecSpace, T, Bias> f{as_matrix<ExecSpace>(dlogits, batch_heads, n),
                                              heads, as_matrix<ExecSpace>(dbias, heads, n)};
  Kokkos::parallel_for("meshtron::attention_bias_backward", Range<ExecSpace>(0, heads * n), f);
}

}  // namespace meshtron::kernels
