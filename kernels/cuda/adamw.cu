// =================================================================== AdamW ==
//
// torch.optim.AdamW as kernels/kokkos/adamw.hpp, on fp32 master weights,
// fp32 gradients (main_grad) and fp32 moments: the update in double and each
// stored quantity rounded to fp32 once, so the device and host optimisers
// agree to the last bit or two. The bias corrections come precomputed from
// the host (AdamWCoefficients). Memory-bound (16 bytes read, 12 written per
// element): double arithmetic costs nothing measurable here.
//
// Under bf16/fp16 the same pass may also write the compute copy of the
// updated master (2 more bytes per element), rounded as cuda::cast rounds,
// instead of a second kernel that reads the master again.
//
// Two launch shapes, one arithmetic (adamw_update below, shared, so their
// results are bit for bit equal):
//  * adamw_step: one tensor, cut into pieces as below, 16-byte packs in its
//    aligned body (grid-stride);
//  * AdamWTable::step: many tensors in ONE launch (apex's multi_tensor_apply).
//    A table in device memory lists the pieces {param, grad, m, v, copy, n,
//    weight decay}; each block updates one chunk of kChunk elements of one
//    piece, found through a per-block work list. The table is built on the
//    host, compared with the one already on the device and uploaded only
//    when a pointer, size or weight decay changed: the per-step scalars (lr,
//    bias corrections) travel as kernel arguments.
// Gradient clipping may come from a norm still on the device (the global
// sum of squares, after its all-reduce): every block reads it and derives
// the same factor, so the host never waits for the norm inside a step.
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "ops/clip_factor.hpp"
#include "ops/ops_cuda.hpp"
#include "tensor/device_allocator.hpp"

namespace meshtron::cuda {
namespace {

struct AdamWUpdate {
  float param, m, v;
};

/// The update of one element (the expression of kernels/kokkos/adamw.hpp).
__device__ __forceinline__ AdamWUpdate adamw_update(float param, float grad, float m, float v,
                                                    double weight_decay,
                                                    const AdamWCoefficients& k) {
  // The product rounded to fp32 as ops::scale stores it (clipping).
  const double g = k.grad_scale == 1.f ? grad : __fmul_rn(k.grad_scale, grad);
  const double p = double(param) * (1.0 - k.lr * weight_decay);
  const double m_new = k.beta1 * m + (1.0 - k.beta1) * g;
  const double v_new = k.beta2 * v + (1.0 - k.beta2) * g * g;
  const double denom = sqrt(v_new) * k.inv_sqrt_bias2 + k.eps;
  return {float(p - k.step_size * m_new / denom), float(m_new), float(v_new)};
}

/// One element in place; the compute copy (C = bf16_t or f16_t) when non-null.
template <class C>
__device__ __forceinline__ void adamw_element(float* param, const float* grad, float* m, float* v,
                                              C* copy, kindex i, double weight_decay,
                                              const AdamWCoefficients& k) {
  const AdamWUpdate u = adamw_update(param[i], grad[i], m[i], v[i], weight_decay, k);
  param[i] = u.param;
  m[i] = u.m;
  v[i] = u.v;
  if (copy) store_f(copy, i, u.param);
}

/// Takes grad_scale from the norm on the device where there is one (the
/// expression the host uses: clip_factor.hpp); false: this step updates
/// nothing (a non-finite norm under skip_nonfinite).
__device__ __forceinline__ bool clip_from_device_norm(AdamWCoefficients& k) {
  if (k.grad_sum_of_squares == nullptr) return true;
  const double norm = sqrt(*k.grad_sum_of_squares);
  if (k.skip_nonfinite && !isfinite(norm)) return false;
  k.grad_scale = float(ops::clip_factor(norm, k.clip_grad));
  return true;
}

// ------------------------------------------------------------ multi-tensor

constexpr int kThreads = 256;
constexpr kindex kChunk = 16384;  ///< elements per block: 16 packs of 4 per thread

/// One piece of a tensor in the device table. `packed`: every pointer is
/// 16-byte aligned (the copy 8-byte) and n % 4 == 0, so the block moves 4
/// elements per access.
struct TableEntry {
  float* param;
  const float* grad;
  float* m;
  float* v;
  void* copy;  ///< bf16/fp16 compute copy, or null
  kindex n;
  double weight_decay;
  kindex packed;
};
static_assert(sizeof(TableEntry) == 64, "the table image is compared byte for byte");

/// What block b does: chunk `chunk` of entry `entry`.
struct BlockWork {
  std::uint32_t entry, chunk;
};

template <class C>
struct alignas(8) CopyPack {
  C v[4];
};

/// Four consecutive elements with 16-byte loads and stores.
template <class C>
__device__ __forceinline__ void adamw_pack(const TableEntry& e, kindex i,
                                           const AdamWCoefficients& k) {
  const float4 p = *reinterpret_cast<const float4*>(e.param + i);
  const float4 g = *reinterpret_cast<const float4*>(e.grad + i);
  const float4 m = *reinterpret_cast<const float4*>(e.m + i);
  const float4 v = *reinterpret_cast<const float4*>(e.v + i);
  const AdamWUpdate u0 = adamw_update(p.x, g.x, m.x, v.x, e.weight_decay, k);
  const AdamWUpdate u1 = adamw_update(p.y, g.y, m.y, v.y, e.weight_decay, k);
  const AdamWUpdate u2 = adamw_update(p.z, g.z, m.z, v.z, e.weight_decay, k);
  const AdamWUpdate u3 = adamw_update(p.w, g.w, m.w, v.w, e.weight_decay, k);
  *reinterpret_cast<float4*>(e.param + i) = make_float4(u0.param, u1.param, u2.param, u3.param);
  *reinterpret_cast<float4*>(e.m + i) = make_float4(u0.m, u1.m, u2.m, u3.m);
  *reinterpret_cast<float4*>(e.v + i) = make_float4(u0.v, u1.v, u2.v, u3.v);
  if (e.copy) {
    CopyPack<C> c;
    c.v[0] = from_f<C>(u0.param), c.v[1] = from_f<C>(u1.param);
    c.v[2] = from_f<C>(u2.param), c.v[3] = from_f<C>(u3.param);
    *reinterpret_cast<CopyPack<C>*>(static_cast<C*>(e.copy) + i) = c;
  }
}

/// Elements [begin, end) of piece e, this thread's share: units (packs of 4
/// where e is packed, else single elements) first, first + stride, ...
template <class C>
__device__ __forceinline__ void adamw_piece(const TableEntry& e, kindex begin, kindex end,
                                            kindex first, kindex stride,
                                            const AdamWCoefficients& k) {
  if (e.packed) {
    for (kindex i = begin + 4 * first; i < end; i += 4 * stride) adamw_pack<C>(e, i, k);
  } else {
    for (kindex i = begin + first; i < end; i += stride)
      adamw_element(e.param, e.grad, e.m, e.v, static_cast<C*>(e.copy), i, e.weight_decay, k);
  }
}

template <class C>
__global__ void __launch_bounds__(kThreads)
    adamw_multi_kernel(const TableEntry* __restrict__ table, const BlockWork* __restrict__ work,
                       AdamWCoefficients k) {
  start_after_prior_grid();
  if (!clip_from_device_norm(k)) return;
  const BlockWork w = work[blockIdx.x];
  const TableEntry e = table[w.entry];
  const kindex begin = kindex(w.chunk) * kChunk;
  const kindex end = begin + kChunk < e.n ? begin + kChunk : e.n;
  adamw_piece<C>(e, begin, end, threadIdx.x, kThreads, k);
}

std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

/// `t` advanced by `elements` of `bytes` each (null stays null).
template <class T>
T* advance(T* t, kindex elements, std::size_t bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return t ? reinterpret_cast<T*>(reinterpret_cast<Byte*>(t) + elements * kindex(bytes))
           : nullptr;
}

TableEntry piece(const AdamWTensorPtrs& t, std::size_t copy_bytes, kindex begin, kindex end,
                 bool packed) {
  return {advance(t.param, begin, 4), advance(t.grad, begin, 4), advance(t.m, begin, 4),
          advance(t.v, begin, 4),     advance(t.copy, begin, copy_bytes), end - begin,
          t.weight_decay,             kindex(packed)};
}

/// Cuts a tensor into an unaligned head, a packed body and a tail: the head
/// brings param to a 16-byte boundary; the body is packed only when that
/// boundary is also one of grad, m, v (16 bytes) and the copy (8 bytes), as
/// for whole tensors from the allocator (256-byte aligned) and for equal
/// offsets into flat buffers. Otherwise the tensor stays one unpacked piece.
void append_pieces(const AdamWTensorPtrs& t, std::size_t copy_bytes,
                   std::vector<TableEntry>& out) {
  const kindex head = kindex((16 - address(t.param) % 16) % 16) / 4;
  const auto aligned_after_head = [&](const void* p, std::size_t element, std::size_t align) {
    return !p || (address(p) + std::size_t(head) * element) % align == 0;
  };
  const bool packable = address(t.param) % 4 == 0 && aligned_after_head(t.grad, 4, 16) &&
                        aligned_after_head(t.m, 4, 16) && aligned_after_head(t.v, 4, 16) &&
                        aligned_after_head(t.copy, copy_bytes, 8) && t.n - head >= 4;
  if (!packable) {
    out.push_back(piece(t, copy_bytes, 0, t.n, false));
    return;
  }
  const kindex body_end = head + (t.n - head) / 4 * 4;
  if (head > 0) out.push_back(piece(t, copy_bytes, 0, head, false));
  out.push_back(piece(t, copy_bytes, head, body_end, true));
  if (body_end < t.n) out.push_back(piece(t, copy_bytes, body_end, t.n, false));
}

/// One tensor's pieces (append_pieces: an unaligned head, the packed body, a
/// tail; or one unpacked piece), passed by value as kernel arguments.
struct TensorPieces {
  TableEntry piece[3];
  int count;
};

/// adamw_step's kernel: each piece grid-strided, 16-byte packs in the packed
/// body (one element per 4-byte access kept this fallback at 0.68 of an
/// H200's copy bandwidth, against 0.95+ for the multi-tensor kernel's packs).
template <class C>
__global__ void adamw_kernel(TensorPieces pieces, AdamWCoefficients k) {
  start_after_prior_grid();
  if (!clip_from_device_norm(k)) return;
  const kindex first = kindex(blockIdx.x) * blockDim.x + threadIdx.x;
  const kindex stride = kindex(gridDim.x) * blockDim.x;
  for (int q = 0; q < pieces.count; ++q)
    adamw_piece<C>(pieces.piece[q], 0, pieces.piece[q].n, first, stride, k);
}

}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, index_t n,
                const AdamWCoefficients& k, DType copy_dtype, void* copy) {
  if (n == 0) return;
  with_storage_type(copy_dtype, "adamw_step (compute copy)", [&](auto zero) {
    using C = decltype(zero);
    if constexpr (std::is_same_v<C, float>) {
      MESH_VERIFY(false, "adamw_step: the compute copy is bf16 or fp16, got fp32");
    } else {
      std::vector<TableEntry> entries;
      append_pieces({param, grad, m, v, copy, n, k.weight_decay}, sizeof(C), entries);
      TensorPieces pieces{};
      for (const TableEntry& e : entries) pieces.piece[pieces.count++] = e;
      // One block per kChunk elements, as the multi-tensor kernel: 16 packs a thread.
      launch_dependent(adamw_kernel<C>, grid_for(n, kChunk), kThreads, 0, compute_stream(), pieces,
                       k);
    }
  });
}

// ------------------------------------------------------------- AdamWTable

AdamWTable::~AdamWTable() {
  if (device_) device::deallocate(device_);
}

void AdamWTable::step(const std::vector<AdamWTensorPtrs>& tensors, DType copy_dtype,
                      const AdamWCoefficients& k) {
  MESH_VERIFY(copy_dtype == DType::BF16 || copy_dtype == DType::F16,
              "AdamWTable: the compute copies are bf16 or fp16, got " << dtype_name(copy_dtype));
  std::vector<TableEntry> entries;
  for (const AdamWTensorPtrs& t : tensors)
    if (t.n > 0) append_pieces(t, dtype_size(copy_dtype), entries);
  if (entries.empty()) return;
  std::vector<unsigned char> image(entries.size() * sizeof(TableEntry));
  std::memcpy(image.data(), entries.data(), image.size());
  if (image != image_) upload(image);

  const auto* table = static_cast<const TableEntry*>(device_);
  const auto* work =
      reinterpret_cast<const BlockWork*>(static_cast<const char*>(device_) + image_.size());
  const unsigned grid = unsigned(blocks_);
  if (copy_dtype == DType::BF16)
    launch_dependent(adamw_multi_kernel<bf16_t>, grid, kThreads, 0, compute_stream(), table, work, k);
  else
    launch_dependent(adamw_multi_kernel<f16_t>, grid, kThreads, 0, compute_stream(), table, work, k);
}

// Device layout: the entries, then the per-block work list (8-byte aligned
// after 64-byte entries). Only the entries are kept on the host to compare:
// the work list follows from them. The copy is synchronous, on the legacy
// default stream, which the compute stream synchronises with: a kernel still
// reading the previous table runs first.
void AdamWTable::upload(const std::vector<unsigned char>& image) {
  std::vector<TableEntry> entries(image.size() / sizeof(TableEntry));
  std::memcpy(entries.data(), image.data(), image.size());
  std::vector<BlockWork> work;
  for (std::size_t e = 0; e < entries.size(); ++e)
    for (kindex c = 0; c * kChunk < entries[e].n; ++c)
      work.push_back({std::uint32_t(e), std::uint32_t(c)});
  MESH_VERIFY(work.size() < (std::size_t(1) << 31), "AdamWTable: too many blocks");
  const std::size_t work_bytes = work.size() * sizeof(BlockWork);
  if (image.size() + work_bytes > capacity_) {
    if (device_) device::deallocate(device_);
    device_ = device::allocate(image.size() + work_bytes);
    capacity_ = image.size() + work_bytes;
  }
  device::copy_bytes(device_, image.data(), image.size());
  device::copy_bytes(static_cast<char*>(device_) + image.size(), work.data(), work_bytes);
  image_ = image;
  blocks_ = work.size();
  ++uploads_;
}

}  // namespace meshtron::cuda
