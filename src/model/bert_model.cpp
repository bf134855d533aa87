#include "model/bert_model.hpp"

#include <cmath>
#include <cstdint>

#include "common/error.hpp"
#include "model/linear.hpp"
#include "parallel/mappings.hpp"

namespace meshtron {

ModelSpec bert_spec(int layers, int hidden, int heads, int ffn, int vocab, int seq_length,
                    int max_positions, int num_token_types) {
  ModelSpec s;
  s.model_class = ModelClass::BertPretraining;
  s.num_layers = layers;
  s.hidden_size = hidden;
  s.seq_length = seq_length;
  s.max_positions = max_positions;
  s.vocab_size = s.padded_vocab_size = vocab;
  s.num_token_types = num_token_types;
  s.block.norm.epsilon = 1e-12;  // MegatronBertConfig's layer_norm_eps
  s.block.attention = AttentionSpec::multi_head(hidden, heads);
  s.block.attention.mask = AttentionMask::Padding;
  s.block.mlp.ffn_hidden_size = ffn;
  s.block.mlp.activation = Activation::Gelu;
  return s;
}

ModelSpec google_bert_spec(int layers, int hidden, int heads, int ffn, int vocab, int seq_length,
                           int max_positions, int num_token_types) {
  ModelSpec s = bert_spec(layers, hidden, heads, ffn, vocab, seq_length, max_positions,
                          num_token_types);
  s.block.norm.placement = NormPlacement::Post;
  s.embedding_norm = true;
  return s;
}

namespace {

Parameter replicated_param(const std::string& name, Shape shape, bool decay, DType dtype,
                           MemorySpace space) {
  Parameter p;
  p.name = name;
  p.global_shape = shape;
  p.value = Tensor::zeros(shape, dtype, space);
  p.grad = Tensor::zeros(shape, grad_dtype_for(dtype), space);
  p.weight_decay = decay;
  return p;
}

/// The MLM bias, split by vocabulary rows as the word table it goes with.
Parameter mlm_bias_param(const ModelSpec& c, const LayerContext& ctx, DType dtype) {
  Parameter word = make_word_embedding(c, ctx, dtype);
  const index_t rows = word.value.dim(0);
  Parameter p;
  p.name = "mlm_head.bias";
  p.global_shape = {c.vocab_size};
  p.value = Tensor::zeros({rows}, dtype, ctx.space);
  p.grad = Tensor::zeros({rows}, grad_dtype_for(dtype), ctx.space);
  p.shard.split_dim = 0;
  p.padded_rows = word.padded_rows;
  p.weight_decay = false;
  return p;
}

/// `ctx` for the heads, which run on every row on each tp rank (the
/// gathered final hidden states under sequence parallelism).
LayerContext rows_replicated(const LayerContext& ctx) {
  LayerContext out = ctx;
  out.sequence_parallel = false;
  return out;
}

}  // namespace

ReplicatedLinear::ReplicatedLinear(const std::string& name, index_t in, index_t out, DType dtype,
                                   MemorySpace space)
    : weight(replicated_param(name + ".weight", {in, out}, true, dtype, space)),
      bias(replicated_param(name + ".bias", {out}, false, dtype, space)) {}

Tensor ReplicatedLinear::forward(const Tensor& x) const {
  return matmul_bias(x, weight.value, bias.value);
}

Tensor ReplicatedLinear::backward(const Tensor& dy, const Tensor& x) {
  ops::linear_weight_grads(x, dy, weight.grad, bias.grad, weight.take_grad_store(),
                           bias.take_grad_store());
  Tensor dx = Tensor::empty({dy.dim(0), weight.value.dim(0)}, dy.dtype(), dy.space());
  ops::gemm(dy, false, weight.value, true, dx);
  return dx;
}

namespace {
const ModelSpec& checked(const ModelSpec& s) {
  MESH_REQUIRE(s.model_class == ModelClass::BertPretraining,
               "BertModel: the spec describes a causal LM, not BERT");
  MESH_REQUIRE(s.num_token_types > 0, "BertModel: num_token_types must be positive");
  // The MLM head multiplies by the word table; under pp > 1 the trainer
  // keeps the last stage's copy equal to it only for a tied spec.
  MESH_REQUIRE(s.tie_word_embeddings,
               "BertModel: the MLM head is tied to the word table "
               "(model.untie_embeddings_and_output_weights must be false)");
  return s;
}
}  // namespace

BertModel::Heads::Heads(const ModelSpec& s, const LayerContext& ctx, DType dtype, Parameter& word)
    : transform("mlm_head.dense", s.hidden_size, s.hidden_size, dtype, ctx.space),
      transform_norm("mlm_head.norm", s.hidden_size, s.block.norm, dtype, false, ctx.space),
      mlm_bias(mlm_bias_param(s, ctx, dtype)),
      pooler("pooler", s.hidden_size, s.hidden_size, dtype, ctx.space),
      binary_head("binary_head", s.hidden_size, 2, dtype, ctx.space),
      mlm_loss(s, word, &mlm_bias) {
  if (s.has_final_norm())
    final_norm.emplace("final_norm", s.hidden_size, s.block.norm, dtype, ctx.sequence_parallel,
                       ctx.space);
}

void BertModel::Heads::collect(ParameterList& out) {
  if (final_norm) final_norm->collect(out);
  transform.collect(out);
  transform_norm.collect(out);
  out.push_back(&mlm_bias);
  pooler.collect(out);
  binary_head.collect(out);
}

BertModel::BertModel(const ModelSpec& s, LayerContext& ctx, DType dtype, std::uint64_t seed)
    : BertModel(s, StagePlacement::whole_model(s.num_layers), ctx, dtype, seed) {}

BertModel::BertModel(const ModelSpec& s, const StagePlacement& placement, LayerContext& ctx,
                     DType dtype, std::uint64_t seed)
    : spec_(checked(s)), placement_(placement) {
  if (placement.has_embedding) embedding_.emplace(s, ctx, dtype);
  layers_.reserve(std::size_t(placement.num_layers));
  for (int i = 0; i < placement.num_layers; ++i)
    layers_.emplace_back(placement.first_layer + i, s, ctx, dtype);
  if (placement.has_head) {
    if (!embedding_) head_copy_.emplace(make_word_embedding(s, ctx, dtype));
    heads_.emplace(s, ctx, dtype, embedding_ ? embedding_->word : *head_copy_);
  }
  initialise(ctx, seed);
}

void BertModel::initialise(const LayerContext& ctx, std::uint64_t seed) {
  // As GptModel's: N(0, std), output projections by 1/sqrt(2 L), biases 0,
  // norms 1; keyed by name and global index (the same model on any tp, and
  // the head's word-table copy equal to the embedding's).
  const double std = spec_.init_std, out_std = std / std::sqrt(2.0 * spec_.num_layers);
  const int r = ctx.tp.rank(), p = ctx.tp.size();
  if (embedding_)
    for (Parameter* w : {&embedding_->word, &embedding_->position, &embedding_->token_type})
      init_normal(*w, seed, std, r, p);
  for (auto& layer : layers_) {
    init_normal(layer.attention.qkv.weight, seed, std, r, p);
    init_normal(layer.attention.proj.weight, seed, out_std, r, p);
    init_normal(layer.mlp.fc.weight, seed, std, r, p);
    init_normal(layer.mlp.proj.weight, seed, out_std, r, p);
  }
  if (head_copy_) init_normal(*head_copy_, seed, std, r, p);
  if (heads_)
    for (Parameter* w : {&heads_->transform.weight, &heads_->pooler.weight,
                         &heads_->binary_head.weight})
      init_normal(*w, seed, std, r, p);
}

ParameterList BertModel::parameters() {
  ParameterList out;
  if (embedding_) embedding_->collect(out);
  for (auto& layer : layers_) layer.collect(out);
  if (heads_) heads_->collect(out);
  if (head_copy_) out.push_back(&*head_copy_);
  return out;
}

void BertModel::check_batch(const BertBatch& in, const LayerContext& ctx) const {
  // What this stage reads: the tokens and their types (first), the labels
  // and classes (last), the padding mask (every stage's layers).
  const bool first = placement_.has_embedding, last = placement_.has_head;
  const index_t s = ctx.seq_length, b = ctx.micro_batch, n = s * b;
  const auto require_ids = [&](const Tensor& t, index_t count, const char* what) {
    MESH_REQUIRE(t.defined() && t.dtype() == DType::I32 && t.numel() == count,
                 "BertModel: " << what << " must be int32 with " << count << " entries (s = " << s
                               << ", b = " << b << ")");
  };
  if (first) require_ids(in.tokens, n, "tokens");
  if (first) require_ids(in.token_types, n, "token_types");
  if (last) require_ids(in.labels, n, "labels");
  if (last) require_ids(in.next_sentence, b, "next_sentence");
  MESH_REQUIRE(in.padding_mask.defined() && in.padding_mask.dtype() == DType::I32 &&
                   in.padding_mask.rank() == 2 && in.padding_mask.dim(0) == b &&
                   in.padding_mask.dim(1) == s,
               "BertModel: padding_mask must be int32 [b = " << b << ", s = " << s << "], got "
                                                            << shape_string(in.padding_mask.shape()));
  if (first) {
    for (std::int32_t v : host_ints(in.tokens))
      MESH_REQUIRE(v >= 0 && v < spec_.vocab_size, "BertModel: token " << v
                                                       << " is outside the vocabulary [0, "
                                                       << spec_.vocab_size << ")");
    for (std::int32_t v : host_ints(in.token_types))
      MESH_REQUIRE(v >= 0 && v < spec_.num_token_types,
                   "BertModel: token type " << v << " is outside [0, " << spec_.num_token_types
                                            << ")");
  }
  if (last) {
    for (std::int32_t v : host_ints(in.labels))
      MESH_REQUIRE(v == -100 || (v >= 0 && v < spec_.vocab_size),
                   "BertModel: label " << v << " is neither -100 nor in [0, " << spec_.vocab_size
                                       << ")");
    for (std::int32_t v : host_ints(in.next_sentence))
      MESH_REQUIRE(v == 0 || v == 1, "BertModel: next_sentence label " << v << " is not 0 or 1");
  }
  for (std::int32_t v : host_ints(in.padding_mask))
    MESH_REQUIRE(v == 0 || v == 1, "BertModel: padding_mask value " << v << " is not 0 or 1");
}

double BertModel::forward(const BertBatch& in, LayerContext& ctx, Cache& c) const {
  MESH_REQUIRE(placement_.has_embedding && placement_.has_head,
               "BertModel: a whole batch's loss needs the whole model on one stage "
               "(parallel.pipeline_parallel = 1)");
  stage_forward(Tensor(), in, ctx, c);
  return c.mlm_loss + c.binary_loss;
}

Tensor BertModel::stage_forward(const Tensor& hidden, const BertBatch& in, LayerContext& ctx,
                                Cache& c) const {
  check_batch(in, ctx);
  c.padding_mask = in_space(in.padding_mask, ctx.space);
  ctx.key_padding_mask = c.padding_mask;
  c.layers.resize(layers_.size());
  Tensor x = embedding_ ? embedding_->forward(in.tokens, ctx, c.embedding, in.token_types) : hidden;
  for (std::size_t i = 0; i < layers_.size(); ++i)
    x = ctx.recompute_layer(int(i)) ? layers_[i].forward_checkpointed(x, ctx, c.layers[i])
                                    : layers_[i].forward(x, ctx, c.layers[i]);
  if (!heads_) return x;
  const Tensor normed = heads_->final_norm ? heads_->final_norm->forward(x, c.final_norm) : x;
  c.sequence = ctx.sequence_parallel ? mapping::gather_from_sp(ctx.tp, normed) : normed;
  LayerContext whole_rows = rows_replicated(ctx);
  c.mlm_loss = mlm_forward(c.sequence, in.labels, whole_rows, c);
  c.binary_loss = binary_forward(c.sequence, in.next_sentence, whole_rows, c);
  return x;
}

double BertModel::mlm_forward(const Tensor& sequence, const Tensor& labels, LayerContext& ctx,
                              Cache& c) const {
  const auto [targets, weights] = labelled_targets(labels, stats_dtype(sequence));
  c.mlm_weights = in_space(weights, ctx.space);
  Tensor pre = heads_->transform.forward(sequence);
  c.transform_pre_gelu = pre;
  Tensor activated = Tensor::empty(pre.shape(), pre.dtype(), pre.space());
  ops::activation_forward(pre, ops::GatedActivation::GeLUErf, activated);
  const Tensor normed = heads_->transform_norm.forward(activated, c.transform_norm);
  c.mlm_losses = heads_->mlm_loss.forward(normed, targets, ctx, c.mlm);
  const std::vector<double> loss = c.mlm_losses.to_doubles(), w = weights.to_doubles();
  double total = 0;
  for (std::size_t i = 0; i < loss.size(); ++i) total += w[i] * loss[i];
  return total;
}

double BertModel::binary_forward(const Tensor& sequence, const Tensor& next_sentence,
                                 const LayerContext& ctx, Cache& c) const {
  const index_t b = ctx.micro_batch;
  const Tensor first_tokens = sequence.slice_rows(0, b);  // token 0 of each sample: rows [0, b)
  c.pooler_pre_tanh = heads_->pooler.forward(first_tokens);
  c.pooled = Tensor::empty(c.pooler_pre_tanh.shape(), sequence.dtype(), sequence.space());
  ops::activation_forward(c.pooler_pre_tanh, ops::GatedActivation::Tanh, c.pooled);
  c.binary_logits = heads_->binary_head.forward(c.pooled);
  c.binary_targets = in_space(next_sentence, ctx.space);
  const DType stats = stats_dtype(sequence);
  c.binary_max = Tensor::empty({b}, stats, sequence.space());
  c.binary_sum_exp = Tensor::empty({b}, stats, sequence.space());
  Tensor target_logit = Tensor::empty({b}, stats, sequence.space());
  ops::cross_entropy_row_stats(c.binary_logits, c.binary_targets, 0, 2, c.binary_max,
                               c.binary_sum_exp, target_logit);
  c.binary_losses = Tensor::empty({b}, stats, sequence.space());
  ops::cross_entropy_loss(c.binary_sum_exp, target_logit, c.binary_losses);
  double total = 0;
  for (double v : c.binary_losses.to_doubles()) total += v;
  return total / double(b);
}

BertModel::Scores BertModel::scores(const Cache& c) {
  Scores s;
  const std::vector<double> loss = c.mlm_losses.to_doubles(), w = c.mlm_weights.to_doubles();
  for (std::size_t i = 0; i < loss.size(); ++i)
    if (w[i] > 0) {
      s.mlm_loss_sum += loss[i];
      s.labelled += 1;
    }
  const std::vector<double> logits = c.binary_logits.to_doubles();
  const std::vector<std::int32_t> target = host_ints(c.binary_targets);
  for (std::size_t j = 0; j < target.size(); ++j) {
    const int predicted = logits[2 * j + 1] > logits[2 * j] ? 1 : 0;
    s.binary_correct += predicted == target[j];
    s.samples += 1;
  }
  return s;
}

Tensor BertModel::heads_backward(LayerContext& ctx, const Cache& c, const Tensor& dmlm,
                                 const Tensor& dbinary) {
  Heads& h = *heads_;
  LayerContext whole_rows = rows_replicated(ctx);
  Tensor dnormed = h.mlm_loss.backward(dmlm, whole_rows, c.mlm);
  Tensor dactivated = h.transform_norm.backward(dnormed, c.transform_norm);
  ops::activation_backward(dactivated, c.transform_pre_gelu, ops::GatedActivation::GeLUErf,
                           dactivated);
  Tensor dsequence = h.transform.backward(dactivated, c.sequence);

  const index_t b = ctx.micro_batch;
  Tensor dlogits = Tensor::empty(c.binary_logits.shape(), c.binary_logits.dtype(),
                                 c.binary_logits.space());
  ops::cross_entropy_backward(c.binary_logits, c.binary_targets, c.binary_max, c.binary_sum_exp,
                              dbinary, 0, 2, dlogits);
  Tensor dpooled = h.binary_head.backward(dlogits, c.pooled);
  ops::activation_backward(dpooled, c.pooler_pre_tanh, ops::GatedActivation::Tanh, dpooled);
  const Tensor first_tokens = c.sequence.slice_rows(0, b);
  Tensor dfirst = dsequence.slice_rows(0, b);
  ops::add(dfirst, h.pooler.backward(dpooled, first_tokens), dfirst);
  if (ctx.sequence_parallel) dsequence = mapping::gather_from_sp_backward(ctx.tp, dsequence);
  return h.final_norm ? h.final_norm->backward(dsequence, c.final_norm) : dsequence;
}

void BertModel::backward(LayerContext& ctx, const Cache& c) {
  const index_t b = ctx.micro_batch;
  Tensor dbinary = Tensor::empty({b}, c.binary_max.dtype(), c.binary_max.space());
  dbinary.fill(1.0 / double(b));
  body_backward(heads_backward(ctx, c, c.mlm_weights, dbinary), ctx, c);
}

Tensor BertModel::body_backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  ctx.key_padding_mask = c.padding_mask;
  Tensor dx = dy;
  for (std::size_t i = layers_.size(); i-- > 0;) dx = layers_[i].backward(dx, ctx, c.layers[i]);
  if (!embedding_) return dx;
  embedding_->backward(dx, ctx, c.embedding);
  return Tensor();
}

Tensor BertModel::forward(const Tensor& input, const MicroBatch& mb, LayerContext& ctx,
                          StageCache& cache) const {
  if (ctx.param_gather) ctx.param_gather->before_forward(const_cast<BertModel&>(*this).parameters());
  auto& c = static_cast<Cache&>(cache);
  const BertBatch batch{mb.ids, mb.token_types, mb.padding_mask, mb.targets, mb.next_sentence};
  Tensor out = stage_forward(input, batch, ctx, c);
  if (!heads_) return out;
  const index_t s = ctx.seq_length, b = ctx.micro_batch;
  const std::vector<double> mlm = c.mlm_losses.to_doubles(), w = c.mlm_weights.to_doubles(),
                            binary = c.binary_losses.to_doubles();
  Tensor per_token = Tensor::zeros({s * b}, c.mlm_losses.dtype(), MemorySpace::Host);
  for (index_t i = 0; i < s * b; ++i) {
    const double first_token = i < b ? double(s) * binary[std::size_t(i)] : 0.0;
    set_element_from_double(per_token, i,
                            double(s * b) * w[std::size_t(i)] * mlm[std::size_t(i)] + first_token);
  }
  return in_space(per_token, ctx.space);
}

Tensor BertModel::backward(const Tensor& dout, LayerContext& ctx, const StageCache& cache,
                           const std::function<void(const ParameterList&)>& grads_done) {
  // The chain rule through forward()'s per-token loss (see the header).
  const auto& c = static_cast<const Cache&>(cache);
  Tensor dy = dout;
  if (heads_) {
    const index_t s = ctx.seq_length, b = ctx.micro_batch;
    const std::vector<double> d = dout.to_doubles(), w = c.mlm_weights.to_doubles();
    Tensor dmlm = Tensor::zeros({s * b}, c.mlm_weights.dtype(), MemorySpace::Host);
    Tensor dbinary = Tensor::zeros({b}, c.binary_max.dtype(), MemorySpace::Host);
    for (index_t i = 0; i < s * b; ++i)
      set_element_from_double(dmlm, i, d[std::size_t(i)] * double(s * b) * w[std::size_t(i)]);
    for (index_t j = 0; j < b; ++j)
      set_element_from_double(dbinary, j, d[std::size_t(j)] * double(s));
    dy = heads_backward(ctx, c, in_space(dmlm, ctx.space), in_space(dbinary, ctx.space));
  }
  Tensor dx = body_backward(dy, ctx, c);
  if (grads_done) grads_done(parameters());
  return dx;
}

}  // namespace meshtron
