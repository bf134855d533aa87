// The reductions on the device against the host (src/ops/ops_reductions.cpp).
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include <utility>
#include <vector>

#include "gpu_ops_test_util.hpp"

namespace meshtron::ops {
namespace {

using namespace gpu_ops_test;

// =========================================================== Reductions ==

TEST_F(GpuOps, SumOfSquaresOfALargeTensorMatchesHost) {
  const Pair x = input({(1 << 22) + 17}, DType::F32);
  const double host = sum_of_squares(x.host), dev = sum_of_squares(x.dev);
  EXPECT_NEAR(dev, host, 1e-9 * host);
  EXPECT_EQ(dev, sum_of_squares(x.dev)) << "not deterministic";
}

TEST_F(GpuOps, SumOfSquaresOfManyTensorsMatchesHost) {
  // Mixed dtypes and sizes, an empty tensor, one sum with a single copy back.
  std::vector<Tensor> host, dev;
  for (auto [n, dt] : {std::pair{index_t(1 << 20), DType::F32}, {index_t(0), DType::F32},
                       {index_t(1000), DType::BF16}, {index_t(3), DType::F16},
                       {index_t(777777), DType::BF16}}) {
    const Pair x = input({n}, dt);
    host.push_back(x.host);
    dev.push_back(x.dev);
  }
  double expected = 0;
  for (const Tensor& h : host) expected += sum_of_squares(h);
  const double got = sum_of_squares(dev);
  EXPECT_NEAR(got, expected, 1e-6 * expected);
  EXPECT_EQ(got, sum_of_squares(dev)) << "not deterministic";
  EXPECT_EQ(sum_of_squares(host), expected);
}

#ifdef MESHTRON_HAVE_CUDA
// Row loops past one pass of the grid: see gpu_ops_test_util.hpp (misaligned_copy).

// The last block of a sum_of_squares call adds the block partials and
// resets the ticket counter: back-to-back calls of different sizes and
// dtypes (16-bit packs are squared in fp32 first), aligned and one element
// off, each match the host and repeat bit for bit.
TEST_F(GpuOps, SumOfSquaresBackToBackCallsMatchHostAndRepeat) {
  for (int round = 0; round < 2; ++round)
    for (DType dt : kDtypes)
      for (index_t n : {index_t(1), index_t(7), index_t(4099), index_t(8192 * 3072 + 5)}) {
        const std::string what = "sum_of_squares " + name(dt) + " n=" + std::to_string(n);
        const Pair x = input({n}, dt, -3.0, 3.0);
        const double host = sum_of_squares(x.host), dev = sum_of_squares(x.dev);
        EXPECT_NEAR(dev, host, 1e-6 * host) << what;
        EXPECT_EQ(dev, sum_of_squares(x.dev)) << what << ": not deterministic";
        const OffsetView off = misaligned_copy(x.dev);
        EXPECT_NEAR(sum_of_squares(off.view), host, 1e-6 * host) << what << " misaligned";
      }
  // Many tensors: 48 of 1M elements are 48 x 1024 block partials.
  std::vector<Tensor> host, dev;
  for (int k = 0; k < 48; ++k) {
    const Pair x = input({index_t(1 << 20) + k}, k % 3 == 0 ? DType::F32 : DType::BF16);
    host.push_back(x.host);
    dev.push_back(x.dev);
  }
  const double expected = sum_of_squares(host), got = sum_of_squares(dev);
  EXPECT_NEAR(got, expected, 1e-6 * expected);
  EXPECT_EQ(got, sum_of_squares(dev)) << "many tensors: not deterministic";
}
#endif

}  // namespace
}  // namespace meshtron::ops
