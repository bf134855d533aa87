// ==================================================================== GEMM ==
//
// Row-major GEMMs through cuBLASLt. cuBLASLt is column-major; a row-major
// X [r, c] with row length ld is, read column-major, X^T [c, r] with the same
// ld. So row-major C = op(A) op(B) is computed as the column-major product
//   C^T [N, M] = op(B)^T op(A)^T,
// i.e. cuBLASLt's first operand is B's storage (transposed iff trans_b), its
// second is A's storage (transposed iff trans_a), m = N, n = M, k = K.
//
// Precision: CUBLAS_COMPUTE_32F with fp32 scale, for fp32 and bf16 inputs
// alike. For fp32 this keeps TF32 off (the host path's numbers, 1e-5); for
// bf16 it accumulates in fp32 and may write C in bf16 or fp32 (the fp32
// main_grad of Megatron's fused weight-gradient accumulation, beta = 1).
//
// Bias epilogue (gemm_bias, a linear layer's forward): row-major C [M, N]
// plus bias [N] broadcast over its rows is, column-major, C^T [N, M] plus a
// bias of length m = N broadcast over its columns, which is exactly
// CUBLASLT_EPILOGUE_BIAS ("bias vector length must match matrix D rows").
// The bias has D's dtype (cuBLASLt's default, set explicitly). Where the
// heuristic offers no algorithm with the epilogue (e.g. for an oddly aligned
// bias), the GEMM runs plain and the bias_add kernel follows.
//
// The handle, a 32 MiB workspace and the heuristic's choice per problem
// (shape, dtypes, transposes, batch, pointer alignment, epilogue) are
// cached: after the first call of a shape, a GEMM is descriptor setup plus
// one launch.
#include <cublasLt.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "kernels/cuda/common.cuh"
#include "ops/ops_cuda.hpp"
#include "tensor/device_allocator.hpp"

namespace meshtron::cuda {
namespace {

#define CUBLAS_CHECK(call)                                                            \
  do {                                                                                \
    cublasStatus_t mesh_cublas_st_ = (call);                                          \
    if (mesh_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                     \
      ::meshtron::fatal(MESH_MSG(#call << " failed: status " << int(mesh_cublas_st_)), \
                        __FILE__, __LINE__);                                          \
  } while (0)

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's advice for Hopper

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: break;
  }
  MESH_VERIFY(false, "gemm: the CUDA path takes fp32, bf16 or fp16, got " << dtype_name(t));
  return CUDA_R_32F;
}

/// Largest power of two (<= 256) dividing the address: cuBLASLt's kernels
/// assume 256-byte alignment unless told otherwise, and views made by
/// slice_rows() may be less aligned.
std::uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

/// Everything the heuristic's choice depends on (the last two: whether the
/// bias epilogue is on, and the bias pointer's alignment, which cuBLASLt
/// reads from the descriptor when it chooses).
using ProblemKey = std::tuple<int, int, bool, bool, index_t, index_t, index_t, index_t, index_t,
                              index_t, index_t, index_t, index_t, index_t, std::uint32_t,
                              std::uint32_t, std::uint32_t, bool, bool, std::uint32_t>;

/// RAII for the four descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descriptors() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

/// A stored row-major matrix of `batch` entries, as the column-major layout
/// cuBLASLt sees: rows = stored cols, cols = stored rows.
void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, index_t stored_rows,
                 index_t stored_cols, index_t ld, index_t batch, index_t stride) {
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, std::uint64_t(stored_cols),
                                          std::uint64_t(stored_rows), std::int64_t(ld)));
  if (batch > 1) {
    const std::int32_t count = std::int32_t(batch);
    const std::int64_t offset = stride;
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                  &count, sizeof(count)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        *layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof(offset)));
  }
}

/// Turns on the bias epilogue: bias [m = N] of D's dtype, one per row of the
/// column-major D = C^T, i.e. one per column of our row-major C.
void set_bias_epilogue(cublasLtMatmulDesc_t op, const void* bias, DType c) {
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const std::int32_t bias_type = cuda_type(c);
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof(epilogue)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof(bias)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                              &bias_type, sizeof(bias_type)));
}

class GemmEngine {
 public:
  /// Launches the GEMM. Returns false, launching nothing, only when a bias
  /// epilogue was asked for and cuBLASLt has no algorithm for it.
  bool run(const GemmArgs& g) {
    std::lock_guard<std::mutex> lock(mutex_);
    init();
    Descriptors d;
    const cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // B's storage
    const cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // A's storage
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                                sizeof(op_first)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                                sizeof(op_second)));
    // Stored shapes: B is [K, N] (or [N, K] if trans_b), A is [M, K] (or [K, M]).
    const index_t b_rows = g.trans_b ? g.N : g.K, b_cols = g.trans_b ? g.K : g.N;
    const index_t a_rows = g.trans_a ? g.K : g.M, a_cols = g.trans_a ? g.M : g.K;
    make_layout(&d.a, cuda_type(g.ab), b_rows, b_cols, g.ldb, g.batch, g.stride_b);
    make_layout(&d.b, cuda_type(g.ab), a_rows, a_cols, g.lda, g.batch, g.stride_a);
    make_layout(&d.c, cuda_type(g.c), g.M, g.N, g.ldc, g.batch, g.stride_c);
    if (g.bias) set_bias_epilogue(d.op, g.bias, g.c);

    const std::uint32_t align_a = alignment_of(g.B), align_b = alignment_of(g.A),
                        align_c = alignment_of(g.C);
    const std::uint32_t align_bias = g.bias ? alignment_of(g.bias) : 0;
    const ProblemKey key{int(g.ab), int(g.c), g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb,
                         g.ldc, g.batch, g.stride_a, g.stride_b, g.stride_c, align_a, align_b,
                         align_c, g.beta != 0.0, g.bias != nullptr, align_bias};
    const std::optional<cublasLtMatmulAlgo_t> algo = choose(key, d, align_a, align_b, align_c);
    if (!algo) return false;
    const float alpha = float(g.alpha), beta = float(g.beta);
    CUBLAS_CHECK(cublasLtMatmul(handle_, d.op, &alpha, g.B, d.a, g.A, d.b, &beta, g.C, d.c, g.C,
                                d.c, &*algo, workspace_, kWorkspaceBytes, kStream));
    return true;
  }

 private:
  void init() {
    if (handle_) return;
    CUBLAS_CHECK(cublasLtCreate(&handle_));
    workspace_ = device::allocate(kWorkspaceBytes);  // kept for the process's life
  }

  /// The heuristic's first algorithm, cached per key; nullopt (also cached)
  /// only for a bias epilogue without one. Without a bias, none is fatal.
  std::optional<cublasLtMatmulAlgo_t> choose(const ProblemKey& key, const Descriptors& d,
                                             std::uint32_t align_a, std::uint32_t align_b,
                                             std::uint32_t align_c) {
    auto it = algos_.find(key);
    if (it != algos_.end()) return it->second;
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = kWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
    for (const auto& [attr, value] : aligns)
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
    cublasLtMatmulHeuristicResult_t result;
    std::memset(&result, 0, sizeof(result));
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c,
                                                             pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    const bool with_bias = std::get<18>(key);
    if (with_bias && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {
      algos_.emplace(key, std::nullopt);
      return std::nullopt;
    }
    MESH_VERIFY(st == CUBLAS_STATUS_SUCCESS && found > 0,
                "gemm: cuBLASLt found no algorithm (status " << int(st) << ") for M="
                                                            << std::get<4>(key) << " N="
                                                            << std::get<5>(key) << " K="
                                                            << std::get<6>(key));
    algos_.emplace(key, result.algo);
    return result.algo;
  }

  std::mutex mutex_;
  cublasLtHandle_t handle_ = nullptr;  ///< Owned; never destroyed (see allocator).
  void* workspace_ = nullptr;          ///< Owned, from the caching allocator.
  std::map<ProblemKey, std::optional<cublasLtMatmulAlgo_t>> algos_;
};

std::atomic<std::uint64_t> bias_fallbacks{0};

GemmEngine& engine() {
  static GemmEngine* instance = new GemmEngine;
  return *instance;
}

/// C = beta C for K = 0 (cuBLASLt wants k >= 1); beta = 0 writes zeros, so
/// that a NaN in an unset C does not survive as 0 * NaN.
template <class T>
__global__ void scale_or_zero_kernel(T* C, index_t rows, index_t cols, index_t ld,
                                     index_t batch, index_t stride, float beta) {
  const kindex n = rows * cols * batch;
  for (kindex i = kindex(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += kindex(gridDim.x) * blockDim.x) {
    const kindex b = i / (rows * cols), r = (i / cols) % rows, c = i % cols;
    const kindex at = b * stride + r * ld + c;
    store_f(C, at, beta == 0.f ? 0.f : beta * load_f(C, at));
  }
}

}  // namespace

void gemm(const GemmArgs& args) {
  if (args.M == 0 || args.N == 0 || args.batch == 0) return;
  MESH_VERIFY(args.c == args.ab || args.c == DType::F32,
              "gemm: C must be " << dtype_name(args.ab) << " or fp32, got "
                                 << dtype_name(args.c));
  MESH_VERIFY(!args.bias || (args.batch == 1 && args.ldc == args.N),
              "gemm: a bias epilogue takes one contiguous C, got batch " << args.batch
                                                                          << ", ldc " << args.ldc
                                                                          << ", N " << args.N);
  if (args.K == 0) {
    with_storage_type(args.c, "gemm", [&](auto zero) {
      using T = decltype(zero);
      const kindex n = args.M * args.N * args.batch;
      scale_or_zero_kernel<<<grid_for(n, 256), 256, 0, kStream>>>(
          static_cast<T*>(args.C), args.M, args.N, args.ldc, args.batch, args.stride_c,
          float(args.beta));
      MESH_CUDA_LAUNCHED();
    });
    if (args.bias) bias_add(args.c, args.C, args.bias, args.M, args.N);
    return;
  }
  if (engine().run(args)) return;
  // No algorithm fuses this bias: the plain GEMM, then the bias kernel.
  ++bias_fallbacks;
  GemmArgs plain = args;
  plain.bias = nullptr;
  engine().run(plain);
  bias_add(args.c, args.C, args.bias, args.M, args.N);
}

std::uint64_t gemm_bias_fallbacks() { return bias_fallbacks.load(); }

}  // namespace meshtron::cuda
