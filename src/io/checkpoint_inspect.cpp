// inspect_checkpoint: serial read of a checkpoint's metadata and of every
// dataset in full, so that each chunk passes through its Fletcher32 check.
#include <algorithm>
#include <filesystem>
#include <set>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_format.hpp"

namespace meshtron::io {

namespace {

/// Elements read per H5Dread: bounds memory for the largest tensors.
constexpr index_t kReadBlockElements = index_t(1) << 23;

std::vector<std::string> sorted_members(hid_t group) {
  std::vector<std::string> names;
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0) return names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[1024];
    if (H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name,
                           H5P_DEFAULT) >= 0)
      names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// Read all of `dset` in blocks of leading-dimension rows; "" or the reason.
std::string read_everything(hid_t dset, const Shape& shape) {
  if (shape.empty() || shape_numel(shape) == 0) return "";
  const index_t row = shape_numel(shape) / shape[0];
  const index_t rows_per_block = std::max<index_t>(1, kReadBlockElements / std::max<index_t>(row, 1));
  std::vector<float> buffer(std::size_t(std::min(shape[0], rows_per_block) * row));
  h5::Handle file_space = h5::space(H5_CHECK(H5Dget_space(dset)));
  std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
  for (index_t r = 0; r < shape[0]; r += rows_per_block) {
    start[0] = hsize_t(r);
    count[0] = hsize_t(std::min(rows_per_block, shape[0] - r));
    H5_CHECK(H5Sselect_hyperslab(file_space.id(), H5S_SELECT_SET, start.data(), nullptr,
                                 count.data(), nullptr));
    const hsize_t n = count[0] * hsize_t(row);
    h5::Handle mem_space = h5::space(H5_CHECK(H5Screate_simple(1, &n, nullptr)));
    if (H5Dread(dset, H5T_NATIVE_FLOAT, mem_space.id(), file_space.id(), H5P_DEFAULT,
                buffer.data()) < 0)
      return MESH_MSG("rows [" << r << ", " << r + index_t(count[0])
                               << "): " << h5::last_error());
  }
  return "";
}

CheckpointTensorInfo inspect_dataset(hid_t group, const std::string& group_name,
                                     const std::string& name) {
  CheckpointTensorInfo t;
  t.path = group_name + "/" + name;
  h5::Handle d = h5::dataset(H5Dopen2(group, name.c_str(), H5P_DEFAULT));
  if (!d.valid()) {
    t.error = "cannot open: " + h5::last_error();
    return t;
  }
  t.shape = h5::dataset_shape(d.id());
  t.dtype = h5::dataset_type_name(d.id());
  t.error = read_everything(d.id(), t.shape);
  t.checksum_ok = t.error.empty();
  return t;
}

/// Entries that a damaged group lost: the model's names absent from a
/// moment's group, or a count short of the one the writer recorded.
void report_missing(CheckpointInfo& info, const std::string& group_name,
                    const std::vector<std::string>& names,
                    const std::vector<std::string>& model_names, std::int64_t expected_count) {
  for (const std::string& name : model_names)
    if (!std::binary_search(names.begin(), names.end(), name))
      info.tensors.push_back({group_name + "/" + name, "?", {}, false, "missing"});
  const std::int64_t present = std::int64_t(std::max(names.size(), model_names.size()));
  if (expected_count >= 0 && present < expected_count)
    info.tensors.push_back({group_name + "/", "?", {}, false,
                            MESH_MSG("the group lists " << present << " tensors, the file was "
                                                        "written with " << expected_count)});
}

}  // namespace

bool CheckpointInfo::checksums_ok() const {
  return std::all_of(tensors.begin(), tensors.end(),
                     [](const CheckpointTensorInfo& t) { return t.checksum_ok; });
}

CheckpointInfo inspect_checkpoint(const std::string& path) {
  h5::silence_errors();
  MESH_REQUIRE(std::filesystem::is_regular_file(path),
               "checkpoint file '" << path << "' does not exist");
  h5::Handle f = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  MESH_REQUIRE(f.valid(), "cannot open checkpoint '" << path
                                                     << "' (truncated or not an HDF5 file?): "
                                                     << h5::last_error());
  const std::string format_error = check_format(f.id(), path);
  MESH_REQUIRE(format_error.empty(), format_error);

  CheckpointInfo info;
  info.path = path;
  info.format_version = kCheckpointFormatVersion;
  WriterTopology writer;
  const std::string metadata_error =
      read_metadata(f.id(), path, info.state, writer, info.has_optimizer_state);
  MESH_REQUIRE(metadata_error.empty(), metadata_error);
  info.tp = writer.tp;
  info.pp = writer.pp;
  info.dp = writer.dp;
  info.world = writer.world;

  std::int64_t expected_count = -1;  // unknown in files written without the count
  h5::read_attribute(f.id(), kTensorCountAttribute, expected_count);
  std::vector<std::string> model_names;
  for (TensorKind kind : kAllKinds) {
    if (kind != TensorKind::Value && !info.has_optimizer_state) break;
    h5::Handle group = h5::group(H5Gopen2(f.id(), kind_group(kind), H5P_DEFAULT));
    MESH_REQUIRE(group.valid(), "checkpoint '" << path << "' has no group /" << kind_group(kind));
    const std::vector<std::string> names = sorted_members(group.id());
    for (const std::string& name : names)
      info.tensors.push_back(inspect_dataset(group.id(), kind_group(kind), name));
    if (kind == TensorKind::Value) model_names = names;
    report_missing(info, kind_group(kind), names, model_names, expected_count);
  }
  return info;
}

}  // namespace meshtron::io
