// T5's attention (transformers' T5Attention), self or cross, heads split
// over the tp group:
//
//   self   q | k | v = x W_qkv              (one ColumnParallelLinear, as Attention's)
//   cross  q = x W_q,  k | v = memory W_kv  (memory: the encoder's output)
//   probs  = softmax(scale q k^T + bias + masks)   (ops::attention_softmax_forward)
//   out    = dropout(probs) v W_o                  (RowParallelLinear)
//
// No biases. T5 does not divide the scores by sqrt(d) (AttentionSpec::
// scale_scores false: scale 1). The position bias [heads_local, Sq, Sk]
// comes from the stack (T5Stack computes it once from the relative-bias
// table and every layer adds the same one); the backward sums d(logits)
// over the samples into the stack's bias gradient (ops::attention_bias_
// backward), which the stack scatters into the table once.
//
// The core is the unfused one (gemm_batched, the general masked softmax,
// gemm_batched) on host and device: the fused kernels take no bias. Sq and
// Sk differ in cross-attention; rows are in [s, b] order on both sides.
#pragma once

#include <optional>
#include <string>

#include "model/linear.hpp"
#include "model/model_spec.hpp"

namespace meshtron {

class T5Attention {
 public:
  enum class Kind { Self, Cross };
  struct Cache {
    ColumnParallelLinear::Cache in;  ///< qkv (self) or q (cross)
    ColumnParallelLinear::Cache kv;  ///< cross only
    RowParallelLinear::Cache proj;
    Tensor q, k, v;                  ///< [b * heads_local, Sq or Sk, d]
    /// softmax output and its dropout (the same tensor without dropout);
    /// undefined under selective recompute (rebuilt in the backward)
    Tensor probs, probs_kept;
  };
  /// `stream_layer`: the dropout streams' layer number (distinct over both
  /// stacks); `probs_site`: the site of the probabilities' dropout within it.
  T5Attention(const std::string& name, Kind kind, int stream_layer, std::uint32_t probs_site,
              index_t hidden, const AttentionSpec& spec, double dropout,
              const LayerContext& ctx, DType dtype);
  /// x [Sq*b, h] -> [Sq*b, h]; `memory` [Sk*b, h] for cross-attention
  /// (undefined for self); under sequence parallelism x, memory and the
  /// output are this rank's sequence shards. `masks` holds this rank's heads of the bias.
  Tensor forward(const Tensor& x, const Tensor& memory, const ops::SoftmaxMasks& masks,
                 LayerContext& ctx, Cache& cache) const;
  /// dx from dy; cross-attention adds d(memory) into `dmemory` (set when
  /// undefined). With `dbias` (fp32 [heads_local, Sq, Sk]) d(bias) is
  /// accumulated there.
  Tensor backward(const Tensor& dy, const ops::SoftmaxMasks& masks, LayerContext& ctx,
                  const Cache& cache, Tensor* dbias, Tensor* dmemory);
  void collect(ParameterList& out);

  /// Generation: keys and values [b * heads_local, capacity, d] (self:
  /// filled one position per step; cross: the encoder's, computed once).
  struct KeyValues {
    Tensor k, v;
  };
  /// Self-attention's empty cache for `capacity` decoder positions.
  KeyValues make_cache(index_t b, index_t capacity, DType dtype, MemorySpace space) const;
  /// Cross-attention's keys and values of `memory` [s_enc*b, h] (no
  /// sequence parallelism).
  KeyValues key_values(const Tensor& memory, LayerContext& ctx) const;
  /// Generation: x [b, h], one token per sample at decoder `position`
  /// (self: its key and value are stored there first) attending over
  /// `kv` under `masks` (whose key mask hides the positions not yet
  /// filled); no dropout. Returns [b, h].
  Tensor forward_step(const Tensor& x, index_t position, const ops::SoftmaxMasks& masks,
                      LayerContext& ctx, KeyValues& kv) const;

  ColumnParallelLinear in;                ///< "qkv" [h, 3 inner] or "q" [h, inner]
  std::optional<ColumnParallelLinear> kv; ///< cross only: "kv" [h, 2 inner]
  RowParallelLinear proj;                 ///< "proj" [inner, h]

  int heads_local() const { return heads_local_; }

 private:
  /// probs = softmax(scale q k^T + masks), probs_kept = dropout(probs).
  void attention_probs(const Tensor& q, const Tensor& k, const ops::SoftmaxMasks& masks,
                       const LayerContext& ctx, Tensor& probs, Tensor& probs_kept) const;
  ops::DropoutSite probs_site(const LayerContext& ctx, index_t sq, index_t sk) const;
  Kind kind_;
  int stream_layer_;
  std::uint32_t probs_site_;
  int heads_local_;
  index_t head_dim_;
  double scale_;
  double dropout_;
};

}  // namespace meshtron
