// T5Model on one GPU against the host: in fp32 the loss (1e-5) and every
// gradient (1e-4, norm-wise: max |gpu - host| / max |host|), v1.0 and v1.1,
// without and with dropout (Philox masks keyed by global positions on both);
// in bf16 the loss within 2 % of the host's fp32 one and every gradient
// finite. The device runs the relative-bias kernels, the general attention
// softmax (bias, key mask, causal, Sq != Sk) and its bias gradient; the
// generation steps (encode, decode_step) equal the forward's logits.
//
// Run: ctest -R gpu_t5 --output-on-failure   (skips, exit 0, without a GPU)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "parallel/communicator.hpp"
#include "tests/model/t5_fixture.hpp"

namespace meshtron::t5_test {
namespace {

gpu_test::DeviceRun run_on(MemorySpace space, DType dtype, bool v11, double dropout) {
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx = context(tp);
  ctx.space = space;
  ModelSpec spec = tiny_spec(v11);
  spec.hidden_dropout = spec.attention_dropout = dropout;
  T5Model model(spec, ctx, dtype, 5);
  const double loss = loss_and_grads(model, tiny_batch(), ctx);
  return gpu_test::device_run(loss, model.parameters(), space);
}

TEST(GpuT5, Fp32MatchesHost) {
  REQUIRE_GPU();
  for (bool v11 : {false, true})
    for (double dropout : {0.0, 0.1}) {
      const gpu_test::DeviceRun host = run_on(MemorySpace::Host, DType::F32, v11, dropout);
      const gpu_test::DeviceRun gpu = run_on(MemorySpace::Cuda, DType::F32, v11, dropout);
      SCOPED_TRACE("v11 " + std::to_string(v11) + ", dropout " + std::to_string(dropout));
      gpu_test::expect_fp32_matches_host(gpu, host);
    }
}

TEST(GpuT5, DecodeStepsMatchTheFullForward) {
  // fp32 on the device: encode once, feed the decoder ids one at a time
  // (self-attention cache rows written on the device), against forward().
  REQUIRE_GPU();
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx = context(tp);
  ctx.space = MemorySpace::Cuda;
  T5Model model(tiny_spec(true), ctx, DType::F32, 5);
  T5Batch batch = tiny_batch();
  batch.decoder_mask = Tensor();
  T5Model::Cache full;
  model.forward(batch, ctx, full);
  const std::vector<double> want = T5Model::logits(full).to_doubles();
  auto state = model.start_decoding(model.encode(batch.encoder_ids, batch.encoder_mask, ctx),
                                    batch.encoder_mask, kDecSeq, ctx);
  for (index_t t = 0; t < kDecSeq; ++t) {
    const std::int32_t* row = batch.decoder_ids.data<std::int32_t>() + t * kBatch;
    const std::vector<double> got =
        model.decode_step(ints({kBatch}, {row[0], row[1]}), ctx, state).to_doubles();
    const std::size_t v = got.size() / std::size_t(kBatch);
    for (std::size_t k = 0; k < got.size(); ++k)
      ASSERT_NEAR(got[k], want[std::size_t(t * kBatch) * v + k], 1e-4) << "step " << t;
  }
}

TEST(GpuT5, Bf16TracksFp32Host) {
  REQUIRE_GPU();
  for (bool v11 : {false, true}) {
    const gpu_test::DeviceRun host = run_on(MemorySpace::Host, DType::F32, v11, 0.0);
    const gpu_test::DeviceRun gpu = run_on(MemorySpace::Cuda, DType::BF16, v11, 0.0);
    SCOPED_TRACE("v11 " + std::to_string(v11));
    gpu_test::expect_bf16_tracks_host(gpu, host);
  }
}

}  // namespace
}  // namespace meshtron::t5_test
