#include "model/gpt_model.hpp"

#include <cmath>

#include "common/error.hpp"

namespace meshtron {

GptModel::GptModel(const ModelSpec& c, const StagePlacement& placement, LayerContext& ctx,
                   DType dtype, std::uint64_t seed)
    : config_(c), placement_(placement) {
  if (placement.has_embedding) embedding_.emplace(c, ctx, dtype);
  layers_.reserve(std::size_t(placement.num_layers));
  for (int i = 0; i < placement.num_layers; ++i)
    layers_.emplace_back(placement.first_layer + i, c, ctx, dtype);
  if (placement.has_head && c.has_final_norm())
    final_norm_.emplace("final_norm", c.hidden_size, c.block.norm, dtype, ctx.sequence_parallel,
                        ctx.space);
  if (placement.has_head) head_.emplace(c, head_weight(ctx, dtype));
  initialise(ctx, seed);
}

Parameter& GptModel::head_weight(const LayerContext& ctx, DType dtype) {
  if (!config_.tie_word_embeddings) {
    output_weight_.emplace(make_word_embedding(config_, ctx, dtype));
    output_weight_->name = "output_layer.weight";
    return *output_weight_;
  }
  if (embedding_) return embedding_->word;
  head_copy_.emplace(make_word_embedding(config_, ctx, dtype));
  return *head_copy_;
}

void GptModel::initialise(LayerContext& ctx, std::uint64_t seed) {
  // GPT-2 / Megatron: N(0, std) for weights, output projections scaled by
  // 1/sqrt(2 L) (one residual branch pair per layer), zeros for biases, ones
  // for norm weights (set by LayerNorm). Keyed by name and global index, so
  // every decomposition builds the same global model.
  const double out_std = config_.init_std / std::sqrt(2.0 * config_.num_layers);
  const int r = ctx.tp.rank(), p = ctx.tp.size();
  if (embedding_) {
    init_normal(embedding_->word, seed, config_.init_std, r, p);
    init_normal(embedding_->position, seed, config_.init_std, r, p);
  }
  if (head_copy_) init_normal(*head_copy_, seed, config_.init_std, r, p);
  if (output_weight_) init_normal(*output_weight_, seed, config_.init_std, r, p);
  for (auto& layer : layers_) {
    init_normal(layer.attention.qkv.weight, seed, config_.init_std, r, p);
    init_normal(layer.attention.proj.weight, seed, out_std, r, p);
    init_normal(layer.mlp.fc.weight, seed, config_.init_std, r, p);
    init_normal(layer.mlp.proj.weight, seed, out_std, r, p);
  }
}

bool GptModel::draws_attention_masks_ahead(const LayerContext& ctx) const {
  return !layers_.empty() && layers_.front().attention.draws_mask_ahead(ctx);
}

void GptModel::draw_attention_masks_ahead(const LayerContext& ctx, void* stream) {
  for (auto& layer : layers_) layer.attention.draw_mask_ahead(ctx, stream);
}

ParameterList GptModel::parameters() {
  ParameterList out;
  if (embedding_) embedding_->collect(out);
  for (auto& layer : layers_) layer.collect(out);
  if (final_norm_) final_norm_->collect(out);
  collect_head(out);
  return out;
}

void GptModel::collect_head(ParameterList& out) {
  if (head_copy_) out.push_back(&*head_copy_);
  if (output_weight_) out.push_back(&*output_weight_);
}

Tensor GptModel::forward(const Tensor& input, const Tensor& targets, LayerContext& ctx,
                         Cache& cache, bool labelled_only) const {
  // parallel.overlap_param_gather: each part's parameters may still be in
  // flight from the last optimizer step; the hook waits for them.
  auto gathered = [&](auto&& collect) {
    if (!ctx.param_gather) return;
    ParameterList part;
    collect(part);
    ctx.param_gather->before_forward(part);
  };
  // collect() hands out non-const pointers; the hook only waits and writes values.
  GptModel& self = const_cast<GptModel&>(*this);
  cache.layers.resize(layers_.size());
  if (embedding_) gathered([&](ParameterList& out) { self.embedding_->collect(out); });
  Tensor x = embedding_ ? embedding_->forward(input, ctx, cache.embedding) : input;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    gathered([&](ParameterList& out) { self.layers_[i].collect(out); });
    x = ctx.recompute_layer(int(i)) ? layers_[i].forward_checkpointed(x, ctx, cache.layers[i])
                                    : layers_[i].forward(x, ctx, cache.layers[i]);
  }
  if (!head_) return x;
  gathered([&](ParameterList& out) {
    if (self.final_norm_) self.final_norm_->collect(out);
    self.collect_head(out);
  });
  const Tensor normed = final_norm_ ? final_norm_->forward(x, cache.final_norm) : x;
  cache.target_weights = Tensor();
  if (!labelled_only) return head_->forward(normed, targets, ctx, cache.head);
  // Right padding needs no attention mask: attention is causal, so a real
  // token never sees the padding after it, and the padding's targets are
  // -100 (weight 0).
  auto [labels, weights] = labelled_targets(targets, stats_dtype(normed));
  cache.target_weights = std::move(weights);
  const Tensor losses = head_->forward(normed, labels, ctx, cache.head);
  return spread_by_weights(losses, cache.target_weights, ctx.space);
}

Tensor GptModel::forward_cached(const Tensor& input, const CachedRows& rows, LayerContext& ctx,
                                KvCache& kv) const {
  MESH_VERIFY(kv.layers.size() == layers_.size(), "GptModel::forward_cached: a cache of "
                                                      << kv.layers.size() << " layers for "
                                                      << layers_.size());
  kv.require_holds(rows);
  Tensor x = embedding_ ? embedding_->forward_at(input, rows.positions, ctx) : input;
  for (std::size_t i = 0; i < layers_.size(); ++i)
    x = layers_[i].forward_cached(x, ctx, rows, kv.layers[i]);
  if (!head_) return x;
  if (!rows.logit_rows.empty()) {
    Tensor picked = Tensor::empty({index_t(rows.logit_rows.size()), x.dim(1)}, x.dtype(), x.space());
    for (std::size_t i = 0; i < rows.logit_rows.size(); ++i)
      picked.slice_rows(index_t(i), index_t(i) + 1)
          .copy_from(x.slice_rows(rows.logit_rows[i], rows.logit_rows[i] + 1));
    x = picked;
  }
  LayerNorm::Cache norm;
  return head_->logits(final_norm_ ? final_norm_->forward(x, norm) : x, ctx);
}

KvCache GptModel::make_kv_cache(index_t slots, index_t capacity, DType dtype,
                                MemorySpace space) const {
  KvCache kv;
  for (const auto& layer : layers_)
    kv.layers.push_back(layer.attention.make_kv_cache(slots, capacity, dtype, space));
  return kv;
}

Tensor GptModel::backward(const Tensor& dout, LayerContext& ctx, const Cache& cache,
                          const std::function<void(const ParameterList&)>& grads_done) {
  // The layernorm backwards leave their dgamma / dbeta adds to the next one
  // (one kernel fewer each on the device): a norm's gradients are final,
  // and reported, once the chain no longer holds them.
  ops::LayerNormGradChain chain;
  struct ChainInContext {  // ctx carries it for this backward only, whatever happens
    LayerContext& ctx;
    ~ChainInContext() { ctx.layernorm_grads = nullptr; }
  } in_context{ctx};
  ctx.layernorm_grads = &chain;
  ParameterList held;  // collected, not yet reported: the chain holds their gradients
  auto report = [&](auto&& collect) {
    if (!grads_done) return;
    ParameterList candidates, done;
    candidates.swap(held);
    collect(candidates);
    for (Parameter* p : candidates) (chain.holds(p->grad) ? held : done).push_back(p);
    if (!done.empty()) grads_done(done);
  };
  const auto flush_and_report_held = [&] {
    chain.flush();
    report([](ParameterList&) {});
  };
  Tensor dx = dout;
  if (head_) {
    const Tensor dlosses = cache.target_weights.defined()
                               ? spread_by_weights(dout, cache.target_weights, ctx.space)
                               : dout;
    dx = head_->backward(dlosses, ctx, cache.head);
    if (final_norm_) dx = final_norm_->backward(dx, cache.final_norm, nullptr, &chain);
    // The head's weight is final here when it is the head's own (untied,
    // or the last stage's copy); with pp = 1 a tied head uses the
    // embedding's table, reported with the embedding.
    report([&](ParameterList& out) {
      if (final_norm_) final_norm_->collect(out);
      collect_head(out);
    });
  }
  for (std::size_t i = layers_.size(); i-- > 0;) {
    dx = layers_[i].backward(dx, ctx, cache.layers[i]);
    report([&](ParameterList& out) { layers_[i].collect(out); });
  }
  flush_and_report_held();  // the first layer's ln_1, before the embedding's work
  if (!embedding_) return dx;
  embedding_->backward(dx, ctx, cache.embedding);
  report([&](ParameterList& out) { embedding_->collect(out); });
  return Tensor();
}

}  // namespace meshtron
