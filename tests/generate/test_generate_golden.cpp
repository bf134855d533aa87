// meshtron generate on the golden GPT-2 (validation/gpt2-golden, converted by
// `meshtron convert`) against transformers' generate
// (validation/gpt2-golden-generate, made by make_generate_golden.py): greedy
// and beam-search ids equal exactly, both prompts (of different lengths)
// decoded in one batch, on one rank, and on 4 ranks as tp 2 (x dp 2), pp 2
// (x dp 2) and tp 2 x pp 2.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "common/mpi_test_util.hpp"

namespace meshtron {
namespace {

using Ids = std::vector<std::int32_t>;
using testing_util::world_rank;
using testing_util::world_size;

const std::string kSource = MESHTRON_SOURCE_DIR;
const std::string kGolden = kSource + "/validation/gpt2-golden-generate";

nlohmann::json expected() {
  std::ifstream in(kGolden + "/expected.json");
  return nlohmann::json::parse(in);
}

std::vector<std::vector<std::string>> layouts() {
  if (world_size() == 1) return {{}};
  EXPECT_EQ(world_size(), 4) << "the 4-rank run checks tp 2, pp 2 and tp 2 x pp 2";
  return {{"parallel.tensor_parallel=2", "parallel.data_parallel=2"},
          {"parallel.pipeline_parallel=2", "parallel.data_parallel=2"},
          {"parallel.tensor_parallel=2", "parallel.pipeline_parallel=2"}};
}

/// `meshtron generate` of the golden prompts with `sets`; the generated ids
/// read back on every rank.
std::vector<Ids> generate(const std::string& name, const std::vector<std::string>& sets) {
  const std::string output = std::string(MESHTRON_GENERATE_WORK) + "/" + name + "_np" +
                             std::to_string(world_size()) + ".jsonl";
  std::vector<std::string> args = {kSource + "/tests/generate/golden.deck",
                                   "--set", "run.output_dir=" + std::string(MESHTRON_GENERATE_WORK) + "/runs",
                                   "--set", "checkpoint.load=" + std::string(MESHTRON_GENERATE_CHECKPOINT),
                                   "--set", "generate.prompts=" + kGolden + "/prompts.jsonl",
                                   "--set", "generate.output=" + output};
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  EXPECT_EQ(app::run_generate(args), 0);
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<Ids> ids;
  std::ifstream in(output);
  for (std::string line; std::getline(in, line);) ids.push_back(nlohmann::json::parse(line).at("ids").get<Ids>());
  return ids;
}

std::string layout_name(const std::vector<std::string>& sets) {
  std::string name = "layout";
  for (const auto& s : sets) name += "_" + s.substr(s.find('.') + 1);
  return name;
}

TEST(GenerateGolden, GreedyEqualsTransformers) {
  const auto golden = expected();
  for (const auto& sets : layouts()) {
    auto all = sets;
    all.push_back("generate.decoding=greedy");
    all.push_back("generate.max_new_tokens=" + std::to_string(golden.at("max_new_tokens").get<int>()));
    EXPECT_EQ(generate("greedy_" + layout_name(sets), all), golden.at("greedy").get<std::vector<Ids>>())
        << layout_name(sets);
  }
}

TEST(GenerateGolden, BeamSearchEqualsTransformers) {
  const auto golden = expected();
  for (const auto& sets : layouts()) {
    auto all = sets;
    all.push_back("generate.decoding=beam");
    all.push_back("generate.max_new_tokens=" + std::to_string(golden.at("max_new_tokens").get<int>()));
    all.push_back("generate.num_beams=" + std::to_string(golden.at("num_beams").get<int>()));
    all.push_back("generate.length_penalty=" + golden.at("length_penalty").dump());
    EXPECT_EQ(generate("beam_" + layout_name(sets), all), golden.at("beam").get<std::vector<Ids>>())
        << layout_name(sets);
  }
}

}  // namespace
}  // namespace meshtron
