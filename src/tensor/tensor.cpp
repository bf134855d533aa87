#include "tensor/tensor.hpp"

#include <atomic>
#include <cstdlib>
#include <sstream>

#include "tensor/device_allocator.hpp"

namespace meshtron {

index_t shape_numel(const Shape& shape) {
  index_t n = 1;
  for (index_t d : shape) n *= d;
  return n;
}

std::string shape_string(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

namespace {
/// Bytes of live host tensors (rounded as allocated) and their peak: the
/// host's counterpart of the device allocator's stats, which the process's
/// resident set cannot give (it holds the binary, MPI and the libraries).
std::atomic<std::size_t> host_current_bytes{0};
std::atomic<std::size_t> host_peak_bytes{0};

void count_host_allocation(std::size_t bytes) {
  const std::size_t now = host_current_bytes.fetch_add(bytes) + bytes;
  std::size_t peak = host_peak_bytes.load();
  while (now > peak && !host_peak_bytes.compare_exchange_weak(peak, now)) {
  }
}

/// Host memory: 64-byte alignment for cache lines and AVX-512 loads in the
/// host kernels. Device memory: the caching allocator (device_allocator.hpp).
std::shared_ptr<void> allocate(std::size_t bytes, MemorySpace space) {
  if (space == MemorySpace::Cuda) return {device::allocate(bytes), device::deallocate};
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  const std::size_t held = rounded == 0 ? 64 : rounded;
  void* p = std::aligned_alloc(64, held);
  MESH_VERIFY(p != nullptr, "out of host memory allocating " << bytes << " bytes");
  count_host_allocation(held);
  return {p, [held](void* q) {
            host_current_bytes.fetch_sub(held);
            std::free(q);
          }};
}
}  // namespace

HostTensorStats host_tensor_stats() { return {host_current_bytes.load(), host_peak_bytes.load()}; }

Tensor Tensor::empty(Shape shape, DType dtype, MemorySpace space) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.space_ = space;
  t.storage_ = allocate(t.bytes(), space);
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, MemorySpace space) {
  Tensor t = empty(std::move(shape), dtype, space);
  t.fill(0.0);
  return t;
}

Tensor Tensor::view(void* data, Shape shape, DType dtype, MemorySpace space) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.space_ = space;
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  MESH_VERIFY(shape_numel(shape) == numel(), "cannot reshape " << shape_string(shape_)
                                             << " to " << shape_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(index_t begin, index_t end) const {
  MESH_VERIFY(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
              "slice_rows(" << begin << ", " << end << ") of " << shape_string(shape_));
  Tensor t = *this;
  const index_t row = numel() / (shape_[0] == 0 ? 1 : shape_[0]);
  t.data_ = static_cast<char*>(data_) + std::size_t(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

double element_as_double(const Tensor& t, index_t i) {
  const void* p = t.raw();
  switch (t.dtype()) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::BF16: return float(static_cast<const bf16*>(p)[i]);
    case DType::F16: return float(static_cast<const fp16*>(p)[i]);
    case DType::I32: return static_cast<const std::int32_t*>(p)[i];
    case DType::I64: return double(static_cast<const std::int64_t*>(p)[i]);
    case DType::U16: return static_cast<const std::uint16_t*>(p)[i];
    case DType::U8: return static_cast<const std::uint8_t*>(p)[i];
  }
  return 0;
}

void set_element_from_double(Tensor& t, index_t i, double v) {
  void* p = t.raw();
  switch (t.dtype()) {
    case DType::F32: static_cast<float*>(p)[i] = float(v); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::BF16: static_cast<bf16*>(p)[i] = bf16(float(v)); break;
    case DType::F16: static_cast<fp16*>(p)[i] = fp16(float(v)); break;
    case DType::I32: static_cast<std::int32_t*>(p)[i] = std::int32_t(v); break;
    case DType::I64: static_cast<std::int64_t*>(p)[i] = std::int64_t(v); break;
    case DType::U16: static_cast<std::uint16_t*>(p)[i] = std::uint16_t(v); break;
    case DType::U8: static_cast<std::uint8_t*>(p)[i] = std::uint8_t(v); break;
  }
}

void Tensor::fill(double value) {
  if (value == 0.0) {  // all-zero bits are 0 in every dtype (zeroing gradients)
    if (is_host())
      std::memset(data_, 0, bytes());
    else
      device::zero_bytes(data_, bytes());
    return;
  }
  if (!is_host()) {
    Tensor staged = empty(shape_, dtype_);
    staged.fill(value);
    copy_from(staged);
    return;
  }
  for (index_t i = 0; i < numel(); ++i) set_element_from_double(*this, i, value);
}

std::vector<double> Tensor::to_doubles() const {
  if (!is_host()) return to_host().to_doubles();
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (index_t i = 0; i < numel(); ++i) out[std::size_t(i)] = element_as_double(*this, i);
  return out;
}

std::vector<double> Tensor::to_doubles_at(device::StreamMark& mark) const {
  if (is_host()) return to_doubles();
  Tensor staged = Tensor::empty(shape_, dtype_, MemorySpace::Host);
  mark.copy_to_host(staged.raw(), raw(), staged.bytes());
  return staged.to_doubles();
}

void Tensor::copy_from(const Tensor& src) {
  MESH_VERIFY(src.numel() == numel(), "copy_from: " << shape_string(src.shape())
                                      << " into " << shape_string(shape_));
  if (src.dtype() == dtype_) {
    if (is_host() && src.is_host())
      std::memcpy(data_, src.raw(), bytes());
    else if (!is_host() && !src.is_host())  // queued: the host need not wait
      device::copy_device_bytes(data_, src.raw(), bytes());
    else
      device::copy_bytes(data_, src.raw(), bytes());
    return;
  }
  if (!src.is_host()) {  // convert on the host: stage the source there first
    copy_from(src.to_host());
    return;
  }
  if (!is_host()) {  // convert into a host staging tensor, then upload it
    Tensor staged = empty(shape_, dtype_);
    staged.copy_from(src);
    copy_from(staged);
    return;
  }
  for (index_t i = 0; i < numel(); ++i)
    set_element_from_double(*this, i, element_as_double(src, i));
}

Tensor Tensor::to(DType dtype) const {
  Tensor out = empty(shape_, dtype, space_);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to_space(MemorySpace space) const {
  Tensor out = empty(shape_, dtype_, space);
  out.copy_from(*this);
  return out;
}

}  // namespace meshtron
