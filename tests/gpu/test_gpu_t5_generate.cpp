// T5 generation on one GPU against the host, fp32: T5Decoding's step logits
// (beam copies of each prompt's encoder output gathered on the device, a
// reorder of the device self caches between steps) within 1e-5, and
// T5Generator's greedy, sampled and beam ids equal the host's, v1.0 and v1.1.
//
// Run: ctest -R gpu_t5_generate --output-on-failure   (skips, exit 0, without a GPU)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "generate/t5_generator.hpp"
#include "gpu_test_util.hpp"
#include "parallel/communicator.hpp"
#include "tests/model/t5_fixture.hpp"

namespace meshtron::t5_test {
namespace {

std::vector<generate::Request> prompts() { return {{0, {5, 7, 11, 3, 19, 1}}, {1, {8, 5, 3, 1}}}; }

struct OneRank {
  explicit OneRank(MemorySpace space) { ctx.space = space; }
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx = context(tp);
};

/// Each step's logits of two copies per prompt, with a reorder after step 1.
std::vector<std::vector<double>> decoding_logits(MemorySpace space, bool v11) {
  OneRank r(space);
  T5Model model(tiny_spec(v11), r.ctx, DType::F32, 7);
  generate::T5Decoding decoding(model, prompts(), 2, 4, 0, r.ctx);
  std::vector<std::vector<double>> out;
  for (int step = 0; step < 4; ++step) {
    std::vector<std::int32_t> ids;
    for (int j = 0; j < 4; ++j) ids.push_back(step == 0 ? 0 : std::int32_t(2 + 3 * j + 5 * step));
    const Tensor logits = decoding.step(ids);
    EXPECT_EQ(logits.space(), space);
    out.push_back(logits.to_doubles());
    if (step == 1) decoding.reorder({0, 2}, {1, 3});
  }
  return out;
}

TEST(GpuT5Generate, DecodingStepsMatchTheHost) {
  REQUIRE_GPU();
  for (bool v11 : {false, true}) {
    const auto host = decoding_logits(MemorySpace::Host, v11);
    const auto gpu = decoding_logits(MemorySpace::Cuda, v11);
    for (std::size_t s = 0; s < host.size(); ++s) {
      double worst = 0;
      for (std::size_t i = 0; i < host[s].size(); ++i)
        worst = std::max(worst, std::fabs(gpu[s][i] - host[s][i]) / (1 + std::fabs(host[s][i])));
      EXPECT_LE(worst, 1e-5) << "step " << s << " v11 " << v11;
    }
  }
}

std::vector<std::vector<std::int32_t>> generated(MemorySpace space, bool v11,
                                                 const generate::GenerateParams& p) {
  OneRank r(space);
  T5Model model(tiny_spec(v11), r.ctx, DType::F32, 7);
  generate::T5Generator generator(model, r.tp, space);
  std::vector<std::vector<std::int32_t>> out;
  for (const generate::Result& res : generator.generate(prompts(), p)) out.push_back(res.ids);
  return out;
}

TEST(GpuT5Generate, GreedySampledAndBeamIdsEqualTheHost) {
  REQUIRE_GPU();
  generate::GenerateParams greedy, sample, beam;
  greedy.max_new_tokens = sample.max_new_tokens = beam.max_new_tokens = 6;
  sample.decoding = generate::Decoding::Sample;
  sample.top_k = 8;
  beam.decoding = generate::Decoding::Beam;
  beam.num_beams = 3;
  for (bool v11 : {false, true})
    for (const generate::GenerateParams* p : {&greedy, &sample, &beam}) {
      const auto host = generated(MemorySpace::Host, v11, *p);
      EXPECT_EQ(generated(MemorySpace::Cuda, v11, *p), host) << "v11 " << v11;
      EXPECT_EQ(host[0].size(), 6u);
    }
}

}  // namespace
}  // namespace meshtron::t5_test
