// Tensors across memory spaces, the cast kernel and the device allocator.
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include "gpu_ops_test_util.hpp"
#include "ops/cast.hpp"
#include "tensor/device_allocator.hpp"

namespace meshtron::ops {
namespace {

using namespace gpu_ops_test;

// ================================================= tensors and allocator ==

TEST_F(GpuOps, TensorCopiesFillAndConversionsAcrossSpaces) {
  const Tensor h = random_host({33, 17});
  const Tensor d = h.to_device();
  EXPECT_FALSE(d.is_host());
  expect_close(d, h, 0.0, "to_device/to_doubles round trip");
  expect_close(d.to_host(), h, 0.0, "to_host");
  expect_close(d.clone(), h, 0.0, "device clone");
  const Tensor d_bf16 = d.to(DType::BF16);  // device -> device with conversion
  EXPECT_EQ(d_bf16.space(), MemorySpace::Cuda);
  expect_close(d_bf16, h.to(DType::BF16), 0.0, "device fp32 -> bf16");
  Tensor z = Tensor::zeros({1000}, DType::F32, MemorySpace::Cuda);
  for (double v : z.to_doubles()) ASSERT_EQ(v, 0.0);
  z.fill(2.5);
  for (double v : z.to_doubles()) ASSERT_EQ(v, 2.5);
  Tensor dst = Tensor::empty({33, 17}, DType::F32, MemorySpace::Cuda);
  dst.copy_from(d_bf16);
  expect_close(dst, h.to(DType::BF16), 0.0, "copy_from bf16 device into fp32 device");
  expect_close(d.slice_rows(3, 10), h.slice_rows(3, 10), 0.0, "slice_rows of a device tensor");
}

TEST_F(GpuOps, CastKernelRoundsLikeTheHostConversion) {
  // ops::cast on the device (kernels/cuda/cast.cu) against the host's
  // software bf16/fp16 rounding (tensor/types.hpp), both ways, bit for bit;
  // the range covers fp16 subnormals and overflow to inf.
  Tensor h = random_host({4099}, -2.0, 2.0);
  for (index_t i = 0; i < h.numel(); i += 7) h.data<float>()[i] *= float(i % 3 == 0 ? 1e-6 : 1e5);
  for (DType half : {DType::BF16, DType::F16}) {
    const Tensor d = h.to_device();
    Tensor narrow = Tensor::empty(h.shape(), half, MemorySpace::Cuda);
    ops::cast(d, narrow);
    const Tensor expected = h.to(half);
    const auto got = narrow.to_doubles(), want = expected.to_doubles();
    int differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      differ += !(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])));
    EXPECT_EQ(differ, 0) << "fp32 -> " << name(half);
    Tensor wide = Tensor::empty(h.shape(), DType::F32, MemorySpace::Cuda);
    ops::cast(narrow, wide);
    EXPECT_EQ(wide.to_doubles(), want) << name(half) << " -> fp32";
  }
}

TEST_F(GpuOps, AllocatorReusesFreedBlocksWithoutCudaMalloc) {
  device::release_cached();
  const device::AllocatorStats before = device::allocator_stats();
  EXPECT_EQ(before.cached_bytes, 0u);
  for (int round = 0; round < 2; ++round) {  // round 1 must be served from the cache
    std::vector<Tensor> live;
    for (index_t n : {1, 100, 5000, 1 << 20, 3 << 20}) live.push_back(Tensor::empty({n}, DType::F32, MemorySpace::Cuda));
    const device::AllocatorStats during = device::allocator_stats();
    EXPECT_GE(during.current_bytes, before.current_bytes + sizeof(float) * ((1 << 20) + (3 << 20)));
    EXPECT_GE(during.peak_bytes, during.current_bytes);
    if (round == 1) EXPECT_EQ(during.cuda_mallocs, before.cuda_mallocs + 5) << "cache missed";
  }
  const device::AllocatorStats after = device::allocator_stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_GT(after.cached_bytes, 0u);
  device::release_cached();
  EXPECT_EQ(device::allocator_stats().cached_bytes, 0u);
}

}  // namespace
}  // namespace meshtron::ops
