// Layout changes between the token-major activations of the linear layers,
// [s*b, parts * heads * d] with rows in [s, b] order, and the head-major
// layout of the attention core, [b * heads, s, d], where each (sample, head)
// is one contiguous matrix for the batched GEMMs.
#pragma once

#include "tensor/tensor.hpp"

namespace meshtron::ops {

/// x [s*b, parts*heads*d] -> out[p] [b*heads, s, d] for p < parts
/// (parts = 3 splits a fused q|k|v projection; parts = 1 one tensor).
void split_heads(const Tensor& x, index_t s, index_t b, index_t heads, int parts,
                 Tensor* out);
/// Inverse of split_heads: in[p] [b*heads, s, d] -> x [s*b, parts*heads*d].
void merge_heads(const Tensor* in, int parts, index_t s, index_t b, index_t heads,
                 Tensor& x);

}  // namespace meshtron::ops
