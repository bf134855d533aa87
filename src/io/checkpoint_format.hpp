// The structure of a checkpoint file (see io/checkpoint.hpp for the layout):
// tensor kinds and their groups, the train-state and topology records, the
// format-version check, and moving one rank's shard in and out of a dataset.
// Internal to src/io.
#pragma once

#include <hdf5.h>

#include <array>
#include <string>

#include "io/checkpoint.hpp"
#include "io/checkpoint_hdf5.hpp"
#include "io/checkpoint_layout.hpp"

namespace meshtron::io {

/// Root attribute: the number of model tensors (each group holds as many).
/// Files written without it are inspected without that check.
constexpr const char* kTensorCountAttribute = "tensor_count";

/// What a dataset holds: the parameter values or one of Adam's moments.
enum class TensorKind { Value, ExpAvg, ExpAvgSq };
constexpr std::array<TensorKind, 3> kAllKinds = {TensorKind::Value, TensorKind::ExpAvg,
                                                 TensorKind::ExpAvgSq};

/// Group of a kind: "model", "optimizer/exp_avg", "optimizer/exp_avg_sq".
const char* kind_group(TensorKind kind);
/// The tensor of `kind` in `t`: the value's fp32 master when `t` has one;
/// null for a moment when there is no optimizer state.
Tensor* tensor_of(const CheckpointTensor& t, TensorKind kind);

/// Writing topology as stored in /topology.
struct WriterTopology {
  int tp = 0, pp = 0, dp = 0, world = 0;
};

/// Collective: root attributes, /train_state and /topology (every rank
/// passes the same values; world rank 0 writes the byte blobs).
void write_metadata(hid_t file, const TrainState& state, const WriterTopology& topo,
                    bool has_optimizer_state, bool is_rank0);

/// "" when `file` is a checkpoint of the supported format version, else the
/// one-line reason naming `path`.
std::string check_format(hid_t file, const std::string& path);

/// Read /train_state, /topology and has_optimizer_state; "" or the reason.
std::string read_metadata(hid_t file, const std::string& path, TrainState& state,
                          WriterTopology& topo, bool& has_optimizer_state);

/// Collective write of `local` (this rank's shard of `p`, any floating dtype)
/// into `dset` in `calls` H5Dwrite calls (the tensor's fused parts: the same
/// number on every rank); a null `p` takes part selecting nothing. "" or
/// the reason.
std::string write_shard(hid_t dset, const Parameter* p, const Tensor* local, int tp_rank,
                        int tp_size, int calls, hid_t collective_dxpl);

/// Independent read of this rank's shard of `p` from `dset` as fp32 (padded
/// rows zero). Returns "" or the HDF5 reason.
std::string read_shard(hid_t dset, const Parameter& p, int tp_rank, int tp_size, Tensor& out);

/// Host fp32 copy (or the tensor itself when it already is one).
Tensor host_f32(const Tensor& t);

}  // namespace meshtron::io
