// T5Model: transformers' T5ForConditionalGeneration (T5 v1.0: ReLU, the
// head tied to the shared table) and MT5ForConditionalGeneration / T5 v1.1
// (gated gelu_new, an untied lm_head), the whole model or one pipeline stage
// of it:
//
//   embedding   the shared vocab-parallel word table (Embedding), no
//               positions, dropout; the encoder's and the decoder's ids
//   encoder     T5Stack (bidirectional, the encoder's padding mask)
//   decoder     T5Stack (causal, its own padding mask if given; every
//               block's cross-attention on the encoder output)
//   head        tied: logits = (d_model^-0.5 x) W_word^T; untied:
//               logits = x W_out^T (output_layer.weight [V, h]); the
//               vocab-parallel cross-entropy (LmHeadLoss)
//
// loss = mean over the labelled decoder tokens (label != -100) of the
// cross-entropy (transformers' CrossEntropyLoss(ignore_index = -100)).
//
// Tensor parallelism as GptModel's: heads (and the relative-bias tables'
// head columns) and the MLP split, the word table, head and loss split by
// vocabulary rows. Dropout masks are keyed by global positions (the
// encoder's blocks draw from stream layers 0.., the decoder's from
// num_layers..; the embeddings and the stacks' final dropouts from streams
// of their own; the feed-forward's inner dropout by global ffn column), so
// every tp layout drops what one rank does. The dropouts are transformers':
// after each embedding, on the attention probabilities, inside the
// feed-forward (between the activation and wo), on each branch before its
// residual add and after each stack's final norm.
//
// Sequence parallelism (ctx.sequence_parallel): both stacks' residual
// streams are sharded by sequence ([s/tp * b, h] rows per rank, both
// lengths multiples of tp); the column-parallel linears gather them, the
// encoder's output among them: each cross-attention's kv projection
// all-gathers the encoder's shards, and its backward reduce-scatters
// d(encoder output) back to them. The position bias and the masks cover
// the whole sequence on every rank (attention runs on all tokens of its
// heads).
//
// The two sequence lengths come from the batch (ids / ctx.micro_batch);
// ctx.seq_length is not read (each stack runs under a copy of ctx with its
// own). Initialisation follows transformers' T5PreTrainedModel._init_weights
// (initializer_factor 1): the word table and untied head N(0, 1); q
// N(0, (h d_kv)^-1/2), k and v N(0, h^-1/2), o N(0, (heads d_kv)^-1/2);
// wi N(0, h^-1/2), wo N(0, d_ff^-1/2); relative-bias tables N(0, h^-1/2);
// norms 1. Keyed by name and global index: the same model on any tp and pp.
//
// Pipeline parallelism as Megatron splits an encoder-decoder model
// (stage_placement): stages [0, split) hold the encoder's blocks, evenly,
// [split, pp) the decoder's. The word table lives on the first encoder
// stage, the first decoder stage and (tied head) the last stage, its
// copies' gradients summed over the embedding group; the encoder's final
// norm on the last encoder stage; each stage that holds blocks of a stack
// holds that stack's relative-bias table (T5Stack). What travels between
// stages ([rows, h], rows in order):
//
//   encoder stage -> next     its blocks' output (the last encoder stage:
//                             the encoder output, after the final norm)
//   decoder stage -> next     [encoder output ; decoder hidden states]
//
// so every decoder stage's cross-attention reads the encoder output, and
// the gradient going back is [d(encoder output) ; d(hidden)], each decoder
// stage adding its cross-attentions' share to the first half; the first
// decoder stage sends d(encoder output) alone to the last encoder stage.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/embedding.hpp"
#include "model/stage_model.hpp"
#include "model/t5_stack.hpp"

namespace meshtron {

/// The spec of a T5 of these sizes (activation Relu: v1.0, GegluTanh: v1.1 / mT5).
ModelSpec t5_spec(int encoder_layers, int decoder_layers, int d_model, int heads, int d_kv,
                  int d_ff, Activation activation, bool tie_word_embeddings, int vocab,
                  int encoder_seq_length, int decoder_seq_length, int buckets = 32,
                  int max_distance = 128, double eps = 1e-6);

/// One micro-batch of T5's inputs; token rows in [s, b] order (row t*b + i
/// is token t of sample i).
struct T5Batch {
  Tensor encoder_ids;   ///< int32 [s_enc * b]
  Tensor encoder_mask;  ///< int32 [b, s_enc]: 1 real, 0 padding
  Tensor decoder_ids;   ///< int32 [s_dec * b]
  Tensor decoder_mask;  ///< int32 [b, s_dec], optional (undefined: all real)
  Tensor labels;        ///< int32 [s_dec * b], -100 = not scored
};

class T5Model final : public StageModel {
 public:
  struct Cache : StageCache {
    Embedding::Cache encoder_embedding, decoder_embedding;
    T5Stack::Cache encoder, decoder;
    index_t encoder_length = 0, decoder_length = 0;
    Tensor encoder_mask;   ///< [b, s_enc] where the layers live
    Tensor encoder_out;    ///< the encoder stack's output [s_enc*b, h]
    LmHeadLoss::Cache head;
    Tensor weights;        ///< [s_dec*b]: 1 / labelled tokens where labelled, else 0
    Tensor losses;         ///< [s_dec*b]: each token's cross-entropy (label 0 where none)
    double loss = 0;
  };

  /// Rejects a spec whose model_class is not T5, and what its layers reject.
  T5Model(const ModelSpec& spec, LayerContext& ctx, DType dtype, std::uint64_t seed);
  /// One pipeline stage: `place` over the layers of both stacks, the
  /// encoder's first ([0, num_layers), then the decoder's), either the
  /// whole model or within one stack (stage_placement).
  T5Model(const ModelSpec& spec, const StagePlacement& place, LayerContext& ctx, DType dtype,
          std::uint64_t seed);
  /// Stage `stage` of `pp` under Megatron's split: the encoder's layers
  /// evenly over stages [0, split), the decoder's over [split, pp); a
  /// UserError where they do not divide evenly.
  static StagePlacement stage_placement(const ModelSpec& spec, int stage, int pp, int split);
  /// The whole-batch calls (forward(T5Batch), backward) hold the whole
  /// model: a UserError naming `what` otherwise.
  void require_whole_model(const char* what) const;
  /// Mean cross-entropy over the labelled decoder tokens; checks the batch
  /// (a UserError naming the offending input).
  double forward(const T5Batch& batch, LayerContext& ctx, Cache& cache) const;
  /// Accumulates d(forward's loss)/d(params).
  void backward(LayerContext& ctx, const Cache& cache);
  /// This rank's vocabulary shard of the logits [s_dec*b, V_pad/tp] (after
  /// T5's scaling of a tied head).
  static const Tensor& logits(const Cache& c) { return c.head.logits; }

  /// Generation: the encoder's output [s_enc*b, h] (this rank's sequence
  /// shard under sequence parallelism) of ids int32 [s_enc*b] ([s, b] rows,
  /// b = ctx.micro_batch) and mask int32 [b, s_enc]; no dropout is drawn
  /// unless ctx.training. On an encoder stage: its blocks' part, `input`
  /// the ids on the first stage, else the previous stage's rows
  /// [s_enc*b, h]; the final norm on the last.
  Tensor encode(const Tensor& input, const Tensor& mask, LayerContext& ctx) const;

  /// Generation's decoder state: the self-attention caches of every
  /// decoder block and the cross-attention keys and values of the encoder
  /// output, computed once (no sequence parallelism).
  struct DecoderState {
    index_t position = 0;  ///< decoder tokens fed so far
    index_t capacity = 0;  ///< the most the caches hold
    Tensor encoder_mask;   ///< int32 [b, s_enc] where the layers live
    std::vector<T5Attention::KeyValues> self, cross;  ///< per decoder block
  };
  /// The state for decoding up to `capacity` tokens per sample after
  /// encode(): encoder_out [s_enc*b, h], encoder_mask int32 [b, s_enc].
  DecoderState start_decoding(const Tensor& encoder_out, const Tensor& encoder_mask,
                              index_t capacity, LayerContext& ctx) const;
  /// Feeds ids int32 [b] (one token per sample, at state.position) and
  /// returns this rank's vocabulary shard of their logits [b, V_pad/tp]
  /// (LmHeadLoss::logits, after T5's scaling of a tied head): the rows
  /// forward() gives at that position for the same decoder prefix. On a
  /// decoder stage: its blocks' part, `input` the ids on the first decoder
  /// stage, else the previous stage's rows [b, h]; the rows [b, h] it
  /// passes on, the logits on the last stage.
  Tensor decode_step(const Tensor& input, LayerContext& ctx, DecoderState& state) const;

  // StageModel (the whole model on one stage): mb.ids are the encoder's
  // ids, mb.padding_mask its mask, mb.decoder_ids / decoder_padding_mask
  // the decoder's, mb.targets the labels. The per-token loss [s_dec*b] puts
  // s_dec*b / labelled * cross-entropy on each labelled token (0 elsewhere):
  // its mean is forward()'s loss, as BertModel spreads its loss.
  std::unique_ptr<StageCache> make_cache() const override { return std::make_unique<Cache>(); }
  Tensor forward(const Tensor& input, const MicroBatch& mb, LayerContext& ctx,
                 StageCache& cache) const override;
  Tensor backward(const Tensor& dout, LayerContext& ctx, const StageCache& cache,
                  const std::function<void(const ParameterList&)>& grads_done) override;
  ParameterList parameters() override;
  const ModelSpec& config() const override { return spec_; }
  const StagePlacement& placement() const override { return placement_; }
  Parameter* head_word_weight() override {
    return placement_.has_head && spec_.tie_word_embeddings ? &embedding->word : nullptr;
  }
  /// Encoder stage: [s_enc*b/sp, h]; decoder stage: the encoder output
  /// (first decoder stage) or [encoder output ; hidden] (see the file comment).
  Shape input_shape(const MicroBatch& mb, const LayerContext& ctx) const override;
  Shape output_shape(const MicroBatch& mb, const LayerContext& ctx) const override;
  const ModelSpec& spec() const { return spec_; }

  /// "embedding.word.weight", T5's `shared`: on the first stage of each
  /// stack and on a tied head's stage.
  std::optional<Embedding> embedding;
  T5Stack encoder;  ///< this stage's encoder blocks (none on a decoder stage)
  T5Stack decoder;  ///< this stage's decoder blocks (none on an encoder stage)
  std::optional<Parameter> output_weight;  ///< untied: "output_layer.weight"

 private:
  void check_batch(const T5Batch& batch, const LayerContext& ctx) const;
  bool whole_model() const { return !encoder.blocks.empty() && !decoder.blocks.empty(); }
  /// Rows of the encoder's and the decoder's streams on this rank.
  static index_t encoder_rows(const MicroBatch& mb, const LayerContext& ctx);
  static index_t decoder_rows(const MicroBatch& mb, const LayerContext& ctx);
  /// Fills c's lengths and encoder mask from the batch.
  void start_cache(const T5Batch& in, const LayerContext& ctx, Cache& c) const;
  /// The head on the decoder's output: the loss of the labelled tokens.
  double head_loss(Tensor sequence, const Tensor& labels, LayerContext& dec, Cache& c) const;
  /// StageModel's per-token loss: s_dec*b x weight x cross-entropy.
  static Tensor per_token_losses(const Cache& c, const LayerContext& ctx);
  /// The forward and backward of this stage's part of each stack (the
  /// whole model: both, the encoder output passed straight on).
  Tensor encoder_stage_forward(const Tensor& input, LayerContext& ctx, Cache& c) const;
  Tensor decoder_stage_forward(const Tensor& input, const T5Batch& in, LayerContext& ctx,
                               Cache& c) const;
  Tensor encoder_stage_backward(const Tensor& dout, LayerContext& ctx, const Cache& c);
  Tensor decoder_stage_backward(const Tensor& dout, LayerContext& ctx, const Cache& c);
  /// d(loss)/d(each token's cross-entropy) from StageModel's dout [s_dec*b].
  static Tensor dlosses_of(const Tensor& dout, const Cache& c, const LayerContext& ctx);
  /// ctx for a stack of sequence length s.
  static LayerContext stack_context(const LayerContext& ctx, index_t s);
  /// The decoder's embedding rows, with their dropout (a stream apart from the encoder's).
  Tensor decoder_embedding(const Tensor& ids, LayerContext& ctx, Cache& c) const;
  void decoder_embedding_backward(const Tensor& dy, LayerContext& ctx, const Cache& c);
  /// The head's input scale: d_model^-0.5 tied, 1 untied.
  double head_scale() const;
  /// The backward from d(loss)/d(each token's cross-entropy) [s_dec*b].
  void backward_from(const Tensor& dlosses, LayerContext& ctx, const Cache& c);
  void initialise(const LayerContext& ctx, std::uint64_t seed);

  ModelSpec spec_;
  StagePlacement placement_;
  std::optional<LmHeadLoss> head_;  ///< on the last stage
};

}  // namespace meshtron
