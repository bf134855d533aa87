// Loading a checkpoint under any decomposition. Steps, all collective, each
// ending in an agreement on errors (raise_if_any) so that every rank throws
// the same one-line UserError or none does:
//   1. the file exists, opens (a truncated file fails here) and has our
//      format version;
//   2. train state and writing topology are readable;
//   3. the file holds exactly the model's tensors (union over the world) in
//      the model's shapes, plus optimizer state when it is asked for;
//   4. each rank reads its own hyperslabs (independent I/O: a checksum
//      failure is seen by the ranks reading that chunk, then shared).
#include <filesystem>
#include <map>
#include <set>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_format.hpp"

namespace meshtron::io {

namespace {

/// Names of the links in a group.
std::set<std::string> member_names(hid_t group) {
  H5G_info_t info;
  std::set<std::string> names;
  if (H5Gget_info(group, &info) < 0) return names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr,
                                           0, H5P_DEFAULT);
    if (len < 0) continue;
    std::string name(std::size_t(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(),
                       H5P_DEFAULT);
    name.resize(std::size_t(len));
    names.insert(name);
  }
  return names;
}

/// Whether `path` ("a/b/c") exists, checking each step (H5Lexists fails
/// rather than answering false when an intermediate group is missing).
bool link_exists(hid_t file, const std::string& path) {
  for (std::size_t end = path.find('/'); ; end = path.find('/', end + 1)) {
    const std::string prefix = path.substr(0, end);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (end == std::string::npos) return true;
  }
}

/// "" when the file holds every tensor of every kind in the model's shape
/// and no model tensor the model lacks. Every rank sees the same union, so
/// every rank finds the same first problem.
std::string check_contents(hid_t file, const std::string& path,
                           const std::vector<GlobalTensor>& globals,
                           const std::vector<TensorKind>& kinds) {
  const std::string where = "checkpoint '" + path + "'";
  for (TensorKind kind : kinds) {
    const std::string group_name = kind_group(kind);
    h5::Handle group = h5::group(
        link_exists(file, group_name) ? H5Gopen2(file, group_name.c_str(), H5P_DEFAULT) : -1);
    if (!group.valid()) return where + " has no group /" + group_name;
    const std::set<std::string> present = member_names(group.id());
    for (const GlobalTensor& g : globals) {
      const std::string name = group_name + "/" + g.name;
      if (!present.count(g.name)) return where + " has no tensor '" + name + "'";
      h5::Handle d = h5::dataset(H5Dopen2(group.id(), g.name.c_str(), H5P_DEFAULT));
      if (!d.valid()) return where + ": cannot open tensor '" + name + "': " + h5::last_error();
      const Shape shape = h5::dataset_shape(d.id());
      if (shape != g.shape)
        return MESH_MSG(where << ": tensor '" << name << "' has shape " << shape_string(shape)
                              << " in the file, the model expects " << shape_string(g.shape));
    }
    if (kind != TensorKind::Value) continue;
    std::set<std::string> expected;
    for (const GlobalTensor& g : globals) expected.insert(g.name);
    for (const std::string& name : present)
      if (!expected.count(name))
        return where + " holds tensor '" + group_name + "/" + name +
               "', which the model does not have";
  }
  return "";
}

/// Read this rank's shards; "" or the first failure. Read-only opens may be
/// independent (HDF5's collective-calling rules), so each rank opens only
/// the datasets it holds.
std::string read_tensors(hid_t file, const std::string& path,
                         const std::vector<GlobalTensor>& globals,
                         const std::vector<TensorKind>& kinds, const Topology& topo,
                         const std::vector<CheckpointTensor>& tensors) {
  std::map<std::string, const CheckpointTensor*> local;
  for (const CheckpointTensor& t : tensors) local.emplace(t.param->name, &t);
  for (TensorKind kind : kinds) {
    h5::Handle group = h5::group(H5_CHECK(H5Gopen2(file, kind_group(kind), H5P_DEFAULT)));
    for (const GlobalTensor& g : globals) {
      auto it = local.find(g.name);
      Tensor* target = it == local.end() ? nullptr : tensor_of(*it->second, kind);
      if (!target) continue;
      h5::Handle d = h5::dataset(H5Dopen2(group.id(), g.name.c_str(), H5P_DEFAULT));
      Tensor shard;
      std::string error = d.valid() ? read_shard(d.id(), *it->second->param, topo.tp_rank(),
                                                 topo.tp(), shard)
                                    : h5::last_error();
      if (!error.empty())
        return "checkpoint '" + path + "': reading tensor '" + kind_group(kind) + "/" + g.name +
               "' failed: " + error;
      target->copy_from(shard);  // a host shard; copy_from uploads it to a device target
      // A master's 16-bit value: its rounding (the optimizer's load redoes
      // this on the device, as its step does).
      if (kind == TensorKind::Value && it->second->master)
        it->second->param->value.copy_from(shard);
    }
  }
  return "";
}

/// Steps 1 and 2: the open file, its train state and optimizer-state flag.
h5::Handle open_checkpoint(const std::string& path, MPI_Comm world, TrainState& state,
                           bool& has_optimizer_state) {
  h5::silence_errors();
  raise_if_any(world, std::filesystem::is_regular_file(path)
                          ? "" : "checkpoint file '" + path + "' does not exist");
  h5::Handle fapl = h5::file_access(world);
  h5::Handle f = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id()));
  raise_if_any(world, f.valid() ? "" : "cannot open checkpoint '" + path +
                                           "' (truncated or not an HDF5 file?): " +
                                           h5::last_error());
  raise_if_any(world, check_format(f.id(), path));
  WriterTopology writer;
  raise_if_any(world, read_metadata(f.id(), path, state, writer, has_optimizer_state));
  return f;
}

}  // namespace

CheckpointHeader read_checkpoint_header(const std::string& path, MPI_Comm comm) {
  CheckpointHeader header;
  h5::Handle f = open_checkpoint(path, comm, header.state, header.has_optimizer_state);
  return header;
}

void load_checkpoint(const std::string& path, const Topology& topo,
                     const std::vector<CheckpointTensor>& tensors, TrainState& state_out,
                     bool load_optimizer) {
  MPI_Comm world = topo.world_comm();
  TrainState state;
  bool has_optimizer_state = false;
  h5::Handle f = open_checkpoint(path, world, state, has_optimizer_state);
  const std::vector<GlobalTensor> globals = gather_global_tensors(topo, tensors);
  std::vector<TensorKind> kinds = {TensorKind::Value};
  if (load_optimizer) {
    raise_if_any(world, has_optimizer_state ? "" : "checkpoint '" + path +
                                                       "' holds no optimizer state");
    kinds = {kAllKinds.begin(), kAllKinds.end()};
  }
  raise_if_any(world, check_contents(f.id(), path, globals, kinds));
  raise_if_any(world, read_tensors(f.id(), path, globals, kinds, topo, tensors));
  const bool closed = f.reset() >= 0;
  raise_if_any(world, closed ? "" : "closing checkpoint '" + path + "' failed: " +
                                        h5::last_error());
  state_out = state;
}

}  // namespace meshtron::io
