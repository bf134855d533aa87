// What every layer needs to know about the micro-batch it is processing and
// where it sits in the decomposition. Built by the schedule, passed down.
#pragma once

#include <cstdint>
#include <string>

#include "model/parameter.hpp"
#include "ops/ops.hpp"
#include "parallel/mappings.hpp"

namespace meshtron {

/// Activation recomputation (training.recompute), as Megatron-LM's:
///   Selective  the attention core (scores, softmax, attention dropout,
///              probs @ V) is recomputed in the backward from the kept q, k, v;
///              the [b*heads, s, s] probabilities are never stored.
///   Full       a transformer layer keeps only its input; its whole forward
///              runs again at the start of its backward.
enum class Recompute { None, Selective, Full };

/// "none" | "selective" | "full" (validated by RunConfig).
inline Recompute recompute_from_string(const std::string& s) {
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  return Recompute::None;
}

/// Called by a model before a part of it (the embedding, a transformer
/// layer, the final norm and head) reads its parameters in a forward: the
/// distributed optimizer's overlapped parameter all-gather
/// (parallel.overlap_param_gather, optimizer.hpp) waits there for the
/// buckets that hold them, so the gathers of later layers run under the
/// compute of earlier ones.
class ParamGatherHook {
 public:
  virtual void before_forward(const ParameterList& params) = 0;

 protected:
  ~ParamGatherHook() = default;
};

struct LayerContext {
  TensorParallelGroup& tp;        ///< Not owned.
  bool sequence_parallel = false;
  /// Under SP: column-parallel layers keep their gathered input for the
  /// backward (parallel.sequence_parallel_keep_gathered).
  bool keep_gathered_input = false;
  /// Under SP: the row-parallel backward runs its GEMMs by token blocks,
  /// this rank's block while the dy all-gather brings the others'
  /// (parallel.split_row_parallel_backward).
  bool split_row_parallel_backward = false;
  /// Under SP: the column-parallel forward GEMMs multiply this rank's own
  /// rows while the input all-gather brings the others'
  /// (parallel.split_column_parallel_forward).
  bool split_column_parallel_forward = false;
  /// Sequence parallelism over more than one tp rank: the tokens are
  /// sharded, so the tp collectives around the GEMMs are all-gathers and
  /// reduce-scatters.
  bool sequence_sharded() const { return sequence_parallel && tp.size() > 1; }
  bool training = true;           ///< dropout on
  std::uint64_t seed = 0;
  std::uint32_t step = 0;         ///< iteration (dropout counter)
  index_t seq_length = 0;         ///< s, global
  index_t micro_batch = 0;        ///< b
  index_t sample_offset = 0;      ///< global index of sample 0 within the step
  index_t global_batch = 0;       ///< samples in the step over all dp ranks
  /// CUDA graphs: device words {step, sample_offset low, high} the dropout
  /// kernels read at run time (ops::DropoutSite::live); `step` and
  /// `sample_offset` are then 0. Null otherwise. Not owned.
  const std::uint32_t* dropout_live = nullptr;
  /// Where the layers keep their parameters, gradients and activations.
  /// Activations follow their inputs; inputs from elsewhere (token ids,
  /// targets built on the host) are copied here by in_space().
  MemorySpace space = MemorySpace::Host;
  Recompute recompute = Recompute::None;
  /// The LM head writes its logits in the operands' dtype instead of fp32
  /// (training.logits_dtype = compute).
  bool logits_in_compute_dtype = false;
  /// The layers' attention-dropout masks of this micro-batch are in their
  /// ahead buffers (Attention::draw_mask_ahead, training.attention_masks_ahead).
  bool attention_masks_drawn = false;
  /// Attention dropout drawn by cuDNN's fused attention with its own
  /// generator (training.attention_dropout_rng = cudnn).
  bool attention_dropout_cudnn = false;
  /// The column-parallel linears' biases ride in their GEMMs through a ones
  /// column of their inputs (ColumnParallelLinear; training.bias_in_weight_gemm,
  /// by default on the device). Read when the layers are built.
  bool bias_in_weight_gemm = false;
  /// Bidirectional attention with padding (AttentionMask::Padding): which
  /// keys of each sample are real, int32 [b, s] (non-zero: real) where the
  /// activations live. Undefined for causal models.
  Tensor key_padding_mask = Tensor();
  /// With Full: layers of each model chunk recomputed, counted from the
  /// chunk's first (Megatron's "block" method); 0 = every layer.
  int recompute_num_layers = 0;
  /// Null unless parallel.overlap_param_gather. Not owned.
  ParamGatherHook* param_gather = nullptr;
  /// During a model's backward: the chain its layernorm backwards share
  /// (ops::LayerNormGradChain; set and flushed by GptModel::backward). Not
  /// owned; null elsewhere.
  ops::LayerNormGradChain* layernorm_grads = nullptr;

  /// Whether the `local_index`-th layer of a chunk keeps only its input.
  bool recompute_layer(int local_index) const {
    return recompute == Recompute::Full &&
           (recompute_num_layers == 0 || local_index < recompute_num_layers);
  }

  int sp_size() const { return sequence_parallel ? tp.size() : 1; }
  int sp_rank() const { return sequence_parallel ? tp.rank() : 0; }
  /// Tokens (rows) this rank holds in the residual stream: s/sp x b.
  index_t local_tokens() const { return seq_length / sp_size() * micro_batch; }

  /// Dropout site of a [s_local, b, h] activation in [s, b, h] order.
  ops::DropoutSite hidden_site(std::uint32_t stream, index_t hidden) const {
    ops::DropoutSite s;
    s.seed = seed;
    s.step = step;
    s.stream = stream;
    s.a = seq_length / sp_size();
    s.b = micro_batch;
    s.c = hidden;
    s.a_offset = sp_rank() * s.a;
    s.b_offset = sample_offset;
    s.b_global = global_batch;
    s.c_global = hidden;
    s.live = dropout_live;
    s.sample_axis = 1;  // samples are the b axis here
    return s;
  }
};

/// `t` itself when it already lives in `space`, else a copy there.
inline Tensor in_space(const Tensor& t, MemorySpace space) {
  return t.space() == space ? t : t.to_space(space);
}

/// Dtype of per-row statistics (mean, rstd, softmax max and sums, loss) of
/// an activation `x`: its own dtype on the host (fp32, or fp64 in gradient
/// checks), always fp32 on the device (see op_checks.hpp's dtype rules).
inline DType stats_dtype(DType activation, MemorySpace space) {
  return space == MemorySpace::Host ? activation : DType::F32;
}
inline DType stats_dtype(const Tensor& x) { return stats_dtype(x.dtype(), x.space()); }

/// Dropout streams: layer * kStreamsPerLayer + site.
constexpr std::uint32_t kStreamsPerLayer = 16;
constexpr std::uint32_t kStreamAttentionProbs = 1, kStreamAttentionOut = 2,
                        kStreamMlpOut = 3;
constexpr std::uint32_t kStreamEmbedding = 0xffff0u;

}  // namespace meshtron
