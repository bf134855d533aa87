// The cases of T5's attention softmax (scale, relative bias, key mask,
// causal) that the host op test and the GPU-against-host test run.
#pragma once

#include <cstdint>

#include "tensor/tensor.hpp"

namespace meshtron::ops::test_support {

/// Scores [batch * heads, Sq, Sk] and which masks apply.
struct SoftmaxCase {
  index_t batch, heads, Sq, Sk;
  bool bias, key_mask, causal;
};

/// Key mask int32 [batch, Sk]: sample b's last b keys masked; sample 1 (when
/// there is one) has none left, so its rows are all zero.
inline Tensor key_mask_for(index_t batch, index_t Sk) {
  Tensor m = Tensor::empty({batch, Sk}, DType::I32);
  for (index_t b = 0; b < batch; ++b)
    for (index_t j = 0; j < Sk; ++j)
      m.data<std::int32_t>()[b * Sk + j] = b == 1 ? 0 : (j < Sk - b ? 1 : 0);
  return m;
}

}  // namespace meshtron::ops::test_support
