// How a backward op stores a parameter gradient.
#pragma once

namespace meshtron::ops {

/// Accumulate: added to what the gradient holds (the micro-batches of a
/// step). Overwrite: written over it, for the step's first contribution to
/// a gradient that was never zeroed (a deferred zero_grad, see
/// train/optimizer.hpp): the same values as zeroing and then accumulating,
/// without the memset (PyTorch's zero_grad(set_to_none=True) does the same).
enum class GradStore { Accumulate, Overwrite };

/// GEMM beta for a gradient written with `store`.
inline double gemm_beta(GradStore store) { return store == GradStore::Overwrite ? 0.0 : 1.0; }

}  // namespace meshtron::ops
