// Tensor: a typed, shaped block of memory in one memory space.
//
// A Tensor either owns its buffer (shared, reference-counted: copies of a
// Tensor alias the same memory, as torch.Tensor does) or is a non-owning
// view of memory that someone else keeps alive. Row-major, contiguous.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "tensor/types.hpp"

namespace meshtron {
namespace device {
class StreamMark;  // device_allocator.hpp
}

using Shape = std::vector<index_t>;

index_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  /// Owning, uninitialised.
  static Tensor empty(Shape shape, DType dtype = DType::F32,
                      MemorySpace space = MemorySpace::Host);
  /// Owning, zero-filled.
  static Tensor zeros(Shape shape, DType dtype = DType::F32,
                      MemorySpace space = MemorySpace::Host);
  /// Non-owning view of `data` (not owned; must outlive every use).
  static Tensor view(void* data, Shape shape, DType dtype,
                     MemorySpace space = MemorySpace::Host);

  bool defined() const { return data_ != nullptr; }
  const Shape& shape() const { return shape_; }
  index_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int rank() const { return int(shape_.size()); }
  index_t numel() const { return shape_numel(shape_); }
  std::size_t bytes() const { return std::size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  MemorySpace space() const { return space_; }
  bool is_host() const { return space_ == MemorySpace::Host; }

  void* raw() const { return data_; }
  template <class T>
  T* data() const {
    MESH_VERIFY(dtype_v<T> == dtype_, "tensor holds " << dtype_name(dtype_)
                                      << ", accessed as " << dtype_name(dtype_v<T>));
    return static_cast<T*>(data_);
  }

  /// Same memory, another shape with the same element count.
  Tensor reshape(Shape shape) const;
  /// Rows [begin, end) along dimension 0, sharing memory.
  Tensor slice_rows(index_t begin, index_t end) const;

  // The helpers below work in either space. On a device tensor they go
  // through a host staging copy where a conversion is needed (they are for
  // setup, tests and checkpoints, not for the training step's hot path);
  // same-dtype copies and zero fills stay on the device.

  /// Set every element to `value` (converted to the dtype).
  void fill(double value);
  /// Copy of the elements as doubles (for tests and checks).
  std::vector<double> to_doubles() const;
  /// to_doubles() of values written before `mark` was recorded: a device
  /// tensor's copy waits for that point of the compute stream only, not for
  /// the work queued after it (a host tensor is read at once).
  std::vector<double> to_doubles_at(device::StreamMark& mark) const;
  /// Deep copy into a new owning tensor of `dtype`, in the same space.
  Tensor to(DType dtype) const;
  Tensor clone() const { return to(dtype_); }
  /// Deep copy into a new owning tensor of the same dtype in `space`.
  Tensor to_space(MemorySpace space) const;
  Tensor to_host() const { return to_space(MemorySpace::Host); }
  Tensor to_device() const { return to_space(MemorySpace::Cuda); }
  /// Copy elements (converting dtype, across spaces) from `src` of equal numel.
  void copy_from(const Tensor& src);

 private:
  std::shared_ptr<void> storage_;  ///< Owned buffer, or null for a view.
  void* data_ = nullptr;           ///< Not owned when storage_ is null.
  Shape shape_;
  DType dtype_ = DType::F32;
  MemorySpace space_ = MemorySpace::Host;
};

/// Bytes of the host tensors' buffers (Tensor::empty in MemorySpace::Host,
/// 64-byte rounded), as device::allocator_stats() counts the device's.
struct HostTensorStats {
  std::size_t current_bytes = 0;  ///< allocated and not yet freed
  std::size_t peak_bytes = 0;     ///< highest current_bytes so far
};
HostTensorStats host_tensor_stats();

/// Element i of a host tensor of any floating dtype, as double.
double element_as_double(const Tensor& t, index_t i);
void set_element_from_double(Tensor& t, index_t i, double v);

}  // namespace meshtron
