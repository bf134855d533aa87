// ParallelRuntime: the topology and one Communicator per group, built once
// from MPI_COMM_WORLD (or any communicator: tests build a 1-rank reference
// over MPI_COMM_SELF beside the decomposed run).
#pragma once

#include <memory>
#include <optional>

#include "parallel/communicator.hpp"
#include "parallel/mappings.hpp"
#include "parallel/topology.hpp"
#include "train/optimizer.hpp"

namespace meshtron {

class ParallelRuntime {
 public:
  ParallelRuntime(MPI_Comm world, const ParallelDegrees& degrees)
      : topo(world, degrees),
        world(topo.world_comm()),
        tp(topo.tp_comm()),
        dp(topo.dp_comm()),
        pp(topo.pp_comm()),
        model(topo.model_parallel_comm()),
        tp_group{tp} {
    // The tied word table needs a reduction only when first and last stage
    // are different ranks.
    if (topo.pp() > 1 && topo.in_embedding_group()) embedding.emplace(topo.embedding_comm());
  }
  ParallelRuntime(const ParallelRuntime&) = delete;
  ParallelRuntime& operator=(const ParallelRuntime&) = delete;

  OptimizerGroups optimizer_groups() {
    return {tp, dp, model, embedding ? &*embedding : nullptr};
  }

  Topology topo;
  MpiCommunicator world, tp, dp, pp, model;
  std::optional<MpiCommunicator> embedding;
  TensorParallelGroup tp_group;
};

}  // namespace meshtron
