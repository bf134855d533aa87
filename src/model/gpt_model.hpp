// GptModel: the part of a decoder-only model (its ModelSpec) one pipeline
// stage holds; GPT-2 is what its layers build today.
//
//   first stage:  token + position embedding (+ its norm)
//   every stage:  its contiguous block of transformer layers
//   last stage:   final norm (pre-norm blocks only), LM head, loss
//
// A tied head (tie_word_embeddings) uses the word embedding: with pp = 1 the
// embedding's own table; with pp > 1 the last stage keeps a copy
// initialised identically, and the two gradients are summed over the
// embedding group before the optimizer (Megatron's
// word_embeddings_for_head), so the copies stay equal. An untied head owns
// its vocab-parallel weight `output_layer.weight` [V_pad/tp, h] (Megatron's
// untie_embeddings_and_output_weights): nothing to copy or keep in sync.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "model/embedding.hpp"
#include "model/stage_model.hpp"
#include "model/transformer_layer.hpp"

namespace meshtron {

class GptModel final : public StageModel {
 public:
  /// Activations one micro-batch keeps between its forward and backward.
  struct Cache : StageCache {
    Embedding::Cache embedding;
    std::vector<TransformerLayer::Cache> layers;
    LayerNorm::Cache final_norm;
    LmHeadLoss::Cache head;
    /// labelled_only: labelled_targets' weights (undefined: every target
    /// counts alike).
    Tensor target_weights;
  };

  /// Its layers reject what they do not build.
  GptModel(const ModelSpec& config, const StagePlacement& placement, LayerContext& ctx,
           DType dtype, std::uint64_t seed);

  /// First stage: `input` is token ids int32 [s*b] in [s, b] order; other
  /// stages: the previous stage's hidden states. Last stage: returns the
  /// per-token loss [s*b] (needs `targets`); others: hidden states.
  /// `labelled_only`: targets of -100 are not scored and the loss is the
  /// mean over the others (transformers' ignore_index), spread over the
  /// s*b rows as BertModel spreads its MLM loss (stage_model.hpp).
  Tensor forward(const Tensor& input, const Tensor& targets, LayerContext& ctx,
                 Cache& cache, bool labelled_only = false) const;
  /// Last stage: `dout` is dloss [s*b]; others: d hidden. Returns d input
  /// hidden (empty tensor on the first stage). Accumulates parameter grads.
  /// `grads_done`, if set, is called with each part's parameters (head and
  /// final norm, each layer, the embedding) as soon as their gradient
  /// accumulation is over: the hook of the overlapped gradient reduction.
  Tensor backward(const Tensor& dout, LayerContext& ctx, const Cache& cache,
                  const std::function<void(const ParameterList&)>& grads_done = {});

  // StageModel: the calls above, the targets taken from the micro-batch.
  std::unique_ptr<StageCache> make_cache() const override { return std::make_unique<Cache>(); }
  Tensor forward(const Tensor& input, const MicroBatch& mb, LayerContext& ctx,
                 StageCache& cache) const override {
    return forward(input, mb.targets, ctx, static_cast<Cache&>(cache), mb.unlabelled_targets);
  }
  Tensor backward(const Tensor& dout, LayerContext& ctx, const StageCache& cache,
                  const std::function<void(const ParameterList&)>& grads_done) override {
    return backward(dout, ctx, static_cast<const Cache&>(cache), grads_done);
  }

  /// Generation: `input` as forward()'s, its rows placed by `rows`, each
  /// layer reading and extending its cache in `kv`. Last stage: this rank's
  /// vocabulary shard of the logits [rows, V_pad/tp] (LmHeadLoss::logits) of
  /// rows.logit_rows (all rows when empty);
  /// others: hidden states.
  Tensor forward_cached(const Tensor& input, const CachedRows& rows, LayerContext& ctx,
                        KvCache& kv) const;
  /// An empty cache of this stage's layers for `slots` sequences of up to
  /// `capacity` tokens.
  KvCache make_kv_cache(index_t slots, index_t capacity, DType dtype, MemorySpace space) const;

  /// Whether this chunk's layers can take the micro-batch of `ctx` with
  /// masks drawn ahead (Attention::draws_mask_ahead; the same for all).
  bool draws_attention_masks_ahead(const LayerContext& ctx) const override;
  /// Every layer's Attention::draw_mask_ahead for the micro-batch of `ctx`
  /// on `stream`.
  void draw_attention_masks_ahead(const LayerContext& ctx, void* stream) override;

  /// All parameters of this stage (a tied head weight once).
  ParameterList parameters() override;
  const ModelSpec& config() const override { return config_; }
  const StagePlacement& placement() const override { return placement_; }
  /// The word-embedding table a tied head uses (this stage's copy), or
  /// null (no head, or an untied one).
  Parameter* head_word_weight() override {
    return head_ && config_.tie_word_embeddings ? head_->word : nullptr;
  }
  Embedding* embedding() { return embedding_ ? &*embedding_ : nullptr; }

 private:
  /// The weight the head multiplies by, made here unless it is the
  /// embedding's own table.
  Parameter& head_weight(const LayerContext& ctx, DType dtype);
  /// The head's parameters that no other part collects.
  void collect_head(ParameterList& out);
  void initialise(LayerContext& ctx, std::uint64_t seed);

  ModelSpec config_;
  StagePlacement placement_;
  std::optional<Embedding> embedding_;
  std::vector<TransformerLayer> layers_;
  std::optional<LayerNorm> final_norm_;  ///< a pre-norm model's last stage (ModelSpec::has_final_norm)
  std::optional<Parameter> head_copy_;  ///< tied: word table copy on a last stage without embedding
  std::optional<Parameter> output_weight_;  ///< untied: the head's own weight
  std::optional<LmHeadLoss> head_;
};

}  // namespace meshtron
