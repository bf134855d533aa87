#include "io/checkpoint_format.hpp"

#include "common/error.hpp"

namespace meshtron::io {

const char* kind_group(TensorKind kind) {
  switch (kind) {
    case TensorKind::Value: return "model";
    case TensorKind::ExpAvg: return "optimizer/exp_avg";
    case TensorKind::ExpAvgSq: return "optimizer/exp_avg_sq";
  }
  return "";
}

Tensor* tensor_of(const CheckpointTensor& t, TensorKind kind) {
  switch (kind) {
    case TensorKind::Value: return t.master ? t.master : &t.param->value;
    case TensorKind::ExpAvg: return t.exp_avg;
    case TensorKind::ExpAvgSq: return t.exp_avg_sq;
  }
  return nullptr;
}

Tensor host_f32(const Tensor& t) {
  // HDF5 reads and writes host memory: device tensors (GPU path) are staged.
  const Tensor host = t.is_host() ? t : t.to_host();
  return host.dtype() == DType::F32 ? host : host.to(DType::F32);
}

void write_metadata(hid_t file, const TrainState& s, const WriterTopology& topo,
                    bool has_optimizer_state, bool is_rank0) {
  using h5::write_attribute;
  write_attribute(file, "format_version", std::int64_t(kCheckpointFormatVersion));
  write_attribute(file, "has_optimizer_state", std::int64_t(has_optimizer_state));

  h5::Handle state = h5::create_group(file, "train_state");
  write_attribute(state.id(), "iteration", s.iteration);
  write_attribute(state.id(), "consumed_samples", s.consumed_samples);
  write_attribute(state.id(), "optimizer_step", s.optimizer_step);
  write_attribute(state.id(), "seed", s.seed);
  write_attribute(state.id(), "loss_scale", s.loss_scale);
  write_attribute(state.id(), "loss_scale_good_steps", s.loss_scale_good_steps);
  write_attribute(state.id(), "skipped_steps", s.skipped_steps);
  MESH_VERIFY(h5::write_bytes(state.id(), "deck_text", s.deck_text, is_rank0) &&
                  h5::write_bytes(state.id(), "data_sampler_state", s.data_sampler_state,
                                  is_rank0),
              "writing the checkpoint train state failed: " << h5::last_error());

  h5::Handle grid = h5::create_group(file, "topology");
  write_attribute(grid.id(), "tp", std::int64_t(topo.tp));
  write_attribute(grid.id(), "pp", std::int64_t(topo.pp));
  write_attribute(grid.id(), "dp", std::int64_t(topo.dp));
  write_attribute(grid.id(), "world", std::int64_t(topo.world));
}

std::string check_format(hid_t file, const std::string& path) {
  std::int64_t version = 0;
  if (!h5::read_attribute(file, "format_version", version))
    return "'" + path + "' is not a meshtron checkpoint (no format_version attribute)";
  if (version != kCheckpointFormatVersion)
    return MESH_MSG("checkpoint '" << path << "' has format version " << version
                                   << "; this meshtron reads version "
                                   << kCheckpointFormatVersion);
  return "";
}

namespace {

/// Read named int64/uint64/double attributes; the first missing one is named.
template <class T>
bool read_into(hid_t obj, const char* name, T& value, std::string& missing) {
  if (!missing.empty()) return false;
  if (h5::read_attribute(obj, name, value)) return true;
  missing = name;
  return false;
}

}  // namespace

std::string read_metadata(hid_t file, const std::string& path, TrainState& s,
                          WriterTopology& topo, bool& has_optimizer_state) {
  const std::string where = "checkpoint '" + path + "': ";
  if (H5Lexists(file, "train_state", H5P_DEFAULT) <= 0 ||
      H5Lexists(file, "topology", H5P_DEFAULT) <= 0)
    return where + "missing /train_state or /topology group";
  h5::Handle state = h5::group(H5Gopen2(file, "train_state", H5P_DEFAULT));
  h5::Handle grid = h5::group(H5Gopen2(file, "topology", H5P_DEFAULT));
  if (!state.valid() || !grid.valid()) return where + "cannot open metadata: " + h5::last_error();
  std::string missing;
  std::int64_t has_opt = 0, tp = 0, pp = 0, dp = 0, world = 0;
  read_into(file, "has_optimizer_state", has_opt, missing);
  read_into(state.id(), "iteration", s.iteration, missing);
  read_into(state.id(), "consumed_samples", s.consumed_samples, missing);
  read_into(state.id(), "optimizer_step", s.optimizer_step, missing);
  read_into(state.id(), "seed", s.seed, missing);
  read_into(state.id(), "loss_scale", s.loss_scale, missing);
  read_into(state.id(), "skipped_steps", s.skipped_steps, missing);
  // Optional (added within format version 1): files without it read as 0.
  if (!h5::read_attribute(state.id(), "loss_scale_good_steps", s.loss_scale_good_steps))
    s.loss_scale_good_steps = 0;
  read_into(grid.id(), "tp", tp, missing);
  read_into(grid.id(), "pp", pp, missing);
  read_into(grid.id(), "dp", dp, missing);
  read_into(grid.id(), "world", world, missing);
  if (!missing.empty()) return where + "missing or unreadable attribute '" + missing + "'";
  has_optimizer_state = has_opt != 0;
  topo = {int(tp), int(pp), int(dp), int(world)};
  std::string error;
  if (!h5::read_bytes(state.id(), "deck_text", s.deck_text, error) ||
      !h5::read_bytes(state.id(), "data_sampler_state", s.data_sampler_state, error))
    return where + "train_state: " + error;
  return "";
}

std::string write_shard(hid_t dset, const Parameter* p, const Tensor* local, int tp_rank,
                        int tp_size, int calls, hid_t dxpl) {
  ShardSelection sel;
  Tensor data;
  if (p) {
    MESH_VERIFY(local->shape() == p->value.shape(),
                "tensor for '" << p->name << "' has shape " << shape_string(local->shape())
                               << ", its parameter " << shape_string(p->value.shape()));
    sel = shard_selection(*p, tp_rank, tp_size);
    data = host_f32(*local);
    MESH_VERIFY(int(sel.pieces.size()) <= calls, "'" << p->name << "' has more pieces than "
                                                     << calls);
  }
  // Collective I/O: every rank makes `calls` H5Dwrite calls, selecting
  // nothing where it has no piece, and keeps going after an error so that
  // the calls stay matched.
  h5::Handle file_space = h5::space(H5_CHECK(H5Dget_space(dset)));
  const float dummy = 0;
  std::string error;
  for (int i = 0; i < calls; ++i) {
    const Piece* piece = i < int(sel.pieces.size()) ? &sel.pieces[std::size_t(i)] : nullptr;
    select_in_file(file_space.id(), piece);
    h5::Handle mem_space = h5::space(memory_space(sel, piece));
    const void* buf = piece ? data.raw() : &dummy;
    if (H5Dwrite(dset, H5T_NATIVE_FLOAT, mem_space.id(), file_space.id(), dxpl, buf) < 0 &&
        error.empty())
      error = h5::last_error();
  }
  return error;
}

std::string read_shard(hid_t dset, const Parameter& p, int tp_rank, int tp_size, Tensor& out) {
  const ShardSelection sel = shard_selection(p, tp_rank, tp_size);
  out = Tensor::zeros(p.value.shape(), DType::F32);  // padded rows stay zero
  h5::Handle file_space = h5::space(H5_CHECK(H5Dget_space(dset)));
  // Independent: a checksum failure stays on this rank (no peer waits in a
  // collective), and the callers agree on errors afterwards.
  h5::Handle dxpl = h5::transfer(/*collective=*/false);
  for (const Piece& piece : sel.pieces) {
    select_in_file(file_space.id(), &piece);
    h5::Handle mem_space = h5::space(memory_space(sel, &piece));
    if (H5Dread(dset, H5T_NATIVE_FLOAT, mem_space.id(), file_space.id(), dxpl.id(),
                out.raw()) < 0)
      return h5::last_error();
  }
  return "";
}

}  // namespace meshtron::io
