// The op table's dispatch (see ops.hpp): check every argument once, with
// messages that name the op, the argument and the shapes, then hand host
// tensors to the portable Kokkos kernels (kernels/kokkos/) or to CBLAS, by
// dtype. Device tensors stop with an error until the CUDA path is built.
//
// Shape convention of the checks: ops "over the last dim" accept any rank,
// the leading dimensions flattening into rows (x [B, S, H] is N = B*S rows
// of H); per-row tensors (mean, rstd, targets, ...) must hold N elements.
#include <cblas.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <initializer_list>

#include "kernels/kokkos/adamw.hpp"
#include "kernels/kokkos/cross_entropy.hpp"
#include "kernels/kokkos/dropout.hpp"
#include "kernels/kokkos/elementwise.hpp"
#include "kernels/kokkos/embedding.hpp"
#include "kernels/kokkos/gelu.hpp"
#include "kernels/kokkos/layernorm.hpp"
#include "kernels/kokkos/softmax.hpp"
#include "ops/ops.hpp"

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

void require_host(const char* op, const Arg& a) {
  MESH_VERIFY(a.t.defined(), op << ": " << a.name << " is an undefined tensor");
  MESH_VERIFY(a.t.is_host(),
              op << ": " << describe(a) << " is in CUDA memory, but the CUDA path is not built");
}

/// Host tensors sharing one floating dtype, fp32 or fp64 (the host path).
void require_float_args(const char* op, std::initializer_list<Arg> args) {
  for (const Arg& a : args) require_host(op, a);
  const Arg& first = *args.begin();
  MESH_VERIFY(first.t.dtype() == DType::F32 || first.t.dtype() == DType::F64,
              op << ": the host path computes in fp32 or fp64, got " << describe(first));
  for (const Arg& a : args)
    MESH_VERIFY(a.t.dtype() == first.t.dtype(),
                op << ": dtypes differ: " << describe(first) << " but " << describe(a));
}

/// Host int32 index tensor (token ids, targets).
void require_index_arg(const char* op, const Arg& a) {
  require_host(op, a);
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

void check_gemm_operands(const char* op, const Tensor& A, const Tensor& B, const Tensor& C,
                         int rank) {
  const Arg a{"A", A}, b{"B", B}, c{"C", C};
  require_float_args(op, {a, b, c});
  for (const Arg& x : {a, b, c})
    MESH_VERIFY(x.t.rank() == rank, op << ": " << describe(x) << " must be " << rank << "-D");
  MESH_VERIFY(!overlaps(C, A) && !overlaps(C, B), op << ": C must not share memory with A or B");
  for (const Arg& x : {a, b, c})
    for (index_t d : x.t.shape())
      MESH_VERIFY(d <= index_t(INT32_MAX), op << ": " << describe(x) << " exceeds CBLAS's int");
}

}  // namespace

void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C, double alpha,
          double beta) {
  const char* op = "gemm";
  check_gemm_operands(op, A, B, C, 2);
  const GemmShape s = gemm_shape(op, A.dim(0), A.dim(1), trans_a, B.dim(0), B.dim(1), trans_b,
                                 C.dim(0), C.dim(1), {"A", A}, {"B", B}, {"C", C});
  if (s.M == 0 || s.N == 0) return;
  with_float_type(A.dtype(), [&](auto zero) {
    using T = decltype(zero);
    cblas_gemm(trans_a, trans_b, s, alpha, A.data<T>(), B.data<T>(), beta, C.data<T>());
  });
}

void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& C,
                  double alpha, double beta) {
  const char* op = "gemm_batched";
  check_gemm_operands(op, A, B, C, 3);
  const index_t batch = A.dim(0);
  MESH_VERIFY(B.dim(0) == batch && C.dim(0) == batch,
              op << ": batch sizes differ: A " << shape_string(A.shape()) << ", B "
                 << shape_string(B.shape()) << ", C " << shape_string(C.shape()));
  const GemmShape s = gemm_shape(op, A.dim(1), A.dim(2), trans_a, B.dim(1), B.dim(2), trans_b,
                                 C.dim(1), C.dim(2), {"A", A}, {"B", B}, {"C", C});
  if (s.M == 0 || s.N == 0) return;
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
  require_float_args(op, {ax, ag, ab, ay, am, ar});
  const index_t N = rows_of(op, ax), H = x.dim(-1);
  MESH_VERIFY(gamma.numel() == H && beta.numel() == H,
              op << ": " << describe(ag) << " and " << describe(ab) << " must hold " << H
                 << " elements, the last dim of " << describe(ax));
  MESH_VERIFY(y.shape() == x.shape(), op << ": " << describe(ay) << " must match " << describe(ax));
  require_per_row(op, am, N, ax);
  require_per_row(op, ar, N, ax);
  MESH_VERIFY(eps > 0, op << ": eps must be positive, got " << eps);
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::layernorm_forward<Host>(x.data<T>(), gamma.data<T>(), beta.data<T>(), N, H, eps,
                                     y.data<T>(), mean.data<T>(), rstd.data<T>());
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const char* op = "layernorm_backward";
  const Arg ady{"dy", dy}, ax{"x", x}, ag{"gamma", gamma}, am{"mean", mean}, ar{"rstd", rstd},
      adx{"dx", dx}, adg{"dgamma", dgamma}, adb{"dbeta", dbeta};
  require_float_args(op, {ax, ady, ag, am, ar, adx, adg, adb});
  const index_t N = rows_of(op, ax), H = x.dim(-1);
  MESH_VERIFY(
      dy.shape() == x.shape() && dx.shape() == x.shape(),
      op << ": " << describe(ady) << " and " << describe(adx) << " must match " << describe(ax));
  for (const Arg& a : {ag, adg, adb})
    MESH_VERIFY(a.t.numel() == H, op << ": " << describe(a) << " must hold " << H
                                     << " elements, the last dim of " << describe(ax));
  require_per_row(op, am, N, ax);
  require_per_row(op, ar, N, ax);
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::layernorm_backward<Host>(dy.data<T>(), x.data<T>(), gamma.data<T>(), mean.data<T>(),
                                      rstd.data<T>(), N, H, dx.data<T>(), dgamma.data<T>(),
                                      dbeta.data<T>());
  });
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
  require_float_args(op, {as, ap});
  const index_t B = softmax_batch(op, as), S = scores.dim(-1);
  MESH_VERIFY(probs.shape() == scores.shape(),
              op << ": " << describe(ap) << " must match " << describe(as));
  with_float_type(scores.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scaled_causal_softmax_forward<Host>(scores.data<T>(), B, S, scale, probs.data<T>());
  });
}

void scaled_causal_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale,
                                    Tensor& dscores) {
  const char* op = "scaled_causal_softmax_backward";
  const Arg adp{"dprobs", dprobs}, ap{"probs", probs}, ads{"dscores", dscores};
  require_float_args(op, {ap, adp, ads});
  const index_t B = softmax_batch(op, ap), S = probs.dim(-1);
  MESH_VERIFY(
      dprobs.shape() == probs.shape() && dscores.shape() == probs.shape(),
      op << ": " << describe(adp) << " and " << describe(ads) << " must match " << describe(ap));
  with_float_type(probs.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scaled_causal_softmax_backward<Host>(dprobs.data<T>(), probs.data<T>(), B, S, scale,
                                                  dscores.data<T>());
  });
}

// ------------------------------------------------------ GeLU and biases ---

void gelu_forward(const Tensor& x, Tensor& y) {
  const char* op = "gelu_forward";
  const Arg ax{"x", x}, ay{"y", y};
  require_float_args(op, {ax, ay});
  require_same_numel(op, ax, ay);
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::gelu_forward<Host>(x.data<T>(), x.numel(), y.data<T>());
  });
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  const char* op = "gelu_backward";
  const Arg ady{"dy", dy}, ax{"x", x}, adx{"dx", dx};
  require_float_args(op, {ax, ady, adx});
  require_same_numel(op, ax, ady);
  require_same_numel(op, ax, adx);
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::gelu_backward<Host>(dy.data<T>(), x.data<T>(), x.numel(), dx.data<T>());
  });
}

void bias_add(Tensor& y, const Tensor& bias) {
  const char* op = "bias_add";
  const Arg ay{"y", y}, ab{"bias", bias};
  require_float_args(op, {ay, ab});
  const index_t N = rows_of(op, ay), C = y.dim(-1);
  MESH_VERIFY(bias.numel() == C, op << ": " << describe(ab) << " must hold " << C
                                    << " elements, the last dim of " << describe(ay));
  with_float_type(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::bias_add<Host>(y.data<T>(), bias.data<T>(), N, C);
  });
}

void bias_backward(const Tensor& dy, Tensor& dbias) {
  const char* op = "bias_backward";
  const Arg ady{"dy", dy}, adb{"dbias", dbias};
  require_float_args(op, {ady, adb});
  const index_t N = rows_of(op, ady), C = dy.dim(-1);
  MESH_VERIFY(dbias.numel() == C, op << ": " << describe(adb) << " must hold " << C
                                     << " elements, the last dim of " << describe(ady));
  with_float_type(dy.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::bias_backward<Host>(dy.data<T>(), N, C, dbias.data<T>());
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const char* op = "add";
  const Arg aa{"a", a}, ab{"b", b}, ao{"out", out};
  require_float_args(op, {aa, ab, ao});
  require_same_numel(op, aa, ab);
  require_same_numel(op, aa, ao);
  with_float_type(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::add<Host>(a.data<T>(), b.data<T>(), a.numel(), out.data<T>());
  });
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  const char* op = "axpy";
  const Arg ax{"x", x}, ay{"y", y};
  require_float_args(op, {ax, ay});
  require_same_numel(op, ax, ay);
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::axpy<Host>(alpha, x.data<T>(), x.numel(), y.data<T>());
  });
}

void scale(Tensor& x, double alpha) {
  require_float_args("scale", {{"x", x}});
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::scale<Host>(x.data<T>(), x.numel(), alpha);
  });
}

// --------------------------------------------------------------- Dropout ---

namespace {
void check_dropout(const char* op, const Arg& in, double p, const DropoutSite& s, const Arg& out) {
  require_float_args(op, {in, out});
  require_same_numel(op, in, out);
  MESH_VERIFY(p >= 0.0 && p < 1.0, op << ": p must be in [0, 1), got " << p);
  MESH_VERIFY(s.a >= 0 && s.b > 0 && s.c > 0 && s.a * s.b * s.c == in.t.numel(),
              op << ": site view [" << s.a << ", " << s.b << ", " << s.c << "] does not cover "
                 << describe(in));
  MESH_VERIFY(s.a_offset >= 0 && s.b_offset >= 0 && s.c_offset >= 0 &&
                  s.b + s.b_offset <= s.b_global && s.c + s.c_offset <= s.c_global,
              op << ": site view [" << s.a << ", " << s.b << ", " << s.c << "] at offsets ("
                 << s.a_offset << ", " << s.b_offset << ", " << s.c_offset
                 << ") does not fit in the global [*, " << s.b_global << ", " << s.c_global << "]");
}

void dropout_apply(const Tensor& in, double p, const DropoutSite& s, Tensor& out) {
  const kernels::DropoutPlacement place{s.seed,     s.step,     s.stream,   s.b,        s.c,
                                        s.a_offset, s.b_offset, s.c_offset, s.b_global, s.c_global};
  with_float_type(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::dropout_apply<Host>(in.data<T>(), in.numel(), p, place, out.data<T>());
  });
}
}  // namespace

void dropout_forward(const Tensor& x, double p, const DropoutSite& site, Tensor& y) {
  check_dropout("dropout_forward", {"x", x}, p, site, {"y", y});
  dropout_apply(x, p, site, y);
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
  require_index_arg(op, ai);
  require_float_args(op, {at, ao});
  MESH_VERIFY(table.rank() == 2, op << ": " << describe(at) << " must be [V_local, H]");
  const index_t N = ids.numel(), V = table.dim(0), H = table.dim(1);
  MESH_VERIFY(out.rank() >= 1 && out.dim(-1) == H && out.numel() == N * H,
              op << ": " << describe(ao) << " must be [" << N << ", " << H << "] for "
                 << describe(ai) << " and " << describe(at));
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
  require_index_arg(op, ai);
  require_float_args(op, {at, ad});
  MESH_VERIFY(dtable.rank() == 2, op << ": " << describe(at) << " must be [V_local, H]");
  const index_t N = ids.numel(), V = dtable.dim(0), H = dtable.dim(1);
  MESH_VERIFY(dout.rank() >= 1 && dout.dim(-1) == H && dout.numel() == N * H,
              op << ": " << describe(ad) << " must be [" << N << ", " << H << "] for "
                 << describe(ai) << " and " << describe(at));
  with_float_type(dtable.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::embedding_backward<Host>(ids.data<std::int32_t>(), N, dout.data<T>(), V, H,
                                      vocab_begin, dtable.data<T>());
  });
}

namespace {
/// out [N, H] with N a multiple of seq_len, table [P >= seq_len, H].
index_t check_position_embedding(const char* op, const Arg& table, index_t seq_len,
                                 const Arg& out) {
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
                                             seq_len, {"out", out});
  with_float_type(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::position_embedding_forward<Host>(table.data<T>(), table.dim(0), seq_len, N,
                                              table.dim(1), out.data<T>());
  });
}

void position_embedding_backward(const Tensor& dout, index_t seq_len, Tensor& dtable) {
  const index_t N = check_position_embedding("position_embedding_backward", {"dtable", dtable},
                                             seq_len, {"dout", dout});
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
void check_targets(const char* op, const Tensor& targets, index_t vocab_valid) {
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
  require_float_args(op, {al, am});
  const index_t N = rows_of(op, al);
  require_per_row(op, am, N, al);
  const kernels::VocabShard shard = vocab_shard(op, al, vocab_begin, vocab_valid);
  with_float_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_row_max<Host>(logits.data<T>(), N, logits.dim(-1), shard,
                                         row_max.data<T>());
  });
}

void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                            index_t vocab_begin, index_t vocab_valid, Tensor& sum_exp,
                            Tensor& target_logit) {
  const char* op = "cross_entropy_partials";
  const Arg al{"logits", logits}, at{"targets", targets}, am{"row_max", row_max},
      as{"sum_exp", sum_exp}, atl{"target_logit", target_logit};
  require_float_args(op, {al, am, as, atl});
  require_index_arg(op, at);
  const index_t N = rows_of(op, al);
  for (const Arg& a : {at, am, as, atl}) require_per_row(op, a, N, al);
  const kernels::VocabShard shard = vocab_shard(op, al, vocab_begin, vocab_valid);
  check_targets(op, targets, vocab_valid);
  with_float_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_partials<Host>(logits.data<T>(), targets.data<std::int32_t>(),
                                          row_max.data<T>(), N, logits.dim(-1), shard,
                                          sum_exp.data<T>(), target_logit.data<T>());
  });
}

void cross_entropy_loss(const Tensor& sum_exp, const Tensor& target_logit, Tensor& loss) {
  const char* op = "cross_entropy_loss";
  const Arg as{"sum_exp", sum_exp}, at{"target_logit", target_logit}, al{"loss", loss};
  require_float_args(op, {as, at, al});
  require_same_numel(op, as, at);
  require_same_numel(op, as, al);
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
  require_float_args(op, {al, am, as, ad, adl});
  require_index_arg(op, at);
  const index_t N = rows_of(op, al);
  for (const Arg& a : {at, am, as, ad}) require_per_row(op, a, N, al);
  MESH_VERIFY(dlogits.shape() == logits.shape(),
              op << ": " << describe(adl) << " must match " << describe(al));
  const kernels::VocabShard shard = vocab_shard(op, al, vocab_begin, vocab_valid);
  check_targets(op, targets, vocab_valid);
  with_float_type(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::cross_entropy_backward<Host>(logits.data<T>(), targets.data<std::int32_t>(),
                                          row_max.data<T>(), sum_exp.data<T>(), dloss.data<T>(), N,
                                          logits.dim(-1), shard, dlogits.data<T>());
  });
}

// ----------------------------------------------------------------- AdamW ---

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& hp) {
  const char* op = "adamw_step";
  const Arg ap{"param", param}, ag{"grad", grad}, am{"m", m}, av{"v", v};
  require_float_args(op, {ap, ag, am, av});
  for (const Arg& a : {ag, am, av}) require_same_numel(op, ap, a);
  MESH_VERIFY(hp.step >= 1 && hp.lr >= 0 && hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 &&
                  hp.beta2 < 1 && hp.eps > 0 && hp.weight_decay >= 0,
              op << ": invalid hyper-parameters step=" << hp.step << " lr=" << hp.lr
                 << " beta1=" << hp.beta1 << " beta2=" << hp.beta2 << " eps=" << hp.eps
                 << " weight_decay=" << hp.weight_decay);
  const kernels::AdamWCoefficients k =
      kernels::adamw_coefficients(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.step);
  with_float_type(param.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::adamw_step<Host>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(),
                              param.numel(), k);
  });
}

// ------------------------------------------------------------ Reductions ---

double sum_of_squares(const Tensor& x) {
  require_float_args("sum_of_squares", {{"x", x}});
  double total = 0;
  with_float_type(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    total = kernels::sum_of_squares<Host>(x.data<T>(), x.numel());
  });
  return total;
}

}  // namespace meshtron::ops
