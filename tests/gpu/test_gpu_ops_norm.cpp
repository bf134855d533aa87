// The LayerNorm ops on the device against the host (src/ops/ops_norm.cpp).
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include "gpu_ops_test_util.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "ops/ops_cuda.hpp"
#endif

namespace meshtron::ops {
namespace {

using namespace gpu_ops_test;

// ============================================================ LayerNorm ==

TEST_F(GpuOps, LayerNormForwardAndBackwardMatchHost) {
  for (DType dt : kDtypes)
    for (index_t N : kRows)
      for (index_t H : kCols)
        for (DType gdt : {DType::F32, dt}) {
          const std::string what = "layernorm " + name(dt) + " N=" + std::to_string(N) +
                                   " H=" + std::to_string(H) + " grads " + name(gdt);
          const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
          const Pair &x = c.x, &gamma = c.gamma, &mean = c.mean, &rstd = c.rstd;

          const Pair dy = input({N, H}, dt);
          Pair dx = output({N, H}, dt), dgamma = input({H}, gdt), dbeta = input({H}, gdt);
          // Both sides use the host's statistics, so that dx measures the backward only.
          const Tensor mean_dev = mean.host.to_device(), rstd_dev = rstd.host.to_device();
          layernorm_backward(dy.host, x.host, gamma.host, mean.host, rstd.host, dx.host,
                             dgamma.host, dbeta.host);
          layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx.dev, dgamma.dev,
                             dbeta.dev);
          expect_close(dx, dt, what + " dx");
          expect_close(dgamma, gdt == DType::F32 ? dt : gdt, what + " dgamma");
          expect_close(dbeta, gdt == DType::F32 ? dt : gdt, what + " dbeta");
        }
}

// The packed layernorm kernels (kernels/cuda/layernorm.cu) take H a
// multiple of 16 bytes up to 1280 fp32 / 2048 bf16 (backward: 1280 fp32,
// 1536 16-bit), K = 1..8 packs per lane (fp32 also 10); wider rows
// (fp32 H = 1600, 2048; 16-bit backward H = 1600, 2048) the column-owner
// kernels, whose 2-row tiles N = 2501 leaves one
// short. The packed backward takes 8-row tiles: 313 of them over 132
// blocks, so blocks take two or three, and the last tile has 5 rows (16-bit
// H = 1280: 7-row tiles, the last of 2 rows; fp32 H = 1280: 4-row tiles,
// the last of 1 row). Forward and backward
// give the same bits on a second call (the dgamma/dbeta partials are added
// in a fixed order), and the backward's residual form is its plain form +
// add().
TEST_F(GpuOps, LayerNormPackedAndColumnOwnerPathsOnManyRowsMatchHostAndRepeatBitwise) {
  const index_t N = 2501;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(256), index_t(768), index_t(1024), index_t(1280), index_t(1536),
                      index_t(1600), index_t(2048)}) {
      const std::string what = "layernorm " + name(dt) + " N=" + std::to_string(N) +
                               " H=" + std::to_string(H);
      const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
      const Pair &x = c.x, &gamma = c.gamma, &mean = c.mean, &rstd = c.rstd;

      const Pair dy = input({N, H}, dt);
      Pair dx = output({N, H}, dt), dgamma = input({H}, DType::F32), dbeta = input({H}, DType::F32);
      const Tensor mean_dev = mean.host.to_device(), rstd_dev = rstd.host.to_device();
      const Tensor dgamma0 = dgamma.dev.clone(), dbeta0 = dbeta.dev.clone();
      layernorm_backward(dy.host, x.host, gamma.host, mean.host, rstd.host, dx.host, dgamma.host,
                         dbeta.host);
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx.dev, dgamma.dev,
                         dbeta.dev);
      expect_close(dx, dt, what + " dx");
      expect_close(dgamma, dt, what + " dgamma");
      expect_close(dbeta, dt, what + " dbeta");

      Tensor dx2 = Tensor::empty({N, H}, dt, MemorySpace::Cuda), dgamma2 = dgamma0.clone(),
             dbeta2 = dbeta0.clone();
      dx2.fill(kNaN);
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx2, dgamma2, dbeta2);
      EXPECT_TRUE(dx2.to_doubles() == dx.dev.to_doubles()) << what << ": dx differs between calls";
      EXPECT_TRUE(dgamma2.to_doubles() == dgamma.dev.to_doubles())
          << what << ": dgamma differs between calls";
      EXPECT_TRUE(dbeta2.to_doubles() == dbeta.dev.to_doubles())
          << what << ": dbeta differs between calls";

      Tensor y2 = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      Tensor mean2 = Tensor::empty({N}, DType::F32, MemorySpace::Cuda), rstd2 = mean2.clone();
      layernorm_forward(x.dev, gamma.dev, c.beta.dev, 1e-5, y2, mean2, rstd2);
      EXPECT_TRUE(y2.to_doubles() == c.y.dev.to_doubles()) << what << ": y differs between calls";
      EXPECT_TRUE(rstd2.to_doubles() == rstd.dev.to_doubles()) << what << ": rstd differs";

      const Tensor residual = input({N, H}, dt).dev;
      Tensor fused = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      Tensor dgamma3 = dgamma0.clone(), dbeta3 = dbeta0.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, fused, dgamma3, dbeta3,
                         &residual);
      Tensor two_pass = dx.dev.clone();
      add(two_pass, residual, two_pass);
      EXPECT_TRUE(fused.to_doubles() == two_pass.to_doubles()) << what << ": + residual";
      EXPECT_TRUE(dgamma3.to_doubles() == dgamma.dev.to_doubles()) << what << ": dgamma, residual";
    }
}

// The ones column (y [N, H + kOnesColumnWidth], ColumnParallelLinear): each
// row the bits of the plain call's on the device, then 1 and zeros, on the
// packed kernel (16-bit and fp32 H = 768, 1280), the scalar one (H = 33) and
// the column-owner one (fp32 H = 1600); and close to the host's.
TEST_F(GpuOps, LayerNormOnesColumnRowsAreThePlainRowsThenOneAndZeros) {
  const index_t N = 301;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(33), index_t(768), index_t(1280), index_t(1600)}) {
      const std::string what = "layernorm ones column " + name(dt) + " H=" + std::to_string(H);
      const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
      const index_t ld = H + kOnesColumnWidth;
      Pair wide = output({N, ld}, dt);
      Tensor mean = Tensor::empty({N}, DType::F32, MemorySpace::Cuda), rstd = mean.clone();
      layernorm_forward(c.x.dev, c.gamma.dev, c.beta.dev, 1e-5, wide.dev, mean, rstd);
      Tensor host_mean = c.mean.host.clone(), host_rstd = c.rstd.host.clone();
      layernorm_forward(c.x.host, c.gamma.host, c.beta.host, 1e-5, wide.host, host_mean, host_rstd);
      expect_close(wide, dt, what + " vs host");
      const std::vector<double> got = wide.dev.to_doubles(), plain = c.y.dev.to_doubles();
      for (index_t r = 0; r < N; ++r) {
        for (index_t h = 0; h < H; ++h)
          ASSERT_EQ(got[r * ld + h], plain[r * H + h]) << what << " row " << r << " col " << h;
        for (index_t h = H; h < ld; ++h)
          ASSERT_EQ(got[r * ld + h], h == H ? 1.0 : 0.0) << what << " row " << r << " col " << h;
      }
      EXPECT_TRUE(rstd.to_doubles() == c.rstd.dev.to_doubles()) << what << ": rstd";
    }
}

// A model backward's layernorm backwards share an ops::LayerNormGradChain:
// each call leaves its dgamma / dbeta adds to the next call's kernel (or to
// flush()), which adds them in the order of the kernel that would have
// added them alone. After the flush every output must be the bits of the
// same calls without a chain: over a sequence that mixes widths and dtypes,
// the residual form, one layernorm twice in a row (accumulating, then
// overwriting), a call on few rows (its 5-block grid has no room for the
// earlier call's columns: they are added alone), a width off the split
// kernel (bf16 H = 2048, the column-owner kernel) and fp16 gradients (never
// held). Until the flush, holds() names the last held call's gradients only.
TEST_F(GpuOps, LayerNormGradChainGivesTheBitsOfUnchainedCalls) {
  struct Norm {
    LayerNormCase c;
    Tensor dy, residual, dgamma0, dbeta0;
    DType grad_dtype;
  };
  std::vector<Norm> norms;
  const auto add_norm = [&](index_t N, index_t H, DType dt, DType gdt) {
    const std::string what = "chain norm " + std::to_string(norms.size());
    norms.push_back({layernorm_forward_case(N, H, dt, what), input({N, H}, dt).dev,
                     input({N, H}, dt).dev, input({H}, gdt).dev, input({H}, gdt).dev, gdt});
  };
  add_norm(2501, 768, DType::BF16, DType::F32);   // 0
  add_norm(2501, 1280, DType::BF16, DType::F32);  // 1
  add_norm(2501, 768, DType::F32, DType::F32);    // 2
  add_norm(40, 768, DType::BF16, DType::F32);     // 3: 5 tiles, 5 blocks
  add_norm(2501, 2048, DType::BF16, DType::F32);  // 4: column-owner kernel
  add_norm(2501, 1024, DType::F16, DType::F16);   // 5: 16-bit gradients
  struct Call {
    int norm;
    bool residual;
    GradStore store;
  };
  const std::vector<Call> calls = {
      {0, false, GradStore::Accumulate}, {1, true, GradStore::Accumulate},
      {1, false, GradStore::Accumulate}, {1, true, GradStore::Overwrite},
      {0, true, GradStore::Accumulate},  {3, false, GradStore::Accumulate},
      {0, false, GradStore::Overwrite},  {4, true, GradStore::Accumulate},
      {2, true, GradStore::Accumulate},  {5, false, GradStore::Accumulate},
      {2, false, GradStore::Accumulate}, {3, true, GradStore::Accumulate},
      {0, true, GradStore::Accumulate}};
  struct Outputs {
    std::vector<Tensor> dx, dgamma, dbeta;
  };
  const auto run = [&](LayerNormGradChain* chain) {
    Outputs out;
    for (const Norm& n : norms) {
      out.dgamma.push_back(n.dgamma0.clone());
      out.dbeta.push_back(n.dbeta0.clone());
    }
    for (const Call& k : calls) {
      const Norm& n = norms[std::size_t(k.norm)];
      Tensor dx = Tensor::empty(n.dy.shape(), n.dy.dtype(), MemorySpace::Cuda);
      dx.fill(kNaN);
      layernorm_backward(n.dy, n.c.x.dev, n.c.gamma.dev, n.c.mean.dev, n.c.rstd.dev, dx,
                         out.dgamma[std::size_t(k.norm)], out.dbeta[std::size_t(k.norm)],
                         k.residual ? &n.residual : nullptr, k.store, chain);
      out.dx.push_back(dx);
    }
    return out;
  };
  const Outputs alone = run(nullptr);
  LayerNormGradChain chain;
  const Outputs chained = run(&chain);
  // The last call (norm 0, bf16 on the split kernel, fp32 gradients) is held.
  EXPECT_TRUE(chain.holds(chained.dgamma[0]));
  EXPECT_TRUE(chain.holds(chained.dbeta[0]));
  for (std::size_t i = 1; i < norms.size(); ++i) {
    EXPECT_FALSE(chain.holds(chained.dgamma[i])) << "norm " << i;
    EXPECT_FALSE(chain.holds(chained.dbeta[i])) << "norm " << i;
  }
  EXPECT_FALSE(same_bits(chained.dgamma[0], alone.dgamma[0])) << "the held adds were not pending";
  chain.flush();
  EXPECT_FALSE(chain.holds(chained.dgamma[0]));
  for (std::size_t k = 0; k < calls.size(); ++k)
    EXPECT_TRUE(same_bits(chained.dx[k], alone.dx[k])) << "call " << k << " dx";
  for (std::size_t i = 0; i < norms.size(); ++i) {
    EXPECT_TRUE(same_bits(chained.dgamma[i], alone.dgamma[i])) << "norm " << i << " dgamma";
    EXPECT_TRUE(same_bits(chained.dbeta[i], alone.dbeta[i])) << "norm " << i << " dbeta";
    EXPECT_FALSE(same_bits(alone.dgamma[i], norms[i].dgamma0)) << "norm " << i << " unchanged";
  }
  // And the unchained results are the host's.
  for (std::size_t i = 0; i < norms.size(); ++i) {
    const Norm& n = norms[i];
    const DType dt = n.dy.dtype();
    Tensor dgamma = n.dgamma0.to_host().to(DType::F32), dbeta = n.dbeta0.to_host().to(DType::F32);
    const Tensor x = n.c.x.host, dy = n.dy.to_host().to(DType::F32);
    const Tensor residual = n.residual.to_host().to(DType::F32);
    Tensor dx = Tensor::empty(x.shape(), DType::F32);
    for (const Call& k : calls)
      if (std::size_t(k.norm) == i)
        layernorm_backward(dy, x, n.c.gamma.host, n.c.mean.dev.to_host(), n.c.rstd.dev.to_host(),
                           dx, dgamma, dbeta, k.residual ? &residual : nullptr, k.store);
    const double tol = 20 * tolerance(dt);  // a few calls' worth of 16-bit gradients
    expect_close(alone.dgamma[i], dgamma, tol, "chain norm " + std::to_string(i) + " dgamma");
    expect_close(alone.dbeta[i], dbeta, tol, "chain norm " + std::to_string(i) + " dbeta");
  }
}

// The transformer layer's residual gradient rides in the layernorm
// backward: dx = round(layernorm dx) + residual must be the bits of the
// backward followed by add(), on the packed (H = 1280) and scalar (H = 130)
// paths, and match the host.
TEST_F(GpuOps, LayerNormBackwardWithResidualEqualsBackwardThenAdd) {
  const index_t N = 300;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(130), index_t(1280)}) {
      const std::string what = name(dt) + " H=" + std::to_string(H);
      const LayerNormCase c = layernorm_forward_case(N, H, dt, what);
      const Pair &x = c.x, &gamma = c.gamma, &mean = c.mean, &rstd = c.rstd;
      const Pair dy = input({N, H}, dt), residual = input({N, H}, dt);
      Tensor two_pass = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      Tensor dg1 = Tensor::zeros({H}, DType::F32, MemorySpace::Cuda), db1 = dg1.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean.dev, rstd.dev, two_pass, dg1, db1);
      add(two_pass, residual.dev, two_pass);

      Pair fused = output({N, H}, dt);
      Tensor dg2 = Tensor::zeros({H}, DType::F32, MemorySpace::Cuda), db2 = dg2.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean.dev, rstd.dev, fused.dev, dg2, db2,
                         &residual.dev);
      EXPECT_TRUE(fused.dev.to_doubles() == two_pass.to_doubles()) << what;
      EXPECT_TRUE(dg2.to_doubles() == dg1.to_doubles()) << what;

      Tensor dgh = Tensor::zeros({H}, DType::F32), dbh = dgh.clone();
      layernorm_backward(dy.host, x.host, gamma.host, mean.host, rstd.host, fused.host, dgh, dbh,
                         &residual.host);
      expect_close(fused, dt, "layernorm_backward + residual " + what);
    }
}


#ifdef MESHTRON_HAVE_CUDA
// Row loops past one pass of the grid: see gpu_ops_test_util.hpp (misaligned_copy).
TEST_F(GpuOps, LayerNormRowLoopsMatchHostRepeatAndFallBackWhenMisaligned) {
  const index_t N = 8197;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(768), index_t(1024), index_t(1280), index_t(2048)}) {
      const std::string what = "layernorm " + name(dt) + " N=" + std::to_string(N) +
                               " H=" + std::to_string(H);
      const Pair x = input({N, H}, dt, -2.0, 3.0), gamma = input({H}, dt), beta = input({H}, dt);
      Pair y = output({N, H}, dt), mean = output({N}, DType::F32), rstd = output({N}, DType::F32);
      layernorm_forward(x.host, gamma.host, beta.host, 1e-5, y.host, mean.host, rstd.host);
      layernorm_forward(x.dev, gamma.dev, beta.dev, 1e-5, y.dev, mean.dev, rstd.dev);
      expect_close(y, dt, what + " y");
      expect_close(mean, DType::F32, what + " mean");
      expect_close(rstd, DType::F32, what + " rstd");
      Pair y2 = output({N, H}, dt), mean2 = output({N}, DType::F32),
           rstd2 = output({N}, DType::F32);
      layernorm_forward(x.dev, gamma.dev, beta.dev, 1e-5, y2.dev, mean2.dev, rstd2.dev);
      EXPECT_TRUE(same_bits(y2.dev, y.dev)) << what << ": y differs between calls";
      EXPECT_TRUE(same_bits(mean2.dev, mean.dev) && same_bits(rstd2.dev, rstd.dev)) << what;

      // Scalar forward: x one element off a 16-byte boundary.
      OffsetView x_off = misaligned_copy(x.dev);
      Pair y_off = output({N, H}, dt), mean_off = output({N}, DType::F32),
           rstd_off = output({N}, DType::F32);
      layernorm_forward(x_off.view, gamma.dev, beta.dev, 1e-5, y_off.dev, mean_off.dev,
                        rstd_off.dev);
      expect_close(y_off.dev, y.host, tolerance(dt), what + " misaligned x: y");
      expect_close(mean_off.dev, mean.host, tolerance(DType::F32), what + " misaligned x: mean");

      // Backward with the residual gradient (the model's call), host statistics.
      const Pair dy = input({N, H}, dt), residual = input({N, H}, dt);
      const Tensor mean_dev = mean.host.to_device(), rstd_dev = rstd.host.to_device();
      Pair dx = output({N, H}, dt), dgamma = input({H}, DType::F32), dbeta = input({H}, DType::F32);
      const Tensor dgamma0 = dgamma.dev.clone(), dbeta0 = dbeta.dev.clone();
      layernorm_backward(dy.host, x.host, gamma.host, mean.host, rstd.host, dx.host, dgamma.host,
                         dbeta.host, &residual.host);
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx.dev, dgamma.dev,
                         dbeta.dev, &residual.dev);
      expect_close(dx, dt, what + " dx + residual");
      expect_close(dgamma, dt, what + " dgamma");
      expect_close(dbeta, dt, what + " dbeta");
      Pair dx2 = output({N, H}, dt);
      Tensor dgamma2 = dgamma0.clone(), dbeta2 = dbeta0.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx2.dev, dgamma2, dbeta2,
                         &residual.dev);
      EXPECT_TRUE(same_bits(dx2.dev, dx.dev)) << what << ": dx differs between calls";
      EXPECT_TRUE(same_bits(dgamma2, dgamma.dev)) << what << ": dgamma differs between calls";
      EXPECT_TRUE(same_bits(dbeta2, dbeta.dev)) << what << ": dbeta differs between calls";

      // Without the residual: round(layernorm dx) + residual must be the
      // bits of the fused call (the ring carries the residual, or not).
      Tensor plain = Tensor::empty({N, H}, dt, MemorySpace::Cuda);
      plain.fill(kNaN);
      Tensor dgamma3 = dgamma0.clone(), dbeta3 = dbeta0.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, plain, dgamma3, dbeta3);
      EXPECT_TRUE(same_bits(dgamma3, dgamma.dev)) << what << ": dgamma depends on the residual";
      add(plain, residual.dev, plain);
      EXPECT_TRUE(same_bits(plain, dx.dev)) << what << ": fused residual != backward + add";

      // Scalar backward: a misaligned residual sends the call to the scalar
      // kernels; same host reference.
      OffsetView res_off = misaligned_copy(residual.dev);
      Pair dx_off = output({N, H}, dt);
      Tensor dgamma4 = dgamma0.clone(), dbeta4 = dbeta0.clone();
      layernorm_backward(dy.dev, x.dev, gamma.dev, mean_dev, rstd_dev, dx_off.dev, dgamma4,
                         dbeta4, &res_off.view);
      expect_close(dx_off.dev, dx.host, tolerance(dt), what + " misaligned residual: dx");
      expect_close(dgamma4, dgamma.host, tolerance(dt), what + " misaligned residual: dgamma");
    }
}
#endif

}  // namespace
}  // namespace meshtron::ops
