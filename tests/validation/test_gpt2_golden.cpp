// The golden GPT-2 model on the host path (the checks: tests/common/gpt2_golden.hpp).
#include "common/gpt2_golden.hpp"

namespace meshtron::golden {
INSTANTIATE_TEST_SUITE_P(Host, Gpt2Golden, ::testing::Values(MemorySpace::Host));
}  // namespace meshtron::golden
