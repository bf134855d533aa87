// T5Generator against transformers' generate() on the golden T5 models
// (validation/t5-golden/v1_0: ReLU, tied; v1_1: gated-gelu, untied, 3
// decoder layers; made by validation/make_t5_golden.py): the padded batch of
// two encoder inputs of generate.json, greedy and beam search (3 beams,
// length_penalty 1, early_stopping false), max_new_tokens 8, eos 1; the ids
// equal transformers' exactly (its rows after the first eos are pad),
// in fp32 on one rank or tp 2 (the world is the tp group).
//
// Run: ctest -R generate_t5_golden --output-on-failure
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/golden_tokens.hpp"
#include "generate/t5_generator.hpp"
#include "io/hf/t5.hpp"
#include "io/hf/t5_config.hpp"
#include "parallel/communicator.hpp"

namespace meshtron::golden {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

class T5GenerateGolden : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir = golden_folder("t5") + "/" + GetParam();
    ASSERT_TRUE(fs::exists(dir + "/generate.json"))
        << dir << ": golden model absent: on a machine with torch and transformers run\n"
        << "  python3 validation/make_t5_golden.py --out validation/t5-golden";
    std::ifstream in(dir + "/generate.json");
    expected = nlohmann::json::parse(in);
    spec = io::model_spec_from_hf(io::read_hf_t5_config(dir), 1, tp.size());
    LayerContext ctx{tp};
    ctx.micro_batch = ctx.global_batch = 2;
    model = std::make_unique<T5Model>(spec, ctx, DType::F32, 1);
    io::import_hf_t5(dir, spec, model->parameters(), tp.rank(), tp.size());
  }

  /// generate.json's encoder inputs: each row's real tokens (mask 1).
  std::vector<generate::Request> requests() const {
    std::vector<generate::Request> out;
    const auto& ids = expected.at("input_ids");
    const auto& mask = expected.at("attention_mask");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      generate::Request r{std::int64_t(i), {}};
      for (std::size_t t = 0; t < ids[i].size(); ++t)
        if (mask[i][t].get<int>() == 1) r.prompt.push_back(ids[i][t].get<std::int32_t>());
      out.push_back(r);
    }
    return out;
  }

  generate::GenerateParams params(bool beam) const {
    generate::GenerateParams p;
    p.decoding = beam ? generate::Decoding::Beam : generate::Decoding::Greedy;
    p.max_new_tokens = expected.at("max_new_tokens").get<int>();
    p.num_beams = beam ? expected.at("num_beams").get<int>() : 1;
    p.length_penalty = expected.at("length_penalty").get<double>();
    p.early_stopping = expected.at("early_stopping").get<bool>();
    p.stop_ids = {expected.at("eos_token_id").get<std::int32_t>()};
    return p;
  }

  /// transformers' row up to and including its first eos (the pad after it dropped).
  Ids through_eos(const nlohmann::json& row) const {
    const std::int32_t eos = expected.at("eos_token_id").get<std::int32_t>();
    Ids out;
    for (const auto& v : row) {
      out.push_back(v.get<std::int32_t>());
      if (out.back() == eos) break;
    }
    return out;
  }

  void expect_same_ids(bool beam) {
    generate::T5Generator generator(*model, tp, MemorySpace::Host,
                                    expected.at("decoder_start_token_id").get<std::int32_t>(),
                                    expected.at("pad_token_id").get<std::int32_t>());
    const std::vector<generate::Result> got = generator.generate(requests(), params(beam));
    const auto& want = expected.at(beam ? "beam" : "greedy");
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i].ids, through_eos(want[i]))
          << GetParam() << (beam ? " beam" : " greedy") << " prompt " << i
          << " (greedy_min_margin " << expected.at("greedy_min_margin") << ")";
  }

  std::string dir;
  MpiCommunicator world{MPI_COMM_WORLD};
  TensorParallelGroup tp{world};
  nlohmann::json expected;
  ModelSpec spec;
  std::unique_ptr<T5Model> model;
};

TEST_P(T5GenerateGolden, GreedyIdsEqualTransformers) { expect_same_ids(false); }
TEST_P(T5GenerateGolden, BeamIdsEqualTransformers) { expect_same_ids(true); }

INSTANTIATE_TEST_SUITE_P(Models, T5GenerateGolden, ::testing::Values("v1_0", "v1_1"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace meshtron::golden
