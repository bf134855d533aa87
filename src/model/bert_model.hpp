// BertModel: Megatron-LM's BertModel, laid out as transformers'
// MegatronBertForPreTraining, on one pipeline stage:
//
//   embedding     word (vocab-parallel) + learned position + token type,
//                 then dropout (no norm: Megatron moved it into the blocks)
//   blocks        pre-LN transformer layers, bidirectional attention over
//                 each sample's real tokens (AttentionMask::Padding)
//   final norm
//
// or, with post-norm blocks and the embedding norm (google_bert_spec), the
// original Google BERT, transformers' BertForPreTraining: the embedding
// sum normed (embeddings.LayerNorm) before its dropout, post-LN blocks
// (TransformerLayer), no final norm; the heads below are the same.
//   MLM head      dense h->h, GeLU, LayerNorm, logits = x W_word^T + bias
//                 (vocab-parallel, tied to the word table), vocab-parallel
//                 cross-entropy (LmHeadLoss)
//   pooler        dense h->h + tanh on each sample's first token
//   binary head   h->2 (next-sentence / sentence-order prediction)
//
// loss = mean over labelled tokens (label != -100) of the MLM cross-entropy
//      + mean over samples of the binary head's cross-entropy,
// as MegatronBertForPreTraining (CrossEntropyLoss, ignore_index -100).
//
// Tensor parallelism: heads and the MLP split as in GptModel's layers, the
// word table, the MLM bias and the MLM loss split by vocabulary rows; the
// head transform, pooler and binary head are replicated (as Megatron's),
// each rank computing them on the replicated final hidden states. Under
// sequence parallelism the residual stream is sharded by rows as in
// GptModel; the final norm's output is all-gathered (gather_from_sp: every
// rank's d of it is the same, so the backward keeps its own rows) for the
// heads, which read every token (MLM) and each sample's first (pooler).
//
// Pipeline parallelism: see the placement constructor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/embedding.hpp"
#include "model/stage_model.hpp"
#include "model/transformer_layer.hpp"

namespace meshtron {

/// The spec of a MegatronBert of these sizes: pre-LN with biases, learned
/// positions, bidirectional attention with a padding mask, the exact GeLU,
/// `num_token_types` segments, the head tied to the word table.
ModelSpec bert_spec(int layers, int hidden, int heads, int ffn, int vocab, int seq_length,
                    int max_positions, int num_token_types);
/// bert_spec's sizes as Google BERT (transformers' BertForPreTraining):
/// post-norm blocks and the embedding norm.
ModelSpec google_bert_spec(int layers, int hidden, int heads, int ffn, int vocab, int seq_length,
                           int max_positions, int num_token_types);

/// One micro-batch of BERT's inputs; token rows in [s, b] order, as
/// GptModel's (row t * b + i is token t of sample i).
struct BertBatch {
  Tensor tokens;         ///< int32 [s*b]
  Tensor token_types;    ///< int32 [s*b], each in [0, num_token_types)
  Tensor padding_mask;   ///< int32 [b, s]: 1 a real token, 0 padding
  Tensor labels;         ///< int32 [s*b]: the token to predict, or -100 (none)
  Tensor next_sentence;  ///< int32 [b]: the binary head's class, 0 or 1
};

/// A linear layer every tp rank holds whole: Y = X W + b, W [in, out].
struct ReplicatedLinear {
  ReplicatedLinear(const std::string& name, index_t in, index_t out, DType dtype,
                   MemorySpace space);
  Tensor forward(const Tensor& x) const;
  /// dX; accumulates dW += X^T dY and db += colsum(dY).
  Tensor backward(const Tensor& dy, const Tensor& x);
  void collect(ParameterList& out) {
    out.push_back(&weight);
    out.push_back(&bias);
  }
  Parameter weight, bias;
};

class BertModel final : public StageModel {
 public:
  struct Cache : StageCache {
    Embedding::Cache embedding;
    std::vector<TransformerLayer::Cache> layers;
    LayerNorm::Cache final_norm;
    Tensor padding_mask;  ///< [b, s] where the layers live (ctx.key_padding_mask)
    Tensor sequence;      ///< the final norm's (or last block's) output [s*b, h], gathered under SP
    Tensor transform_pre_gelu;
    LayerNorm::Cache transform_norm;
    LmHeadLoss::Cache mlm;
    Tensor mlm_weights;   ///< [s*b]: 1 / labelled tokens where labelled, else 0
    Tensor mlm_losses;    ///< [s*b]: each token's MLM cross-entropy (label 0 where none)
    Tensor binary_losses; ///< [b]: each sample's binary-head cross-entropy
    Tensor pooler_pre_tanh, pooled;
    Tensor binary_logits, binary_targets, binary_max, binary_sum_exp;  ///< [b, 2], [b]
    double mlm_loss = 0, binary_loss = 0;
  };

  /// The whole model. Rejects a spec whose model_class is not
  /// BertPretraining, and what its layers reject.
  BertModel(const ModelSpec& spec, LayerContext& ctx, DType dtype, std::uint64_t seed);
  /// The part of `placement` (Megatron's split): the embedding on the first
  /// stage, the final norm and both heads on the last, which keeps its own
  /// copy of the tied word table when it is not also the first (GptModel's
  /// head copy: the trainer sums the two gradients over the embedding group).
  BertModel(const ModelSpec& spec, const StagePlacement& placement, LayerContext& ctx,
            DType dtype, std::uint64_t seed);
  /// The whole model only: the batch's loss (MLM + binary head); checks the
  /// batch (a UserError naming the offending input).
  double forward(const BertBatch& batch, LayerContext& ctx, Cache& cache) const;
  /// Accumulates the gradients of forward's loss into the parameters.
  void backward(LayerContext& ctx, const Cache& cache);

  // StageModel. The micro-batch's ids are the tokens, its targets the MLM
  // labels; every stage reads its padding mask, the first its token types,
  // the last its labels and next-sentence classes. The last stage's
  // per-token loss puts s*b * (1 / labelled) * MLM loss on each labelled
  // token and s * the binary loss on each sample's first token: its mean is
  // forward()'s loss, so the trainer's mean over the step's tokens is the
  // mean over its micro-batches of the BERT loss (Megatron's averaging).
  std::unique_ptr<StageCache> make_cache() const override { return std::make_unique<Cache>(); }
  Tensor forward(const Tensor& input, const MicroBatch& mb, LayerContext& ctx,
                 StageCache& cache) const override;
  Tensor backward(const Tensor& dout, LayerContext& ctx, const StageCache& cache,
                  const std::function<void(const ParameterList&)>& grads_done) override;
  const ModelSpec& config() const override { return spec_; }
  const StagePlacement& placement() const override { return placement_; }
  Parameter* head_word_weight() override { return heads_ ? heads_->mlm_loss.word : nullptr; }

  /// What `meshtron evaluate` reports of a forward: the MLM cross-entropy
  /// summed over the labelled tokens and their number, the binary head's
  /// right answers (argmax) and the samples.
  struct Scores {
    double mlm_loss_sum = 0, labelled = 0, binary_correct = 0, samples = 0;
  };
  static Scores scores(const Cache& c);

  /// This rank's vocabulary shard of the prediction logits [s*b, V_pad/tp]
  /// (bias included), and the binary head's logits [b, 2].
  static const Tensor& prediction_logits(const Cache& c) { return c.mlm.logits; }
  static const Tensor& binary_logits(const Cache& c) { return c.binary_logits; }

  /// All parameters of this stage, in the order of the Hugging Face layout
  /// (a last stage's word-table copy at the end).
  ParameterList parameters() override;
  const ModelSpec& spec() const { return spec_; }

 private:
  /// The last stage's parts. Not movable: the loss holds the bias's address.
  struct Heads {
    Heads(const ModelSpec& s, const LayerContext& ctx, DType dtype, Parameter& word);
    Heads(const Heads&) = delete;
    Heads& operator=(const Heads&) = delete;
    void collect(ParameterList& out);
    std::optional<LayerNorm> final_norm;  ///< pre-norm blocks only (ModelSpec::has_final_norm)
    ReplicatedLinear transform;  ///< "mlm_head.dense"
    LayerNorm transform_norm;    ///< "mlm_head.norm"
    Parameter mlm_bias;          ///< "mlm_head.bias" [V_pad/tp], split by rows as the word table
    ReplicatedLinear pooler;
    ReplicatedLinear binary_head;
    LmHeadLoss mlm_loss;
  };

  void check_batch(const BertBatch& batch, const LayerContext& ctx) const;
  /// First stage: embeds batch.tokens, others take `hidden`; then this
  /// stage's layers. Last stage: the final norm and both heads fill the
  /// cache's losses. Returns the layers' output.
  Tensor stage_forward(const Tensor& hidden, const BertBatch& batch, LayerContext& ctx,
                       Cache& c) const;
  /// The MLM loss of the final hidden states (fills the MLM part of the cache).
  double mlm_forward(const Tensor& sequence, const Tensor& labels, LayerContext& ctx,
                     Cache& c) const;
  double binary_forward(const Tensor& sequence, const Tensor& next_sentence,
                        const LayerContext& ctx, Cache& c) const;
  /// d (the layers' output) from both heads, given d loss / d (each token's
  /// MLM cross-entropy) [s*b] and d loss / d (each sample's binary loss) [b].
  Tensor heads_backward(LayerContext& ctx, const Cache& c, const Tensor& dmlm,
                        const Tensor& dbinary);
  /// This stage's layers and the embedding from d (their output); returns
  /// d (their input), empty on the first stage.
  Tensor body_backward(const Tensor& dx, LayerContext& ctx, const Cache& c);
  void initialise(const LayerContext& ctx, std::uint64_t seed);

  ModelSpec spec_;
  StagePlacement placement_;
  std::optional<Embedding> embedding_;
  std::vector<TransformerLayer> layers_;
  std::optional<Parameter> head_copy_;  ///< the tied word table on a last stage without embedding
  std::optional<Heads> heads_;
};

}  // namespace meshtron
