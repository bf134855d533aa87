// ================================================= cuDNN fused attention ==
//
// Causal attention through cuDNN 9's fused flash-attention engines, built
// with the backend graph API of cudnn_graph.h (descriptor create / set
// attribute / finalize; no cudnn-frontend). It reads and writes the linear
// layers' token-major layout in place, as flash_attention.cu's token-major
// entry points do: cuDNN takes any strides, so q, k, v are the [b, heads, s, d]
// views of qkv [s * b, 3 * heads * d] (rows in [s, b] order) with strides
// {3 heads d, d, b 3 heads d, 1}, context / dcontext the same with one part,
// and dq, dk, dv are written straight into dqkv. lse [b * heads, s] is
// cuDNN's softmax "Stats" [b, heads, s, 1] (max + log sum of the scaled
// scores, natural log: the same numbers our kernel saves).
//
// Forward graph (cuDNN's fused engines match this pattern; virtual tensors
// fp32 unless said):
//   S = Q K^T;  S *= scale (by-value scalar);  causal: row = GEN_INDEX(axis 2),
//   col = GEN_INDEX(axis 3), keep = row >= col, S = keep ? S : lowest float;
//   M = rowmax S;  E = exp(S - M);  L = rowsum E;  Stats = M + log L;
//   P = E / L (bf16/fp16);  O = P V.
// With attention dropout from cuDNN's generator (Problem::dropout_p > 0;
// cuDNN's fused engines match the cudnn-frontend's SDPA pattern): the
// forward multiplies P by Z = Bernoulli(1 - p) from an RNG operation (seed
// and offset: device int64 tensors, read when the kernels run) and by
// 1 / (1 - p) before P V; the backward redraws Z from the same seed and
// offset, dV = (P Z / (1 - p))^T dO, dS = P (Z dP - (1 - p) sum) / (1 - p).
// Tests may have the forward write Z out (Problem::mask_out).
//
// Backward graph (the dP-workspace form: dQ is a matmul output, not an
// fp32 accumulator updated with atomics, so the engine is deterministic):
//   sum = rowsum(dO * O) (fp32, non-virtual: bound to the caller's delta);
//   P = exp(causal(S * scale - Stats));  dV = P^T dO;
//   dS = P * (dO V^T - sum) * scale;  dK = dS^T Q;  dQ = dS K.
//
// Plans: one per (device, dtype, s, b, heads, d, direction), built on first
// use and cached (also a refusal, with its reason). Engines come from the
// heuristics (CUDNN_HEUR_MODE_A) in their order; a config whose engine has
// the CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC note is never taken (meshtron
// promises bitwise restart replay), and the first that finalizes wins.
// Execution: a variant pack per call (pointers change), the plan's
// workspace from the caching allocator, on meshtron's stream (compute_stream(), set
// on the handle with cudnnSetStream).
//
// Measured on an H100 (cuDNN 9.19.0, bf16, bench_cuda_ops attention fused),
// fwd / bwd ms, ours against cuDNN's: b 8 x 12 heads, s 1024, d 64 (GPT-2
// 124M): 0.087 / 0.277 against 0.059 / 0.208; b 8 x 16, d 128: 0.197 / 0.595
// against 0.096 / 0.337; b 8 x 20, d 64 (774M): 0.129 / 0.420 against
// 0.083 / 0.314. The price: the deterministic backward keeps dS in a
// workspace of b heads s^2 bf16 (200 MB at 124M's shape, 335 MB at 774M's),
// taken from the caching allocator for the call.
//
// Errors: while planning, a failed cuDNN call means "cuDNN cannot do this
// shape": it is recorded (call, file:line, cudnnGetErrorString and cuDNN's
// last error message) and the shape stays on our kernel. At execution a
// failed call aborts the job with the same details.
//
// Without MESHTRON_HAVE_CUDNN (cuDNN not found at configure time) the
// support query says so and the entry points abort.
#include "ops/ops_cuda.hpp"

#ifdef MESHTRON_HAVE_CUDNN

#include <cudnn_graph.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "tensor/device_allocator.hpp"

namespace meshtron::cuda {
namespace {

/// cuDNN refused something while planning (the shape stays on our kernel).
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string describe_failure(const char* call, cudnnStatus_t status) {
  char last[1024] = {};
  cudnnGetLastErrorString(last, sizeof last);
  return MESH_MSG(call << " failed: " << cudnnGetErrorString(status)
                       << (last[0] ? " (" : "") << last << (last[0] ? ")" : ""));
}

/// A cuDNN call made while planning: failure throws Unsupported.
#define CUDNN_TRY(call)                                                                   \
  do {                                                                                    \
    const cudnnStatus_t mesh_cudnn_st_ = (call);                                          \
    if (mesh_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                           \
      throw Unsupported(MESH_MSG(describe_failure(#call, mesh_cudnn_st_)                  \
                                 << " at " << __FILE__ << ":" << __LINE__));              \
  } while (0)

/// A cuDNN call that must succeed: failure aborts the job.
#define CUDNN_CHECK(call)                                                                 \
  do {                                                                                    \
    const cudnnStatus_t mesh_cudnn_st_ = (call);                                          \
    if (mesh_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                           \
      ::meshtron::fatal(describe_failure(#call, mesh_cudnn_st_), __FILE__, __LINE__);     \
  } while (0)

using Raw = cudnnBackendDescriptor_t;

/// An owned backend descriptor.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    CUDNN_TRY(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  Raw get() const { return d_; }

  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t n,
            const void* values) {
    CUDNN_TRY(cudnnBackendSetAttribute(d_, name, type, n, values));
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, Raw value) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  Desc& set_type(cudnnBackendAttributeName_t name, cudnnDataType_t value) {
    return set(name, CUDNN_TYPE_DATA_TYPE, 1, &value);
  }
  Desc& finalize() {
    CUDNN_TRY(cudnnBackendFinalize(d_));
    return *this;
  }

 private:
  Raw d_ = nullptr;
};

// ------------------------------------------------------------ the graphs ---

using Dims = std::array<std::int64_t, 4>;
struct Layout {
  Dims dim, stride;
};

/// Unique ids of the tensors bound in the variant pack.
enum Uid : std::int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kMaskFill, kDO, kDQ, kDK, kDV, kSoftmaxSum, kSoftmaxSumScale,
  kSeed, kOffset, kDropScale, kMaskOut,
  kFirstVirtual = 100
};

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

/// Builds one operation graph; owns every descriptor it makes (the plan
/// keeps the builder alive).
class GraphBuilder {
 public:
  Raw tensor(std::int64_t uid, cudnnDataType_t type, const Layout& l) {
    return make_tensor(uid, type, l, false, false);
  }
  /// A device int64 [1, 1, 1, 1] (the RNG's seed and offset), 8-byte aligned.
  Raw device_int64(std::int64_t uid) {
    return make_tensor(uid, CUDNN_DATA_INT64, {{1, 1, 1, 1}, {1, 1, 1, 1}}, false, false, 8);
  }
  Raw virtual_tensor(cudnnDataType_t type, const Layout& l) {
    return make_tensor(next_virtual_++, type, l, true, false);
  }
  /// A float passed by value in the variant pack (a host pointer).
  Raw scalar(std::int64_t uid) {
    return make_tensor(uid, kF32, {{1, 1, 1, 1}, {1, 1, 1, 1}}, false, true);
  }

  /// y = mode(x[, b][, t]) in precision `prec`; axis for GEN_INDEX.
  Raw pointwise_into(cudnnPointwiseMode_t mode, cudnnDataType_t prec, Raw x, Raw b, Raw t, Raw y,
                     std::int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get());
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    op.finalize();
    keep(std::move(pw));
    add_op(std::move(op));
    return y;
  }
  /// A new virtual fp32 tensor y = mode(x[, b]).
  Raw pointwise(cudnnPointwiseMode_t mode, Raw x, Raw b, const Layout& l) {
    return pointwise_into(mode, kF32, x, b, nullptr, virtual_tensor(kF32, l));
  }

  void matmul(Raw a, Raw b, Raw c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set_type(CUDNN_ATTR_MATMUL_COMP_TYPE, kF32).finalize();
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
    op.finalize();
    keep(std::move(mm));
    add_op(std::move(op));
  }

  /// y = Bernoulli(keep_probability) draws (1 or 0) from cuDNN's generator
  /// at (seed, offset), one per element of y.
  Raw bernoulli_into(double keep_probability, Raw seed, Raw offset, Raw y) {
    Desc rng(CUDNN_BACKEND_RNG_DESCRIPTOR);
    const cudnnRngDistribution_t bernoulli = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
    rng.set(CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &bernoulli);
    rng.set(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &keep_probability);
    rng.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RNG_YDESC, y);
    op.set_desc(CUDNN_ATTR_OPERATION_RNG_DESC, rng.get());
    op.set_desc(CUDNN_ATTR_OPERATION_RNG_SEED, seed);
    op.set_desc(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, offset);
    op.finalize();
    keep(std::move(rng));
    add_op(std::move(op));
    return y;
  }

  /// y = reduction of x over the dimensions where y has extent 1.
  Raw reduce_into(cudnnReduceTensorOp_t how, Raw x, Raw y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    red.set_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, kF32).finalize();
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get());
    op.finalize();
    keep(std::move(red));
    add_op(std::move(op));
    return y;
  }

  /// y = x seen with y's dims and strides (a transpose, for the matmuls).
  Raw reshape_into(Raw x, Raw y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize();
    add_op(std::move(op));
    return y;
  }

  Desc finalize(cudnnHandle_t handle) const {
    std::vector<Raw> ops;
    for (const Desc& op : ops_) ops.push_back(op.get());
    Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
              std::int64_t(ops.size()), ops.data());
    graph.finalize();
    return graph;
  }

 private:
  Raw make_tensor(std::int64_t uid, cudnnDataType_t type, const Layout& l, bool is_virtual,
                  bool by_value, std::int64_t alignment = 16) {
    Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, l.dim.data());
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, l.stride.data());
    t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    if (is_virtual) t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    t.finalize();
    return keep(std::move(t));
  }
  Raw keep(Desc d) {
    owned_.push_back(std::move(d));
    return owned_.back().get();
  }
  void add_op(Desc op) { ops_.push_back(std::move(op)); }

  std::vector<Desc> owned_, ops_;
  std::int64_t next_virtual_ = kFirstVirtual;
};

/// One attention problem: dtype and shape, and the layouts of its tensors.
struct Problem {
  cudnnDataType_t io;
  std::int64_t s, b, heads, d;
  double dropout_p = 0.0;     ///< attention dropout from cuDNN's generator (0: none)
  bool mask_out = false;      ///< the forward also writes the keep mask (tests)

  /// A [b, heads, s, d] view of a token-major tensor of `parts` parts.
  Layout token_major(std::int64_t parts) const {
    return {{b, heads, s, d}, {parts * heads * d, d, b * parts * heads * d, 1}};
  }
  /// The same, transposed to [b, heads, d, s] (K^T, V^T).
  Layout token_major_t(std::int64_t parts) const {
    const Layout l = token_major(parts);
    return {{b, heads, d, s}, {l.stride[0], l.stride[1], l.stride[3], l.stride[2]}};
  }
  Layout scores() const { return {{b, heads, s, s}, {heads * s * s, s * s, s, 1}}; }
  Layout scores_t() const { return {{b, heads, s, s}, {heads * s * s, s * s, 1, s}}; }
  /// Per-row statistics [b, heads, s, 1]: lse / Stats and the softmax sum.
  Layout rows() const { return {{b, heads, s, 1}, {heads * s, s, 1, 1}}; }
};

/// keep(row >= col) ? scores : lowest float: the causal mask.
Raw causal_mask(GraphBuilder& g, const Problem& p, Raw scores, Raw fill) {
  const Raw row = g.pointwise_into(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scores, nullptr,
                                   nullptr, g.virtual_tensor(CUDNN_DATA_INT32, p.scores()), 2);
  const Raw col = g.pointwise_into(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scores, nullptr,
                                   nullptr, g.virtual_tensor(CUDNN_DATA_INT32, p.scores()), 3);
  const Raw keep = g.pointwise_into(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr,
                                    g.virtual_tensor(CUDNN_DATA_BOOLEAN, p.scores()));
  return g.pointwise_into(CUDNN_POINTWISE_BINARY_SELECT, kF32, scores, fill, keep,
                          g.virtual_tensor(kF32, p.scores()));
}

/// The dropout mask of the scores: 1 (kept, probability 1 - p) or 0, drawn
/// by cuDNN from the seed and offset bound in the variant pack; written out
/// (uid kMaskOut) when the problem asks for it.
Raw dropout_mask(GraphBuilder& g, const Problem& p) {
  const Raw mask = p.mask_out ? g.tensor(kMaskOut, kF32, p.scores())
                              : g.virtual_tensor(kF32, p.scores());
  return g.bernoulli_into(1.0 - p.dropout_p, g.device_int64(kSeed), g.device_int64(kOffset), mask);
}

/// probs * mask * drop_scale (1 / (1 - p), by value) as `type`: the dropped
/// probabilities, in the order cuDNN's fused engines match.
Raw dropped(GraphBuilder& g, const Problem& p, Raw probs, Raw mask, Raw drop_scale,
            cudnnDataType_t type) {
  const Raw kept = g.pointwise(CUDNN_POINTWISE_MUL, probs, mask, p.scores());
  return g.pointwise_into(CUDNN_POINTWISE_MUL, kF32, kept, drop_scale, nullptr,
                          g.virtual_tensor(type, p.scores()));
}

std::unique_ptr<GraphBuilder> forward_graph(const Problem& p) {
  auto g = std::make_unique<GraphBuilder>();
  const Raw q = g->tensor(kQ, p.io, p.token_major(3)), kt = g->tensor(kK, p.io, p.token_major_t(3)),
            v = g->tensor(kV, p.io, p.token_major(3)), o = g->tensor(kO, p.io, p.token_major(1)),
            stats = g->tensor(kStats, kF32, p.rows()), scale = g->scalar(kScale),
            fill = g->scalar(kMaskFill);
  const Raw s = g->virtual_tensor(kF32, p.scores());
  g->matmul(q, kt, s);
  const Raw masked = causal_mask(*g, p, g->pointwise(CUDNN_POINTWISE_MUL, s, scale, p.scores()),
                                 fill);
  const Raw max = g->reduce_into(CUDNN_REDUCE_TENSOR_MAX, masked, g->virtual_tensor(kF32, p.rows()));
  const Raw e = g->pointwise(CUDNN_POINTWISE_EXP,
                             g->pointwise(CUDNN_POINTWISE_SUB, masked, max, p.scores()), nullptr,
                             p.scores());
  const Raw sum = g->reduce_into(CUDNN_REDUCE_TENSOR_ADD, e, g->virtual_tensor(kF32, p.rows()));
  g->pointwise_into(CUDNN_POINTWISE_ADD, kF32, max,
                    g->pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, p.rows()), nullptr, stats);
  const Raw probs = g->pointwise_into(CUDNN_POINTWISE_DIV, kF32, e, sum, nullptr,
                                      g->virtual_tensor(p.dropout_p > 0 ? kF32 : p.io, p.scores()));
  g->matmul(p.dropout_p > 0
                ? dropped(*g, p, probs, dropout_mask(*g, p), g->scalar(kDropScale), p.io)
                : probs,
            v, o);
  return g;
}

std::unique_ptr<GraphBuilder> backward_graph(const Problem& p) {
  auto g = std::make_unique<GraphBuilder>();
  const Raw q = g->tensor(kQ, p.io, p.token_major(3)), kt = g->tensor(kK, p.io, p.token_major_t(3)),
            vt = g->tensor(kV, p.io, p.token_major_t(3)), o = g->tensor(kO, p.io, p.token_major(1)),
            d_o = g->tensor(kDO, p.io, p.token_major(1)), stats = g->tensor(kStats, kF32, p.rows()),
            dq = g->tensor(kDQ, p.io, p.token_major(3)), dk = g->tensor(kDK, p.io, p.token_major(3)),
            dv = g->tensor(kDV, p.io, p.token_major(3)),
            softmax_sum = g->tensor(kSoftmaxSum, kF32, p.rows()), scale = g->scalar(kScale),
            sum_scale = g->scalar(kSoftmaxSumScale), fill = g->scalar(kMaskFill);
  // sum_i = dO_i . O_i (times 1 - p with dropout: cuDNN's softmax sum)
  const Layout bhsd{{p.b, p.heads, p.s, p.d},
                    {p.heads * p.s * p.d, p.s * p.d, p.heads * p.d, 1}};
  const Raw row_dot = g->reduce_into(CUDNN_REDUCE_TENSOR_ADD,
                                     g->pointwise(CUDNN_POINTWISE_MUL, d_o, o, bhsd),
                                     g->virtual_tensor(kF32, p.rows()));
  g->pointwise_into(CUDNN_POINTWISE_MUL, kF32, row_dot, sum_scale, nullptr, softmax_sum);
  // P = exp(causal(Q K^T scale - Stats)); dV = P^T dO
  const Raw s = g->virtual_tensor(kF32, p.scores());
  g->matmul(q, kt, s);
  const Raw shifted = g->pointwise(CUDNN_POINTWISE_SUB,
                                   g->pointwise(CUDNN_POINTWISE_MUL, s, scale, p.scores()), stats,
                                   p.scores());
  const Raw probs =
      g->pointwise(CUDNN_POINTWISE_EXP, causal_mask(*g, p, shifted, fill), nullptr, p.scores());
  const Raw mask = p.dropout_p > 0 ? dropout_mask(*g, p) : nullptr;
  const Raw drop_scale = mask ? g->scalar(kDropScale) : nullptr;
  const Raw probs_used = mask ? dropped(*g, p, probs, mask, drop_scale, kF32) : probs;
  g->matmul(g->reshape_into(probs_used, g->virtual_tensor(p.io, p.scores_t())), d_o, dv);
  // dS = P (dO V^T - sum) scale; dK = dS^T Q; dQ = dS K. With dropout mask Z
  // (cuDNN's form): dS = P (Z dP - (1 - p) sum) / (1 - p) scale, sum_scale
  // being 1 - p (1 without dropout).
  Raw dp = g->virtual_tensor(kF32, p.scores());
  g->matmul(d_o, vt, dp);
  if (mask) dp = g->pointwise(CUDNN_POINTWISE_MUL, dp, mask, p.scores());
  Raw ds = g->pointwise(CUDNN_POINTWISE_MUL,
                        g->pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, p.scores()), probs,
                        p.scores());
  if (mask) ds = g->pointwise(CUDNN_POINTWISE_MUL, ds, drop_scale, p.scores());
  ds = g->pointwise(CUDNN_POINTWISE_MUL, ds, scale, p.scores());
  g->matmul(g->reshape_into(ds, g->virtual_tensor(p.io, p.scores_t())), q, dk);
  g->matmul(ds, g->reshape_into(kt, g->virtual_tensor(kF32, p.token_major(3))), dq);
  return g;
}

// ------------------------------------------------------------- planning ---

struct Plan {
  std::unique_ptr<GraphBuilder> parts;  ///< the graph's tensors and operations
  std::optional<Desc> graph, plan;
  std::int64_t workspace = 0, engine = -1;
  std::string passed_over;  ///< engines ranked above the chosen one, and why not taken
};

struct EngineInfo {
  std::int64_t index = -1;
  bool nondeterministic = false;
};

EngineInfo engine_of(Raw config) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  Raw raw = engine.get();
  std::int64_t got = 0;
  CUDNN_TRY(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &raw));
  EngineInfo info;
  CUDNN_TRY(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                                     &got, &info.index));
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  CUDNN_TRY(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                     CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                                     &got, notes));
  for (std::int64_t i = 0; i < got; ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) info.nondeterministic = true;
  return info;
}

/// The heuristics' engine configs for the graph, best first.
std::vector<Desc> engine_configs(Raw graph) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode).finalize();
  std::int64_t n = 0;
  CUDNN_TRY(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr));
  std::vector<Desc> configs;
  std::vector<Raw> raw;
  for (std::int64_t i = 0; i < n; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  if (n > 0)
    CUDNN_TRY(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &n, raw.data()));
  configs.erase(configs.begin() + n, configs.end());  // the results it filled
  return configs;
}

/// The first deterministic engine config whose plan finalizes.
std::unique_ptr<Plan> make_plan(cudnnHandle_t handle, std::unique_ptr<GraphBuilder> parts) {
  auto p = std::make_unique<Plan>();
  p->graph.emplace(parts->finalize(handle));
  p->parts = std::move(parts);
  std::vector<Desc> configs = engine_configs(p->graph->get());
  std::string refused;
  for (const Desc& config : configs) {
    const EngineInfo info = engine_of(config.get());
    if (info.nondeterministic) {
      refused += MESH_MSG(" engine " << info.index << ": nondeterministic;");
      continue;
    }
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config.get());
    const cudnnStatus_t st = cudnnBackendFinalize(plan.get());
    if (st != CUDNN_STATUS_SUCCESS) {
      refused += MESH_MSG(" engine " << info.index << ": " << describe_failure("finalize", st)
                                     << ";");
      continue;
    }
    std::int64_t got = 0;
    CUDNN_TRY(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &got, &p->workspace));
    p->plan.emplace(std::move(plan));
    p->engine = info.index;
    p->passed_over = refused;
    return p;
  }
  throw Unsupported(MESH_MSG("no deterministic engine config of " << configs.size()
                                                                  << " finalizes:" << refused));
}

// ---------------------------------------------------------------- caches ---

struct Key {
  int device;
  DType t;
  index_t s, b, heads, d;
  bool backward;
  double dropout_p = 0.0;  ///< cuDNN's own attention dropout (0: none)
  bool mask_out = false;   ///< the forward writes its keep mask (tests)
  auto operator<=>(const Key&) const = default;
};

struct Entry {
  std::unique_ptr<Plan> plan;  ///< null: cuDNN refused (why)
  std::string why;
};

std::string library_name() {
  const std::size_t v = cudnnGetVersion();
  return MESH_MSG("cuDNN " << v / 10000 << "." << v / 100 % 100 << "." << v % 100);
}

std::string describe(const Key& k) {
  return MESH_MSG(dtype_name(k.t) << " s " << k.s << " b " << k.b << " heads " << k.heads
                                  << " d " << k.d << (k.backward ? " backward" : " forward")
                                  << (k.dropout_p > 0 ? MESH_MSG(" dropout " << k.dropout_p)
                                                      : std::string()));
}

/// Handles (one per device) and plans, built on first use.
class Planner {
 public:
  static Planner& instance() {
    static Planner* planner = new Planner;  // never destroyed: plans may outlive CUDA at exit
    return *planner;
  }

  /// The handle of the current device, or null (why) when cuDNN does not load.
  cudnnHandle_t handle(int device, std::string* why) {
    auto it = handles_.find(device);
    if (it == handles_.end()) {
      cudnnHandle_t h = nullptr;
      const cudnnStatus_t st = cudnnCreate(&h);
      if (st == CUDNN_STATUS_SUCCESS) {
        CUDNN_CHECK(cudnnSetStream(h, compute_stream()));  // meshtron's one compute stream
      } else {
        h = nullptr;
        handle_error_ = describe_failure("cudnnCreate", st);
      }
      it = handles_.emplace(device, h).first;
    }
    if (!it->second && why) *why = handle_error_;
    return it->second;
  }

  const Entry& entry(const Key& key) {
    auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
    Entry e;
    if (key.t != DType::BF16 && key.t != DType::F16) {
      e.why = MESH_MSG("cuDNN's fused attention here takes bf16 or fp16, got "
                       << dtype_name(key.t));
    } else if (const cudnnHandle_t h = handle(key.device, &e.why)) {
      const Problem p{key.t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF,
                      key.s,
                      key.b,
                      key.heads,
                      key.d,
                      key.dropout_p,
                      key.mask_out};
      try {
        e.plan = make_plan(h, key.backward ? backward_graph(p) : forward_graph(p));
      } catch (const Unsupported& u) {
        e.why = MESH_MSG(describe(key) << ": " << u.what());
      }
    }
    return entries_.emplace(key, std::move(e)).first->second;
  }

  std::mutex& mutex() { return mutex_; }

 private:
  std::mutex mutex_;
  std::map<int, cudnnHandle_t> handles_;  ///< Not destroyed: they live as long as the process.
  std::string handle_error_;
  std::map<Key, Entry> entries_;
};

Key key_of(DType t, index_t s, index_t b, index_t heads, index_t d, bool backward,
           double dropout_p = 0.0, bool mask_out = false) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return {device, t, s, b, heads, d, backward, dropout_p, mask_out};
}

/// The variant pack's extra tensors of cuDNN's attention dropout.
struct DropoutBinding {
  explicit DropoutBinding(const CudnnDropout& d_) : d(d_) {
    if (d.p <= 0) return;
    MESH_VERIFY(d.seed && d.offset, "cuDNN attention dropout needs device seed and offset");
    drop_scale = float(1.0 / (1.0 - d.p));
    softmax_sum_scale = float(1.0 - d.p);
  }
  const CudnnDropout& d;
  float drop_scale = 1.f, softmax_sum_scale = 1.f;  ///< 1 / (1 - p), 1 - p (1, 1 without)

  void add_to(std::vector<std::int64_t>& uids, std::vector<void*>& pointers) {
    if (d.p <= 0) return;
    uids.insert(uids.end(), {kSeed, kOffset, kDropScale});
    pointers.insert(pointers.end(), {const_cast<std::int64_t*>(d.seed),
                                     const_cast<std::int64_t*>(d.offset), &drop_scale});
  }
};

/// The cached plan of `key`; aborts (naming cuDNN's refusal) when there is none.
const Plan& plan_for(const Key& key, cudnnHandle_t* handle) {
  Planner& planner = Planner::instance();
  std::lock_guard<std::mutex> lock(planner.mutex());
  const Entry& e = planner.entry(key);
  MESH_VERIFY(e.plan, "cuDNN attention was called for a shape it cannot plan: " << e.why);
  *handle = planner.handle(key.device, nullptr);
  return *e.plan;
}

/// Runs the plan on the bound tensors (uid, pointer), with a fresh workspace.
void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<std::int64_t>& uids,
             const std::vector<void*>& pointers) {
  device::Buffer workspace(std::size_t(plan.workspace));
  void* ws = workspace.as<void>();
  try {
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, std::int64_t(uids.size()),
             uids.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
             std::int64_t(pointers.size()), pointers.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    pack.finalize();
    CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan->get(), pack.get()));
  } catch (const Unsupported& u) {
    ::meshtron::fatal(MESH_MSG("cuDNN attention: building the variant pack: " << u.what()),
                      __FILE__, __LINE__);
  }
}

void check_aligned(const char* op, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    MESH_VERIFY(aligned16(p), op << ": cuDNN attention needs 16-byte aligned operands");
}

}  // namespace

CudnnAttentionSupport cudnn_attention_support(DType t, index_t s, index_t b, index_t heads,
                                              index_t D, double dropout_p) {
  Planner& planner = Planner::instance();
  std::lock_guard<std::mutex> lock(planner.mutex());
  CudnnAttentionSupport out;
  const Entry& fwd = planner.entry(key_of(t, s, b, heads, D, false, dropout_p));
  out.forward = fwd.plan != nullptr;
  out.why_not = fwd.why;
  auto describe_plan = [](const char* direction, const Plan& p) {
    return MESH_MSG(direction << " engine " << p.engine << ", workspace " << p.workspace
                              << " B" << (p.passed_over.empty() ? "" : "; passed over:")
                              << p.passed_over);
  };
  if (out.forward) {
    out.plans = describe_plan("forward", *fwd.plan);
    const Entry& bwd = planner.entry(key_of(t, s, b, heads, D, true, dropout_p));
    out.backward = bwd.plan != nullptr;
    out.why_not = bwd.why;
    if (out.backward) out.plans += "; " + describe_plan("backward", *bwd.plan);
  }
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (planner.handle(device, nullptr)) out.library = library_name();
  return out;
}

void cudnn_attention_forward_token_major(DType t, const void* qkv, index_t s, index_t b,
                                         index_t heads, index_t D, double scale, void* context,
                                         float* lse, const CudnnDropout& dropout) {
  if (s == 0 || b == 0 || heads == 0) return;
  cudnnHandle_t handle = nullptr;
  const bool mask_out = dropout.p > 0 && dropout.mask_out;
  const Plan& plan = plan_for(
      key_of(t, s, b, heads, D, false, std::max(dropout.p, 0.0), mask_out), &handle);
  const char* base = static_cast<const char*>(qkv);
  const std::size_t part = std::size_t(heads * D) * dtype_size(t);
  check_aligned("cudnn_attention_forward", {qkv, base + part, context, lse});
  float scale_f = float(scale), fill = std::numeric_limits<float>::lowest();
  std::vector<std::int64_t> uids{kQ, kK, kV, kO, kStats, kScale, kMaskFill};
  std::vector<void*> pointers{const_cast<char*>(base), const_cast<char*>(base + part),
                              const_cast<char*>(base + 2 * part), context, lse, &scale_f, &fill};
  DropoutBinding drop(dropout);
  drop.add_to(uids, pointers);
  if (mask_out) {
    uids.push_back(kMaskOut);
    pointers.push_back(dropout.mask_out);
  }
  execute(handle, plan, uids, pointers);
}

void cudnn_attention_backward_token_major(DType t, const void* dcontext, const void* qkv,
                                          const void* context, const float* lse, index_t s,
                                          index_t b, index_t heads, index_t D, double scale,
                                          float* delta, void* dqkv, const CudnnDropout& dropout) {
  if (s == 0 || b == 0 || heads == 0) return;
  cudnnHandle_t handle = nullptr;
  const Plan& plan =
      plan_for(key_of(t, s, b, heads, D, true, std::max(dropout.p, 0.0)), &handle);
  char* in = const_cast<char*>(static_cast<const char*>(qkv));
  char* grad = static_cast<char*>(dqkv);
  const std::size_t part = std::size_t(heads * D) * dtype_size(t);
  check_aligned("cudnn_attention_backward",
                {dcontext, qkv, in + part, context, lse, delta, dqkv, grad + part});
  float scale_f = float(scale), fill = std::numeric_limits<float>::lowest();
  DropoutBinding drop(dropout);
  std::vector<std::int64_t> uids{kQ,  kK,  kV,          kO,     kDO,  kStats, kDQ,
                                 kDK, kDV, kSoftmaxSum, kScale, kSoftmaxSumScale, kMaskFill};
  std::vector<void*> pointers{in,
                              in + part,
                              in + 2 * part,
                              const_cast<void*>(context),
                              const_cast<void*>(dcontext),
                              const_cast<float*>(lse),
                              grad,
                              grad + part,
                              grad + 2 * part,
                              delta,
                              &scale_f,
                              &drop.softmax_sum_scale,
                              &fill};
  drop.add_to(uids, pointers);
  execute(handle, plan, uids, pointers);
}

}  // namespace meshtron::cuda

#else  // !MESHTRON_HAVE_CUDNN

#include "common/error.hpp"

namespace meshtron::cuda {

CudnnAttentionSupport cudnn_attention_support(DType, index_t, index_t, index_t, index_t, double) {
  CudnnAttentionSupport out;
  out.why_not = "meshtron was built without cuDNN (not found next to the CUDA toolkit)";
  return out;
}

void cudnn_attention_forward_token_major(DType, const void*, index_t, index_t, index_t, index_t,
                                         double, void*, float*, const CudnnDropout&) {
  MESH_VERIFY(false, "cudnn_attention_forward: meshtron was built without cuDNN");
}

void cudnn_attention_backward_token_major(DType, const void*, const void*, const void*,
                                          const float*, index_t, index_t, index_t, index_t, double,
                                          float*, void*, const CudnnDropout&) {
  MESH_VERIFY(false, "cudnn_attention_backward: meshtron was built without cuDNN");
}

}  // namespace meshtron::cuda

#endif  // MESHTRON_HAVE_CUDNN
