// Saving a checkpoint (loading: checkpoint_load.cpp, inspecting:
// checkpoint_inspect.cpp). Steps of save_checkpoint, all collective:
//   1. agree on the train state (rank 0's), the optimizer-state flag and the
//      union of tensors over the world; refuse a model that is not finite
//      and a file system without room for the file (nothing written yet);
//   2. write save_dir/.tmp_iter_N.h5: metadata, then every tensor kind and
//      name in sorted order, each rank writing only its hyperslab; flush it
//      to stable storage (H5Fflush, then fsync on every rank);
//   3. reopen and verify: every dataset present with its shape, each rank's
//      shard read back through the Fletcher32 filter equals what it wrote;
//   4. rank 0 renames to iter_N.h5, replaces `latest`, syncs the folder and
//      prunes checkpoints older than the one it has just published.
#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
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

/// "" when every value this rank would save is finite, else a one-line
/// reason naming the first parameter that is not: a diverged model is never
/// published, so keep_last never prunes the good checkpoints for it.
/// Padded vocabulary rows are not saved and not checked.
std::string check_finite(const std::vector<CheckpointTensor>& tensors, const Topology& topo,
                         std::int64_t iteration) {
  for (const CheckpointTensor& t : tensors) {
    const Tensor values = host_f32(t.master ? *t.master : t.param->value);
    const float* v = values.data<float>();
    const index_t n = shard_selection(*t.param, topo.tp_rank(), topo.tp()).real_elements;
    for (index_t i = 0; i < n; ++i)
      if (!std::isfinite(v[i]))
        return MESH_MSG("refusing to save " << checkpoint_file_name(iteration) << ": parameter '"
                                            << t.param->name << "' holds " << v[i]
                                            << " (the model diverged); earlier checkpoints are kept");
  }
  return "";
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

/// An upper estimate of the file's size: every tensor in fp32 per kind, one
/// Fletcher32 word per chunk, the byte blobs, and HDF5's object headers and
/// chunk indices: kMetadataBytesPerDataset is above the ~2.8 KiB a dataset
/// costs in tests/train/tiny.deck's checkpoint ((file size - data bytes) /
/// datasets), and the fixed part covers the superblock and groups.
std::uint64_t estimated_file_bytes(const SavePlan& plan, const TrainState& state) {
  constexpr std::uint64_t kMetadataBytesPerDataset = 4096, kFixedBytes = 64 << 10;
  std::uint64_t bytes = kFixedBytes + state.deck_text.size() + state.data_sampler_state.size();
  for (const GlobalTensor& g : plan.globals) {
    const std::uint64_t n = std::uint64_t(shape_numel(g.shape));
    const std::uint64_t chunks = n / std::uint64_t(plan.chunk_elements) + 1;
    bytes += plan.kinds.size() * (4 * n + 4 * chunks + kMetadataBytesPerDataset);
  }
  return bytes;
}

/// Rank 0 checks that `dir`'s file system has room for the file before any
/// rank writes: a full disk is reported in one line and leaves nothing behind.
void check_free_space(MPI_Comm comm, const std::string& dir, const std::string& name,
                      std::uint64_t needed) {
  std::string error;
  struct statvfs fs_stat;
  if (comm_rank(comm) == 0 && statvfs(dir.c_str(), &fs_stat) == 0) {
    const std::uint64_t free_bytes = std::uint64_t(fs_stat.f_bavail) * fs_stat.f_frsize;
    if (free_bytes < needed)
      error = MESH_MSG("no space for checkpoint " << dir << "/" << name << ": it needs about "
                                                  << (needed >> 20) << " MiB, the file system has "
                                                  << (free_bytes >> 20)
                                                  << " MiB free; earlier checkpoints are kept");
  }
  raise_if_any(comm, error);
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

/// fsync `path` (a file or a folder): each rank flushes what its node's page
/// cache still holds of it. "" or the reason.
std::string sync_to_disk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return "cannot open '" + path + "' to sync it: " + std::strerror(errno);
  const bool ok = ::fsync(fd) == 0;
  const std::string reason = ok ? "" : "cannot sync '" + path + "': " + std::strerror(errno);
  ::close(fd);
  return reason;
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
  // inspect compares each group with this count: a damaged group may lose
  // whole links and still read back clean.
  h5::write_attribute(f.id(), kTensorCountAttribute, std::int64_t(plan.globals.size()));
  write_tensors(f.id(), topo, plan);
  const bool flushed = H5Fflush(f.id(), H5F_SCOPE_GLOBAL) >= 0;
  const bool closed = f.reset() >= 0;
  raise_if_any(world, flushed && closed ? "" : "closing checkpoint file '" + tmp + "' failed: " +
                                                   h5::last_error());
  raise_if_any(world, sync_to_disk(tmp));
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

/// Keep the newest keep_last checkpoints up to and including `published`
/// (iter_*.h5 older than it beyond that are deleted) and delete leftovers of
/// interrupted saves (.tmp_iter_*.h5). Files newer than `published` (another
/// run's, in a reused folder) are never touched: a save never deletes or
/// shadows work newer than itself.
void prune(const std::string& dir, int keep_last, std::int64_t published) {
  static const std::regex checkpoint(R"(iter_(\d+)\.h5)"), leftover(R"(\.tmp_iter_\d+\.h5)");
  std::vector<std::pair<std::int64_t, fs::path>> older;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, checkpoint)) {
      if (std::stoll(m[1]) < published) older.emplace_back(std::stoll(m[1]), entry.path());
    } else if (std::regex_match(name, leftover)) {
      fs::remove(entry.path(), ec);
    }
  }
  const std::size_t keep_older = keep_last > 0 ? std::size_t(keep_last - 1) : older.size();
  if (older.size() <= keep_older) return;
  std::sort(older.begin(), older.end());
  for (std::size_t i = 0; i + keep_older < older.size(); ++i) fs::remove(older[i].second, ec);
}

/// Rank 0 moves the verified file into place, then updates `latest`.
void publish(const Topology& topo, const std::string& dir, const std::string& tmp,
             std::int64_t iteration, int keep_last) {
  const std::string name = checkpoint_file_name(iteration);
  MPI_CHECK(MPI_Barrier(topo.world_comm()));
  std::string error;
  if (topo.world_rank() == 0) {
    std::error_code ec;
    fs::rename(tmp, dir + "/" + name, ec);
    if (ec) error = "cannot rename '" + tmp + "' into place: " + ec.message();
    if (error.empty()) error = replace_file_atomically(dir + "/latest", name + "\n");
    if (error.empty()) error = sync_to_disk(dir);  // the renames themselves
    if (error.empty()) prune(dir, keep_last, iteration);
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
  raise_if_any(world, check_finite(tensors, topo, state.iteration));
  prepare_directory(world, save_dir);

  const std::string name = checkpoint_file_name(state.iteration);
  check_free_space(world, save_dir, name, estimated_file_bytes(plan, state));
  const std::string tmp = save_dir + "/.tmp_" + name;
  write_file(tmp, topo, plan, state);
  verify_file(tmp, topo, plan);
  publish(topo, save_dir, tmp, state.iteration, keep_last);
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
