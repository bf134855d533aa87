// The golden GPT-2 model on ONE GPU in fp32, the whole model on device
// tensors, held to the host path's tolerances (tests/common/gpt2_golden.hpp).
// Skips (exit 0) without a GPU or without the golden files.
#include "common/gpt2_golden.hpp"

namespace meshtron::golden {
INSTANTIATE_TEST_SUITE_P(Cuda, Gpt2Golden, ::testing::Values(MemorySpace::Cuda));
}  // namespace meshtron::golden
