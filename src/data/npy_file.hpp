// Minimal NumPy .npy (format 1.0) files for little-endian integer arrays.
//
// The GPT sample builder caches its index arrays as .npy so that they can be
// inspected with numpy.load and carry Megatron-LM's dtypes (int32 doc_idx,
// int32 sample_idx pairs, uint32 shuffle_idx). Only C-order arrays of
// int32, uint32 and int64 are supported.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshtron::data {

template <class T>
struct NpyArray {
  std::vector<std::int64_t> shape;
  std::vector<T> values;  ///< Row-major, product(shape) elements.
};

/// Writes `values` with `shape` to `path` atomically (temporary file, then
/// rename), so a concurrent reader sees the old file or the whole new one.
/// Throws UserError if the file cannot be written.
template <class T>
void write_npy(const std::string& path, const std::vector<T>& values,
               const std::vector<std::int64_t>& shape);

/// Reads `path` if it exists and is a well-formed .npy of element type T;
/// std::nullopt otherwise (missing, truncated, other dtype, Fortran order).
template <class T>
std::optional<NpyArray<T>> read_npy(const std::string& path);

}  // namespace meshtron::data
