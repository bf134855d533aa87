// Topology: the Cartesian decomposition of MPI_COMM_WORLD into tensor-,
// pipeline- and data-parallel groups.
//
// The grid has dimensions (pp, dp, tp) with tp varying fastest, so world rank
//     r = tp_rank + tp * (dp_rank + dp * pp_rank)
// and consecutive ranks share a tensor group (Megatron's tp-dp-pp order):
// tensor collectives, the most frequent and the largest, stay inside a node.
//
// Built once at start-up and passed by reference; it owns its communicators.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace meshtron {

/// Requested degrees; data_parallel = 0 means "auto" (world / (tp * pp)).
struct ParallelDegrees {
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int data_parallel = 0;
  /// Encoder-decoder models (Megatron's --pipeline-model-parallel-split-rank):
  /// stages [0, split) hold the encoder, [split, pp) the decoder; 0 = one stack.
  int pipeline_split_rank = 0;
  /// Whether the last stage holds a copy of the word table (a tied head),
  /// so that it belongs to the embedding group.
  bool last_stage_holds_word_table = true;
};

/// Position of a rank in the grid.
struct GridCoord {
  int tp = 0, dp = 0, pp = 0;
  bool operator==(const GridCoord&) const = default;
};

class Topology {
 public:
  /// Collective over `world`. Throws UserError (on every rank alike) when the
  /// degrees do not multiply to the world size; the message names each factor.
  Topology(MPI_Comm world, const ParallelDegrees& degrees);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  /// Resolve "auto" dp and check tp * pp * dp == world_size.
  static ParallelDegrees resolve(const ParallelDegrees& requested, int world_size);

  int world_size() const { return world_size_; }
  int world_rank() const { return world_rank_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  const GridCoord& coord() const { return coord_; }
  int tp_rank() const { return coord_.tp; }
  int dp_rank() const { return coord_.dp; }
  int pp_rank() const { return coord_.pp; }

  /// Rank <-> coordinate maps (pure functions of the degrees).
  GridCoord coord_of(int world_rank) const;
  int rank_of(const GridCoord& c) const;

  bool is_first_stage() const { return coord_.pp == 0; }
  bool is_last_stage() const { return coord_.pp == pp_ - 1; }
  /// World ranks of the previous / next pipeline stage, or -1 at the ends.
  int prev_stage_rank() const;
  int next_stage_rank() const;
  /// Within the pp communicator, ranks equal the stage index.
  int prev_stage() const { return is_first_stage() ? -1 : coord_.pp - 1; }
  int next_stage() const { return is_last_stage() ? -1 : coord_.pp + 1; }

  MPI_Comm world_comm() const { return world_; }
  MPI_Comm grid_comm() const { return grid_; }
  MPI_Comm tp_comm() const { return tp_comm_; }
  MPI_Comm dp_comm() const { return dp_comm_; }
  MPI_Comm pp_comm() const { return pp_comm_; }
  /// tp x pp ranks holding one full model replica.
  MPI_Comm model_parallel_comm() const { return mp_comm_; }
  /// The stages of this (tp, dp) pipeline that hold the word table: the
  /// first and the last (tied embeddings), and the first decoder stage under
  /// a pipeline split (Megatron's embedding group); MPI_COMM_NULL on the others.
  MPI_Comm embedding_comm() const { return embedding_comm_; }
  bool in_embedding_group() const { return embedding_comm_ != MPI_COMM_NULL; }
  /// Under a pipeline split: the stages of this (tp, dp) pipeline that hold
  /// this rank's stack (encoder stages or decoder stages), which share the
  /// stack's tables; MPI_COMM_NULL without a split.
  MPI_Comm stack_comm() const { return stack_comm_; }
  int pipeline_split_rank() const { return split_; }

  /// Node-local rank (MPI_COMM_TYPE_SHARED) and the GPU it maps to.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int gpu_for_local_rank(int num_gpus) const;
  const std::string& host_name() const { return host_; }

 private:
  MPI_Comm world_ = MPI_COMM_NULL;  ///< Not owned.
  MPI_Comm grid_ = MPI_COMM_NULL, tp_comm_ = MPI_COMM_NULL,
           dp_comm_ = MPI_COMM_NULL, pp_comm_ = MPI_COMM_NULL,
           mp_comm_ = MPI_COMM_NULL, embedding_comm_ = MPI_COMM_NULL,
           stack_comm_ = MPI_COMM_NULL,
           node_comm_ = MPI_COMM_NULL;  ///< Owned.
  int world_size_ = 1, world_rank_ = 0;
  int tp_ = 1, pp_ = 1, dp_ = 1, split_ = 0;
  GridCoord coord_;
  int local_rank_ = 0, local_size_ = 1;
  std::string host_;
};

/// One row per world rank: "rank tp dp pp host gpu" (collective; the
/// returned table is complete on every rank).
struct RankMapRow {
  int world_rank;
  GridCoord coord;
  std::string host;
  int local_rank;
  int gpu;  ///< -1 on the host path
};
std::vector<RankMapRow> gather_rank_map(const Topology& topo, int num_gpus);
std::string format_rank_map(const std::vector<RankMapRow>& rows);
/// The most hosts that any tensor-parallel group of the map spans (1: every
/// tp group on one node, as CUDA IPC between its GPUs needs).
int max_hosts_per_tp_group(const std::vector<RankMapRow>& rows);

}  // namespace meshtron
