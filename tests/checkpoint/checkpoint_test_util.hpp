// Helpers of the checkpoint tests: shared temporary folders, saving and
// loading the fake model under a decomposition, collective error capture,
// an independent serial reader of the file, and damaged copies of a file.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "parallel/topology.hpp"
#include "tests/checkpoint/fake_model.hpp"

namespace meshtron::testing_ckpt {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline void broadcast(std::string& s, MPI_Comm comm = MPI_COMM_WORLD) {
  int n = int(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, comm);
  s.resize(std::size_t(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, comm);
}

/// A new folder (made by rank 0) whose name every rank gets.
inline std::string shared_temp_dir() {
  std::string dir;
  if (world_rank() == 0) {
    char pattern[] = "/tmp/meshtron_ckpt_XXXXXX";
    dir = mkdtemp(pattern);
  }
  broadcast(dir);
  return dir;
}
inline void remove_shared_dir(const std::string& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

/// The writing layout: tp=2 pp=2 dp=2 on 8 ranks, smaller factors otherwise.
inline ParallelDegrees save_layout(int world) {
  const int tp = world % 2 == 0 ? 2 : 1;
  const int pp = (world / tp) % 2 == 0 ? 2 : 1;
  return {tp, pp, world / (tp * pp)};
}

inline std::vector<ParallelDegrees> factorisations(int world) {
  std::vector<ParallelDegrees> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; tp * pp <= world; ++pp)
      if (world % (tp * pp) == 0) out.push_back({tp, pp, world / (tp * pp)});
  return out;
}

inline io::TrainState sample_state(std::int64_t iteration) {
  io::TrainState s;
  s.iteration = iteration;
  s.consumed_samples = 64 * iteration;
  s.optimizer_step = iteration - 1;
  s.seed = 0xfedcba9876543210ull;  // needs all 64 bits
  s.loss_scale = 32768.5;
  s.loss_scale_good_steps = 517;
  s.skipped_steps = 3;
  s.deck_text = "[model]\nnum_layers = 4\n# iteration " + std::to_string(iteration) + "\n";
  s.data_sampler_state = std::string("\0\x01\xff sampler", 11);  // binary-safe
  return s;
}

/// Build the fake model under `layout`, fill it from the formula, save it.
inline std::string save_fake(const std::string& dir, const ParallelDegrees& layout,
                             const FakeModelSpec& spec, bool with_optimizer,
                             const io::TrainState& state, int keep_last,
                             const io::CheckpointOptions& options, std::int64_t salt = 0) {
  Topology topo(MPI_COMM_WORLD, layout);
  FakeModel m = make_fake_model(spec, topo.tp_rank(), topo.tp(), topo.pp_rank(), topo.pp());
  fill(m, salt);
  io::save_checkpoint(dir, topo, m.tensors(with_optimizer), state, keep_last, options);
  return dir + "/" + io::checkpoint_file_name(state.iteration);
}

/// Load into a fresh fake model under `layout` over `comm`; expect every
/// element and the train state to match.
inline void expect_loads(const std::string& path, MPI_Comm comm, const ParallelDegrees& layout,
                         const FakeModelSpec& spec, bool with_optimizer,
                         const io::TrainState& want, std::int64_t salt = 0) {
  Topology topo(comm, layout);
  FakeModel m = make_fake_model(spec, topo.tp_rank(), topo.tp(), topo.pp_rank(), topo.pp());
  clear(m);
  io::TrainState got;
  io::load_checkpoint(path, topo, m.tensors(with_optimizer), got, with_optimizer);
  std::string first;
  EXPECT_EQ(count_mismatches(m, with_optimizer, &first, salt), 0) << first;
  EXPECT_EQ(got, want);
}

/// Load into a fake model of `spec` under the saving layout (errors expected).
inline void load_fake(const std::string& path, const FakeModelSpec& spec, bool with_optimizer) {
  Topology topo(MPI_COMM_WORLD, save_layout(world_size()));
  FakeModel m = make_fake_model(spec, topo.tp_rank(), topo.tp(), topo.pp_rank(), topo.pp());
  io::TrainState state;
  io::load_checkpoint(path, topo, m.tensors(with_optimizer), state, with_optimizer);
}

/// The UserError message `fn` raises; expects every rank to raise the same
/// one-line message.
template <class F>
std::string collective_error(F&& fn) {
  std::string msg;
  try {
    fn();
  } catch (const UserError& e) {
    msg = e.what();
  }
  std::string root = msg;
  broadcast(root);
  EXPECT_FALSE(msg.empty()) << "no UserError on rank " << world_rank();
  EXPECT_EQ(msg, root) << "rank " << world_rank() << " raised another message";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  return msg;
}

inline std::vector<std::string> directory_listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// Reads a checkpoint with plain serial HDF5 calls (no meshtron I/O code).
class SerialFileCheck {
 public:
  explicit SerialFileCheck(const std::string& path)
      : file_(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {
    EXPECT_GE(file_, 0) << path;
  }
  ~SerialFileCheck() { H5Fclose(file_); }

  std::int64_t attribute(const char* object, const char* name) const {
    std::int64_t v = -1;
    hid_t a = H5Aopen_by_name(file_, object, name, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(a, 0) << object << " " << name;
    H5Aread(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    return v;
  }

  void expect_topology(const ParallelDegrees& d, int world) const {
    EXPECT_EQ(attribute("/", "format_version"), 1);
    EXPECT_EQ(attribute("/topology", "tp"), d.tensor_parallel);
    EXPECT_EQ(attribute("/topology", "pp"), d.pipeline_parallel);
    EXPECT_EQ(attribute("/topology", "dp"), d.data_parallel);
    EXPECT_EQ(attribute("/topology", "world"), world);
  }

  /// The group of `kind` holds exactly the model's tensors, each in its
  /// global shape, chunked with Fletcher32, with the formula's values.
  void expect_group_matches(int kind, const FakeModel& whole) const {
    static const char* groups[] = {"/model", "/optimizer/exp_avg", "/optimizer/exp_avg_sq"};
    hid_t g = H5Gopen2(file_, groups[kind], H5P_DEFAULT);
    ASSERT_GE(g, 0) << groups[kind];
    H5G_info_t info;
    H5Gget_info(g, &info);
    EXPECT_EQ(info.nlinks, whole.params.size()) << groups[kind];
    for (const Parameter& p : whole.params) expect_dataset(g, kind, p);
    H5Gclose(g);
  }

 private:
  void expect_dataset(hid_t group, int kind, const Parameter& p) const {
    hid_t d = H5Dopen2(group, p.name.c_str(), H5P_DEFAULT);
    ASSERT_GE(d, 0) << p.name;
    hid_t space = H5Dget_space(d);
    std::vector<hsize_t> dims(std::size_t(H5Sget_simple_extent_ndims(space)));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    EXPECT_EQ(Shape(dims.begin(), dims.end()), p.global_shape) << p.name;
    hid_t dcpl = H5Dget_create_plist(d);
    EXPECT_EQ(H5Pget_layout(dcpl), H5D_CHUNKED) << p.name;
    unsigned flags = 0;
    size_t nelmts = 0;
    char fname[64];
    unsigned filter_config = 0;
    ASSERT_EQ(H5Pget_nfilters(dcpl), 1) << p.name;
    EXPECT_EQ(H5Pget_filter2(dcpl, 0, &flags, &nelmts, nullptr, sizeof fname, fname,
                             &filter_config),
              H5Z_FILTER_FLETCHER32);
    std::vector<float> data(std::size_t(shape_numel(p.global_shape)));
    EXPECT_GE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
    index_t bad = 0;
    for (index_t g = 0; g < index_t(data.size()); ++g)
      bad += data[std::size_t(g)] != expected_value(kind, p.name, g);
    EXPECT_EQ(bad, 0) << groups_name(kind) << p.name;
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Dclose(d);
  }
  static std::string groups_name(int kind) { return "kind " + std::to_string(kind) + " "; }

  hid_t file_;
};

inline void make_truncated_copy(const std::string& from, const std::string& to) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(to, std::filesystem::file_size(to) / 2);
}

/// Copy `from` and flip four bytes in the middle of the first chunk of
/// `dataset` (found through HDF5's chunk index).
inline void make_corrupt_copy(const std::string& from, const std::string& to,
                              const std::string& dataset) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
  hid_t f = H5Fopen(to.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0) << dataset;
  hid_t space = H5Dget_space(d);
  hsize_t offset[8];
  unsigned mask = 0;
  haddr_t addr = 0;
  hsize_t size = 0;
  ASSERT_GE(H5Dget_chunk_info(d, space, 0, offset, &mask, &addr, &size), 0);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
  std::fstream io(to, std::ios::in | std::ios::out | std::ios::binary);
  char bytes[4];
  io.seekg(std::streamoff(addr + size / 2));
  io.read(bytes, 4);
  for (char& b : bytes) b = char(~b);
  io.seekp(std::streamoff(addr + size / 2));
  io.write(bytes, 4);
}

/// Copy `from` with another format_version attribute.
inline void make_version_copy(const std::string& from, const std::string& to,
                              std::int64_t version) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
  hid_t f = H5Fopen(to.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
  ASSERT_GE(a, 0);
  H5Awrite(a, H5T_NATIVE_INT64, &version);
  H5Aclose(a);
  H5Fclose(f);
}

}  // namespace meshtron::testing_ckpt
