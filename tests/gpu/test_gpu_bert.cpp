// BertModel on one GPU against the host: in fp32 the loss (1e-5) and every
// gradient (1e-4, norm-wise: max |gpu - host| / max |host|); in bf16 the
// loss within 2 % of the host's fp32 one and every gradient finite. The
// device runs the masked softmax kernel, the erf GeLU and tanh activations
// and the MLM bias of LmHeadLoss.
//
// Run: ctest -R gpu_bert --output-on-failure   (skips, exit 0, without a GPU)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpu_test_util.hpp"
#include "parallel/communicator.hpp"
#include "tests/model/bert_fixture.hpp"

namespace meshtron::bert_test {
namespace {

gpu_test::DeviceRun run_on(MemorySpace space, DType dtype) {
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx = context(tp);
  ctx.space = space;
  BertModel model(tiny_spec(), ctx, dtype, 5);
  const double loss = loss_and_grads(model, tiny_batch(), ctx);
  return gpu_test::device_run(loss, model.parameters(), space);
}

TEST(GpuBert, Fp32MatchesHost) {
  REQUIRE_GPU();
  const gpu_test::DeviceRun host = run_on(MemorySpace::Host, DType::F32);
  const gpu_test::DeviceRun gpu = run_on(MemorySpace::Cuda, DType::F32);
  gpu_test::expect_fp32_matches_host(gpu, host);
}

TEST(GpuBert, Bf16TracksFp32Host) {
  REQUIRE_GPU();
  const gpu_test::DeviceRun host = run_on(MemorySpace::Host, DType::F32);
  const gpu_test::DeviceRun gpu = run_on(MemorySpace::Cuda, DType::BF16);
  gpu_test::expect_bf16_tracks_host(gpu, host);
}

}  // namespace
}  // namespace meshtron::bert_test
