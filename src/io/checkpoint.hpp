// Topology-free checkpoints in one parallel HDF5 file (DESIGN.md §3, inv. 2).
//
// Layout of save_dir/iter_0000100.h5 (format_version 1):
//
//   /                      attrs format_version, has_optimizer_state
//   /model/<name>          fp32, the GLOBAL, UNSHARDED, UNPADDED logical shape;
//                          under bf16/fp16 training the fp32 MASTER weights
//                          (as Megatron saves them), so a resume is exact
//   /optimizer/exp_avg/<name>, /optimizer/exp_avg_sq/<name>   same shapes
//   /train_state           attrs iteration, consumed_samples, optimizer_step,
//                          seed, loss_scale, loss_scale_good_steps,
//                          skipped_steps;
//                          datasets deck_text, data_sampler_state (uint8 bytes)
//   /topology              attrs tp, pp, dp, world (the writing decomposition)
//
// Every dataset is chunked with the Fletcher32 checksum filter. Writing is
// collective over the world (MPI-IO, H5FD_MPIO_COLLECTIVE, which parallel
// HDF5 >= 1.10.2 needs for filtered datasets): each rank writes only the
// hyperslab its shard covers, and only one copy of each tensor is written
// (dp rank 0, tp rank 0 for tp-replicated tensors, the lowest pipeline stage
// holding a tensor tied over stages). Loading is the mirror under the
// reader's own decomposition, so restarting on another tp/pp/dp is ordinary
// loading.
//
// Safety: the file is written as save_dir/.tmp_iter_XXXXXXX.h5, closed,
// reopened and verified (every dataset present, read back through its
// checksum and compared with what was written), renamed into place, and only
// then is save_dir/latest replaced (write latest.tmp, rename). A job killed
// at any point leaves the previous checkpoint and `latest` intact.
//
// Errors: every failure a user can cause (missing, truncated, corrupt file,
// another format version, a tensor the model lacks, a shape mismatch) raises
// the same one-line UserError on every rank; ranks agree on it with an
// MPI_Allreduce, so no rank is left waiting in a collective.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/parameter.hpp"
#include "parallel/topology.hpp"

namespace meshtron::io {

constexpr int kCheckpointFormatVersion = 1;

/// One parameter and its Adam moments. exp_avg / exp_avg_sq are null when
/// there is no optimizer state; otherwise they have param->value's local
/// shape and shard layout. `master`, when set (bf16/fp16 values), is the
/// fp32 master of param->value in the same shape: it is what /model/<name>
/// holds, a load fills it and sets param->value to its rounding. None owned.
struct CheckpointTensor {
  Parameter* param = nullptr;
  Tensor* exp_avg = nullptr;
  Tensor* exp_avg_sq = nullptr;
  Tensor* master = nullptr;
};

/// Scalars and blobs of the training loop. Saved from world rank 0's copy.
struct TrainState {
  std::int64_t iteration = 0;
  std::int64_t consumed_samples = 0;
  std::int64_t optimizer_step = 0;
  std::uint64_t seed = 0;
  double loss_scale = 1.0;
  /// fp16 loss scaler's good steps since its last change (growth resumes
  /// where it stopped); absent in older files, read as 0.
  std::int64_t loss_scale_good_steps = 0;
  std::int64_t skipped_steps = 0;
  std::string deck_text;
  std::string data_sampler_state;  ///< opaque bytes
  bool operator==(const TrainState&) const = default;
};

/// Tuning of the file layout (defaults suit models of any size).
struct CheckpointOptions {
  /// Elements per HDF5 chunk (each chunk carries one Fletcher32 checksum).
  index_t chunk_elements = index_t(1) << 20;
};

/// "iter_0000100.h5"
std::string checkpoint_file_name(std::int64_t iteration);

/// Write save_dir/iter_XXXXXXX.h5 for state.iteration, update save_dir/latest,
/// then delete the oldest iter_*.h5 beyond keep_last (keep_last <= 0 keeps
/// all). Collective over topo.world_comm(). Creates save_dir if needed.
/// Optimizer state is written when the tensors carry it (all or none).
/// Test hook: MESHTRON_TEST_ABORT_DURING_SAVE=1 makes world rank 0 call
/// MPI_Abort after half of the tensors were written.
void save_checkpoint(const std::string& save_dir, const Topology& topo,
                     const std::vector<CheckpointTensor>& tensors, const TrainState& state,
                     int keep_last, const CheckpointOptions& options = {});

/// Path of the checkpoint save_dir/latest names; false if there is no
/// marker. Not collective.
bool find_latest(const std::string& save_dir, std::string& path);

/// Read every tensor's local shard (under topo's decomposition) and the train
/// state. Collective over topo.world_comm(). Throws UserError (on every rank)
/// for a missing/unreadable/corrupt file, another format version, a tensor
/// missing from the file or of another shape, a tensor in the file that no
/// rank's model has, or load_optimizer without optimizer state in the file.
/// Padded vocabulary rows are set to zero.
void load_checkpoint(const std::string& path, const Topology& topo,
                     const std::vector<CheckpointTensor>& tensors, TrainState& state,
                     bool load_optimizer);

/// What a run needs to know before loading a checkpoint.
struct CheckpointHeader {
  TrainState state;
  bool has_optimizer_state = false;
};

/// Read a checkpoint's train state and optimizer-state flag without its
/// tensors. Collective over `comm`; the same one-line UserError on every
/// rank as load_checkpoint for a missing, unreadable or foreign file.
CheckpointHeader read_checkpoint_header(const std::string& path, MPI_Comm comm);

/// One dataset of a checkpoint as inspect reports it.
struct CheckpointTensorInfo {
  std::string path;   ///< "model/layers.0.mlp.fc.weight"
  std::string dtype;  ///< "fp32", ...
  Shape shape;
  bool checksum_ok = false;
  std::string error;  ///< why the read failed, when !checksum_ok
};

struct CheckpointInfo {
  std::string path;
  int format_version = 0;
  TrainState state;
  int tp = 0, pp = 0, dp = 0, world = 0;  ///< writing topology
  bool has_optimizer_state = false;
  std::vector<CheckpointTensorInfo> tensors;  ///< model first, then optimizer
  bool checksums_ok() const;
};

/// Serial: read the metadata and every dataset in full (verifying each
/// chunk's Fletcher32). Throws UserError if the file cannot be opened or is
/// not a meshtron checkpoint of a known format; checksum failures are
/// reported per tensor, not thrown.
CheckpointInfo inspect_checkpoint(const std::string& path);

}  // namespace meshtron::io
