// Multi-head self-attention with heads split across the tp group, causal
// (GPT) or bidirectional over each sample's real keys (AttentionMask::
// Padding, BERT: ops::scaled_masked_softmax_forward on the unfused core):
// a fused q|k|v ColumnParallelLinear gives each rank heads/tp heads, the core
// (softmax(q k^T / sqrt(d)) v) runs locally per head, and a RowParallelLinear
// sums the heads' contributions. One all-reduce forward and one backward
// (reduce-scatter / all-gather pairs under sequence parallelism).
//
// Grouped-query attention (num_query_groups G < num_heads H, Ainslie et
// al., 2023; G = 1: multi-query): the projection has (H + 2G) x head_dim
// columns, global layout [q (H heads) | k (G) | v (G)] (Parameter::
// part_units {H/G, 1, 1}), and rank t holds q heads [t H/tp, (t+1) H/tp)
// and kv groups [t G/tp, (t+1) G/tp), locally [q_t | k_t | v_t]. Query head
// h reads kv group h / (H/G) (transformers' repeat_kv), so a rank's q heads
// read only its own groups. The core never copies k and v per head: the H/G
// query heads of a group are one [H/G * s, d] matrix against the group's
// k and v, and the backward's GEMMs over it sum their gradients.
//
// Rotary positions (Su et al., 2021): q and k are rotated in place in the
// projection's output by the position of each token in its sequence (plus
// position_offset); the backward rotates dq and dk back. The rows are the
// whole sequence on every tp rank (the column-parallel linear gathers the
// sequence shards first), so every rank uses the same positions.
//
// ALiBi (Press et al., 2022): the softmax adds -slope_h (i - j) to the
// scaled scores of query i and key j (ops::scaled_causal_softmax_forward);
// each rank holds the slopes of its global heads, which the fused core takes
// too (ops::FusedAttentionScores), as it takes the padding mask.
//
// The core runs either unfused (scores GEMM, scaled causal softmax, dropout,
// probs @ V, keeping the [b*heads, s, s] probabilities for the backward) or
// fused (ops::fused_attention_*: FlashAttention-2 on the GPU, keeping only
// the context and the per-row log-sum-exp). model.attention_backend picks;
// auto takes the fused kernel on the device wherever it is supported.
#pragma once

#include <cmath>

#include <string>

#include "model/kv_cache.hpp"
#include "model/linear.hpp"
#include "model/model_spec.hpp"

namespace meshtron {

enum class AttentionBackend { Auto, Fused, Unfused };

/// "auto" | "fused" | "unfused" (validated by RunConfig).
inline AttentionBackend attention_backend_from_string(const std::string& s) {
  if (s == "fused") return AttentionBackend::Fused;
  if (s == "unfused") return AttentionBackend::Unfused;
  return AttentionBackend::Auto;
}

class Attention {
 public:
  struct Cache {
    ColumnParallelLinear::Cache qkv;
    RowParallelLinear::Cache proj;
    Tensor q, k, v;    ///< [b * heads_local, s, d] (unfused core only)
    /// Fused core only: the qkv projection's output [s*b, 3 * heads_local * d],
    /// read in place by the fused kernels (with grouped queries, its copy
    /// with k and v repeated per query head: ops::expand_kv_groups).
    Tensor qkv_out;
    /// softmax output before dropout; undefined under selective recompute
    /// (rebuilt from q and k in the backward)
    Tensor probs;
    Tensor probs_kept; ///< after dropout (aliases probs when p = 0); likewise
    /// Fused core only (then probs stay undefined): the log-sum-exp of each
    /// row of scores [b * heads_local, s]. The backward also needs the
    /// context: proj's kept input, in the layout the kernels read.
    Tensor lse;
    /// Fused core on the GPU with attention dropout: the forward's keep
    /// decisions, a bit per probability (ops::AttentionDropout::keep_bits),
    /// so that the backward passes read the mask instead of drawing it again.
    Tensor keep_bits;
  };
  /// Rejects mask none and ALiBi other than causal.
  Attention(const std::string& name, int layer, index_t hidden, const AttentionSpec& spec,
            double dropout, const LayerContext& ctx, DType dtype);
  /// forward() + residual, the add riding in proj's GEMM where it can
  /// (RowParallelLinear::forward_residual); the backward is backward().
  Tensor forward_residual(const Tensor& x, const Tensor& residual, LayerContext& ctx,
                          Cache& cache) const;
  Tensor forward(const Tensor& x, LayerContext& ctx, Cache& cache) const;
  Tensor backward(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  /// Generation: residual + attention of x's rows (placed by `rows`) over
  /// `kv`, after storing their keys and values there (ops::cached_attention;
  /// rotary angles at the rows' absolute positions). No dropout, no backward.
  Tensor forward_cached(const Tensor& x, const Tensor& residual, LayerContext& ctx,
                        const CachedRows& rows, KvCache::Layer& kv) const;
  /// An empty cache of this layer for `slots` sequences of up to
  /// `capacity` tokens.
  KvCache::Layer make_kv_cache(index_t slots, index_t capacity, DType dtype,
                               MemorySpace space) const;
  /// Whether the forward of the micro-batch of `ctx` can read a mask drawn
  /// ahead (device, attention dropout, the fused core, S % 8 == 0).
  bool draws_mask_ahead(const LayerContext& ctx) const;
  /// Draws this layer's attention-dropout mask for the micro-batch of `ctx`
  /// (where draws_mask_ahead) into its ahead buffer on `stream` (a
  /// cudaStream_t), where the fused forward reads it when
  /// ctx.attention_masks_drawn. The buffer lives with the layer: the caller
  /// orders the draws after the last pass reading it.
  void draw_mask_ahead(const LayerContext& ctx, void* stream);
  void collect(ParameterList& out) { qkv.collect(out); proj.collect(out); }

  ColumnParallelLinear qkv;
  RowParallelLinear proj;
  /// Position of the first token of each sequence under rotary positions
  /// (decoding after a prefix); 0 in training.
  index_t position_offset = 0;

 private:
  Tensor core_forward(const Tensor& x, LayerContext& ctx, Cache& c) const;
  double scale() const { return 1.0 / std::sqrt(double(head_dim_)); }
  /// ctx's key-padding mask, checked against the micro-batch.
  const Tensor& key_padding_mask(const LayerContext& ctx) const;
  ops::DropoutSite probs_site(const LayerContext& ctx) const;
  /// The fused core's attention dropout: the unfused path's mask (probs_site)
  /// while training with p > 0, else none.
  ops::AttentionDropout fused_dropout(const LayerContext& ctx) const;
  /// The fused core's ALiBi slopes or key-padding mask (ctx's), or neither.
  ops::FusedAttentionScores fused_scores(const LayerContext& ctx) const;
  /// probs = softmax(q k^T / sqrt(d) + ALiBi) (causal) and probs_kept = dropout(probs)
  /// (the same tensor when dropout is off): the part selective recompute
  /// runs twice. Deterministic, so the rebuilt tensors equal the first ones.
  void attention_probs(const Tensor& q, const Tensor& k, const LayerContext& ctx,
                       Tensor& probs, Tensor& probs_kept) const;
  /// Whether a forward on these activations runs the fused core (backend,
  /// dtype, space, head dim);
  /// "fused" where the fused op cannot run is a UserError.
  bool use_fused(DType activations, MemorySpace space) const;
  /// The rotary positions of the [s, b] rows of ctx's micro-batch, made once
  /// per shape and offset where the activations live.
  const Tensor& rotary_positions(const LayerContext& ctx) const;
  /// Rotates q and k of the projection's output [s*b, (heads + 2 groups) d]
  /// in place by rotary_positions (sign +1), or back (-1, the backward's).
  void rotate_qk(Tensor& qkv_rows, const LayerContext& ctx, double sign) const;
  /// q [b*heads_local, s, d], k and v [b*groups_local, s, d] from the local
  /// projection output, and the inverse for their gradients.
  void split_qkv(const Tensor& qkv_out, index_t s, index_t b, Tensor (&parts)[3]) const;
  Tensor merge_qkv(const Tensor (&parts)[3], index_t s, index_t b) const;
  /// With grouped queries: each sample's q, k and v heads between `all`
  /// [b * (heads_local + 2 groups_local), s, d] (every head of a row apart,
  /// split_heads' layout) and parts [b * heads (or groups), s, d], either way.
  /// (Writes through views: the handles stay const.)
  void move_qkv_heads(const Tensor& all, const Tensor (&parts)[3], index_t b,
                      bool into_parts) const;
  /// q's heads_local/groups_local heads of each group as one matrix:
  /// [b * groups_local, heads per group * s, d] (a view).
  Tensor by_group(const Tensor& per_head) const;
  Tensor core_forward_unfused(const LayerContext& ctx, Cache& c) const;
  void core_backward_unfused(const Tensor& dcontext, const LayerContext& ctx, const Cache& c,
                             Tensor (&dparts)[3]) const;
  int layer_;
  int heads_local_;
  int groups_local_;  ///< kv heads of this rank
  index_t head_dim_;
  bool rotary_ = false;
  ops::RotarySpec rope_;
  Tensor alibi_slopes_;  ///< fp32 [heads_local] of this rank's heads; undefined without ALiBi
  mutable Tensor positions_;  ///< rotary_positions' cache
  mutable index_t positions_b_ = 0, positions_offset_ = 0;
  double dropout_;
  /// Bidirectional over the real keys (ctx.key_padding_mask): the unfused
  /// core's masked softmax, the fused core's key mask.
  bool padding_mask_;
  AttentionBackend backend_;
  /// [b * heads_local, s, words] decisions drawn by draw_mask_ahead.
  Tensor ahead_keep_bits_;
};

}  // namespace meshtron
