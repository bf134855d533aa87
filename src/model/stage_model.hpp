// StageModel: what the trainer and the pipeline schedules need from the part
// of a model one pipeline stage holds, whatever its family (GptModel,
// BertModel). The schedules only move tensors between stages and start
// every head backward from the same per-token constant, so a stage's
// contract is:
//
//   forward   first stage: reads the micro-batch's inputs; other stages:
//             the previous stage's hidden states. Last stage: returns a
//             per-token loss [s*b] whose mean is the micro-batch's loss
//             (GPT: the token cross-entropies; BERT: its MLM and binary
//             losses spread over the tokens, see BertModel); others: hidden
//             states.
//   backward  last stage: `dout` [s*b] is d(step loss)/d(per-token loss);
//             others: d hidden. Returns d input hidden (empty on the first
//             stage) and accumulates the parameters' gradients.
#pragma once

#include <functional>
#include <memory>

#include "model/layer_context.hpp"
#include "model/model_spec.hpp"
#include "model/parameter.hpp"

namespace meshtron {

/// One micro-batch as the model consumes it: rows in [s, b] order (row
/// t * b + i is token t of sample i).
struct MicroBatch {
  Tensor ids;      ///< int32 [s * b]
  Tensor targets;  ///< int32 [s * b]; BERT: the masked-LM labels, -100 = none
  /// GPT: some targets are -100 (not scored: a fine-tuning prompt, padding),
  /// and the loss is the mean over the others (labelled_targets). Set by
  /// the data source, so that a pretraining batch's device targets are
  /// never read back to look.
  bool unlabelled_targets = false;
  index_t sample_offset = 0;  ///< index of its first sample within the step
  /// Evaluation only: host float32 [s * b], 1 where the target counts, 0 for
  /// padding (rows shorter than s + 1, samples past the end of a split);
  /// undefined = every target counts.
  Tensor loss_mask;
  // BERT only (undefined otherwise):
  Tensor token_types;    ///< int32 [s * b]
  Tensor padding_mask;   ///< int32 [b, s]: 1 a real token, 0 padding
  Tensor next_sentence;  ///< int32 [b]: the binary head's class
  // T5 only: ids are the encoder's tokens [s_enc * b], targets the decoder's
  // labels [s_dec * b] (-100 = none), padding_mask the encoder's [b, s_enc].
  Tensor decoder_ids;           ///< int32 [s_dec * b]: the decoder's input
  Tensor decoder_padding_mask;  ///< int32 [b, s_dec]: 1 a real token, 0 padding
};

struct StagePlacement {
  int first_layer = 0;     ///< global index of this stage's first layer
  int num_layers = 0;
  bool has_embedding = true;
  bool has_head = true;
  static StagePlacement whole_model(int num_layers) { return {0, num_layers, true, true}; }
};

/// Activations one micro-batch keeps between its forward and backward.
struct StageCache {
  virtual ~StageCache() = default;
};

class StageModel {
 public:
  virtual ~StageModel() = default;

  virtual std::unique_ptr<StageCache> make_cache() const = 0;
  /// See the file comment; `input` is mb.ids on the first stage.
  virtual Tensor forward(const Tensor& input, const MicroBatch& mb, LayerContext& ctx,
                         StageCache& cache) const = 0;
  /// `grads_done`, if set, is called with each part's parameters as soon as
  /// their gradient accumulation is over (the overlapped reduction's hook).
  virtual Tensor backward(const Tensor& dout, LayerContext& ctx, const StageCache& cache,
                          const std::function<void(const ParameterList&)>& grads_done) = 0;

  /// All parameters of this stage (a tied head weight once).
  virtual ParameterList parameters() = 0;
  virtual const ModelSpec& config() const = 0;
  virtual const StagePlacement& placement() const = 0;
  /// The word-embedding table a tied head uses (this stage's copy), or
  /// null (no head, or an untied one).
  virtual Parameter* head_word_weight() = 0;

  /// What forward() receives from the previous stage (and backward()
  /// returns the gradient of) and what it sends to the next (backward()
  /// receives the gradient of): this rank's hidden rows [s/sp * b, h]
  /// unless the family carries more (T5's decoder stages).
  virtual Shape input_shape(const MicroBatch&, const LayerContext& ctx) const {
    return {ctx.local_tokens(), config().hidden_size};
  }
  virtual Shape output_shape(const MicroBatch& mb, const LayerContext& ctx) const {
    return input_shape(mb, ctx);
  }

  /// Whether this chunk's layers can take the micro-batch of `ctx` with
  /// attention-dropout masks drawn ahead, and drawing them on `stream`.
  virtual bool draws_attention_masks_ahead(const LayerContext&) const { return false; }
  virtual void draw_attention_masks_ahead(const LayerContext&, void*) {}
};

}  // namespace meshtron
