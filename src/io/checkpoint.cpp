// Saving a checkpoint (loading: checkpoint_load.cpp, inspecting:
// checkpoint_inspect.cpp). Steps of save_checkpoint, all collective:
//   1. agree on the train state (rank 0's), the optimizer-state flag and the
//      union of tensors over the world;
//   2. write save_dir/.tmp_iter_N.h5: metadata, then every tensor kind and
//      name in sorted order, each rank writing only its hyperslab;
//   3. reopen and verify: every dataset present with its shape, each rank's
//      shard read back through the Fletcher32 filter equals what it wrote;
//   4. rank 0 renames to iter_N.h5, replaces `latest`, prunes old files.
#include "io/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "common/error.hpp"
#include "io/checkpoint_format.hpp"

namespace meshtron::io {

namespace fs = std::filesystem;

namespace {

int comm_rank(MPI_Comm comm) {
  int r = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &r));
  return r;
}

void broadcast_string(MPI_Comm comm, std::string& s) {
  std::uint64_t n = s.size();
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, comm));
  s.resize(n);
  MPI_CHECK(MPI_Bcast(s.data(), int(n), MPI_CHAR, 0, comm));
}

/// Every rank writes the same attributes, so take world rank 0's state.
TrainState broadcast_state(MPI_Comm comm, const TrainState& in) {
  TrainState s = in;
  std::int64_t ints[6] = {s.iteration,     s.consumed_samples,    s.optimizer_step,
                          s.skipped_steps, std::int64_t(s.seed), s.loss_scale_good_steps};
  MPI_CHECK(MPI_Bcast(ints, 6, MPI_INT64_T, 0, comm));
  MPI_CHECK(MPI_Bcast(&s.loss_scale, 1, MPI_DOUBLE, 0, comm));
  s.iteration = ints[0];
  s.consumed_samples = ints[1];
  s.optimizer_step = ints[2];
  s.skipped_steps = ints[3];
  s.seed = std::uint64_t(ints[4]);
  s.loss_scale_good_steps = ints[5];
  broadcast_string(comm, s.deck_text);
  broadcast_string(comm, s.data_sampler_state);
  return s;
}

/// Optimizer state is saved for all tensors or none, on every rank alike.
bool agree_on_optimizer_state(MPI_Comm comm, const std::vector<CheckpointTensor>& tensors) {
  int with = 0, without = 0;
  for (const CheckpointTensor& t : tensors) {
    MESH_VERIFY((t.exp_avg == nullptr) == (t.exp_avg_sq == nullptr),
                "parameter '" << t.param->name << "' has only one Adam moment");
    (t.exp_avg ? with : without) = 1;
  }
  int flags[2] = {with, without}, any[2] = {0, 0};
  MPI_CHECK(MPI_Allreduce(flags, any, 2, MPI_INT, MPI_MAX, comm));
  MESH_VERIFY(!(any[0] && any[1]), "some parameters carry optimizer state and some do not");
  return any[0] != 0;
}

std::map<std::string, const CheckpointTensor*> index_by_name(
    const std::vector<CheckpointTensor>& tensors) {
  std::map<std::string, const CheckpointTensor*> out;
  for (const CheckpointTensor& t : tensors)
    MESH_VERIFY(out.emplace(t.param->name, &t).second,
                "parameter '" << t.param->name << "' listed twice for the checkpoint");
  return out;
}

void prepare_directory(MPI_Comm comm, const std::string& dir) {
  std::string error;
  if (comm_rank(comm) == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir))
      error = "cannot create checkpoint directory '" + dir + "': " + ec.message();
  }
  raise_if_any(comm, error);
}

/// MESHTRON_TEST_ABORT_DURING_SAVE=1: kill the job half-way through the
/// tensors, to test that an interrupted save leaves the last checkpoint.
void maybe_abort_for_test(MPI_Comm comm, std::size_t written, std::size_t total) {
  const char* hook = std::getenv("MESHTRON_TEST_ABORT_DURING_SAVE");
  if (!hook || std::strcmp(hook, "1") != 0 || written != std::max<std::size_t>(total / 2, 1))
    return;
  if (comm_rank(comm) == 0) {
    std::fprintf(stderr, "meshtron: test hook: aborting during checkpoint save (%zu of %zu "
                         "tensors written)\n", written, total);
    std::fflush(stderr);
    MPI_Abort(comm, 3);
  }
}

struct SavePlan {
  std::vector<GlobalTensor> globals;
  std::map<std::string, const CheckpointTensor*> local;
  std::vector<TensorKind> kinds;
  index_t chunk_elements = 0;
};

/// This rank writes a tensor iff it is the one copy chosen to: dp rank 0,
/// the lowest stage holding it, and tp rank 0 when it is tp-replicated.
const CheckpointTensor* writer_copy(const SavePlan& plan, const GlobalTensor& g,
                                    const Topology& topo) {
  auto it = plan.local.find(g.name);
  if (it == plan.local.end()) return nullptr;
  const bool writes = topo.dp_rank() == 0 && topo.pp_rank() == g.first_stage &&
                      (!it->second->param->tp_replicated() || topo.tp_rank() == 0);
  return writes ? it->second : nullptr;
}

void write_tensors(hid_t file, const Topology& topo, const SavePlan& plan) {
  h5::Handle dxpl = h5::transfer(/*collective=*/true);
  h5::Handle optimizer;
  if (plan.kinds.size() > 1) optimizer = h5::create_group(file, "optimizer");
  const std::size_t total = plan.kinds.size() * plan.globals.size();
  std::size_t written = 0;
  for (TensorKind kind : plan.kinds) {
    h5::Handle group = h5::create_group(file, kind_group(kind));
    for (const GlobalTensor& g : plan.globals) {
      h5::Handle d = h5::create_checksummed(
          group.id(), g.name, H5T_IEEE_F32LE, g.shape,
          chunk_dims(g.shape, plan.chunk_elements, g.split_dim, g.parts));
      const CheckpointTensor* mine = writer_copy(plan, g, topo);
      const std::string error = write_shard(d.id(), mine ? mine->param : nullptr,
                                            mine ? tensor_of(*mine, kind) : nullptr,
                                            topo.tp_rank(), topo.tp(), g.parts, dxpl.id());
      raise_if_any(topo.world_comm(), error.empty() ? "" : MESH_MSG(
          "writing checkpoint tensor '" << kind_group(kind) << "/" << g.name
                                        << "' failed: " << error));
      maybe_abort_for_test(topo.world_comm(), ++written, total);
    }
  }
}

h5::Handle open_parallel(const std::string& path, MPI_Comm comm, bool create) {
  h5::Handle fapl = h5::file_access(comm);
  return h5::file(create ? H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id())
                         : H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.id()));
}

void write_file(const std::string& tmp, const Topology& topo, const SavePlan& plan,
                const TrainState& state) {
  MPI_Comm world = topo.world_comm();
  h5::Handle f = open_parallel(tmp, world, /*create=*/true);
  raise_if_any(world, f.valid() ? "" : "cannot create checkpoint file '" + tmp + "': " +
                                           h5::last_error());
  write_metadata(f.id(), state, {topo.tp(), topo.pp(), topo.dp(), topo.world_size()},
                 plan.kinds.size() > 1, topo.world_rank() == 0);
  write_tensors(f.id(), topo, plan);
  const bool closed = f.reset() >= 0;
  raise_if_any(world, closed ? "" : "closing checkpoint file '" + tmp + "' failed: " +
                                        h5::last_error());
}

/// "" when this rank's written shard of (kind, g) reads back bit for bit.
std::string verify_tensor(hid_t group, const GlobalTensor& g, TensorKind kind,
                          const CheckpointTensor* mine, const Topology& topo) {
  const std::string name = std::string(kind_group(kind)) + "/" + g.name;
  h5::Handle d = h5::dataset(H5Dopen2(group, g.name.c_str(), H5P_DEFAULT));
  if (!d.valid()) return "tensor '" + name + "' is missing";
  if (h5::dataset_shape(d.id()) != g.shape) return "tensor '" + name + "' has the wrong shape";
  if (!mine) return "";
  Tensor back;
  const std::string error = read_shard(d.id(), *mine->param, topo.tp_rank(), topo.tp(), back);
  if (!error.empty()) return "reading back '" + name + "' failed: " + error;
  const Tensor written = host_f32(*tensor_of(*mine, kind));
  const index_t n = shard_selection(*mine->param, topo.tp_rank(), topo.tp()).real_elements;
  if (std::memcmp(back.raw(), written.raw(), std::size_t(n) * sizeof(float)) != 0)
    return "tensor '" + name + "' reads back different values";
  return "";
}

void verify_file(const std::string& tmp, const Topology& topo, const SavePlan& plan) {
  MPI_Comm world = topo.world_comm();
  h5::Handle f = open_parallel(tmp, world, /*create=*/false);
  std::string error = f.valid() ? check_format(f.id(), tmp) : h5::last_error();
  // Every rank opens every dataset in the same order (opens and closes stay
  // collective); each reads back only what it wrote.
  for (TensorKind kind : plan.kinds) {
    h5::Handle group = h5::group(f.valid() ? H5Gopen2(f.id(), kind_group(kind), H5P_DEFAULT) : -1);
    for (const GlobalTensor& g : plan.globals) {
      if (!error.empty() || !group.valid()) break;
      error = verify_tensor(group.id(), g, kind, writer_copy(plan, g, topo), topo);
    }
    if (error.empty() && !group.valid()) error = std::string("group ") + kind_group(kind) + " missing";
  }
  f.reset();
  if (!error.empty()) error = "checkpoint verification of '" + tmp + "' failed: " + error;
  try {
    raise_if_any(world, error);
  } catch (const UserError&) {
    if (topo.world_rank() == 0) std::remove(tmp.c_str());
    throw;
  }
}

/// Write `text` to `path` via path.tmp + fsync + rename, so readers see the
/// old or the new content, never a partial one.
std::string replace_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return "cannot write '" + tmp + "': " + std::strerror(errno);
  const bool ok = std::fputs(text.c_str(), f) >= 0 && std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) return "cannot write '" + tmp + "': " + std::strerror(errno);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  return ec ? "cannot rename '" + tmp + "' to '" + path + "': " + ec.message() : "";
}

/// Delete iter_*.h5 beyond the newest keep_last, and leftovers of
/// interrupted saves (.tmp_iter_*.h5).
void prune(const std::string& dir, int keep_last) {
  static const std::regex checkpoint(R"(iter_(\d+)\.h5)"), leftover(R"(\.tmp_iter_\d+\.h5)");
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, checkpoint)) found.emplace_back(std::stoll(m[1]), entry.path());
    else if (std::regex_match(name, leftover)) fs::remove(entry.path(), ec);
  }
  if (keep_last <= 0 || int(found.size()) <= keep_last) return;
  std::sort(found.begin(), found.end());
  for (std::size_t i = 0; i + keep_last < found.size(); ++i) fs::remove(found[i].second, ec);
}

/// Rank 0 moves the verified file into place, then updates `latest`.
void publish(const Topology& topo, const std::string& dir, const std::string& tmp,
             const std::string& name, int keep_last) {
  MPI_CHECK(MPI_Barrier(topo.world_comm()));
  std::string error;
  if (topo.world_rank() == 0) {
    std::error_code ec;
    fs::rename(tmp, dir + "/" + name, ec);
    if (ec) error = "cannot rename '" + tmp + "' into place: " + ec.message();
    if (error.empty()) error = replace_file_atomically(dir + "/latest", name + "\n");
    if (error.empty()) prune(dir, keep_last);
  }
  raise_if_any(topo.world_comm(), error);
}

}  // namespace

std::string checkpoint_file_name(std::int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld.h5", static_cast<long long>(iteration));
  return buf;
}

void save_checkpoint(const std::string& save_dir, const Topology& topo,
                     const std::vector<CheckpointTensor>& tensors, const TrainState& state_in,
                     int keep_last, const CheckpointOptions& options) {
  h5::silence_errors();
  MPI_Comm world = topo.world_comm();
  const TrainState state = broadcast_state(world, state_in);
  SavePlan plan;
  plan.kinds = {TensorKind::Value};
  if (agree_on_optimizer_state(world, tensors))
    plan.kinds = {kAllKinds.begin(), kAllKinds.end()};
  plan.local = index_by_name(tensors);
  plan.chunk_elements = options.chunk_elements;
  plan.globals = gather_global_tensors(topo, tensors);
  prepare_directory(world, save_dir);

  const std::string name = checkpoint_file_name(state.iteration);
  const std::string tmp = save_dir + "/.tmp_" + name;
  write_file(tmp, topo, plan, state);
  verify_file(tmp, topo, plan);
  publish(topo, save_dir, tmp, name, keep_last);
}

bool find_latest(const std::string& save_dir, std::string& path) {
  std::ifstream in(save_dir + "/latest");
  std::string name;
  if (!in || !std::getline(in, name)) return false;
  const auto end = name.find_last_not_of(" \t\r\n");
  name.erase(end == std::string::npos ? 0 : end + 1);
  if (name.empty()) return false;
  path = save_dir + "/" + name;
  return true;
}

}  // namespace meshtron::io
