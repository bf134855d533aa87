// T5's encoder and decoder stacks (transformers' T5Stack) on the residual
// stream x [s/sp * b, h] (rows in [s, b] order; sequence-sharded under
// sequence parallelism):
//
//   encoder block  x = x + dropout(SelfAttention(ln_1(x)))          bidirectional
//                  x = x + dropout(Mlp(ln_2(x)))
//   decoder block  x = x + dropout(SelfAttention(ln_1(x)))          causal
//                  x = x + dropout(CrossAttention(ln_2(x), memory)) on the encoder output
//                  x = x + dropout(Mlp(ln_3(x)))
//   stack output   dropout(final_norm(x))
//
// Mlp(x) = proj(dropout(act(fc x))) (transformers' T5DenseActDense /
// T5DenseGatedActDense), every dropout at model.hidden_dropout (T5's
// dropout_rate), the attention probabilities' at model.attention_dropout.
//
// The norms are T5LayerNorm (RMSNorm without bias). The relative position
// bias is the stack's: its table `relative_bias` [buckets, heads] (columns
// split over tp with the heads) gives one bias [heads_local, s, s] per
// forward (bucket of key - query, bidirectional in the encoder, causal in
// the decoder), which every block adds; its gradient is the sum of the
// blocks' d(bias), scattered into the table once. Self-attention masks the
// stack's padding keys (the decoder's only when it has a mask),
// cross-attention the encoder's, without a position bias.
//
// Dropout streams: block i of a stack whose first block is stream layer L
// draws from layer L + i (T5Model: the encoder's blocks 0.., the decoder's
// after them), so no two sites of the model share a stream.
//
// Pipeline stages (T5StackPart): a stage holds blocks [first, first + count)
// of the stack, named and keyed by their index in the whole stack, the
// final norm (and its dropout) only on the stack's last stage, and the
// relative-bias table on every stage that holds blocks: each computes the
// bias its own blocks add, and the copies' gradients are summed over the
// stack's stages (Parameter::stage_copy; the trainer's stack group).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "model/layer_norm.hpp"
#include "model/mlp.hpp"
#include "model/model_spec.hpp"
#include "model/t5_attention.hpp"

namespace meshtron {

/// Dropout sites of a block beyond kStreamAttentionProbs, kStreamAttentionOut
/// and kStreamMlpOut (layer_context.hpp): a decoder block's cross-attention,
/// and the MLP's inner dropout (Mlp, between the activation and proj).
constexpr std::uint32_t kStreamCrossAttentionProbs = 4, kStreamCrossAttentionOut = 5,
                        kStreamMlpInner = 6;

/// What a block's attentions add to their scores and mask (this rank's heads).
struct T5Masks {
  ops::SoftmaxMasks self;
  ops::SoftmaxMasks cross;  ///< decoder only
};

class T5Block {
 public:
  struct Cache {
    LayerNorm::Cache ln_1, ln_cross, ln_mlp;
    T5Attention::Cache self_attention, cross_attention;
    Mlp::Cache mlp;
    /// Full recompute: the block's input, the only tensor kept.
    Tensor input;
    bool checkpointed = false;
  };
  /// `prefix` "encoder" or "decoder"; `stream_layer` its dropout streams' layer.
  T5Block(const std::string& prefix, int index, int stream_layer, bool decoder,
          const ModelSpec& spec, const LayerContext& ctx, DType dtype);
  /// `memory`: the encoder's output (decoder blocks).
  Tensor forward(const Tensor& x, const Tensor& memory, const T5Masks& masks, LayerContext& ctx,
                 Cache& cache) const;
  /// forward() keeping only x (full recompute).
  Tensor forward_checkpointed(const Tensor& x, const Tensor& memory, const T5Masks& masks,
                              LayerContext& ctx, Cache& cache) const;
  /// dx; accumulates d(bias) into `dbias` and d(memory) into `dmemory`
  /// (decoder blocks). `memory` is the forward's (to rebuild a checkpointed block).
  Tensor backward(const Tensor& dy, const Tensor& memory, const T5Masks& masks,
                  LayerContext& ctx, const Cache& cache, Tensor& dbias, Tensor& dmemory);
  void collect(ParameterList& out);
  /// Generation (decoder blocks): x [b, h], one token per sample at
  /// `position`, over this block's self-attention cache and the encoder's
  /// keys and values; no dropout.
  Tensor forward_step(const Tensor& x, index_t position, const T5Masks& masks, LayerContext& ctx,
                      T5Attention::KeyValues& self_kv, T5Attention::KeyValues& cross_kv) const;

  LayerNorm ln_1;
  T5Attention self_attention;             ///< "attention" (encoder), "self_attention" (decoder)
  std::optional<LayerNorm> ln_cross;      ///< decoder: "ln_2"
  std::optional<T5Attention> cross_attention;
  LayerNorm ln_mlp;                       ///< "ln_2" (encoder), "ln_3" (decoder)
  Mlp mlp;

 private:
  Tensor backward_stored(const Tensor& dy, const T5Masks& masks, LayerContext& ctx,
                         const Cache& cache, Tensor& dbias, Tensor& dmemory);
  /// residual + dropout(branch) at `site` of this block.
  Tensor add_branch(const Tensor& branch, const Tensor& residual, std::uint32_t site,
                    const LayerContext& ctx) const;
  Tensor branch_backward(const Tensor& dy, std::uint32_t site, const LayerContext& ctx) const;
  int stream_layer_;
  double hidden_dropout_;
};

/// The blocks of a stack one pipeline stage holds.
struct T5StackPart {
  int first = 0;            ///< the stack's index of the first block here
  int count = 0;            ///< blocks here (0: none of this stack)
  bool final_norm = true;   ///< the stack's last block is here
  /// The whole stack of `blocks` blocks.
  static T5StackPart whole(int blocks) { return {0, blocks, true}; }
};

class T5Stack {
 public:
  struct Cache {
    std::vector<T5Block::Cache> blocks;
    LayerNorm::Cache final_norm;
    T5Masks masks;
    Tensor buckets;  ///< int32 [s, s] where the table lives
    Tensor memory;   ///< decoder: the encoder's output
  };
  /// `name` "encoder" or "decoder"; `first_stream_layer` the dropout
  /// stream layer of its block 0; `final_stream` the final dropout's stream.
  /// `part` the blocks this stage holds (the whole stack by default).
  T5Stack(const std::string& name, bool decoder, const ModelSpec& spec, int first_stream_layer,
          std::uint32_t final_stream, const LayerContext& ctx, DType dtype,
          std::optional<T5StackPart> part = std::nullopt);
  /// x [s/sp * b, h] (ctx.seq_length = s) -> dropout(final_norm(blocks(x)))
  /// (blocks(x) on a stage without the final norm).
  /// `key_mask` int32 [b, s] (may be undefined in the decoder: every key
  /// real); decoder: `memory` [s_enc/sp * b, h] and its `memory_mask` [b, s_enc].
  Tensor forward(const Tensor& x, const Tensor& key_mask, const Tensor& memory,
                 const Tensor& memory_mask, LayerContext& ctx, Cache& cache) const;
  /// dx of the stack input; the decoder adds d(memory) into `dmemory`.
  Tensor backward(const Tensor& dy, LayerContext& ctx, const Cache& cache, Tensor* dmemory);
  void collect(ParameterList& out);

  /// This rank's heads' position bias [heads_local, sq, sk] for queries at
  /// positions query_offset.. (generation) against keys 0..sk-1, and the
  /// buckets it used.
  Tensor position_bias(index_t sq, index_t sk, index_t query_offset, const LayerContext& ctx,
                       Tensor* buckets = nullptr) const;

  Parameter relative_bias;  ///< "<name>.relative_bias.weight" [buckets, heads/tp]
  std::vector<T5Block> blocks;        ///< this stage's
  std::optional<LayerNorm> final_norm;  ///< on the stack's last stage

 private:
  /// The bias and its gradient: fp32, or fp64 for an fp64 model on the host
  /// (the gradient checks).
  DType bias_dtype(const LayerContext& ctx) const;
  ops::DropoutSite final_site(const LayerContext& ctx) const {
    return ctx.hidden_site(final_stream_, final_norm->weight.value.numel());
  }
  bool decoder_;
  int num_buckets_, max_distance_, heads_local_;
  /// position_bias' buckets of the last (sq, sk, query_offset).
  mutable Tensor buckets_;
  mutable std::array<index_t, 3> buckets_key_{};
  double hidden_dropout_;
  std::uint32_t final_stream_;
};

}  // namespace meshtron
