// The gradient-clipping factor, one definition for the host (optimizer,
// Kokkos path) and the CUDA AdamW kernels, which compute it from a gradient
// norm that never leaves the device (ops::AdamWParams::grad_sum_of_squares).
#pragma once

#include "common/host_device.hpp"

namespace meshtron::ops {

/// torch.nn.utils.clip_grad_norm_: gradients scale by max_norm / (norm +
/// 1e-6) when norm > max_norm; max_norm <= 0 means no clipping (1).
MESH_HOST_DEVICE inline double clip_factor(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

}  // namespace meshtron::ops
