// Vocab-parallel token embedding plus learned absolute positions (GPT-2).
//
// The word table [V_pad, h] is split by rows: rank i holds token ids
// [i V_pad/tp, (i+1) V_pad/tp). Each rank looks up the ids it owns (zeros for
// the others) and reduce_from_tp sums the partial rows, so exactly one rank
// contributes each token. Positions are replicated. Under sequence
// parallelism the sum is scattered to sequence shards before dropout.
// With ModelSpec::num_token_types (BERT's segments) a replicated
// token-type table adds its rows too, before the dropout.
// With ModelSpec::embedding_norm (BLOOM's word_embeddings_layernorm) the
// block's norm runs on those rows (each rank its shard under sequence
// parallelism) before the dropout.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/layer_norm.hpp"
#include "model/model_spec.hpp"
#include "model/layer_context.hpp"
#include "model/parameter.hpp"

namespace meshtron {

/// The word-embedding parameter of a vocab-parallel table (shared by the
/// embedding and, tied, by the LM head).
Parameter make_word_embedding(const ModelSpec& c, const LayerContext& ctx, DType dtype);
index_t vocab_begin(const ModelSpec& c, const TensorParallelGroup& tp);

class Embedding {
 public:
  struct Cache {
    Tensor ids, positions;  ///< int32 [s*b], rows in [s, b] order
    Tensor token_types;     ///< int32 [s*b]; token-type tables only
    LayerNorm::Cache norm;  ///< embedding_norm only
  };
  /// Learned absolute positions add a table; rotary, ALiBi and none add
  /// nothing here.
  Embedding(const ModelSpec& config, const LayerContext& ctx, DType dtype);
  /// ids int32 [s*b] in [s, b] order -> hidden [s/sp * b, h]. With a
  /// token-type table `token_types` (int32 [s*b], each below
  /// num_token_types) is required; without one it must be undefined.
  Tensor forward(const Tensor& ids, LayerContext& ctx, Cache& cache,
                 const Tensor& token_types = Tensor()) const;
  void backward(const Tensor& dy, LayerContext& ctx, const Cache& cache);
  /// Generation: the rows' token embeddings plus, with a position table,
  /// those of `positions` (int32 [rows], absolute); no dropout, no sequence
  /// parallelism.
  Tensor forward_at(const Tensor& ids, const Tensor& positions, LayerContext& ctx) const;
  void collect(ParameterList& out) {
    out.push_back(&word);
    if (has_position_table()) out.push_back(&position);
    if (has_token_type_table()) out.push_back(&token_type);
    if (norm) norm->collect(out);
  }
  bool has_position_table() const {
    return config_.block.attention.position == PositionEmbedding::LearnedAbsolute;
  }

  bool has_token_type_table() const { return config_.num_token_types > 0; }

  Parameter word;      ///< [V_pad/tp, h], split by rows
  /// [max_positions, h], replicated; without values unless has_position_table()
  Parameter position;
  /// [num_token_types, h], replicated; without values unless has_token_type_table()
  Parameter token_type;
  std::optional<LayerNorm> norm;  ///< "embedding.norm" with ModelSpec::embedding_norm

 private:
  /// Word rows (summed over tp) plus position rows: both forwards' lookup.
  Tensor lookup(const Tensor& ids, const Tensor& positions, LayerContext& ctx) const;
  ModelSpec config_;
  /// The [s, b] position ids where the tables live, built on the first
  /// forward: uploading them every micro-batch (a pageable copy) made the
  /// host wait for the device in the middle of each step.
  mutable Tensor positions_;
  mutable index_t positions_micro_batch_ = 0;  ///< the b they were built for
};

/// An int32 tensor's values, read to the host.
std::vector<std::int32_t> host_ints(const Tensor& t);

/// Targets and weights of a loss over labelled rows only (transformers'
/// CrossEntropyLoss, ignore_index -100): an unlabelled row predicts token 0
/// with weight 0, each labelled row weighs 1 / (labelled rows), so the
/// weighted sum of the per-row losses is their mean. Host tensors.
struct LabelledTargets {
  Tensor targets;  ///< int32 [n]
  Tensor weights;  ///< [n] in the requested dtype
};
LabelledTargets labelled_targets(const Tensor& labels, DType weight_dtype);
/// values[i] x n x weights[i] (n = values.numel()), in `space`: a loss over
/// labelled rows spread over all n rows, so that the plain mean the
/// schedules take (stage_model.hpp) is the weighted sum; and its chain rule
/// on the way back. Read through the host.
Tensor spread_by_weights(const Tensor& values, const Tensor& weights, MemorySpace space);

/// The output layer and loss: logits = x W_word^T on each rank's vocabulary
/// shard, and vocab-parallel cross-entropy (two all-reduces of [s*b] scalars;
/// the logits are never gathered).
class LmHeadLoss {
 public:
  struct Cache {
    Tensor x_full, logits, targets, row_max, sum_exp;
  };
  /// `output_bias`: a vocab-parallel bias [V_pad/tp] added to the logits
  /// (BERT's MLM head), or null.
  LmHeadLoss(const ModelSpec& config, Parameter& word, Parameter* output_bias = nullptr);
  /// x [s/sp * b, h] -> per-token loss [s*b] (same on every tp rank).
  Tensor forward(const Tensor& x, const Tensor& targets, LayerContext& ctx,
                 Cache& cache) const;
  /// dloss [s*b] -> dx [s/sp * b, h]; accumulates into the word gradient.
  Tensor backward(const Tensor& dloss, LayerContext& ctx, const Cache& cache);
  /// Generation: this rank's vocabulary shard of the logits of x [rows, h]
  /// (no sequence parallelism), [rows, V_pad/tp] in the statistics dtype.
  Tensor logits(const Tensor& x, LayerContext& ctx) const;

  Parameter* word;  ///< Not owned (the tied word table or the untied output weight).
  Parameter* bias;  ///< Not owned; null without an output bias.

 private:
  void add_output_bias(Tensor& logits) const;
  ModelSpec config_;
};

}  // namespace meshtron
