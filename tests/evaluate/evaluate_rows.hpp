// What the BERT and T5 `evaluate.inputs` tests share: a fixed tiny model (its
// initial weights plus noise) saved as a checkpoint of the test's deck,
// `meshtron evaluate` of a rows file on this run's layout (1 rank, or
// tp 2 x dp 2), and the cross-entropy of one logits row in double.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "common/mpi_test_util.hpp"
#include "io/checkpoint.hpp"
#include "model/parameter.hpp"
#include "parallel/topology.hpp"

namespace meshtron::evaluate_test {

/// A path in the build folder unique to `family`, `name` and this run's
/// world size (the 1- and 4-rank runs may run at once).
inline std::string work_path(const std::string& family, const std::string& name) {
  return std::string(MESHTRON_EVALUATE_WORK) + "/" + family + "_" + name + "_np" +
         std::to_string(testing_util::world_size());
}

/// Uniform noise (+-0.5) on every weight, large enough that the scores
/// depend on every input.
inline void add_weight_noise(const ParameterList& params) {
  std::mt19937 engine(11);
  std::uniform_real_distribution<float> noise(-0.5f, 0.5f);
  for (Parameter* p : params)
    for (index_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] += noise(engine);
}

/// Rank 0 saves `params` as a checkpoint of `deck` and writes `deck` as
/// work_path(family, "deck").deck; returns the checkpoint's path.
inline std::string save_fixed_checkpoint(const std::string& family, const ParameterList& params,
                                         const std::string& deck) {
  const std::string dir = work_path(family, "checkpoint");
  if (testing_util::world_rank() == 0) {
    Topology topo(MPI_COMM_SELF, {1, 1, 1});
    std::vector<io::CheckpointTensor> tensors;
    for (Parameter* p : params) tensors.push_back({p, nullptr, nullptr});
    io::TrainState state;
    state.deck_text = deck;
    io::save_checkpoint(dir, topo, tensors, state, /*keep_last=*/0);
    std::ofstream(work_path(family, "deck") + ".deck") << deck;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir + "/" + io::checkpoint_file_name(0);
}

/// `meshtron evaluate` of `inputs` with the deck save_fixed_checkpoint
/// wrote, on this run's layout (1 rank, pp 2 on 2 ranks, or tp 2 x dp 2).
inline nlohmann::json evaluate(const std::string& family, const std::string& checkpoint,
                               const std::string& inputs) {
  const std::string output = work_path(family, "result") + ".json";
  std::vector<std::string> args = {work_path(family, "deck") + ".deck",
                                   "--set", "run.output_dir=" + work_path(family, "runs"),
                                   "--set", "checkpoint.load=" + checkpoint,
                                   "--set", "evaluate.inputs=" + inputs,
                                   "--set", "evaluate.output=" + output};
  if (testing_util::world_size() == 2)
    args.insert(args.end(), {"--set", "parallel.pipeline_parallel=2"});
  if (testing_util::world_size() == 4)
    for (const char* s : {"parallel.tensor_parallel=2", "parallel.data_parallel=2"})
      args.insert(args.end(), {"--set", s});
  EXPECT_EQ(app::run_evaluate(args), 0);
  MPI_Barrier(MPI_COMM_WORLD);
  std::ifstream in(output);
  return nlohmann::json::parse(in);
}

/// Rank 0 writes `text` to `path`; every rank waits for it.
inline void write_on_rank0(const std::string& path, const std::string& text) {
  if (testing_util::world_rank() == 0) std::ofstream(path) << text;
  MPI_Barrier(MPI_COMM_WORLD);
}

/// -log softmax(row)[label] over the first `vocab` logits of `row`.
inline double cross_entropy(const double* row, int vocab, std::int32_t label) {
  const double max = *std::max_element(row, row + vocab);
  double sum_exp = 0;
  for (int v = 0; v < vocab; ++v) sum_exp += std::exp(row[v] - max);
  return max + std::log(sum_exp) - row[label];
}

}  // namespace meshtron::evaluate_test
