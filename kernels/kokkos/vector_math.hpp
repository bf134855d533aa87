// Row loops of the cross-entropy over the vocabulary (the hottest host code
// of a small-model CPU step: the LM head's logits are [tokens, vocab]).
//
// The float versions are compiled for AVX-512, AVX2 and baseline x86-64
// (function multiversioning picks one at load time) with FP contraction
// off, so every machine computes the same bits in the same order: only the
// vector width differs. exp is Cephes' expf written without branches or
// library calls (std::exp is a scalar call per element, which made exp the
// largest cost of a CPU training step). double versions use std::exp (the
// fp64 checks want full accuracy).
#pragma once

#include <cmath>
#include <cstdint>

namespace meshtron::kernels {

/// exp(x) to about 1 ulp; NaN propagates, x < -87.34 (below FLT_MIN) gives 0,
/// x > 88.72 gives inf, (88, 88.72] gives exp(88).
float vector_exp(float x);
inline double vector_exp(double x) { return std::exp(x); }

/// max_v row[v] (a NaN is skipped like std::fmax does; the exp below turns
/// it into a NaN sum, so a NaN logit still surfaces as a NaN loss).
float row_maximum(const float* row, std::int64_t n);
double row_maximum(const double* row, std::int64_t n);

/// sum_v exp(row[v] - m): blocks of 64 summed over 8 interleaved lanes in a
/// fixed order, the block sums added in double.
double row_sum_exp(const float* row, std::int64_t n, float m);
double row_sum_exp(const double* row, std::int64_t n, double m);

/// out[v] = scale * exp(row[v] - m); out and row do not overlap.
void scaled_exp_row(const float* row, std::int64_t n, float m, float scale, float* out);
void scaled_exp_row(const double* row, std::int64_t n, double m, double scale, double* out);

}  // namespace meshtron::kernels
