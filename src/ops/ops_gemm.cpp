// The GEMM ops (ops.hpp: GEMM, and the GEMMs with fused epilogues): CBLAS
// on the host, cuBLASLt on the device (kernels/cuda/gemm.cu).
#include <cblas.h>

#include <cstdint>
#include <utility>

#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

// ------------------------------------------------------------------ GEMM ---

namespace {

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

// ----------------------------------------------- GEMMs with fused epilogues ---

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
/// of the host; so fp32 runs the GEMM and then the gelu kernels.
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

}  // namespace meshtron::ops
