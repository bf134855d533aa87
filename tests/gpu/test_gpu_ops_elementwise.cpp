// The elementwise ops on the device against the host (src/ops/ops_elementwise.cpp):
// GeLU, the bias add and its gradient (with GradStore::Overwrite on every
// column-sum path), add, axpy, scale, and the tp all-reduce's sum kernel.
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include <utility>

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

// ======================================================= GeLU, biases ... ==

TEST_F(GpuOps, GeluAndElementwiseOpsMatchHost) {
  for (DType dt : kDtypes)
    for (index_t N : kRows)
      for (index_t C : kCols) {
        const std::string what = name(dt) + " [" + std::to_string(N) + ", " + std::to_string(C) + "]";
        const Pair x = input({N, C}, dt, -5.0, 5.0), dy = input({N, C}, dt);
        Pair y = output({N, C}, dt), dx = output({N, C}, dt);
        gelu_forward(x.host, y.host);
        gelu_forward(x.dev, y.dev);
        expect_close(y, dt, "gelu_forward " + what);
        gelu_backward(dy.host, x.host, dx.host);
        gelu_backward(dy.dev, x.dev, dx.dev);
        expect_close(dx, dt, "gelu_backward " + what);

        Pair acc = input({N, C}, dt);
        const Pair bias = input({C}, dt);
        bias_add(acc.host, bias.host);
        bias_add(acc.dev, bias.dev);
        expect_close(acc, dt, "bias_add " + what);
        for (DType gdt : {DType::F32, dt}) {
          Pair dbias = input({C}, gdt);
          bias_backward(dy.host, dbias.host);
          bias_backward(dy.dev, dbias.dev);
          expect_close(dbias, dt, "bias_backward " + what + " into " + name(gdt));
        }

        Pair sum = output({N, C}, dt);
        add(x.host, dy.host, sum.host);
        add(x.dev, dy.dev, sum.dev);
        expect_close(sum, dt, "add " + what);
        Pair alias = input({N, C}, dt);  // out aliases a
        add(alias.host, dy.host, alias.host);
        add(alias.dev, dy.dev, alias.dev);
        expect_close(alias, dt, "add in place " + what);

        Pair ax = input({N, C}, dt);
        axpy(-0.75, x.host, ax.host);
        axpy(-0.75, x.dev, ax.dev);
        expect_close(ax, dt, "axpy " + what);
        Pair sc = input({N, C}, dt);
        scale(sc.host, 1.0 / 3.0);
        scale(sc.dev, 1.0 / 3.0);
        expect_close(sc, dt, "scale " + what);

        const double ss_host = sum_of_squares(x.host), ss_dev = sum_of_squares(x.dev);
        EXPECT_NEAR(ss_dev, ss_host, 1e-6 * ss_host) << "sum_of_squares " << what;
      }
}

// The packed bias_add takes rounds of rows grid-strided over a grid that fits
// the GPU at once: more rows than the grid's first round (a last round of
// fewer than 4 rows included) must come out as the host's sums rounded to
// the storage type, bit for bit.
TEST_F(GpuOps, BiasAddOverMoreRowsThanTheGridHoldsMatchesHostExactly) {
  for (DType dt : kDtypes)
    for (index_t C : {index_t(768), index_t(3072)}) {
      const index_t N = 9003;
      const std::string what = "bias_add " + name(dt) + " [" + std::to_string(N) + ", " +
                               std::to_string(C) + "]";
      Pair acc = input({N, C}, dt);
      const Pair bias = input({C}, dt);
      bias_add(acc.host, bias.host);
      bias_add(acc.dev, bias.dev);
      // The host adds in fp32 (its copy is fp32); the kernel too, then rounds to dt.
      EXPECT_TRUE(same_bits(acc.dev, acc.host.to(dt))) << what << ": elements unlike the host's";
    }
}

#ifdef MESHTRON_HAVE_CUDA
TEST_F(GpuOps, FusedBiasGeluEqualsBiasAddThenGelu) {
  for (DType dt : kDtypes)
    for (index_t N : {1, 17, 257})
      for (index_t C : kCols) {
        const Pair x = input({N, C}, dt, -4.0, 4.0), bias = input({C}, dt);
        Pair pre = output({N, C}, dt), y = output({N, C}, dt);
        pre.host.copy_from(x.host);
        bias_add(pre.host, bias.host);
        const Tensor pre_rounded = pre.host.to(dt).to(DType::F32);  // the device stores pre in dt
        gelu_forward(pre_rounded, y.host);
        cuda::bias_gelu_forward(dt, x.dev.raw(), bias.dev.raw(), N, C, pre.dev.raw(), y.dev.raw());
        expect_close(pre, dt, "bias_gelu pre " + name(dt));
        expect_close(y, dt, "bias_gelu y " + name(dt));
      }
}
#endif

// bias_backward reads 16-byte packs of columns where it can (C % V == 0,
// aligned) and single columns otherwise (the same data at a misaligned
// address): both match the host, and the packed path repeats bit for bit,
// with its finalize fused (C = 1280) and, past kMaxFusedColumnBlocks column
// blocks (C = 262400), launched on its own.
TEST_F(GpuOps, BiasBackwardPackedAndScalarPathsMatchHostAndRepeat) {
  for (DType dt : kDtypes)
    for (const auto& [N, C] : {std::pair<index_t, index_t>{8192, 1280}, {16, 262400}}) {
      const std::string what = name(dt) + " C=" + std::to_string(C);
      const Tensor flat = input({N * C + 1}, dt).dev;
      const Tensor aligned = flat.slice_rows(0, N * C).reshape({N, C});
      Tensor shifted = Tensor::empty({N * C + 1}, dt, MemorySpace::Cuda);
      shifted.slice_rows(1, N * C + 1).copy_from(aligned.reshape({N * C}));
      const Tensor misaligned = shifted.slice_rows(1, N * C + 1).reshape({N, C});
      Tensor packed = Tensor::zeros({C}, DType::F32, MemorySpace::Cuda);
      Tensor scalar = Tensor::zeros({C}, DType::F32, MemorySpace::Cuda);
      bias_backward(aligned, packed);
      bias_backward(misaligned, scalar);
      Tensor again = Tensor::zeros({C}, DType::F32, MemorySpace::Cuda);
      bias_backward(aligned, again);
      EXPECT_TRUE(packed.to_doubles() == again.to_doubles()) << what << ": not deterministic";
      const Tensor host = aligned.to_host().to(DType::F32);
      Tensor reference = Tensor::zeros({C}, DType::F32, MemorySpace::Host);
      bias_backward(host, reference);
      expect_close(Pair{reference, packed}, dt, "bias_backward packed " + what);
      expect_close(Pair{reference, scalar}, dt, "bias_backward scalar " + what);
    }
}

// GradStore::Overwrite (the first write of a gradient after a deferred
// zero_grad) over a gradient holding NaN (a skipped step's) gives the bits
// of accumulating onto zeros, on every column-sum path: bias_backward
// packed with the fused finish ([8192, 1280]), packed with the separate
// finish (more column blocks than tickets) and scalar (misaligned); the
// layernorm backward's split (H = 768), column-owner (H = 2048) and scalar
// (H = 130) kernels. The GEMMs' beta = 0 is checked in linear_weight_grads
// (both gradients) against accumulating onto zeros (another algorithm may
// serve beta = 0, so to tolerance).
TEST_F(GpuOps, GradientOverwriteOverNaNEqualsAccumulatingOntoZeros) {
  const auto zeros = [](index_t n) { return Tensor::zeros({n}, DType::F32, MemorySpace::Cuda); };
  const auto nans = [](index_t n) {
    Tensor t = Tensor::empty({n}, DType::F32, MemorySpace::Cuda);
    t.fill(kNaN);
    return t;
  };
  for (DType dt : kDtypes) {
    for (const auto& [N, C] : {std::pair<index_t, index_t>{8192, 1280}, {16, 262400}, {33, 130}}) {
      const std::string what = "bias_backward " + name(dt) + " [" + std::to_string(N) + ", " +
                               std::to_string(C) + "]";
      const Tensor flat = input({N * C + 1}, dt).dev;
      for (index_t shift : {index_t(0), index_t(1)}) {  // aligned (packed) and not (scalar)
        const Tensor dy = flat.slice_rows(shift, shift + N * C).reshape({N, C});
        Tensor accumulated = zeros(C), overwritten = nans(C);
        bias_backward(dy, accumulated);
        bias_backward(dy, overwritten, GradStore::Overwrite);
        EXPECT_TRUE(overwritten.to_doubles() == accumulated.to_doubles())
            << what << " shift " << shift;
      }
    }
    for (index_t H : {index_t(768), index_t(2048), index_t(130)}) {
      const index_t N = 2501;
      const std::string what = "layernorm_backward " + name(dt) + " H=" + std::to_string(H);
      const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
      const Tensor dy = input({N, H}, dt).dev;
      Tensor dx = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      Tensor dgamma = zeros(H), dbeta = zeros(H), dgamma2 = nans(H), dbeta2 = nans(H);
      layernorm_backward(dy, c.x.dev, c.gamma.dev, c.mean.dev, c.rstd.dev, dx, dgamma, dbeta);
      layernorm_backward(dy, c.x.dev, c.gamma.dev, c.mean.dev, c.rstd.dev, dx, dgamma2, dbeta2,
                         nullptr, GradStore::Overwrite);
      EXPECT_TRUE(dgamma2.to_doubles() == dgamma.to_doubles()) << what << " dgamma";
      EXPECT_TRUE(dbeta2.to_doubles() == dbeta.to_doubles()) << what << " dbeta";
    }
    for (const GemmCase& g : {GemmCase{5, 3, 17}, GemmCase{1280, 3840, 8192}}) {
      const std::string what = "linear_weight_grads " + name(dt) + " out=" + std::to_string(g.N);
      const Tensor x = input({g.K, g.M}, dt).dev, dy = input({g.K, g.N}, dt).dev;
      Tensor dw = Tensor::zeros({g.M, g.N}, DType::F32, MemorySpace::Cuda), db = zeros(g.N);
      Tensor dw2 = Tensor::empty({g.M, g.N}, DType::F32, MemorySpace::Cuda), db2 = nans(g.N);
      dw2.fill(kNaN);
      linear_weight_grads(x, dy, dw, db);
      linear_weight_grads(x, dy, dw2, db2, GradStore::Overwrite, GradStore::Overwrite);
      expect_close(dw2, dw.to_host(), tolerance(dt), what + " dweight");
      expect_close(db2, db.to_host(), tolerance(dt), what + " dbias");
    }
  }
}

#ifdef MESHTRON_HAVE_CUDA  // a kernel without an ops:: entry (PeerExchange calls it)
// The copy-engine tp all-reduce's sum kernel with a row-parallel layer's
// epilogue (PeerExchange::Addends): out = a + b + residual + bias[column]
// over elements [first, first + n) of a row-major [rows, C] output, in fp32
// with one rounding, so within a few fp32 roundings of the exact sum in fp32
// and within one rounding in 16 bits; the packed kernel (aligned, C and
// first multiples of the pack) and the element kernel (a misaligned
// operand, C = 5); residual and bias each optional; out aliasing a.
TEST_F(GpuOps, AddResidualBiasPackedAndScalarPathsAreOneRoundingOfTheExactSum) {
  struct Case {
    index_t rows, C, first;
    bool misaligned, residual, bias, alias;
  };
  const Case cases[] = {{64, 1280, 0, false, true, true, false},
                        {64, 1280, 32 * 1280, false, true, true, true},
                        {64, 1280, 640, false, false, true, false},
                        {64, 1280, 0, false, true, false, false},
                        {64, 1280, 1280, true, true, true, false},
                        {33, 5, 3, false, true, true, false}};
  for (DType dt : kDtypes)
    for (const Case& c : cases) {
      const std::string what = name(dt) + " C=" + std::to_string(c.C) + " first=" +
                               std::to_string(c.first) + (c.misaligned ? " misaligned" : "") +
                               (c.residual ? "" : " no residual") + (c.bias ? "" : " no bias") +
                               (c.alias ? " out = a" : "");
      const index_t n = c.rows * c.C;
      const Pair a = input({n + 1}, dt), b = input({n}, dt), r = input({n}, dt, -4, 4),
                 bias = input({c.C}, dt);
      // Misaligned: a read from its second element (2 or 4 bytes off).
      const Tensor a_dev = a.dev.slice_rows(c.misaligned ? 1 : 0, n + (c.misaligned ? 1 : 0));
      const Tensor a_host = a.host.slice_rows(c.misaligned ? 1 : 0, n + (c.misaligned ? 1 : 0));
      Tensor out = c.alias ? a_dev : Tensor::empty({n}, dt, MemorySpace::Cuda);
      cuda::add_residual_bias_on_stream(dt, a_dev.raw(), b.dev.raw(),
                                        c.residual ? r.dev.raw() : nullptr,
                                        c.bias ? bias.dev.raw() : nullptr, c.C, c.first, n,
                                        out.raw(), device::compute_stream());
      const std::vector<double> got = out.to_doubles();
      const double unit = dt == DType::F32 ? 4 * std::ldexp(1.0, -24)
                          : dt == DType::BF16 ? std::ldexp(1.0, -8)
                                              : std::ldexp(1.0, -11);
      index_t bad = 0, first_bad = -1;
      for (index_t i = 0; i < n; ++i) {
        const double terms[] = {a_host.data<float>()[i], b.host.data<float>()[i],
                                c.residual ? r.host.data<float>()[i] : 0.0,
                                c.bias ? bias.host.data<float>()[(c.first + i) % c.C] : 0.0};
        double exact = 0, magnitude = 0;
        for (double t : terms) exact += t, magnitude += std::abs(t);
        if (!(std::abs(got[std::size_t(i)] - exact) <= unit * magnitude + 1e-30))
          if (bad++ == 0) first_bad = i;
      }
      EXPECT_EQ(bad, 0) << what << ": first at " << first_bad;
    }
}
#endif

}  // namespace
}  // namespace meshtron::ops
