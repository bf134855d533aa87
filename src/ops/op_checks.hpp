// The argument checks and dispatch helpers shared by the op table's files
// (ops_*.cpp, one per op family; the API is ops.hpp), in ops::detail.
//
// The op table's dispatch: check every argument once, with messages that
// name the op, the argument and the shapes, then hand host tensors to the
// portable Kokkos kernels (kernels/kokkos/) or to CBLAS, by dtype, and
// device tensors to the CUDA launchers (ops_cuda.hpp, kernels/cuda/).
// Without MESHTRON_HAVE_CUDA device tensors stop with "the CUDA path is not
// built". The shape checks are the same for both.
//
// Dtypes: all tensors of one call are in one memory space. Host: every
// floating tensor shares one dtype, fp32 or fp64 (or bf16 or fp16, for the
// ops that compute in fp32 there: require_storage_args). Device: the activations
// and weights ("storage") share fp32, bf16 or fp16; per-row statistics (mean,
// rstd, row_max, sum_exp, target_logit, loss, dloss) are fp32; accumulated
// parameter gradients (dgamma, dbeta, dbias, dtable) are fp32 or the
// storage dtype; AdamW is fp32 throughout; a GEMM's C may be fp32 under
// bf16 A and B (fused fp32 weight-gradient accumulation).
//
// Shape convention of the checks: ops "over the last dim" accept any rank,
// the leading dimensions flattening into rows (x [B, S, H] is N = B*S rows
// of H); per-row tensors (mean, rstd, targets, ...) must hold N elements.
#pragma once

#include <Kokkos_Core.hpp>
#include <initializer_list>
#include <string>

#include "common/error.hpp"
#include "kernels/kokkos/dropout.hpp"
#include "ops/ops.hpp"
#include "tensor/tensor.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "ops/ops_cuda.hpp"
#endif

namespace meshtron::ops::detail {

using Host = Kokkos::DefaultHostExecutionSpace;

// ------------------------------------------------------- argument checks ---

/// A tensor argument with the name it has in ops.hpp, for messages.
struct Arg {
  const char* name;
  const Tensor& t;
};

inline std::string describe(const Arg& a) {
  return MESH_MSG(a.name << " " << shape_string(a.t.shape()) << " "
                         << (a.t.defined() ? dtype_name(a.t.dtype()) : "undefined"));
}

inline const char* space_name(const Tensor& t) { return t.is_host() ? "host" : "CUDA"; }

/// True when the op runs on the device. Every argument must be defined and
/// all in one memory space; device tensors need the CUDA path built.
inline bool on_device(const char* op, std::initializer_list<Arg> args) {
  const Arg& first = *args.begin();
  for (const Arg& a : args) {
    MESH_VERIFY(a.t.defined(), op << ": " << a.name << " is an undefined tensor");
    MESH_VERIFY(a.t.space() == first.t.space(),
                op << ": " << describe(first) << " is in " << space_name(first.t) << " memory but "
                   << describe(a) << " is in " << space_name(a.t) << " memory");
  }
#ifndef MESHTRON_HAVE_CUDA
  MESH_VERIFY(first.t.is_host(),
              op << ": " << describe(first) << " is in CUDA memory, but the CUDA path is not built");
#endif
  return !first.t.is_host();
}

/// Floating tensors sharing one dtype: fp32 or fp64 on the host (the host
/// path), fp32, bf16 or fp16 on the device. Returns whether they are on the device.
inline bool require_float_args(const char* op, std::initializer_list<Arg> args) {
  const bool device = on_device(op, args);
  const Arg& first = *args.begin();
  if (device)
    MESH_VERIFY(first.t.dtype() == DType::F32 || first.t.dtype() == DType::BF16 ||
                    first.t.dtype() == DType::F16,
                op << ": the CUDA path stores fp32, bf16 or fp16, got " << describe(first));
  else
    MESH_VERIFY(first.t.dtype() == DType::F32 || first.t.dtype() == DType::F64,
                op << ": the host path computes in fp32 or fp64, got " << describe(first));
  for (const Arg& a : args)
    MESH_VERIFY(a.t.dtype() == first.t.dtype(),
                op << ": dtypes differ: " << describe(first) << " but " << describe(a));
  return device;
}

inline bool is_half(DType t) { return t == DType::BF16 || t == DType::F16; }

/// Storage tensors of the ops that take bf16 and fp16 on the host as well
/// (they compute in fp32 or wider there: RMSNorm, rotary, gated
/// activations): fp32, bf16 or fp16 in either space, or fp64 on the host,
/// sharing one dtype. Returns whether they are on the device.
inline bool require_storage_args(const char* op, std::initializer_list<Arg> args) {
  const bool device = on_device(op, args);
  const Arg& first = *args.begin();
  const DType t = first.t.dtype();
  MESH_VERIFY(t == DType::F32 || is_half(t) || (!device && t == DType::F64),
              op << ": takes fp32, bf16 or fp16" << (device ? "" : " (or fp64 on the host)")
                 << ", got " << describe(first));
  for (const Arg& a : args)
    MESH_VERIFY(a.t.dtype() == t,
                op << ": dtypes differ: " << describe(first) << " but " << describe(a));
  return device;
}

/// Per-row statistics: the storage dtype on the host, fp32 on the device
/// and for bf16/fp16 storage.
inline void require_stat_args(const char* op, bool device, const Arg& storage,
                              std::initializer_list<Arg> args) {
  const DType want = device || is_half(storage.t.dtype()) ? DType::F32 : storage.t.dtype();
  for (const Arg& a : args)
    MESH_VERIFY(a.t.dtype() == want, op << ": " << describe(a) << " must be " << dtype_name(want)
                                        << " (per-row statistics of " << describe(storage)
                                        << ")");
}

/// Accumulated parameter gradients: the storage dtype, or fp32 on the device
/// and for bf16/fp16 storage.
inline void require_grad_args(const char* op, bool device, const Arg& storage,
                              std::initializer_list<Arg> args) {
  const bool fp32_too = device || is_half(storage.t.dtype());
  for (const Arg& a : args)
    MESH_VERIFY(a.t.dtype() == storage.t.dtype() || (fp32_too && a.t.dtype() == DType::F32),
                op << ": " << describe(a) << " must be " << dtype_name(storage.t.dtype())
                   << (fp32_too ? " or fp32" : "") << " like " << describe(storage));
}

/// int32 index tensor (token ids, targets).
inline void require_index_arg(const char* op, const Arg& a) {
  MESH_VERIFY(a.t.dtype() == DType::I32, op << ": " << describe(a) << " must be int32");
}

inline void require_same_numel(const char* op, const Arg& a, const Arg& b) {
  MESH_VERIFY(a.t.numel() == b.t.numel(), op << ": " << describe(a) << " and " << describe(b)
                                             << " must have the same number of elements");
}

/// Rows of a tensor seen as [rows, last dim]; the last dim must be non-empty.
inline index_t rows_of(const char* op, const Arg& a) {
  MESH_VERIFY(a.t.rank() >= 1 && a.t.dim(-1) > 0,
              op << ": " << describe(a) << " needs a non-empty last dimension");
  return a.t.numel() / a.t.dim(-1);
}

/// A per-row tensor (mean, rstd, targets, ...) holding one element per row.
inline void require_per_row(const char* op, const Arg& a, index_t rows, const Arg& of) {
  MESH_VERIFY(a.t.numel() == rows, op << ": " << describe(a) << " must hold " << rows
                                      << " elements, one per row of " << describe(of));
}

inline bool overlaps(const Tensor& a, const Tensor& b) {
  const char* a0 = static_cast<const char*>(a.raw());
  const char* b0 = static_cast<const char*>(b.raw());
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

/// Calls f(T{}) with T = float or double for the (already checked) dtype.
template <class F>
void with_float_type(DType dtype, F&& f) {
  if (dtype == DType::F32)
    f(float{});
  else
    f(double{});
}

/// Calls f(T{}) with T = float, double, bf16 or fp16 for the (already
/// checked) storage dtype (require_storage_args).
template <class F>
void with_storage_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F64: f(double{}); return;
    case DType::BF16: f(bf16{}); return;
    case DType::F16: f(fp16{}); return;
    default: f(float{}); return;
  }
}

/// The device branch of an op: the call when the CUDA path is built. Where
/// it is not, on_device() has already stopped the job, so this never runs.
#ifdef MESHTRON_HAVE_CUDA
#define ON_CUDA(...) __VA_ARGS__
#else
#define ON_CUDA(...) MESH_VERIFY(false, "unreachable: the CUDA path is not built")
#endif

// ------------------------------------------------------- Dropout sites ---
// Shared by the dropout ops and the fused attention's dropout.

/// A dropout site's view [A, B, C] covers `numel` elements (`what`) and fits
/// its global tensor.
inline void check_dropout_site(const char* op, const DropoutSite& s, index_t numel,
                               const std::string& what) {
  MESH_VERIFY(s.a >= 0 && s.b > 0 && s.c > 0 && s.a * s.b * s.c == numel,
              op << ": site view [" << s.a << ", " << s.b << ", " << s.c << "] does not cover "
                 << what);
  MESH_VERIFY(s.a_offset >= 0 && s.b_offset >= 0 && s.c_offset >= 0 &&
                  s.b + s.b_offset <= s.b_global && s.c + s.c_offset <= s.c_global,
              op << ": site view [" << s.a << ", " << s.b << ", " << s.c << "] at offsets ("
                 << s.a_offset << ", " << s.b_offset << ", " << s.c_offset
                 << ") does not fit in the global [*, " << s.b_global << ", " << s.c_global << "]");
}

/// The host kernels' placement of a site (whose step and offsets are its
/// own: the live device words of CUDA graphs are the device's).
inline kernels::DropoutPlacement placement(const DropoutSite& s) {
  MESH_VERIFY(s.live == nullptr, "dropout: live step and offsets are device words (CUDA graphs)");
  return {s.seed,     s.step,     s.stream,   s.b,        s.c,
          s.a_offset, s.b_offset, s.c_offset, s.b_global, s.c_global};
}

#ifdef MESHTRON_HAVE_CUDA
/// The CUDA kernels' placement of a site (live device words included).
inline cuda::DropoutPlacement device_placement(const DropoutSite& s) {
  return {s.seed,     s.step,     s.stream,   s.b,          s.c,         s.a_offset,
          s.b_offset, s.c_offset, s.b_global, s.c_global, s.live, s.sample_axis};
}
#endif

}  // namespace meshtron::ops::detail
