#include "io/checkpoint_hdf5.hpp"

#include <algorithm>
#include <cstdint>

#include "common/error.hpp"

namespace meshtron::io::h5 {

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {

herr_t take_innermost(unsigned depth, const H5E_error2_t* e, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (depth == 0 && e->desc) *text = e->desc;
  return 0;
}

}  // namespace

std::string last_error() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "unknown HDF5 error" : text;
}

Handle file_access(MPI_Comm comm) {
  Handle fapl = plist(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)));
  if (comm != MPI_COMM_NULL) H5_CHECK(H5Pset_fapl_mpio(fapl.id(), comm, MPI_INFO_NULL));
  return fapl;
}

Handle transfer(bool collective) {
  Handle dxpl = plist(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)));
  H5_CHECK(H5Pset_dxpl_mpio(dxpl.id(), collective ? H5FD_MPIO_COLLECTIVE
                                                  : H5FD_MPIO_INDEPENDENT));
  return dxpl;
}

Handle create_group(hid_t parent, const char* name) {
  return group(H5_CHECK(H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
}

namespace {

void write_scalar(hid_t obj, const char* name, hid_t type_id, const void* value) {
  Handle sp = space(H5_CHECK(H5Screate(H5S_SCALAR)));
  Handle a = attribute(H5_CHECK(H5Acreate2(obj, name, type_id, sp.id(), H5P_DEFAULT, H5P_DEFAULT)));
  H5_CHECK(H5Awrite(a.id(), type_id, value));
}

bool read_scalar(hid_t obj, const char* name, hid_t mem_type, void* value) {
  if (H5Aexists(obj, name) <= 0) return false;
  Handle a = attribute(H5Aopen(obj, name, H5P_DEFAULT));
  return a.valid() && H5Aread(a.id(), mem_type, value) >= 0;
}

}  // namespace

void write_attribute(hid_t obj, const char* name, std::int64_t v) {
  write_scalar(obj, name, H5T_NATIVE_INT64, &v);
}
void write_attribute(hid_t obj, const char* name, std::uint64_t v) {
  write_scalar(obj, name, H5T_NATIVE_UINT64, &v);
}
void write_attribute(hid_t obj, const char* name, double v) {
  write_scalar(obj, name, H5T_NATIVE_DOUBLE, &v);
}
bool read_attribute(hid_t obj, const char* name, std::int64_t& v) {
  return read_scalar(obj, name, H5T_NATIVE_INT64, &v);
}
bool read_attribute(hid_t obj, const char* name, std::uint64_t& v) {
  return read_scalar(obj, name, H5T_NATIVE_UINT64, &v);
}
bool read_attribute(hid_t obj, const char* name, double& v) {
  return read_scalar(obj, name, H5T_NATIVE_DOUBLE, &v);
}

Handle create_checksummed(hid_t parent, const std::string& name, hid_t dtype_id,
                          const Shape& shape, const std::vector<hsize_t>& chunk) {
  MESH_VERIFY(!shape.empty() && shape_numel(shape) > 0,
              "checkpoint tensor '" << name << "' has empty shape " << shape_string(shape));
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle sp = space(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)));
  Handle dcpl = plist(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  MESH_VERIFY(chunk.size() == dims.size(), "chunk rank differs for '" << name << "'");
  H5_CHECK(H5Pset_chunk(dcpl.id(), int(chunk.size()), chunk.data()));
  H5_CHECK(H5Pset_fletcher32(dcpl.id()));
  // Every element is written by some rank: skip writing fill values first.
  H5_CHECK(H5Pset_fill_time(dcpl.id(), H5D_FILL_TIME_NEVER));
  return dataset(H5_CHECK(H5Dcreate2(parent, name.c_str(), dtype_id, sp.id(), H5P_DEFAULT,
                                     dcpl.id(), H5P_DEFAULT)));
}

bool write_bytes(hid_t parent, const char* name, const std::string& bytes, bool writer) {
  // Unlimited max extent, so that an empty string still has a legal chunk.
  const hsize_t n = bytes.size(), unlimited = H5S_UNLIMITED;
  const hsize_t chunk = std::clamp<hsize_t>(n, 1, hsize_t(1) << 20);
  Handle sp = space(H5_CHECK(H5Screate_simple(1, &n, &unlimited)));
  Handle dcpl = plist(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)));
  H5_CHECK(H5Pset_chunk(dcpl.id(), 1, &chunk));
  H5_CHECK(H5Pset_fletcher32(dcpl.id()));
  Handle d = dataset(H5_CHECK(H5Dcreate2(parent, name, H5T_NATIVE_UINT8, sp.id(), H5P_DEFAULT,
                                         dcpl.id(), H5P_DEFAULT)));
  if (n == 0) return true;
  Handle file_sp = space(H5_CHECK(H5Dget_space(d.id())));
  const hsize_t mem_n = writer ? n : 1;
  Handle mem_sp = space(H5_CHECK(H5Screate_simple(1, &mem_n, nullptr)));
  if (!writer) {
    H5_CHECK(H5Sselect_none(file_sp.id()));
    H5_CHECK(H5Sselect_none(mem_sp.id()));
  }
  const std::uint8_t dummy = 0;
  const void* buf = writer ? static_cast<const void*>(bytes.data()) : &dummy;
  Handle dxpl = transfer(/*collective=*/true);
  return H5Dwrite(d.id(), H5T_NATIVE_UINT8, mem_sp.id(), file_sp.id(), dxpl.id(), buf) >= 0;
}

bool read_bytes(hid_t parent, const char* name, std::string& bytes, std::string& error) {
  if (H5Lexists(parent, name, H5P_DEFAULT) <= 0) {
    error = std::string("dataset '") + name + "' is missing";
    return false;
  }
  Handle d = dataset(H5Dopen2(parent, name, H5P_DEFAULT));
  if (!d.valid()) {
    error = std::string("cannot open '") + name + "': " + last_error();
    return false;
  }
  const Shape shape = dataset_shape(d.id());
  bytes.assign(shape.empty() ? 0 : std::size_t(shape[0]), '\0');
  if (bytes.empty()) return true;
  if (H5Dread(d.id(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) < 0) {
    error = std::string("reading '") + name + "' failed: " + last_error();
    return false;
  }
  return true;
}

Shape dataset_shape(hid_t dset) {
  Handle sp = space(H5_CHECK(H5Dget_space(dset)));
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(sp.id()));
  std::vector<hsize_t> dims(rank);
  H5_CHECK(H5Sget_simple_extent_dims(sp.id(), dims.data(), nullptr));
  return Shape(dims.begin(), dims.end());
}

std::string dataset_type_name(hid_t dset) {
  Handle t = type(H5_CHECK(H5Dget_type(dset)));
  const std::size_t bits = 8 * H5Tget_size(t.id());
  switch (H5Tget_class(t.id())) {
    case H5T_FLOAT: return "fp" + std::to_string(bits);
    case H5T_INTEGER:
      return (H5Tget_sign(t.id()) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    default: return "other";
  }
}

}  // namespace meshtron::io::h5
