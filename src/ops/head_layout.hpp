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

/// Grouped-query attention through the multi-head fused kernels: the
/// projection's rows qkv [tokens, (heads + 2 groups) d] (q | k | v, the kv
/// groups in order) -> out [tokens, 3 heads d] (q | k | v of `heads` each),
/// key and value head h being group h / (heads / groups), as Megatron-LM's
/// and transformers' repeat_kv lay them out.
void expand_kv_groups(const Tensor& qkv, index_t heads, index_t groups, Tensor& out);
/// Its backward: dqkv [tokens, (heads + 2 groups) d] from dout [tokens, 3
/// heads d]: dq copied, each group's dk and dv the sum over its heads
/// (accumulated in fp32 for bf16/fp16, in the dtype otherwise).
void reduce_kv_groups(const Tensor& dout, index_t heads, index_t groups, Tensor& dqkv);

}  // namespace meshtron::ops
