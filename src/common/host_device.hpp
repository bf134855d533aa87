// MESH_HOST_DEVICE: a function compiled for both the host and, under nvcc,
// the GPU, so that one definition serves the host path (and its tests) and
// the CUDA kernels (ops/clip_factor.hpp, ops/attention_mask_layout.hpp).
#pragma once

#if defined(__CUDACC__)
#define MESH_HOST_DEVICE __host__ __device__
#else
#define MESH_HOST_DEVICE
#endif
