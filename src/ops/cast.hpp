// ops::cast: copy with dtype conversion, kept out of the host staging path.
//
// Tensor::copy_from converts through a host copy (fine for setup and
// checkpoints). The mixed-precision step converts every step: the optimizer
// writes the bf16/fp16 compute copy of its fp32 master weights, and the LM
// head casts its fp32 logits gradient to bf16/fp16 for the GEMMs. On the
// device fp32 <-> bf16/fp16 is one elementwise kernel (kernels/cuda/cast.cu).
#pragma once

#include "tensor/tensor.hpp"

namespace meshtron::ops {

/// dst = src converted to dst's dtype; equal numel, one memory space.
void cast(const Tensor& src, Tensor& dst);

}  // namespace meshtron::ops

namespace meshtron::cuda {
/// Launcher (CUDA path only): n elements, fp32 <-> bf16 or fp16.
void cast(DType from, const void* src, DType to, void* dst, index_t n);
}  // namespace meshtron::cuda
