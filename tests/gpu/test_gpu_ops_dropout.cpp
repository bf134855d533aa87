// The dropout ops on the device against the host (src/ops/ops_dropout.cpp).
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include "gpu_ops_test_util.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "ops/ops_cuda.hpp"
#endif
#ifdef MESHTRON_HAVE_CUDA
#include "tensor/device_stream.hpp"
#endif

namespace meshtron::ops {
namespace {

using namespace gpu_ops_test;

// ============================================================== Dropout ==

/// A dropout output (inputs never 0) has the host's mask, zero exactly
/// where the host's is, and its values; with `drops`, something is dropped.
void expect_host_dropout(const Pair& y, DType dt, const std::string& what, bool drops = true) {
  const std::vector<double> d = y.dev.to_doubles(), h = y.host.to_doubles();
  index_t mismatches = 0, dropped = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    mismatches += (d[i] == 0.0) != (h[i] == 0.0);
    dropped += h[i] == 0.0;
  }
  EXPECT_EQ(mismatches, 0) << what << ": masks differ";
  if (drops) EXPECT_GT(dropped, 0) << what;
  expect_close(y, dt, what);
}

TEST_F(GpuOps, DropoutMaskIsIdenticalToTheHost) {
  for (DType dt : kDtypes)
    for (double p : {0.0, 0.1, 0.5})
      for (index_t N : {3, 257}) {
        DropoutSite site;
        site.seed = 0x1234567890abcdefULL;
        site.step = 7;
        site.stream = 3 * 16 + 2;
        site.a = 2, site.b = N, site.c = 130;
        site.a_offset = 1, site.b_offset = 5, site.c_offset = 390;
        site.b_global = N + 9, site.c_global = 768;
        const std::string what = "dropout " + name(dt) + " p=" + std::to_string(p) +
                                 " N=" + std::to_string(N);
        // |x| in [0.5, 1.5]: never 0, so a zero output means a dropped element.
        Tensor xh = random_host({2, N, 130}, 0.5, 1.5);
        std::bernoulli_distribution sign(0.5);
        for (index_t i = 0; i < xh.numel(); ++i)
          if (sign(rng())) xh.data<float>()[i] = -xh.data<float>()[i];
        const Tensor rounded = xh.to(dt);
        const Pair x{rounded.to(DType::F32), rounded.to_device()};
        Pair y = output(x.host.shape(), dt), dx = output(x.host.shape(), dt);
        dropout_forward(x.host, p, site, y.host);
        dropout_forward(x.dev, p, site, y.dev);
        dropout_backward(x.host, p, site, dx.host);
        dropout_backward(x.dev, p, site, dx.dev);
        for (const Pair* out : {&y, &dx}) expect_host_dropout(*out, dt, what, /*drops=*/p > 0);
      }
}

// kernels/cuda/dropout.cu has a packed kernel (16-byte aligned in and out;
// index carries within a pack) and the scalar one (anything else). Both
// must give the host's mask: rows of 768 (packs never cross a row), and a
// view from slice_rows(1, ...) of 130-wide rows (start 260 or 520 bytes in:
// not 16-byte aligned, so the scalar kernel), placed at b_offset = 1.
TEST_F(GpuOps, DropoutPackedAndUnalignedPathsGiveTheHostMask) {
  for (DType dt : kDtypes)
    for (index_t C : {index_t(768), index_t(130)}) {
      const index_t rows = 41;
      const bool sliced = C == 130;
      DropoutSite site;
      site.seed = 0xfeedbeef12345ULL;
      site.step = 11;
      site.stream = 5;
      site.a = 1, site.b = sliced ? rows - 1 : rows, site.c = C;
      site.b_offset = sliced ? 1 : 0;
      site.b_global = rows, site.c_global = C;
      const std::string what = "dropout " + name(dt) + " C=" + std::to_string(C) +
                               (sliced ? " unaligned view" : " packed");
      Tensor xh = random_host({rows, C}, 0.5, 1.5);
      const Tensor rounded = xh.to(dt);
      const Tensor x_host_full = rounded.to(DType::F32), x_dev_full = rounded.to_device();
      const Tensor x_host = sliced ? x_host_full.slice_rows(1, rows) : x_host_full;
      const Tensor x_dev = sliced ? x_dev_full.slice_rows(1, rows) : x_dev_full;
      if (sliced)
        ASSERT_NE(reinterpret_cast<std::uintptr_t>(x_dev.raw()) % 16, 0u) << what;
      Pair y = output(x_host.shape(), dt);
      dropout_forward(x_host, 0.3, site, y.host);
      dropout_forward(x_dev, 0.3, site, y.dev);
      expect_host_dropout(y, dt, what);
    }
}

// kernels/cuda/dropout.cu makes one Philox call per aligned group of 8
// global indices (grouped kernel) when C, c_offset and C_global are
// multiples of 8; otherwise the per-element kernels take their half-word of
// the group's call. Placements on both sides of that line, including rows
// of 8 (a bf16 thread's chunk spans two rows: carries between groups), odd
// lengths that leave a tail for block 0, and offsets in every axis.
TEST_F(GpuOps, DropoutGroupedAndPerElementPlacementsGiveTheHostMask) {
  struct Placement {
    index_t A, B, C, a_off, b_off, c_off, B_global, C_global;
  };
  const Placement placements[] = {
      {3, 5, 8, 1, 2, 8, 9, 16},        // grouped, 8-wide rows
      {1, 37, 136, 0, 3, 8, 41, 1000},  // grouped, chunk tail (37 * 136 % 16 != 0)
      {2, 7, 24, 5, 0, 0, 7, 24},       // grouped, whole rows
      {3, 5, 4, 1, 2, 8, 9, 16},        // C % 8 == 4: per element
      {2, 7, 136, 0, 0, 4, 7, 144},     // c_offset % 8 != 0: per element
      {2, 7, 132, 0, 0, 8, 7, 144},     // C % 8 != 0: per element
      {2, 7, 136, 0, 0, 8, 7, 148}};    // C_global % 8 != 0: per element
  for (DType dt : kDtypes)
    for (const Placement& pl : placements) {
      DropoutSite site;
      site.seed = 0x0badc0ffee123ULL;
      site.step = 4;
      site.stream = 17;
      site.a = pl.A, site.b = pl.B, site.c = pl.C;
      site.a_offset = pl.a_off, site.b_offset = pl.b_off, site.c_offset = pl.c_off;
      site.b_global = pl.B_global, site.c_global = pl.C_global;
      const std::string what = "dropout " + name(dt) + " [" + std::to_string(pl.A) + ", " +
                               std::to_string(pl.B) + ", " + std::to_string(pl.C) + "] c_off " +
                               std::to_string(pl.c_off) + " C_global " +
                               std::to_string(pl.C_global);
      const Tensor rounded = random_host({pl.A * pl.B, pl.C}, 0.5, 1.5).to(dt);
      const Pair x{rounded.to(DType::F32), rounded.to_device()};
      Pair y = output(x.host.shape(), dt);
      dropout_forward(x.host, 0.4, site, y.host);
      dropout_forward(x.dev, 0.4, site, y.dev);
      expect_host_dropout(y, dt, what);
    }
}

// dropout_add (out = residual + dropout(x), one pass) gives the bits of
// dropout_forward then add on the device, in each of dropout.cu's three
// kernels (grouped: rows of 768; packed: rows of 130, aligned; scalar: a
// view from slice_rows, not 16-byte aligned), out separate or aliasing the
// residual; p = 0 is the add.
TEST_F(GpuOps, DropoutAddEqualsDropoutThenAddInEveryKernel) {
  for (DType dt : kDtypes)
    for (index_t C : {index_t(768), index_t(130)})
      for (bool sliced : {false, true}) {
        if (C == 768 && sliced) continue;
        const index_t rows = 41, first = sliced ? 1 : 0;
        DropoutSite site;
        site.seed = 0x5eed0123ULL;
        site.step = 9;
        site.stream = 6;
        site.a = 1, site.b = rows - first, site.c = C;
        site.b_offset = first, site.b_global = rows, site.c_global = C;
        const std::string what = "dropout_add " + name(dt) + " C=" + std::to_string(C) +
                                 (sliced ? " unaligned view" : "");
        const Tensor x_full = random_host({rows, C}, -1.5, 1.5).to(dt).to_device();
        const Tensor r_full = random_host({rows, C}, -1.5, 1.5).to(dt).to_device();
        const Tensor x = x_full.slice_rows(first, rows), residual = r_full.slice_rows(first, rows);
        if (sliced) ASSERT_NE(reinterpret_cast<std::uintptr_t>(x.raw()) % 16, 0u) << what;
        for (double p : {0.0, 0.3}) {
          Tensor dropped = Tensor::empty(x.shape(), dt, MemorySpace::Cuda);
          Tensor expected = Tensor::empty(x.shape(), dt, MemorySpace::Cuda);
          dropout_forward(x, p, site, dropped);
          add(residual, dropped, expected);
          Tensor out = Tensor::empty(x.shape(), dt, MemorySpace::Cuda);
          dropout_add(x, residual, p, site, out);
          EXPECT_EQ(out.to_doubles(), expected.to_doubles()) << what << " p=" << p;
          Tensor in_place = residual.clone();
          dropout_add(x, in_place, p, site, in_place);
          EXPECT_EQ(in_place.to_doubles(), expected.to_doubles())
              << what << " p=" << p << ", out aliasing residual";
          if (p > 0) EXPECT_NE(out.to_doubles(), dropped.to_doubles()) << what;
        }
      }
}

}  // namespace
}  // namespace meshtron::ops
