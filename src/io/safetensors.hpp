// safetensors: the Hugging Face tensor file format, read and written.
//
// Layout of a file (https://github.com/huggingface/safetensors):
//
//   [8 bytes]  N, unsigned little-endian: length of the JSON header
//   [N bytes]  JSON object, padded with spaces to a multiple of 8:
//                {"__metadata__": {"key": "value", ...},          (optional)
//                 "<name>": {"dtype": "F32", "shape": [d0, d1, ...],
//                            "data_offsets": [begin, end]}, ...}
//   [rest]     the data section; a tensor's bytes lie at [begin, end)
//              relative to its start, row-major, little-endian.
//
// Every malformed file (too short, header length beyond the file, bad JSON,
// offsets outside the data, a byte count that disagrees with shape × dtype,
// a dtype meshtron does not hold) raises UserError with a one-line message
// naming the file and, where there is one, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.hpp"

namespace meshtron::io {

/// One entry of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::uint64_t begin = 0;  ///< byte offset into the data section
  std::uint64_t end = 0;    ///< one past the last byte
};

using SafetensorsMetadata = std::map<std::string, std::string>;

/// safetensors spelling of a dtype ("F32", "BF16", ...).
std::string_view safetensors_dtype_name(DType dtype);

/// An open safetensors file: the header is parsed and checked on
/// construction; tensors are read on demand with pread (no mmap, so a file
/// larger than the address space or on a parallel file system is fine).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// Entries sorted by name.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  /// The entry called `name`; UserError naming the file if absent.
  const SafetensorsEntry& entry(const std::string& name) const;

  /// Owning host tensor holding `name` in the file's dtype.
  Tensor load(const std::string& name) const;
  /// Owning host tensor holding `name` converted to `dtype`.
  Tensor load(const std::string& name, DType dtype) const;
  /// Read `name` into an existing host tensor of the same shape, converting
  /// to its dtype (reads straight into it when the dtypes agree).
  void load_into(const std::string& name, Tensor& dst) const;

 private:
  void read_bytes(const SafetensorsEntry& e, void* dst) const;

  std::string path_;
  int fd_ = -1;  ///< Owned.
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  SafetensorsMetadata metadata_;
};

/// Entries of the file at `path` (sorted by name).
std::vector<SafetensorsEntry> list_safetensors(const std::string& path);

/// Write host tensors to `path` (via a temporary file renamed into place).
/// The header lists names sorted and is padded with spaces to a multiple of
/// 8 bytes, as the reference implementation does; the data section holds
/// the widest dtypes first, then name order, so every tensor is aligned to
/// its element size. Names must be unique, non-empty, not "__metadata__".
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const SafetensorsMetadata& metadata = {});

}  // namespace meshtron::io
