// The op table's dispatch (see ops.hpp): check every argument once, with
// messages that name the op, the argument and the shapes, then hand host
// tensors to the portable Kokkos kernels (kernels/kokkos/) or to CBLAS, by
// dtype, and device tensors to the CUDA launchers (ops_cuda.hpp,
// kernels/cuda/). Without MESHTRON_HAVE_CUDA device tensors stop with
// "the CUDA path is not built". The shape checks are the same for both.
//
// Dtypes: all tensors of one call are in one memory space. Host: every
// floating tensor shares one dtype, fp32 or fp64. Device: the activations
// and weights ("storage") share fp32, bf16 or fp16; per-row statistics (mean,
// rstd, row_max, sum_exp, target_logit, loss, dloss) are fp32; accumulated
// parameter gradients (dgamma, dbeta, dbias, dtable) are fp32 or the
// storage dtype; AdamW is fp32 throughout; a GEMM's C may be fp32 under
// bf16 A and B (fused fp32 weight-gradient accumulation).
//
// Shape convention of the checks: ops "over the last dim" accept any rank,
// the leading dimensions flattening into rows (x [B, S, H] is N = B*S rows
// of H); per-row tensors (mean, rstd, targets, ...) must hold N elements.
#include <cblas.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <exception>
#include <initializer_list>
#include <utility>

#include "kernels/kokkos/adamw.hpp"
#include "kernels/kokkos/attention.hpp"
#include "kernels/kokkos/cross_entropy.hpp"
#include "kernels/kokkos/dropout.hpp"
#include "kernels/kokkos/elementwise.hpp"
#include "kernels/kokkos/embedding.hpp"
#include "kernels/kokkos/gelu.hpp"
#include "kernels/kokkos/layernorm.hpp"
#include "kernels/kokkos/softmax.hpp"
#include "ops/cast.hpp"
#include "ops/clip_factor.hpp"
#include "ops/ops.hpp"

#include "ops/head_layout.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "ops/ops_cuda.hpp"
#endif

namespace meshtron::ops {
namespace {

using Host = Kokkos::DefaultHostExecutionSpace;

// ------------------------------------------------------- argument checks ---

/// A tensor argument with the name it has in ops.hpp, for messages.
struct Arg {
  const char* name;
  const Tensor& t;
};

std::string describe(const Arg& a) {
  return MESH_MSG(a.name << " " << shape_string(a.t.shape()) << " "
                         << (a.t.defined() ? dtype_name(a.t.dtype()) : "undefined"));
}

const char* space_name(const Tensor& t) { return t.is_host() ? "host" : "CUDA"; }

/// True when the op runs on the device. Every argument must be defined and
/// all in one memory space; device tensors need the CUDA path built.
bool on_device(const char* op, std::initializer_list<Arg> args) {
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
bool require_float_args(const char* op, std::initializer_list<Arg> args) {
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

/// Per-row statistics: the storage dtype on the host, fp32 on the device.
void require_stat_args(const char* op, bool device, const Arg& storage,
                       std::initializer_list<Arg> args) {
  const DType want = device ? DType::F32 : storage.t.dtype();
  for (const Arg& a : args)
    MESH_VERIFY(a.t.dtype() == want, op << ": " << describe(a) << " must be " << dtype_name(want)
                                        << " (per-row statistics of " << describe(storage)
                                        << ")");
}

/// Accumulated parameter gradients: the storage dtype, or fp32 on the device.
void require_grad_args(const char* op, bool device, const Arg& storage,
                       std::initializer_list<Arg> args) {
  for (const Arg& a : args)
    MESH_VERIFY(a.t.dtype() == storage.t.dtype() || (device && a.t.dtype() == DType::F32),
                op << ": " << describe(a) << " must be " << dtype_name(storage.t.dtype())
                   << (device ? " or fp32" : "") << " like " << describe(storage));
}

/// int32 index tensor (token ids, targets).
void require_index_arg(const char* op, const Arg& a) {
  MESH_VERIFY(a.t.dtype() == DType::I32, op << ": " << describe(a) << " must be int32");
}

void require_same_numel(const char* op, const Arg& a, const Arg& b) {
  MESH_VERIFY(a.t.numel() == b.t.numel(), op << ": " << describe(a) << " and " << describe(b)
                                             << " must have the same number of elements");
}

/// Rows of a tensor seen as [rows, last dim]; the last dim must be non-empty.
index_t rows_of(const char* op, const Arg& a) {
  MESH_VERIFY(a.t.rank() >= 1 && a.t.dim(-1) > 0,
              op << ": " << describe(a) << " needs a non-empty last dimension");
  return a.t.numel() / a.t.dim(-1);
}

/// A per-row tensor (mean, rstd, targets, ...) holding one element per row.
void require_per_row(const char* op, const Arg& a, index_t rows, const Arg& of) {
  MESH_VERIFY(a.t.numel() == rows, op << ": " << describe(a) << " must hold " << rows
                                      << " elements, one per row of " << describe(of));
}

bool overlaps(const Tensor& a, const Tensor& b) {
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

/// The device branch of an op: the call when the CUDA path is built. Where
/// it is not, on_device() has already stopped the job, so this never runs.
#ifdef MESHTRON_HAVE_CUDA
#define ON_CUDA(...) __VA_ARGS__
#else
#define ON_CUDA(...) MESH_VERIFY(false, "unreachable: the CUDA path is not built")
#endif

// ------------------------------------------------------------------ GEMM ---

/// C [M, N] = op(A) [M, K] * op(B) [K, N], from 2-D shapes as stored.
struct GemmShape {
  index_t M, N, K;
  index_t lda, ldb, ldc;
};

GemmShape gemm_shape(const char* op, index_t a_rows, index_t a_cols, bool trans_a, index_t b_rows,
                     index_t b_cols, bool trans_b, index_t c_rows, index_t c_cols, const Arg& A,
                     const Arg& B, const Arg& C) {
  const index_t M = trans_a ? a_cols : a_rows, K = trans_a ? a_rows : a_cols;
  const index_t Kb = trans_b ? b_cols : b_rows, N = trans_b ? b_rows : b_cols;
  MESH_VERIFY(K == Kb && c_rows == M && c_cols == N,
              op << ": op(A) is [" << M << ", " << K << "] and op(B) is [" << Kb << ", " << N
                 << "] (trans_a=" << trans_a << ", trans_b=" << trans_b << "), so C must be [" << M
                 << ", " << N << "] with equal inner dims; got " << describe(A) << ", "
                 << describe(B) << ", " << describe(C));
  // CBLAS wants leading dimensions >= 1 even for empty matrices.
  auto ld = [](index_t cols) { return cols > 0 ? cols : index_t(1); };
  return {M, N, K, ld(a_cols), ld(b_cols), ld(c_cols)};
}

void cblas_gemm(bool ta, bool tb, const GemmShape& s, double alpha, const float* A, const float* B,
                double beta, float* C) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(s.M), int(s.N), int(s.K), float(alpha), A, int(s.lda), B, int(s.ldb), float(beta),
              C, int(s.ldc));
}

void cblas_gemm(bool ta, bool tb, const GemmShape& s, double alpha, const double* A,
                const double* B, double beta, double* C) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              int(s.M), int(s.N), int(s.K), alpha, A, int(s.lda), B, int(s.ldb), beta, C,
              int(s.ldc));
}

/// Returns whether the GEMM runs on the device (where C may be fp32 under
/// bf16 A and B).
bool check_gemm_operands(const char* op, const Tensor& A, const Tensor& B, const Tensor& C,
                         int rank) {
  const Arg a{"A", A}, b{"B", B}, c{"C", C};
  on_device(op, {a, b, c});
  const bool device = require_float_args(op, {a, b});
  require_grad_args(op, device, a, {c});
  for (const Arg& x : {a, b, c})
    MESH_VERIFY(x.t.rank() == rank, op << ": " << describe(x) << " must be " << rank << "-D");
  MESH_VERIFY(!overlaps(C, A) && !overlaps(C, B), op << ": C must not share memory with A or B");
  for (const Arg& x : {a, b, c})
    for (index_t d : x.t.shape())
      MESH_VERIFY(d <= index_t(INT32_MAX), op << ": " << describe(x) << " exceeds CBLAS's int");
  return device;
}

#ifdef MESHTRON_HAVE_CUDA
/// The launcher's arguments for C = op(A) op(B) of the checked shape s.
cuda::GemmArgs gemm_args(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C,
                         const GemmShape& s) {
  return cuda::GemmArgs{A.dtype(), C.dtype(), A.raw(), B.raw(), C.raw(), trans_a, trans_b,
                        s.M,       s.N,       s.K,     s.lda,   s.ldb,   s.ldc};
}

void cuda_gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C,
               const GemmShape& s, index_t batch, double alpha, double beta,
               const void* bias = nullptr) {
  cuda::GemmArgs g = gemm_args(A, trans_a, B, trans_b, C, s);
  g.batch = batch;
  if (A.rank() == 3) {
    g.stride_a = A.dim(1) * A.dim(2);
    g.stride_b = B.dim(1) * B.dim(2);
    g.stride_c = C.dim(1) * C.dim(2);
  }
  g.alpha = alpha;
  g.beta = beta;
  g.bias = bias;
  cuda::gemm(g);
}
#endif

}  // namespace

void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, double alpha,
          double beta) {
  const char* op = "gemm";
  const bool device = check_gemm_operands(op, A, B, C, 2);
  const GemmShape s = gemm_shape(op, A.dim(0), A.dim(1), trans_a, B.dim(0), B.dim(1), trans_b,
                                 C.dim(0), C.dim(1), {"A", A}, {"B", B}, {"C", C});
  if (s.M == 0 || s.N == 0) return;
  if (device) {
    ON_CUDA(cuda_gemm(A, trans_a, B, trans_b, C, s, 1, alpha, beta));
    return;
  }
  with_float_type(A.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cblas_gemm(trans_a, trans_b, s, alpha, A.data<T>(), B.data<T>(), beta, C.data<T>());
  });
}

namespace {
/// bias [N] of C's dtype, one per column of C [M, N], in C's space and not
/// sharing C's memory (the bias of gemm_bias and the fused-epilogue GEMMs).
void check_bias(const char* op, const Tensor& bias, const Tensor& C, index_t N) {
  const Arg ac{"C", C}, ab{"bias", bias};
  on_device(op, {ac, ab});
  MESH_VERIFY(bias.dtype() == C.dtype() && bias.numel() == N,
              op << ": " << describe(ab) << " must hold " << N << " elements of C's dtype, one "
                 << "per column of " << describe(ac));
  MESH_VERIFY(!overlaps(C, bias), op << ": the output must not share memory with bias");
}
}  // namespace

void gemm_bias(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, const Tensor& bias,
               Tensor& C) {
  const char* op = "gemm_bias";
  const bool device = check_gemm_operands(op, A, B, C, 2);
  const GemmShape s = gemm_shape(op, A.dim(0), A.dim(1), trans_a, B.dim(0), B.dim(1), trans_b,
                                 C.dim(0), C.dim(1), {"A", A}, {"B", B}, {"C", C});
  check_bias(op, bias, C, s.N);
  if (s.M == 0 || s.N == 0) return;
  if (device) {
    ON_CUDA(cuda_gemm(A, trans_a, B, trans_b, C, s, 1, 1.0, 0.0, bias.raw()));
    return;
  }
  gemm(A, trans_a, B, trans_b, C);
  bias_add(C, bias);
}

void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C,
                  double alpha, double beta) {
  const char* op = "gemm_batched";
  const bool device = check_gemm_operands(op, A, B, C, 3);
  const index_t batch = A.dim(0);
  MESH_VERIFY(B.dim(0) == batch && C.dim(0) == batch,
              op << ": batch sizes differ: A " << shape_string(A.shape()) << ", B "
                 << shape_string(B.shape()) << ", C " << shape_string(C.shape()));
  const GemmShape s = gemm_shape(op, A.dim(1), A.dim(2), trans_a, B.dim(1), B.dim(2), trans_b,
                                 C.dim(1), C.dim(2), {"A", A}, {"B", B}, {"C", C});
  if (s.M == 0 || s.N == 0) return;
  if (device) {
    ON_CUDA(cuda_gemm(A, trans_a, B, trans_b, C, s, batch, alpha, beta));
    return;
  }
  with_float_type(A.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const index_t a_stride = A.dim(1) * A.dim(2), b_stride = B.dim(1) * B.dim(2),
                  c_stride = C.dim(1) * C.dim(2);
    for (index_t i = 0; i < batch; ++i)
      cblas_gemm(trans_a, trans_b, s, alpha, A.data<T>() + i * a_stride, B.data<T>() + i * b_stride,
                 beta, C.data<T>() + i * c_stride);
  });
}

// ------------------------------------------------------------- LayerNorm ---

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps,
                       Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "layernorm_forward";
  const Arg ax{"x", x}, ag{"gamma", gamma}, ab{"beta", beta}, ay{"y", y}, am{"mean", mean},
      ar{"rstd", rstd};
  on_device(op, {ax, ag, ab, ay, am, ar});
  const bool device = require_float_args(op, {ax, ag, ab, ay});
  require_stat_args(op, device, ax, {am, ar});
  const index_t N = rows_of(op, ax), H = x.dim(-1);
  MESH_VERIFY(gamma.numel() == H && beta.numel() == H,
              op << ": " << describe(ag) << " and " << describe(ab) << " must hold " << H
                 << " elements, the last dim of " << describe(ax));
  const bool ones_column = y.rank() == 2 && x.rank() == 2 && y.dim(0) == N &&
                           y.dim(1) == H + kOnesColumnWidth;
  MESH_VERIFY(y.shape() == x.shape() || ones_column,
              op << ": " << describe(ay) << " must match " << describe(ax) << " or be [" << N
                 << ", " << H + kOnesColumnWidth << "] (the ones column)");
  require_per_row(op, am, N, ax);
  require_per_row(op, ar, N, ax);
  MESH_VERIFY(eps > 0, op << ": eps must be positive, got " << eps);
  const index_t ldy = y.dim(-1);
  if (device) {
    ON_CUDA(cuda::layernorm_forward(x.dtype(), x.raw(), gamma.raw(), beta.raw(), N, H, eps,
                                    y.raw(), ldy, mean.data<float>(), rstd.data<float>()));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if (!ones_column) {
      kernels::layernorm_forward<Host>(x.data<T>(), gamma.data<T>(), beta.data<T>(), N, H, eps,
                                       y.data<T>(), mean.data<T>(), rstd.data<T>());
      return;
    }
    // The same kernel into rows of H, then each row moved to its place in y
    // beside its ones column (the host path is for tests and small runs).
    Tensor rows = Tensor::empty(x.shape(), x.dtype());
    kernels::layernorm_forward<Host>(x.data<T>(), gamma.data<T>(), beta.data<T>(), N, H, eps,
                                     rows.data<T>(), mean.data<T>(), rstd.data<T>());
    const T* from = rows.data<T>();
    T* to = y.data<T>();
    for (index_t r = 0; r < N; ++r) {
      std::copy(from + r * H, from + (r + 1) * H, to + r * ldy);
      for (index_t c = H; c < ldy; ++c) to[r * ldy + c] = T(c == H ? 1.0f : 0.0f);
    }
  });
}

#ifdef MESHTRON_HAVE_CUDA
struct LayerNormGradChain::DeviceSums {
  cuda::LayerNormPendingSums pending;
};
#else
struct LayerNormGradChain::DeviceSums {};  // nothing is ever held on the host
#endif

LayerNormGradChain::LayerNormGradChain() : sums_(std::make_unique<DeviceSums>()) {}

LayerNormGradChain::~LayerNormGradChain() {
#ifdef MESHTRON_HAVE_CUDA
  if (std::uncaught_exceptions() > 0)
    cuda::layernorm_drop_pending(sums_->pending);
  else
    flush();  // throws only on a CUDA error: terminate, loudly
#endif
}

void LayerNormGradChain::flush() {
#ifdef MESHTRON_HAVE_CUDA
  cuda::layernorm_add_pending(sums_->pending);
#endif
}

bool LayerNormGradChain::holds(const Tensor& grad) const {
#ifdef MESHTRON_HAVE_CUDA
  const cuda::LayerNormPendingSums& p = sums_->pending;
  return p.partial && grad.defined() && (grad.raw() == p.dgamma || grad.raw() == p.dbeta);
#else
  (void)grad;
  return false;
#endif
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
                        const Tensor* residual_grad, GradStore store, LayerNormGradChain* chain) {
  const char* op = "layernorm_backward";
  const Arg ady{"dy", dy}, ax{"x", x}, ag{"gamma", gamma}, am{"mean", mean}, ar{"rstd", rstd},
      adx{"dx", dx}, adg{"dgamma", dgamma}, adb{"dbeta", dbeta};
  on_device(op, {ax, ady, ag, am, ar, adx, adg, adb});
  const bool device = require_float_args(op, {ax, ady, ag, adx});
  require_stat_args(op, device, ax, {am, ar});
  require_grad_args(op, device, ax, {adg, adb});
  MESH_VERIFY(dgamma.dtype() == dbeta.dtype(),
              op << ": " << describe(adg) << " and " << describe(adb) << " must share a dtype");
  const index_t N = rows_of(op, ax), H = x.dim(-1);
  MESH_VERIFY(
      dy.shape() == x.shape() && dx.shape() == x.shape(),
      op << ": " << describe(ady) << " and " << describe(adx) << " must match " << describe(ax));
  for (const Arg& a : {ag, adg, adb})
    MESH_VERIFY(a.t.numel() == H, op << ": " << describe(a) << " must hold " << H
                                     << " elements, the last dim of " << describe(ax));
  require_per_row(op, am, N, ax);
  require_per_row(op, ar, N, ax);
  if (residual_grad) {
    const Arg arg{"residual_grad", *residual_grad};
    on_device(op, {ax, arg});
    require_float_args(op, {ax, arg});
    MESH_VERIFY(residual_grad->shape() == x.shape(),
                op << ": " << describe(arg) << " must match " << describe(ax));
  }
  if (device) {
    ON_CUDA(cuda::layernorm_backward(x.dtype(), dgamma.dtype(), dy.raw(), x.raw(), gamma.raw(),
                                     mean.data<float>(), rstd.data<float>(), N, H, dx.raw(),
                                     dgamma.raw(), dbeta.raw(),
                                     residual_grad ? residual_grad->raw() : nullptr,
                                     store == GradStore::Accumulate,
                                     chain ? &chain->device_sums().pending : nullptr));
    return;
  }
  if (store == GradStore::Overwrite) {  // the host kernel adds
    dgamma.fill(0.0);
    dbeta.fill(0.0);
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::layernorm_backward<Host>(dy.data<T>(), x.data<T>(), gamma.data<T>(), mean.data<T>(),
                                      rstd.data<T>(), N, H, dx.data<T>(), dgamma.data<T>(),
                                      dbeta.data<T>());
  });
  if (residual_grad) add(dx, *residual_grad, dx);
}

// --------------------------------------------------------------- Softmax ---

namespace {
/// scores [..., S, S]: returns the number of S x S matrices.
index_t softmax_batch(const char* op, const Arg& scores) {
  const Tensor& s = scores.t;
  MESH_VERIFY(s.rank() >= 2 && s.dim(-1) == s.dim(-2) && s.dim(-1) > 0,
              op << ": " << describe(scores) << " must be [B, S, S] with S > 0");
  return s.numel() / (s.dim(-1) * s.dim(-1));
}
}  // namespace

void scaled_causal_softmax_forward(const Tensor& scores, double scale, Tensor& probs) {
  const char* op = "scaled_causal_softmax_forward";
  const Arg as{"scores", scores}, ap{"probs", probs};
  const bool device = require_float_args(op, {as, ap});
  const index_t B = softmax_batch(op, as), S = scores.dim(-1);
  MESH_VERIFY(probs.shape() == scores.shape(),
              op << ": " << describe(ap) << " must match " << describe(as));
  if (device) {
    ON_CUDA(cuda::scaled_causal_softmax_forward(scores.dtype(), scores.raw(), B, S, scale,
                                               probs.raw()));
    return;
  }
  with_float_type(scores.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scaled_causal_softmax_forward<Host>(scores.data<T>(), B, S, scale, probs.data<T>());
  });
}

void scaled_causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale,
                                    Tensor& dscores) {
  const char* op = "scaled_causal_softmax_backward";
  const Arg adp{"dprobs", dprobs}, ap{"probs", probs}, ads{"dscores", dscores};
  const bool device = require_float_args(op, {ap, adp, ads});
  const index_t B = softmax_batch(op, ap), S = probs.dim(-1);
  MESH_VERIFY(
      dprobs.shape() == probs.shape() && dscores.shape() == probs.shape(),
      op << ": " << describe(adp) << " and " << describe(ads) << " must match " << describe(ap));
  if (device) {
    ON_CUDA(cuda::scaled_causal_softmax_backward(probs.dtype(), dprobs.raw(), probs.raw(), B, S,
                                                scale, dscores.raw()));
    return;
  }
  with_float_type(probs.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scaled_causal_softmax_backward<Host>(dprobs.data<T>(), probs.data<T>(), B, S, scale,
                                                  dscores.data<T>());
  });
}

// ------------------------------------------------------- Dropout sites ---

namespace {
/// A dropout site's view [A, B, C] covers `numel` elements (`what`) and fits
/// its global tensor.
void check_dropout_site(const char* op, const DropoutSite& s, index_t numel,
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
kernels::DropoutPlacement placement(const DropoutSite& s) {
  MESH_VERIFY(s.live == nullptr, "dropout: live step and offsets are device words (CUDA graphs)");
  return {s.seed,     s.step,     s.stream,   s.b,        s.c,
          s.a_offset, s.b_offset, s.c_offset, s.b_global, s.c_global};
}

#ifdef MESHTRON_HAVE_CUDA
/// The CUDA kernels' placement of a site (live device words included).
cuda::DropoutPlacement device_placement(const DropoutSite& s) {
  return {s.seed,     s.step,     s.stream,   s.b,          s.c,         s.a_offset,
          s.b_offset, s.c_offset, s.b_global, s.c_global, s.live, s.sample_axis};
}
#endif
}  // namespace

// ------------------------------------------------------- Fused attention ---

bool fused_attention_supported(DType dtype, MemorySpace space, index_t head_dim) {
  if (space == MemorySpace::Host) return dtype == DType::F32 || dtype == DType::F64;
#ifdef MESHTRON_HAVE_CUDA
  return (dtype == DType::BF16 || dtype == DType::F16) && (head_dim == 64 || head_dim == 128);
#else
  return false;
#endif
}

namespace {
/// q [B, S, D] with every `same` tensor of its shape and `lse` holding B*S
/// rows; the device kernel's dtypes and head dims. Returns whether on the device.
bool check_attention(const char* op, const Arg& q, std::initializer_list<Arg> same,
                     const Arg& lse) {
  MESH_VERIFY(q.t.rank() == 3 && q.t.dim(1) > 0 && q.t.dim(2) > 0,
              op << ": " << describe(q) << " must be [batch x heads, S, head_dim]");
  for (const Arg& a : same)
    MESH_VERIFY(a.t.shape() == q.t.shape(), op << ": " << describe(a) << " must match "
                                               << describe(q));
  const bool device = !q.t.is_host();
  require_stat_args(op, device, q, {lse});
  require_per_row(op, lse, q.t.dim(0) * q.t.dim(1), q);
  if (device)
    MESH_VERIFY(fused_attention_supported(q.t.dtype(), q.t.space(), q.t.dim(2)),
                op << ": the CUDA kernel takes bf16 or fp16 with head_dim 64 or 128, got "
                   << describe(q));
  return device;
}

/// The fused attention's dropout on the [B, S, S] probabilities (B = b x
/// heads): p in [0, 1) and, when p > 0, a site view [b, heads, S*S] that
/// covers them (the row of query i is C's i-th block of S).
void check_attention_dropout(const char* op, const AttentionDropout& d, index_t B, index_t S) {
  if (d.p == 0.0) return;
  MESH_VERIFY(d.p > 0.0 && d.p < 1.0, op << ": dropout p must be in [0, 1), got " << d.p);
  const DropoutSite& s = d.site;
  check_dropout_site(op, s, B * S * S, "the probabilities [B, S, S]");
  MESH_VERIFY(s.c == S * S && s.c_global == S * S && s.c_offset == 0,
              op << ": the dropout site's C = " << s.c << " (global " << s.c_global
                 << ", offset " << s.c_offset << ") must be the whole S*S = " << S * S);
}

/// Only the device token-major ops run cuDNN's fused attention, which draws
/// its own mask: every other path would silently draw meshtron's instead.
void refuse_cudnn_rng(const char* op, const AttentionDropout& d) {
  MESH_VERIFY(d.p == 0.0 || !d.cudnn_rng,
              op << ": attention dropout drawn by cuDNN (cudnn_rng) runs in the device "
                    "token-major ops only");
}

/// The host kernels' mask of a checked dropout.
kernels::AttentionMask attention_mask(const char* op, const AttentionDropout& d) {
  refuse_cudnn_rng(op, d);
  if (d.p == 0.0) return {};
  return {true, d.p, placement(d.site)};
}

#ifdef MESHTRON_HAVE_CUDA
/// The CUDA kernels' dropout of a checked dropout (B entries of S x S), with
/// its stored-decision words where given.
cuda::AttentionDropoutSite device_dropout(const char* op, const AttentionDropout& d, index_t B,
                                          index_t S, bool token_major = false) {
  if (d.p == 0.0) return {};
  if (!token_major) refuse_cudnn_rng(op, d);
  cuda::AttentionDropoutSite site{d.p, device_placement(d.site)};
  if (d.keep_bits.defined()) {
    const Shape shape = attention_keep_bits_shape(B, S);
    MESH_VERIFY(!d.keep_bits.is_host() && d.keep_bits.dtype() == DType::I32 &&
                    d.keep_bits.shape() == shape,
                op << ": keep_bits " << describe({"keep_bits", d.keep_bits})
                   << " must be a device I32 [" << shape[0] << ", " << shape[1] << ", "
                   << shape[2] << "]");
    site.keep_bits = static_cast<std::uint32_t*>(d.keep_bits.raw());
    site.keep_bits_words = shape[2];
  }
  MESH_VERIFY(!d.mask_drawn || (d.keep_bits.defined() && attention_mask_drawn_alone(S)),
              op << ": a mask drawn ahead needs keep_bits and S % 8 == 0 (S = " << S << ")");
  site.mask_drawn = d.mask_drawn;
  site.cudnn_rng = d.cudnn_rng;
  return site;
}
#endif
}  // namespace

void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             Tensor& out, Tensor& lse, const AttentionDropout& dropout) {
  const char* op = "fused_attention_forward";
  const Arg aq{"q", q}, ak{"k", k}, av{"v", v}, ao{"out", out}, al{"lse", lse};
  on_device(op, {aq, ak, av, ao, al});
  require_float_args(op, {aq, ak, av, ao});
  const bool device = check_attention(op, aq, {ak, av, ao}, al);
  for (const Arg& a : {aq, ak, av})
    MESH_VERIFY(!overlaps(out, a.t), op << ": out must not share memory with " << a.name);
  const index_t B = q.dim(0), S = q.dim(1), D = q.dim(2);
  check_attention_dropout(op, dropout, B, S);
  if (device) {
    ON_CUDA(cuda::fused_attention_forward(q.dtype(), q.raw(), k.raw(), v.raw(), B, S, D, scale,
                                          out.raw(), lse.data<float>(),
                                          device_dropout(op, dropout, B, S)));
    return;
  }
  const kernels::AttentionMask z = attention_mask(op, dropout);
  with_float_type(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::causal_attention_forward<Host>(q.data<T>(), k.data<T>(), v.data<T>(), B, S, D, scale,
                                            z, out.data<T>(), lse.data<T>());
  });
}

void draw_attention_mask(const AttentionDropout& dropout, index_t B, index_t S, void* stream) {
  const char* op = "draw_attention_mask";
  MESH_VERIFY(dropout.p > 0 && dropout.keep_bits.defined() && !dropout.keep_bits.is_host() &&
                  attention_mask_drawn_alone(S),
              op << ": needs p > 0, device keep_bits and S % 8 == 0 (S = " << S << ")");
  check_attention_dropout(op, dropout, B, S);
  ON_CUDA(cuda::draw_attention_mask(device_dropout(op, dropout, B, S), B, S, stream));
}

void fused_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, double scale,
                              Tensor& dq, Tensor& dk, Tensor& dv, const AttentionDropout& dropout) {
  const char* op = "fused_attention_backward";
  const Arg ado{"dout", dout}, aq{"q", q}, ak{"k", k}, av{"v", v}, ao{"out", out},
      al{"lse", lse}, adq{"dq", dq}, adk{"dk", dk}, adv{"dv", dv};
  on_device(op, {aq, ado, ak, av, ao, al, adq, adk, adv});
  require_float_args(op, {aq, ado, ak, av, ao, adq, adk, adv});
  const bool device = check_attention(op, aq, {ado, ak, av, ao, adq, adk, adv}, al);
  for (const Arg& g : {adq, adk, adv})
    for (const Arg& a : {ado, aq, ak, av, ao})
      MESH_VERIFY(!overlaps(g.t, a.t), op << ": " << g.name << " must not share memory with "
                                          << a.name);
  const index_t B = q.dim(0), S = q.dim(1), D = q.dim(2);
  check_attention_dropout(op, dropout, B, S);
  if (device) {
    Tensor delta = Tensor::empty({B, S}, DType::F32, q.space());
    ON_CUDA(cuda::fused_attention_backward(q.dtype(), dout.raw(), q.raw(), k.raw(), v.raw(),
                                           out.raw(), lse.data<float>(), B, S, D, scale,
                                           delta.data<float>(), dq.raw(), dk.raw(), dv.raw(),
                                           device_dropout(op, dropout, B, S)));
    return;
  }
  const kernels::AttentionMask z = attention_mask(op, dropout);
  with_float_type(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::causal_attention_backward<Host>(dout.data<T>(), q.data<T>(), k.data<T>(),
                                             v.data<T>(), out.data<T>(), lse.data<T>(), B, S, D,
                                             scale, z, dq.data<T>(), dk.data<T>(), dv.data<T>());
  });
}

namespace {
/// qkv [s*b, 3*heads*d] and context [s*b, heads*d] of one attention call;
/// returns d and whether on the device.
bool check_token_major(const char* op, const Arg& qkv, const Arg& context, index_t s, index_t b,
                       index_t heads, const Arg& lse, index_t& d) {
  MESH_VERIFY(s > 0 && b > 0 && heads > 0 && qkv.t.rank() == 2 && qkv.t.dim(0) == s * b &&
                  qkv.t.dim(1) % (3 * heads) == 0 && qkv.t.dim(1) > 0,
              op << ": " << describe(qkv) << " must be [s*b, 3*heads*d] for s = " << s
                 << ", b = " << b << ", heads = " << heads);
  d = qkv.t.dim(1) / (3 * heads);
  MESH_VERIFY(context.t.shape() == Shape({s * b, heads * d}),
              op << ": " << describe(context) << " must be [s*b, heads*d]");
  MESH_VERIFY(!overlaps(qkv.t, context.t),
              op << ": " << qkv.name << " and " << context.name << " must not share memory");
  const bool device = !qkv.t.is_host();
  require_stat_args(op, device, qkv, {lse});
  require_per_row(op, lse, b * heads * s, qkv);
  if (device)
    MESH_VERIFY(fused_attention_supported(qkv.t.dtype(), qkv.t.space(), d),
                op << ": the CUDA kernel takes bf16 or fp16 with head_dim 64 or 128, got "
                   << describe(qkv) << " with head_dim " << d);
  return device;
}
}  // namespace

void fused_attention_forward_token_major(const Tensor& qkv, index_t s, index_t b, index_t heads,
                                         double scale, Tensor& context, Tensor& lse,
                                         const AttentionDropout& dropout) {
  const char* op = "fused_attention_forward_token_major";
  const Arg aqkv{"qkv", qkv}, ac{"context", context}, al{"lse", lse};
  on_device(op, {aqkv, ac, al});
  require_float_args(op, {aqkv, ac});
  index_t d = 0;
  if (check_token_major(op, aqkv, ac, s, b, heads, al, d)) {
    check_attention_dropout(op, dropout, b * heads, s);
    ON_CUDA(cuda::fused_attention_forward_token_major(qkv.dtype(), qkv.raw(), s, b, heads, d,
                                                      scale, context.raw(), lse.data<float>(),
                                                      device_dropout(op, dropout, b * heads, s,
                                                                     /*token_major=*/true)));
    return;
  }
  Tensor parts[3];
  split_heads(qkv, s, b, heads, 3, parts);
  Tensor head_major = Tensor::empty(parts[0].shape(), qkv.dtype(), qkv.space());
  fused_attention_forward(parts[0], parts[1], parts[2], scale, head_major, lse, dropout);
  Tensor merged;
  merge_heads(&head_major, 1, s, b, heads, merged);
  context.copy_from(merged);
}

void fused_attention_backward_token_major(const Tensor& dcontext, const Tensor& qkv,
                                          const Tensor& context, const Tensor& lse, index_t s,
                                          index_t b, index_t heads, double scale, Tensor& dqkv,
                                          const AttentionDropout& dropout) {
  const char* op = "fused_attention_backward_token_major";
  const Arg adc{"dcontext", dcontext}, aqkv{"qkv", qkv}, ac{"context", context}, al{"lse", lse},
      adq{"dqkv", dqkv};
  on_device(op, {aqkv, adc, ac, al, adq});
  require_float_args(op, {aqkv, adc, ac, adq});
  index_t d = 0;
  const bool device = check_token_major(op, aqkv, ac, s, b, heads, al, d);
  MESH_VERIFY(dcontext.shape() == context.shape() && dqkv.shape() == qkv.shape(),
              op << ": " << describe(adc) << " must match " << describe(ac) << " and "
                 << describe(adq) << " " << describe(aqkv));
  for (const Arg& a : {adc, aqkv, ac})
    MESH_VERIFY(!overlaps(dqkv, a.t), op << ": dqkv must not share memory with " << a.name);
  if (device) {
    check_attention_dropout(op, dropout, b * heads, s);
    Tensor delta = Tensor::empty({b * heads, s}, DType::F32, qkv.space());
    ON_CUDA(cuda::fused_attention_backward_token_major(
        qkv.dtype(), dcontext.raw(), qkv.raw(), context.raw(), lse.data<float>(), s, b, heads, d,
        scale, delta.data<float>(), dqkv.raw(),
        device_dropout(op, dropout, b * heads, s, /*token_major=*/true)));
    return;
  }
  Tensor parts[3], dout, out;
  split_heads(qkv, s, b, heads, 3, parts);
  split_heads(dcontext, s, b, heads, 1, &dout);
  split_heads(context, s, b, heads, 1, &out);
  Tensor dparts[3];
  for (Tensor& g : dparts) g = Tensor::empty(parts[0].shape(), qkv.dtype(), qkv.space());
  fused_attention_backward(dout, parts[0], parts[1], parts[2], out, lse, scale, dparts[0],
                           dparts[1], dparts[2], dropout);
  Tensor merged;
  merge_heads(dparts, 3, s, b, heads, merged);
  dqkv.copy_from(merged);
}

// ------------------------------------------------------ GeLU and biases ---

namespace {

/// Checks of the fused-epilogue GEMMs: A, B and the output C 2-D, all of one
/// dtype (no fp32 C under bf16 here); returns the shape and whether the call
/// runs on the device.
std::pair<GemmShape, bool> check_fused_gemm(const char* op, const Tensor& A, bool trans_a,
                                            const Tensor& B, bool trans_b, const Tensor& C) {
  const bool device = check_gemm_operands(op, A, B, C, 2);
  const Arg aa{"A", A}, ac{"C", C};
  MESH_VERIFY(C.dtype() == A.dtype(), op << ": dtypes differ: " << describe(aa) << " but "
                                         << describe(ac));
  const GemmShape s = gemm_shape(op, A.dim(0), A.dim(1), trans_a, B.dim(0), B.dim(1), trans_b,
                                 C.dim(0), C.dim(1), aa, {"B", B}, ac);
  return {s, device};
}

/// An [M, N] companion of the output (pre_gelu, residual): same space,
/// dtype and shape as C, sharing no memory with A, B or C.
void check_companion(const char* op, const Arg& x, const Tensor& A, const Tensor& B,
                     const Tensor& C) {
  const Arg ac{"C", C};
  on_device(op, {ac, x});
  MESH_VERIFY(x.t.dtype() == C.dtype() && x.t.shape() == C.shape(),
              op << ": " << describe(x) << " must have the shape and dtype of " << describe(ac));
  MESH_VERIFY(!overlaps(x.t, A) && !overlaps(x.t, B) && !overlaps(x.t, C),
              op << ": " << x.name << " must not share memory with A, B or the output");
}

/// Whether the device runs the GeLU in cuBLASLt's epilogue: for bf16 and
/// fp16 storage only. The epilogue's tanh GeLU is not held to fp32's
/// rounding (llm.c measured slightly different losses with it, karpathy/
/// llm.c#653), and fp32 on the device is the validation path, held to 1e-5
/// of the host; so fp32 runs the GEMM and the gelu kernels, as before.
bool gelu_in_epilogue(DType t) { return t == DType::BF16 || t == DType::F16; }

/// gemm_bias_gelu, or with bias null gemm_gelu.
void gemm_gelu_forward(const char* op, const Tensor& A, bool trans_a, const Tensor& B,
                       bool trans_b, const Tensor* bias, Tensor& pre_gelu, Tensor& activated) {
  const auto [s, device] = check_fused_gemm(op, A, trans_a, B, trans_b, activated);
  check_companion(op, {"pre_gelu", pre_gelu}, A, B, activated);
  if (bias) {
    check_bias(op, *bias, activated, s.N);
    MESH_VERIFY(!overlaps(pre_gelu, *bias), op << ": pre_gelu must not share memory with bias");
  }
  if (s.M == 0 || s.N == 0) return;
  if (device && gelu_in_epilogue(A.dtype())) {
    ON_CUDA({
      cuda::GemmArgs g = gemm_args(A, trans_a, B, trans_b, activated, s);
      g.bias = bias ? bias->raw() : nullptr;
      g.gelu_pre_out = pre_gelu.raw();
      cuda::gemm(g);
    });
    return;
  }
  if (bias)
    gemm_bias(A, trans_a, B, trans_b, *bias, pre_gelu);
  else
    gemm(A, trans_a, B, trans_b, pre_gelu);
  gelu_forward(pre_gelu, activated);
}
}  // namespace

void gemm_bias_gelu(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b,
                    const Tensor& bias, Tensor& pre_gelu, Tensor& activated) {
  gemm_gelu_forward("gemm_bias_gelu", A, trans_a, B, trans_b, &bias, pre_gelu, activated);
}

void gemm_gelu(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& pre_gelu,
               Tensor& activated) {
  gemm_gelu_forward("gemm_gelu", A, trans_a, B, trans_b, nullptr, pre_gelu, activated);
}

void gemm_dgelu(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b,
                const Tensor& pre_gelu, Tensor& dpre, Tensor* dbias, GradStore bias_store) {
  const char* op = "gemm_dgelu";
  const auto [s, device] = check_fused_gemm(op, A, trans_a, B, trans_b, dpre);
  check_companion(op, {"pre_gelu", pre_gelu}, A, B, dpre);
  if (dbias) {
    const Arg adb{"dbias", *dbias};
    MESH_VERIFY(dbias->numel() == s.N, op << ": " << describe(adb) << " must hold " << s.N
                                          << " elements, one per column of dpre");
  }
  if (s.M == 0 || s.N == 0) return;
  if (device && gelu_in_epilogue(A.dtype())) {
    ON_CUDA({
      cuda::GemmArgs g = gemm_args(A, trans_a, B, trans_b, dpre, s);
      g.gelu_pre_in = pre_gelu.raw();
      cuda::gemm(g);
    });
  } else {
    // The two steps of the unfused path, through the same intermediate
    // (in place on the device, where memory is scarce; the kernel allows it).
    Tensor dactivated =
        device ? dpre : Tensor::empty(dpre.shape(), dpre.dtype(), dpre.space());
    gemm(A, trans_a, B, trans_b, dactivated);
    gelu_backward(dactivated, pre_gelu, dpre);
  }
  if (dbias) bias_backward(dpre, *dbias, bias_store);
}

void gemm_bias_residual(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b,
                        const Tensor& bias, const Tensor& residual, Tensor& out) {
  const char* op = "gemm_bias_residual";
  const auto [s, device] = check_fused_gemm(op, A, trans_a, B, trans_b, out);
  check_companion(op, {"residual", residual}, A, B, out);
  check_bias(op, bias, out, s.N);
  if (s.M == 0 || s.N == 0) return;
  if (device) {
    ON_CUDA({
      cuda::GemmArgs g = gemm_args(A, trans_a, B, trans_b, out, s);
      g.bias = bias.raw();
      g.c_in = residual.raw();
      g.beta = 1.0;
      cuda::gemm(g);
    });
    return;
  }
  gemm_bias(A, trans_a, B, trans_b, bias, out);
  add(residual, out, out);
}

void gelu_forward(const Tensor& x, Tensor& y) {
  const char* op = "gelu_forward";
  const Arg ax{"x", x}, ay{"y", y};
  const bool device = require_float_args(op, {ax, ay});
  require_same_numel(op, ax, ay);
  if (device) {
    ON_CUDA(cuda::gelu_forward(x.dtype(), x.raw(), x.numel(), y.raw()));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::gelu_forward<Host>(x.data<T>(), x.numel(), y.data<T>());
  });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "gelu_backward";
  const Arg ady{"dy", dy}, ax{"x", x}, adx{"dx", dx};
  const bool device = require_float_args(op, {ax, ady, adx});
  require_same_numel(op, ax, ady);
  require_same_numel(op, ax, adx);
  if (device) {
    ON_CUDA(cuda::gelu_backward(x.dtype(), dy.raw(), x.raw(), x.numel(), dx.raw()));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::gelu_backward<Host>(dy.data<T>(), x.data<T>(), x.numel(), dx.data<T>());
  });
}

void bias_add(Tensor& y, const Tensor& bias) {
  const char* op = "bias_add";
  const Arg ay{"y", y}, ab{"bias", bias};
  const bool device = require_float_args(op, {ay, ab});
  const index_t N = rows_of(op, ay), C = y.dim(-1);
  MESH_VERIFY(bias.numel() == C, op << ": " << describe(ab) << " must hold " << C
                                    << " elements, the last dim of " << describe(ay));
  if (device) {
    ON_CUDA(cuda::bias_add(y.dtype(), y.raw(), bias.raw(), N, C));
    return;
  }
  with_float_type(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::bias_add<Host>(y.data<T>(), bias.data<T>(), N, C);
  });
}

void linear_weight_grads(const Tensor& x, const Tensor& dy, Tensor& dweight, Tensor& dbias,
                         GradStore weight_store, GradStore bias_store) {
  const char* op = "linear_weight_grads";
  check_gemm_operands(op, x, dy, dweight, 2);
  const GemmShape s = gemm_shape(op, x.dim(0), x.dim(1), /*trans_a=*/true, dy.dim(0), dy.dim(1),
                                 /*trans_b=*/false, dweight.dim(0), dweight.dim(1), {"x", x},
                                 {"dy", dy}, {"dweight", dweight});
  const Arg adb{"dbias", dbias};
  MESH_VERIFY(dbias.numel() == s.N, op << ": " << describe(adb) << " must hold " << s.N
                                       << " elements, one per column of dy");
  gemm(x, true, dy, false, dweight, 1.0, gemm_beta(weight_store));
  bias_backward(dy, dbias, bias_store);
}

void bias_backward(const Tensor& dy, Tensor& dbias, GradStore store) {
  const char* op = "bias_backward";
  const Arg ady{"dy", dy}, adb{"dbias", dbias};
  on_device(op, {ady, adb});
  const bool device = require_float_args(op, {ady});
  require_grad_args(op, device, ady, {adb});
  const index_t N = rows_of(op, ady), C = dy.dim(-1);
  MESH_VERIFY(dbias.numel() == C, op << ": " << describe(adb) << " must hold " << C
                                     << " elements, the last dim of " << describe(ady));
  if (device) {
    ON_CUDA(cuda::bias_backward(dy.dtype(), dbias.dtype(), dy.raw(), N, C, dbias.raw(),
                                store == GradStore::Accumulate));
    return;
  }
  if (store == GradStore::Overwrite) dbias.fill(0.0);  // the host kernel adds
  with_float_type(dy.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::bias_backward<Host>(dy.data<T>(), N, C, dbias.data<T>());
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  const Arg aa{"a", a}, ab{"b", b}, ao{"out", out};
  const bool device = require_float_args(op, {aa, ab, ao});
  require_same_numel(op, aa, ab);
  require_same_numel(op, aa, ao);
  if (device) {
    ON_CUDA(cuda::add(a.dtype(), a.raw(), b.raw(), a.numel(), out.raw()));
    return;
  }
  with_float_type(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::add<Host>(a.data<T>(), b.data<T>(), a.numel(), out.data<T>());
  });
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  const char* op = "axpy";
  const Arg ax{"x", x}, ay{"y", y};
  const bool device = require_float_args(op, {ax, ay});
  require_same_numel(op, ax, ay);
  if (device) {
    ON_CUDA(cuda::axpy(x.dtype(), alpha, x.raw(), x.numel(), y.raw()));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::axpy<Host>(alpha, x.data<T>(), x.numel(), y.data<T>());
  });
}

void scale(Tensor& x, double alpha) {
  const bool device = require_float_args("scale", {{"x", x}});
  if (device) {
    ON_CUDA(cuda::scale(x.dtype(), x.raw(), x.numel(), alpha));
    return;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scale<Host>(x.data<T>(), x.numel(), alpha);
  });
}

// --------------------------------------------------------------- Dropout ---

namespace {
void check_dropout(const char* op, const Arg& in, double p, const DropoutSite& s, const Arg& out) {
  (void)require_float_args(op, {in, out});
  require_same_numel(op, in, out);
  MESH_VERIFY(p >= 0.0 && p < 1.0, op << ": p must be in [0, 1), got " << p);
  check_dropout_site(op, s, in.t.numel(), describe(in));
}

/// out = dropout(in), or residual + dropout(in) where residual is given.
void dropout_apply(const Tensor& in, double p, const DropoutSite& s, Tensor& out,
                   const Tensor* residual = nullptr) {
  if (!in.is_host()) {
    ON_CUDA(cuda::dropout_apply(in.dtype(), in.raw(), in.numel(), p, device_placement(s),
                                out.raw(), residual ? residual->raw() : nullptr));
    return;
  }
  const kernels::DropoutPlacement place = placement(s);
  with_float_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::dropout_apply<Host>(in.data<T>(), in.numel(), p, place, out.data<T>(),
                                 residual ? residual->data<T>() : nullptr);
  });
}
}  // namespace

void dropout_forward(const Tensor& x, double p, const DropoutSite& site, Tensor& y) {
  check_dropout("dropout_forward", {"x", x}, p, site, {"y", y});
  dropout_apply(x, p, site, y);
}

void dropout_add(const Tensor& x, const Tensor& residual, double p, const DropoutSite& site,
                 Tensor& out) {
  const char* op = "dropout_add";
  check_dropout(op, {"x", x}, p, site, {"out", out});
  const Arg ax{"x", x}, ar{"residual", residual};
  (void)require_float_args(op, {ax, ar});
  require_same_numel(op, ax, ar);
  dropout_apply(x, p, site, out, &residual);
}

void dropout_backward(const Tensor& dy, double p, const DropoutSite& site, Tensor& dx) {
  check_dropout("dropout_backward", {"dy", dy}, p, site, {"dx", dx});
  dropout_apply(dy, p, site, dx);
}

bool dropout_keep(std::uint64_t seed, std::uint32_t step, std::uint32_t stream,
                  std::uint64_t global_index, double p) {
  return kernels::dropout_keep(seed, step, stream, global_index, p);
}

// ------------------------------------------------------------- Embedding ---

void embedding_forward(const Tensor& ids, const Tensor& table, index_t vocab_begin, Tensor& out) {
  const char* op = "embedding_forward";
  const Arg ai{"ids", ids}, at{"table", table}, ao{"out", out};
  on_device(op, {ai, at, ao});
  require_index_arg(op, ai);
  const bool device = require_float_args(op, {at, ao});
  MESH_VERIFY(table.rank() == 2, op << ": " << describe(at) << " must be [V_local, H]");
  const index_t N = ids.numel(), V = table.dim(0), H = table.dim(1);
  MESH_VERIFY(out.rank() >= 1 && out.dim(-1) == H && out.numel() == N * H,
              op << ": " << describe(ao) << " must be [" << N << ", " << H << "] for "
                 << describe(ai) << " and " << describe(at));
  if (device) {
    ON_CUDA(cuda::embedding_forward(table.dtype(), ids.data<std::int32_t>(), N, table.raw(), V, H,
                                    vocab_begin, out.raw()));
    return;
  }
  with_float_type(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::embedding_forward<Host>(ids.data<std::int32_t>(), N, table.data<T>(), V, H,
                                     vocab_begin, out.data<T>());
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dout, index_t vocab_begin,
                        Tensor& dtable) {
  const char* op = "embedding_backward";
  const Arg ai{"ids", ids}, ad{"dout", dout}, at{"dtable", dtable};
  on_device(op, {ai, ad, at});
  require_index_arg(op, ai);
  const bool device = require_float_args(op, {ad});
  require_grad_args(op, device, ad, {at});
  MESH_VERIFY(dtable.rank() == 2, op << ": " << describe(at) << " must be [V_local, H]");
  const index_t N = ids.numel(), V = dtable.dim(0), H = dtable.dim(1);
  MESH_VERIFY(dout.rank() >= 1 && dout.dim(-1) == H && dout.numel() == N * H,
              op << ": " << describe(ad) << " must be [" << N << ", " << H << "] for "
                 << describe(ai) << " and " << describe(at));
  if (device) {
    ON_CUDA(cuda::embedding_backward(dout.dtype(), dtable.dtype(), ids.data<std::int32_t>(), N,
                                     dout.raw(), V, H, vocab_begin, dtable.raw()));
    return;
  }
  with_float_type(dtable.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::embedding_backward<Host>(ids.data<std::int32_t>(), N, dout.data<T>(), V, H,
                                      vocab_begin, dtable.data<T>());
  });
}

namespace {
/// out [N, H] with N a multiple of seq_len, table [P >= seq_len, H].
/// In the backward `table` is dtable (a gradient: fp32 allowed on the device
/// under bf16 dout) and `out` is dout.
index_t check_position_embedding(const char* op, const Arg& table, index_t seq_len,
                                 const Arg& out, bool table_is_grad) {
  on_device(op, {table, out});
  if (table_is_grad)
    require_grad_args(op, require_float_args(op, {out}), out, {table});
  else
    require_float_args(op, {table, out});
  MESH_VERIFY(table.t.rank() == 2 && seq_len > 0 && table.t.dim(0) >= seq_len,
              op << ": " << describe(table) << " must be [max_positions >= seq_len = " << seq_len
                 << ", H]");
  const index_t N = rows_of(op, out);
  MESH_VERIFY(out.t.dim(-1) == table.t.dim(1) && N % seq_len == 0,
              op << ": " << describe(out) << " must be [batch * " << seq_len << ", "
                 << table.t.dim(1) << "]");
  return N;
}
}  // namespace

void position_embedding_forward(const Tensor& table, index_t seq_len, Tensor& out) {
  const index_t N = check_position_embedding("position_embedding_forward", {"table", table},
                                             seq_len, {"out", out}, false);
  if (!table.is_host()) {
    ON_CUDA(cuda::position_embedding_forward(table.dtype(), table.raw(), seq_len, N, table.dim(1),
                                             out.raw()));
    return;
  }
  with_float_type(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::position_embedding_forward<Host>(table.data<T>(), table.dim(0), seq_len, N,
                                              table.dim(1), out.data<T>());
  });
}

void position_embedding_backward(const Tensor& dout, index_t seq_len, Tensor& dtable) {
  const index_t N = check_position_embedding("position_embedding_backward", {"dtable", dtable},
                                             seq_len, {"dout", dout}, true);
  if (!dout.is_host()) {
    ON_CUDA(cuda::position_embedding_backward(dout.dtype(), dtable.dtype(), dout.raw(), N,
                                              dtable.dim(1), seq_len, dtable.raw()));
    return;
  }
  with_float_type(dtable.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::position_embedding_backward<Host>(dout.data<T>(), N, dtable.dim(1), seq_len,
                                               dtable.dim(0), dtable.data<T>());
  });
}

// ------------------------------------------- Cross-entropy (vocab-parallel) ---

namespace {
kernels::VocabShard vocab_shard(const char* op, const Arg& logits, index_t vocab_begin,
                                index_t vocab_valid) {
  MESH_VERIFY(vocab_begin >= 0 && vocab_valid > 0, op << ": vocab_begin = " << vocab_begin
                                                      << " and vocab_valid = " << vocab_valid
                                                      << " must be >= 0 and > 0");
  const index_t V = logits.t.dim(-1);
  const index_t valid_local = std::clamp<index_t>(vocab_valid - vocab_begin, 0, V);
  return {vocab_begin, valid_local};
}

/// Every target names a real (unpadded) token of the global vocabulary.
/// Host targets only: a host copy of device targets would make the host wait
/// for the device twice per micro-batch. The kernels read only the logit of
/// a target inside their shard, so any int32 is memory-safe there, and the
/// training data is checked where it is read (data_source.cpp).
void check_targets(const char* op, const Tensor& targets, index_t vocab_valid) {
  if (!targets.is_host()) return;
  const std::int32_t* t = targets.data<std::int32_t>();
  for (index_t n = 0; n < targets.numel(); ++n)
    MESH_VERIFY(t[n] >= 0 && t[n] < vocab_valid, op << ": targets[" << n << "] = " << t[n]
                                                    << " is outside the vocabulary [0, "
                                                    << vocab_valid << ")");
}
}  // namespace

void cross_entropy_row_max(const Tensor& logits, index_t vocab_begin, index_t vocab_valid,
                           Tensor& row_max) {
  const char* op = "cross_entropy_row_max";
  const Arg al{"logits", logits}, am{"row_max", row_max};
  on_device(op, {al, am});
  const bool device = require_float_args(op, {al});
  require_stat_args(op, device, al, {am});
  const index_t N = rows_of(op, al);
  require_per_row(op, am, N, al);
  const kernels::VocabShard shard = vocab_shard(op, al, vocab_begin, vocab_valid);
  if (device) {
    ON_CUDA(cuda::cross_entropy_row_max(logits.dtype(), logits.raw(), N, logits.dim(-1),
                                        shard.valid_local, row_max.data<float>()));
    return;
  }
  with_float_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_row_max<Host>(logits.data<T>(), N, logits.dim(-1), shard,
                                         row_max.data<T>());
  });
}

namespace {

/// The checks of cross_entropy_partials and cross_entropy_row_stats (the
/// logits, the targets and three per-row statistics).
struct PartialsCall {
  index_t N;
  kernels::VocabShard shard;
  bool device;
};
PartialsCall check_partials_args(const char* op, const Tensor& logits, const Tensor& targets,
                                 const Tensor& row_max, const Tensor& sum_exp,
                                 const Tensor& target_logit, index_t vocab_begin,
                                 index_t vocab_valid) {
  const Arg al{"logits", logits}, at{"targets", targets}, am{"row_max", row_max},
      as{"sum_exp", sum_exp}, atl{"target_logit", target_logit};
  on_device(op, {al, at, am, as, atl});
  const bool device = require_float_args(op, {al});
  require_stat_args(op, device, al, {am, as, atl});
  require_index_arg(op, at);
  const index_t N = rows_of(op, al);
  for (const Arg& a : {at, am, as, atl}) require_per_row(op, a, N, al);
  const kernels::VocabShard shard = vocab_shard(op, al, vocab_begin, vocab_valid);
  check_targets(op, targets, vocab_valid);
  return {N, shard, device};
}

}  // namespace

void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            index_t vocab_begin, index_t vocab_valid, Tensor& sum_exp,
                            Tensor& target_logit) {
  const auto [N, shard, device] =
      check_partials_args("cross_entropy_partials", logits, targets, row_max, sum_exp,
                          target_logit, vocab_begin, vocab_valid);
  if (device) {
    ON_CUDA(cuda::cross_entropy_partials(logits.dtype(), logits.raw(), targets.data<std::int32_t>(),
                                         row_max.data<float>(), N, logits.dim(-1), vocab_begin,
                                         shard.valid_local, sum_exp.data<float>(),
                                         target_logit.data<float>()));
    return;
  }
  with_float_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_partials<Host>(logits.data<T>(), targets.data<std::int32_t>(),
                                          row_max.data<T>(), N, logits.dim(-1), shard,
                                          sum_exp.data<T>(), target_logit.data<T>());
  });
}

void cross_entropy_row_stats(const Tensor& logits, const Tensor& targets, index_t vocab_begin,
                             index_t vocab_valid, Tensor& row_max, Tensor& sum_exp,
                             Tensor& target_logit) {
  const auto [N, shard, device] =
      check_partials_args("cross_entropy_row_stats", logits, targets, row_max, sum_exp,
                          target_logit, vocab_begin, vocab_valid);
  if (device) {
    ON_CUDA(cuda::cross_entropy_row_stats(logits.dtype(), logits.raw(),
                                          targets.data<std::int32_t>(), N, logits.dim(-1),
                                          vocab_begin, shard.valid_local, row_max.data<float>(),
                                          sum_exp.data<float>(), target_logit.data<float>()));
    return;
  }
  cross_entropy_row_max(logits, vocab_begin, vocab_valid, row_max);
  cross_entropy_partials(logits, targets, row_max, vocab_begin, vocab_valid, sum_exp,
                         target_logit);
}

void cross_entropy_loss(const Tensor& sum_exp, const Tensor& target_logit, Tensor& loss) {
  const char* op = "cross_entropy_loss";
  const Arg as{"sum_exp", sum_exp}, at{"target_logit", target_logit}, al{"loss", loss};
  const bool device = require_float_args(op, {as, at, al});
  if (device)
    MESH_VERIFY(sum_exp.dtype() == DType::F32,
                op << ": per-row statistics are fp32 on the device, got " << describe(as));
  require_same_numel(op, as, at);
  require_same_numel(op, as, al);
  if (device) {
    ON_CUDA(cuda::cross_entropy_loss(sum_exp.data<float>(), target_logit.data<float>(), sum_exp.numel(),
                                     loss.data<float>()));
    return;
  }
  with_float_type(sum_exp.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_loss<Host>(sum_exp.data<T>(), target_logit.data<T>(), sum_exp.numel(),
                                      loss.data<T>());
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            const Tensor& sum_exp, const Tensor& dloss, index_t vocab_begin,
                            index_t vocab_valid, Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  const Arg al{"logits", logits}, at{"targets", targets}, am{"row_max", row_max},
      as{"sum_exp", sum_exp}, ad{"dloss", dloss}, adl{"dlogits", dlogits};
  on_device(op, {al, at, am, as, ad, adl});
  const bool device = require_float_args(op, {al});
  // On the device fp32 logits may give 16-bit dlogits directly (the operand
  // dtype of the LM head's backward GEMMs): no fp32 gradient, no cast pass.
  const bool narrowed = device && logits.dtype() == DType::F32 &&
                        (dlogits.dtype() == DType::BF16 || dlogits.dtype() == DType::F16);
  if (!narrowed) require_float_args(op, {al, adl});
  require_stat_args(op, device, al, {am, as, ad});
  require_index_arg(op, at);
  const index_t N = rows_of(op, al);
  for (const Arg& a : {at, am, as, ad}) require_per_row(op, a, N, al);
  MESH_VERIFY(dlogits.shape() == logits.shape(),
              op << ": " << describe(adl) << " must match " << describe(al));
  const kernels::VocabShard shard = vocab_shard(op, al, vocab_begin, vocab_valid);
  check_targets(op, targets, vocab_valid);
  if (device) {
    ON_CUDA(cuda::cross_entropy_backward(logits.dtype(), dlogits.dtype(), logits.raw(),
                                         targets.data<std::int32_t>(),
                                         row_max.data<float>(), sum_exp.data<float>(),
                                         dloss.data<float>(), N, logits.dim(-1), vocab_begin,
                                         shard.valid_local, dlogits.raw()));
    return;
  }
  with_float_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_backward<Host>(logits.data<T>(), targets.data<std::int32_t>(),
                                          row_max.data<T>(), sum_exp.data<T>(), dloss.data<T>(), N,
                                          logits.dim(-1), shard, dlogits.data<T>());
  });
}

// ----------------------------------------------------------------- AdamW ---

namespace {

/// The checks of adamw_step; returns whether it runs on the device.
bool check_adamw(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                 const Tensor& v, const AdamWParams& hp, const Tensor* compute_copy) {
  const Arg ap{"param", param}, ag{"grad", grad}, am{"m", m}, av{"v", v};
  const bool device = require_float_args(op, {ap, ag, am, av});
  if (device)
    MESH_VERIFY(param.dtype() == DType::F32,
                op << ": the CUDA path keeps fp32 master weights, gradients and moments; got "
                   << describe(ap));
  for (const Arg& a : {ag, am, av}) require_same_numel(op, ap, a);
  MESH_VERIFY(hp.step >= 1 && hp.lr >= 0 && hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 &&
                  hp.beta2 < 1 && hp.eps > 0 && hp.weight_decay >= 0,
              op << ": invalid hyper-parameters step=" << hp.step << " lr=" << hp.lr
                 << " beta1=" << hp.beta1 << " beta2=" << hp.beta2 << " eps=" << hp.eps
                 << " weight_decay=" << hp.weight_decay);
  if (compute_copy != nullptr) {
    const Arg ac{"compute_copy", *compute_copy};
    on_device(op, {ap, ac});
    require_same_numel(op, ap, ac);
    if (device)
      MESH_VERIFY(compute_copy->dtype() == DType::BF16 || compute_copy->dtype() == DType::F16,
                  op << ": the CUDA compute copy is bf16 or fp16; got " << describe(ac));
  }
  return device;
}

kernels::AdamWCoefficients adamw_coefficients(const AdamWParams& hp) {
  return kernels::adamw_coefficients(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.step);
}

/// The checks of AdamWParams::grad_sum_of_squares against the parameters'
/// memory space (device: whether they are on the device).
void check_clip_source(const char* op, const AdamWParams& hp, bool device) {
  const Tensor* s = hp.grad_sum_of_squares;
  if (s == nullptr) return;
  MESH_VERIFY(s->dtype() == DType::F64 && s->numel() == 1 && s->is_host() != device,
              op << ": grad_sum_of_squares is one F64 element where the parameters are; got "
                 << describe({"grad_sum_of_squares", *s}));
}

/// Resolves the clipping of hp on the host, where the norm can be read:
/// grad_scale from it; false when the update is to be skipped.
bool resolve_clip_on_host(AdamWParams& hp) {
  if (hp.grad_sum_of_squares == nullptr) return true;
  const double norm = std::sqrt(hp.grad_sum_of_squares->data<double>()[0]);
  if (hp.skip_nonfinite && !std::isfinite(norm)) return false;
  hp.grad_scale = clip_factor(norm, hp.clip_grad);
  hp.grad_sum_of_squares = nullptr;
  return true;
}

#ifdef MESHTRON_HAVE_CUDA
cuda::AdamWCoefficients cuda_coefficients(const kernels::AdamWCoefficients& k,
                                          const AdamWParams& hp) {
  const Tensor* s = hp.grad_sum_of_squares;
  return {k.lr,
          k.beta1,
          k.beta2,
          k.eps,
          k.weight_decay,
          k.step_size,
          k.inv_sqrt_bias2,
          float(hp.grad_scale),
          s ? s->data<double>() : nullptr,
          hp.clip_grad,
          hp.skip_nonfinite};
}
#endif

/// hp with the weight decay of one tensor of a multi-tensor step.
AdamWParams tensor_params(const AdamWParams& hp, bool decay) {
  AdamWParams out = hp;
  out.weight_decay = decay ? hp.weight_decay : 0.0;
  return out;
}

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp) {
  adamw_step(param, grad, m, v, hp, nullptr);
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp,
                Tensor* compute_copy) {
  const bool device = check_adamw("adamw_step", param, grad, m, v, hp, compute_copy);
  check_clip_source("adamw_step", hp, device);
  const kernels::AdamWCoefficients k = adamw_coefficients(hp);
  if (device) {
    ON_CUDA(cuda::adamw_step(param.data<float>(), grad.data<float>(), m.data<float>(),
                             v.data<float>(), param.numel(), cuda_coefficients(k, hp),
                             compute_copy ? compute_copy->dtype() : DType::BF16,
                             compute_copy ? compute_copy->raw() : nullptr));
    return;
  }
  AdamWParams resolved = hp;
  if (!resolve_clip_on_host(resolved)) return;
  with_float_type(param.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::adamw_step<Host>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(),
                              param.numel(), k, resolved.grad_scale);
  });
  if (compute_copy) cast(param, *compute_copy);
}

struct MultiTensorAdamW::DeviceTable {
#ifdef MESHTRON_HAVE_CUDA
  cuda::AdamWTable table;
#endif
};

MultiTensorAdamW::MultiTensorAdamW() = default;
MultiTensorAdamW::~MultiTensorAdamW() = default;
MultiTensorAdamW::MultiTensorAdamW(MultiTensorAdamW&&) noexcept = default;
MultiTensorAdamW& MultiTensorAdamW::operator=(MultiTensorAdamW&&) noexcept = default;

long MultiTensorAdamW::table_uploads() const {
#ifdef MESHTRON_HAVE_CUDA
  return table_ ? table_->table.uploads() : 0;
#else
  return 0;
#endif
}

void MultiTensorAdamW::step(const std::vector<AdamWTensor>& tensors, const AdamWParams& hp) {
  const char* op = "MultiTensorAdamW::step";
  if (tensors.empty()) return;
  const bool device = !tensors[0].param.is_host();
  for (const AdamWTensor& t : tensors) {
    const AdamWParams one = tensor_params(hp, t.decay);
    const Tensor* copy = t.compute_copy.defined() ? &t.compute_copy : nullptr;
    MESH_VERIFY(check_adamw(op, t.param, t.grad, t.m, t.v, one, copy) == device,
                op << ": the tensors are in different memory spaces");
  }
  check_clip_source(op, hp, device);
  if (!device) {  // the per-tensor host kernels, bit for bit what the device does at once
    AdamWParams resolved = hp;  // the norm read once, not once per tensor
    if (!resolve_clip_on_host(resolved)) return;
    for (const AdamWTensor& t : tensors) {
      AdamWTensor u = t;  // handles share the storage: updates land in t's tensors
      adamw_step(u.param, u.grad, u.m, u.v, tensor_params(resolved, t.decay),
                 t.compute_copy.defined() ? &u.compute_copy : nullptr);
    }
    return;
  }
#ifdef MESHTRON_HAVE_CUDA
  std::vector<cuda::AdamWTensorPtrs> ptrs;
  bool any_copy = false;
  DType copy_dtype = DType::BF16;  // any, without copies
  for (const AdamWTensor& t : tensors) {
    void* copy = nullptr;
    if (t.compute_copy.defined()) {
      if (!any_copy) copy_dtype = t.compute_copy.dtype(), any_copy = true;
      MESH_VERIFY(t.compute_copy.dtype() == copy_dtype,
                  op << ": compute copies of one step share a dtype; got "
                     << dtype_name(copy_dtype) << " and " << dtype_name(t.compute_copy.dtype()));
      copy = t.compute_copy.raw();
    }
    ptrs.push_back({t.param.data<float>(), t.grad.data<float>(), t.m.data<float>(),
                    t.v.data<float>(), copy, t.param.numel(), t.decay ? hp.weight_decay : 0.0});
  }
  if (!table_) table_ = std::make_unique<DeviceTable>();
  table_->table.step(ptrs, copy_dtype, cuda_coefficients(adamw_coefficients(hp), hp));
#endif
}

// ------------------------------------------------------------ Reductions ---

double sum_of_squares(const Tensor& x) {
  const bool device = require_float_args("sum_of_squares", {{"x", x}});
  double total = 0;
  if (device) {
    ON_CUDA(total = cuda::sum_of_squares(x.dtype(), x.raw(), x.numel()));
    return total;
  }
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    total = kernels::sum_of_squares<Host>(x.data<T>(), x.numel());
  });
  return total;
}

namespace {

/// The launchers' view of a list of device tensors (sum_of_squares_many*),
/// each checked to be floating point and on the device.
struct DeviceTensorList {
  std::vector<DType> types;
  std::vector<const void*> data;
  std::vector<index_t> sizes;
  explicit DeviceTensorList(const char* op, const std::vector<Tensor>& xs) {
    for (const Tensor& x : xs) {
      require_float_args(op, {{"x", x}});
      MESH_VERIFY(x.space() == MemorySpace::Cuda, op << ": tensors in different spaces");
      types.push_back(x.dtype());
      data.push_back(x.raw());
      sizes.push_back(x.numel());
    }
  }
  int count() const { return int(types.size()); }
};

}  // namespace

double sum_of_squares(const std::vector<Tensor>& xs) {
  if (xs.empty()) return 0.0;
  if (xs.front().space() == MemorySpace::Cuda) {
    const DeviceTensorList l("sum_of_squares", xs);
    double total = 0;
    ON_CUDA(total = cuda::sum_of_squares_many(l.count(), l.types.data(), l.data.data(),
                                              l.sizes.data()));
    return total;
  }
  double total = 0;  // the host sums tensor by tensor, as before
  for (const Tensor& x : xs) total += sum_of_squares(x);
  return total;
}

void sum_of_squares_into(const std::vector<Tensor>& xs, Tensor& total) {
  const char* op = "sum_of_squares_into";
  MESH_VERIFY(total.dtype() == DType::F64 && total.numel() == 1,
              op << ": total is one F64 element; got " << describe({"total", total}));
  if (total.is_host()) {
    total.data<double>()[0] = sum_of_squares(xs);
    return;
  }
  const DeviceTensorList l(op, xs);
  ON_CUDA(cuda::sum_of_squares_many_to(l.count(), l.types.data(), l.data.data(), l.sizes.data(),
                                       total.data<double>()));
}

}  // namespace meshtron::ops
