// Small HDF5 helpers for the checkpoint code: owning handles, error text,
// attributes, byte blobs and checksummed datasets. Internal to src/io.
//
// HDF5's automatic error printing is switched off (silence_errors); a failed
// call returns a negative value and last_error() turns HDF5's error stack
// into one line for our own messages.
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.hpp"

namespace meshtron::io::h5 {

/// Turn off HDF5's printing of its error stack (idempotent, per thread).
void silence_errors();
/// The innermost (originating) message of HDF5's error stack, or "" if the
/// stack is empty; clears the stack.
std::string last_error();

/// An HDF5 identifier with its close function. Owned; move-only.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  /// Close now; returns HDF5's status (0 when there was nothing to close).
  herr_t reset() {
    herr_t status = 0;
    if (id_ >= 0 && close_) status = close_(id_);
    id_ = -1;
    return status;
  }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

inline Handle file(hid_t id) { return Handle(id, H5Fclose); }
inline Handle group(hid_t id) { return Handle(id, H5Gclose); }
inline Handle dataset(hid_t id) { return Handle(id, H5Dclose); }
inline Handle space(hid_t id) { return Handle(id, H5Sclose); }
inline Handle plist(hid_t id) { return Handle(id, H5Pclose); }
inline Handle attribute(hid_t id) { return Handle(id, H5Aclose); }
inline Handle type(hid_t id) { return Handle(id, H5Tclose); }

/// File access: MPI-IO over `comm`, or the default serial driver when comm
/// is MPI_COMM_NULL.
Handle file_access(MPI_Comm comm);
/// Dataset transfer property list: collective or independent MPI-IO.
Handle transfer(bool collective);

/// Group `name` under `parent`, created (collective in parallel files).
Handle create_group(hid_t parent, const char* name);

/// Scalar attributes (collective to write in parallel files: every rank
/// must pass the same value). read_* return false when absent or unreadable.
void write_attribute(hid_t obj, const char* name, std::int64_t value);
void write_attribute(hid_t obj, const char* name, std::uint64_t value);
void write_attribute(hid_t obj, const char* name, double value);
bool read_attribute(hid_t obj, const char* name, std::int64_t& value);
bool read_attribute(hid_t obj, const char* name, std::uint64_t& value);
bool read_attribute(hid_t obj, const char* name, double& value);

/// Dataset of `dtype_id` in chunks of `chunk` with the Fletcher32 checksum
/// filter (collective in parallel files).
Handle create_checksummed(hid_t parent, const std::string& name, hid_t dtype_id,
                          const Shape& shape, const std::vector<hsize_t>& chunk);

/// A byte string as a checksummed uint8 dataset. Collective: every rank
/// passes the same size; only ranks with `writer` set write the bytes.
/// Returns false (with last_error() set) when HDF5 failed.
bool write_bytes(hid_t parent, const char* name, const std::string& bytes, bool writer);
/// Read a dataset written by write_bytes; false (with `error`) on failure.
bool read_bytes(hid_t parent, const char* name, std::string& bytes, std::string& error);

/// Current extent of a dataset.
Shape dataset_shape(hid_t dset);
/// "fp32", "fp64", "int32", "uint8", ... for a dataset's stored type.
std::string dataset_type_name(hid_t dset);

}  // namespace meshtron::io::h5
