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
// GeLU epilogues (the MLP). Forward, CUBLASLT_EPILOGUE_GELU_AUX_BIAS: D =
// gelu(AB + bias) and the GeLU input AB + bias written to the "aux" matrix
// (CUBLASLT_EPILOGUE_GELU_AUX without a bias: one riding in AB's ones column),
// which has D's layout (column-major [N, M], ld = AUX_LD >= N, a multiple of
// 8 elements) and D's dtype (cuBLASLt's default for GeLU aux, left unset);
// with a contiguous row-major C that is exactly our pre_gelu [M, N], ld N.
// Backward, CUBLASLT_EPILOGUE_DGELU: D = (AB) * gelu'(aux) with the same
// aux. cuBLASLt's GeLU is the tanh approximation (GPT-2's; PyTorch's
// _addmm_activation relies on it, pytorch/pytorch#104061), so the numbers
// differ from gelu.cu's only by rounding: gelu.cu rounds the pre-activation
// to storage before the GeLU, the epilogue applies it to the fp32
// accumulator. N % 8 != 0 (the aux ld rule), an aux pointer less than 16-byte
// aligned, or no algorithm: plain GEMM, then the gelu kernels.
//
// Out-of-place C (a residual riding in the GEMM): D = alpha AB + beta C +
// bias with C != D, same layout; only algorithms with
// CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT are taken (the heuristic
// does not see pointers, so it cannot know C != D), else GEMM then axpy.
//
// The handle, a 32 MiB workspace and the heuristic's choice per problem
// (shape, dtypes, transposes, batch, pointer alignments, epilogue) are
// cached: after the first call of a shape, a GEMM is descriptor setup plus
// one launch.
//
// Autotuning (run.gemm_autotune, through set_gemm_autotune): the first call
// of a problem times the heuristic's first eight candidates on scratch
// outputs and keeps the fastest. Off by default: the choice then depends on
// timings, so two runs (a run and its restart, or two decompositions) may
// take different algorithms and differ in the last bits, which the
// bitwise restart-replay checks would see.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <compare>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>

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

// cuBLASLt's advice for Hopper. On a GPT-2 774M training step (H100) 4 MiB
// is as fast, none 8 % slower (the algorithms without workspace).
constexpr std::size_t kWorkspaceBytes = 32u << 20;

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

/// The epilogue of a call, as cuBLASLt names it.
cublasLtEpilogue_t epilogue_of(const GemmArgs& g) {
  if (g.gelu_pre_out) return g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (g.gelu_pre_in) return CUBLASLT_EPILOGUE_DGELU;
  if (g.bias) return CUBLASLT_EPILOGUE_BIAS;
  return CUBLASLT_EPILOGUE_DEFAULT;
}

/// Whether anything beyond D = alpha op(A) op(B) + beta D is asked for; only
/// such calls may find no algorithm (and then run unfused).
bool has_extras(const GemmArgs& g) {
  return epilogue_of(g) != CUBLASLT_EPILOGUE_DEFAULT || g.c_in != nullptr;
}

/// Everything the heuristic's choice depends on: shape, dtypes, transposes,
/// pointer alignments (cuBLASLt reads the bias and aux pointers from the
/// descriptor when it chooses), the epilogue, and whether C is out of place.
struct ProblemKey {
  int ab, c;
  bool trans_a, trans_b;
  index_t M, N, K, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  std::uint32_t align_a, align_b, align_c, align_d, align_bias, align_aux;
  bool beta_nonzero, out_of_place;
  int epilogue;
  auto operator<=>(const ProblemKey&) const = default;
};

ProblemKey key_of(const GemmArgs& g) {
  const void* aux = g.gelu_pre_out ? g.gelu_pre_out : g.gelu_pre_in;
  return ProblemKey{int(g.ab),     int(g.c),       g.trans_a,       g.trans_b,
                    g.M,           g.N,            g.K,             g.lda,
                    g.ldb,         g.ldc,          g.batch,         g.stride_a,
                    g.stride_b,    g.stride_c,     alignment_of(g.B),  // cuBLASLt's A
                    alignment_of(g.A),                                 // cuBLASLt's B
                    alignment_of(g.c_in ? g.c_in : g.C),
                    alignment_of(g.C),
                    g.bias ? alignment_of(g.bias) : 0u,
                    aux ? alignment_of(aux) : 0u,
                    g.beta != 0.0,
                    g.c_in != nullptr,
                    int(epilogue_of(g))};
}

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

/// Sets the epilogue and its inputs. The bias is [m = N] of D's dtype, one
/// per row of the column-major D = C^T, i.e. one per column of our row-major
/// C; the GeLU aux matrix has D's layout (ld = ldc).
void set_epilogue(cublasLtMatmulDesc_t op, const GemmArgs& g) {
  const cublasLtEpilogue_t epilogue = epilogue_of(g);
  if (epilogue == CUBLASLT_EPILOGUE_DEFAULT) return;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof(epilogue)));
  if (g.bias && epilogue != CUBLASLT_EPILOGUE_DGELU) {
    const std::int32_t bias_type = cuda_type(g.c);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                sizeof(g.bias)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                &bias_type, sizeof(bias_type)));
  }
  const void* aux = g.gelu_pre_out ? g.gelu_pre_out : g.gelu_pre_in;
  if (aux) {
    const std::int64_t aux_ld = g.ldc;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &aux, sizeof(aux)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                &aux_ld, sizeof(aux_ld)));
  }
}

/// Whether an algorithm writes D somewhere other than C.
bool supports_out_of_place(const cublasLtMatmulAlgo_t& algo) {
  std::int32_t support = 0;
  std::size_t written = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoCapGetAttribute(
      &algo, CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT, &support, sizeof(support), &written);
  return st == CUBLAS_STATUS_SUCCESS && support != 0;
}

class GemmEngine {
 public:
  /// Turns autotuning on or off; forgets the choices made so far.
  void set_autotune(bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    init();
    autotune_ = on;
    algos_.clear();
  }
  std::uint64_t autotuned() {
    std::lock_guard<std::mutex> lock(mutex_);
    return autotuned_;
  }
  std::uint64_t autotune_changed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return autotune_changed_;
  }

  /// Launches the GEMM. Returns false, launching nothing, only when an
  /// epilogue or an out-of-place C was asked for and cuBLASLt has no
  /// algorithm for it.
  bool run(const GemmArgs& g) {
    std::lock_guard<std::mutex> lock(mutex_);
    init();
    Descriptors d;
    describe(g, d);
    const ProblemKey key = key_of(g);
    const std::optional<cublasLtMatmulAlgo_t> algo = choose(key, d, g);
    if (!algo) return false;
    const cublasStatus_t st = launch(g, d, *algo);
    // An epilogue the heuristic offered but the launch refuses (argument
    // checks fail before anything runs): remembered as unavailable.
    if (st != CUBLAS_STATUS_SUCCESS && has_extras(g)) {
      algos_.erase(key);
      algos_.emplace(key, std::nullopt);
      return false;
    }
    CUBLAS_CHECK(st);
    return true;
  }

 private:
  void init() {
    if (handle_) return;
    CUBLAS_CHECK(cublasLtCreate(&handle_));
    workspace_ = device::allocate(kWorkspaceBytes);  // kept for the process's life
  }

  /// The operation and layout descriptors of a call (epilogue pointers included).
  static void describe(const GemmArgs& g, Descriptors& d) {
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
    set_epilogue(d.op, g);
  }

  cublasStatus_t launch(const GemmArgs& g, const Descriptors& d, const cublasLtMatmulAlgo_t& algo,
                        cudaStream_t stream = compute_stream()) {
    const float alpha = float(g.alpha), beta = float(g.beta);
    const void* c_in = g.c_in ? g.c_in : g.C;
    return cublasLtMatmul(handle_, d.op, &alpha, g.B, d.a, g.A, d.b, &beta, c_in, d.c, g.C, d.c,
                          &algo, workspace_, kWorkspaceBytes, stream);
  }

  /// The stream fastest() times candidates on: the compute stream, or while
  /// that is being captured into a CUDA graph (training.cuda_graphs meets a
  /// problem first in its captured step) a stream of its own, so that the
  /// timing launches run now instead of being recorded into the graph, and
  /// their events can be waited on (CapturedWork captures relaxed, after
  /// draining the compute stream: nothing in flight shares the workspace).
  cudaStream_t timing_stream() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(compute_stream(), &status));
    if (status == cudaStreamCaptureStatusNone) return compute_stream();
    if (!side_stream_) CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
    return side_stream_;
  }

  /// Of the heuristic's candidates for g, the fastest by CUDA events (the
  /// median of kRuns launches after one warm-up each), timed on scratch
  /// outputs: the call's C and its epilogue outputs (GeLU aux, bias
  /// gradient) are not touched; its inputs are read as they are (inside a
  /// capture, whatever their memory holds: the timing does not depend on
  /// it). A candidate whose launch fails is skipped. Blocks the host once
  /// per problem.
  cublasLtMatmulAlgo_t fastest(const GemmArgs& g, const cublasLtMatmulAlgo_t* candidates,
                               int count) {
    constexpr int kRuns = 5;
    const cudaStream_t stream = timing_stream();
    const std::size_t c_elements =
        std::size_t((g.batch - 1) * g.stride_c + (g.M - 1) * g.ldc + g.N);
    GemmArgs t = g;
    device::Buffer c_scratch(c_elements * dtype_size(g.c));
    device::Buffer aux_scratch(g.gelu_pre_out ? c_elements * dtype_size(g.c) : 0);
    t.C = c_scratch.as<void>();
    if (g.gelu_pre_out) t.gelu_pre_out = aux_scratch.as<void>();
    Descriptors d;
    describe(t, d);
    cudaEvent_t start = nullptr, stop = nullptr;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    int best = 0;
    float best_ms = std::numeric_limits<float>::infinity();
    for (int i = 0; i < count; ++i) {
      if (launch(t, d, candidates[i], stream) != CUBLAS_STATUS_SUCCESS) continue;
      float ms[kRuns] = {};
      for (int r = 0; r < kRuns; ++r) {
        CUDA_CHECK(cudaEventRecord(start, stream));
        CUBLAS_CHECK(launch(t, d, candidates[i], stream));
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        CUDA_CHECK(cudaEventElapsedTime(&ms[r], start, stop));
      }
      std::sort(ms, ms + kRuns);
      if (ms[kRuns / 2] < best_ms) {
        best_ms = ms[kRuns / 2];
        best = i;
      }
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    ++autotuned_;
    if (best != 0) ++autotune_changed_;
    return candidates[best];
  }

  /// The heuristic's first algorithm (for an out-of-place C, its first that
  /// writes out of place), or with autotuning on the fastest of its first
  /// kCandidates (fastest()), cached per key; nullopt (also cached) only for a
  /// call with extras (has_extras) and no algorithm. Otherwise none is fatal.
  std::optional<cublasLtMatmulAlgo_t> choose(const ProblemKey& key, const Descriptors& d,
                                             const GemmArgs& g) {
    auto it = algos_.find(key);
    if (it != algos_.end()) return it->second;
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = kWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    for (const auto& [attr, value] : aligns)
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t results[kCandidates];
    std::memset(results, 0, sizeof(results));
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        handle_, d.op, d.a, d.b, d.c, d.c, pref,
        key.out_of_place || autotune_ ? kCandidates : 1, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulAlgo_t usable[kCandidates];
    int count = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      for (int i = 0; i < found; ++i)
        if (!key.out_of_place || supports_out_of_place(results[i].algo))
          usable[count++] = results[i].algo;
    std::optional<cublasLtMatmulAlgo_t> chosen;
    if (count > 0) chosen = autotune_ && count > 1 ? fastest(g, usable, count) : usable[0];
    const bool extras = key.out_of_place || key.epilogue != int(CUBLASLT_EPILOGUE_DEFAULT);
    MESH_VERIFY(chosen || extras,
                "gemm: cuBLASLt found no algorithm (status " << int(st) << ") for M=" << key.M
                                                            << " N=" << key.N << " K=" << key.K);
    algos_.emplace(key, chosen);
    return chosen;
  }

  std::mutex mutex_;
  cudaStream_t side_stream_ = nullptr;  ///< timing_stream() during a capture; kept for the process
  bool autotune_ = false;  ///< set_autotune (run.gemm_autotune)
  std::uint64_t autotuned_ = 0, autotune_changed_ = 0;
  cublasLtHandle_t handle_ = nullptr;  ///< Owned; never destroyed (see allocator).
  void* workspace_ = nullptr;          ///< Owned, from the caching allocator.
  std::map<ProblemKey, std::optional<cublasLtMatmulAlgo_t>> algos_;
};

std::atomic<std::uint64_t> bias_fallbacks{0}, gelu_fallbacks{0}, residual_fallbacks{0};

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

void check_args(const GemmArgs& a) {
  MESH_VERIFY(a.c == a.ab || a.c == DType::F32,
              "gemm: C must be " << dtype_name(a.ab) << " or fp32, got " << dtype_name(a.c));
  const bool fused = a.bias || a.gelu_pre_out || a.gelu_pre_in || a.c_in;
  MESH_VERIFY(!fused || (a.batch == 1 && a.ldc == a.N),
              "gemm: an epilogue takes one contiguous C, got batch " << a.batch << ", ldc "
                                                                      << a.ldc << ", N " << a.N);
  MESH_VERIFY(!(a.gelu_pre_out || a.gelu_pre_in) || a.c == a.ab,
              "gemm: the GeLU epilogues take A, B, C of one dtype");
  MESH_VERIFY(!a.gelu_pre_out || a.beta == 0.0, "gemm: the GeLU forward epilogue takes beta = 0");
  MESH_VERIFY(!a.gelu_pre_in || (!a.bias && !a.c_in && a.beta == 0.0),
              "gemm: the GeLU backward epilogue takes no bias, no C, beta = 0");
  MESH_VERIFY(!a.c_in || a.beta != 0.0, "gemm: an out-of-place C needs beta != 0");
}

/// cuBLASLt's rule for the GeLU aux matrix: ld a multiple of 8 elements;
/// and, to be safe with its vector stores, a 16-byte aligned aux pointer
/// (the caching allocator's blocks are 256-byte aligned; only odd views fail).
bool epilogue_layout_ok(const GemmArgs& a) {
  const void* aux = a.gelu_pre_out ? a.gelu_pre_out : a.gelu_pre_in;
  return !aux || (a.ldc % 8 == 0 && alignment_of(aux) >= 16);
}

void count_fallback(const GemmArgs& a) {
  if (a.gelu_pre_out || a.gelu_pre_in)
    ++gelu_fallbacks;
  else if (a.c_in)
    ++residual_fallbacks;
  else
    ++bias_fallbacks;
}

/// The same result as the fused call (to rounding) from a plain (or bias)
/// GEMM and the elementwise kernels; also every call with K = 0, which
/// cuBLASLt does not take.
void gemm_unfused(const GemmArgs& a) {
  const index_t n = a.M * a.N;
  if (a.gelu_pre_out) {  // pre = AB + bias, then C = gelu(pre)
    GemmArgs pre = a;
    pre.C = a.gelu_pre_out;
    pre.gelu_pre_out = nullptr;
    gemm(pre);
    gelu_forward(a.c, a.gelu_pre_out, n, a.C);
  } else if (a.gelu_pre_in) {  // C = AB, then C = C * gelu'(pre) in place
    GemmArgs plain = a;
    plain.gelu_pre_in = nullptr;
    gemm(plain);
    gelu_backward(a.c, a.C, a.gelu_pre_in, n, a.C);
  } else if (a.c_in) {  // C = alpha AB + bias, then C += beta c_in
    GemmArgs own = a;
    own.c_in = nullptr;
    own.beta = 0.0;
    gemm(own);
    axpy(a.c, a.beta, a.c_in, n, a.C);
  } else if (a.bias) {
    GemmArgs plain = a;
    plain.bias = nullptr;
    gemm(plain);
    bias_add(a.c, a.C, a.bias, a.M, a.N);
  } else {  // K = 0
    with_storage_type(a.c, "gemm", [&](auto zero) {
      using T = decltype(zero);
      const kindex total = a.M * a.N * a.batch;
      scale_or_zero_kernel<<<grid_for(total, 256), 256, 0, compute_stream()>>>(
          static_cast<T*>(a.C), a.M, a.N, a.ldc, a.batch, a.stride_c, float(a.beta));
      MESH_CUDA_LAUNCHED();
    });
  }
}

}  // namespace

void gemm(const GemmArgs& args) {
  if (args.M == 0 || args.N == 0 || args.batch == 0) return;
  check_args(args);
  if (args.K == 0) return gemm_unfused(args);  // cuBLASLt wants k >= 1
  if (!has_extras(args)) {
    engine().run(args);
    return;
  }
  if (epilogue_layout_ok(args) && engine().run(args)) return;
  count_fallback(args);
  gemm_unfused(args);
}

void set_gemm_autotune(bool on) { engine().set_autotune(on); }
std::uint64_t gemm_autotuned_problems() { return engine().autotuned(); }
std::uint64_t gemm_autotune_changed() { return engine().autotune_changed(); }

std::uint64_t gemm_bias_fallbacks() { return bias_fallbacks.load(); }
std::uint64_t gemm_gelu_fallbacks() { return gelu_fallbacks.load(); }
std::uint64_t gemm_residual_fallbacks() { return residual_fallbacks.load(); }

}  // namespace meshtron::cuda
