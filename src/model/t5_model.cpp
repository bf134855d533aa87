#include "model/t5_model.hpp"

#include <cmath>
#include <vector>

#include "common/error.hpp"

namespace meshtron {

namespace {
/// Dropout streams outside the blocks' (layer * kStreamsPerLayer + site).
constexpr std::uint32_t kStreamDecoderEmbedding = kStreamEmbedding + 1,
                        kStreamEncoderFinal = kStreamEmbedding + 2,
                        kStreamDecoderFinal = kStreamEmbedding + 3;

const ModelSpec& checked(const ModelSpec& s, const LayerContext& ctx) {
  MESH_REQUIRE(s.model_class == ModelClass::T5, "T5Model: the spec does not describe a T5");
  MESH_REQUIRE(s.num_layers >= 1 && s.num_decoder_layers >= 1,
               "T5Model: needs at least one encoder and one decoder layer (got "
                   << s.num_layers << " and " << s.num_decoder_layers << ")");
  require_built(!s.block.attention.bias && !s.block.mlp.bias, "T5Model",
                "biases on the linear layers (T5 has none)");
  require_built(s.block.norm.placement == NormPlacement::Pre, "T5Model",
                "norm placement " + to_string(s.block.norm.placement));
  return s;
}

Parameter untied_output_weight(const ModelSpec& s, const LayerContext& ctx, DType dtype) {
  Parameter p = make_word_embedding(s, ctx, dtype);
  p.name = "output_layer.weight";
  return p;
}

/// Multiplies the local columns of each of a column-parallel weight's
/// `factors.size()` fused parts by its factor (q | k | v drawn N(0, 1) together).
void scale_column_parts(Parameter& p, const std::vector<double>& factors) {
  Tensor host = p.value.is_host() ? p.value : p.value.to_host();
  const index_t rows = host.dim(0), cols = host.dim(1), width = cols / index_t(factors.size());
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c)
      set_element_from_double(
          host, r * cols + c,
          factors[std::size_t(c / width)] * element_as_double(host, r * cols + c));
  if (!p.value.is_host()) p.value.copy_from(host);
}
}  // namespace

ModelSpec t5_spec(int encoder_layers, int decoder_layers, int d_model, int heads, int d_kv,
                  int d_ff, Activation activation, bool tie_word_embeddings, int vocab,
                  int encoder_seq_length, int decoder_seq_length, int buckets, int max_distance,
                  double eps) {
  ModelSpec s;
  s.model_class = ModelClass::T5;
  s.num_layers = encoder_layers;
  s.num_decoder_layers = decoder_layers;
  s.hidden_size = d_model;
  s.seq_length = s.max_positions = encoder_seq_length;
  s.decoder_seq_length = decoder_seq_length;
  s.vocab_size = s.padded_vocab_size = vocab;
  s.tie_word_embeddings = tie_word_embeddings;
  s.block.norm = NormSpec{NormKind::RMSNorm, eps, NormPlacement::Pre, /*bias=*/false};
  s.block.attention = AttentionSpec::multi_head(d_model, heads);
  s.block.attention.head_dim = d_kv;
  s.block.attention.mask = AttentionMask::Padding;
  s.block.attention.position = PositionEmbedding::Relative;
  s.block.attention.bias = false;
  s.block.attention.scale_scores = false;
  s.block.mlp = MlpSpec{d_ff, activation, /*bias=*/false};
  s.relative_attention_num_buckets = buckets;
  s.relative_attention_max_distance = max_distance;
  return s;
}

T5Model::T5Model(const ModelSpec& s, LayerContext& ctx, DType dtype, std::uint64_t seed)
    : T5Model(s, StagePlacement::whole_model(s.num_layers + s.num_decoder_layers), ctx, dtype,
              seed) {}

namespace {
/// The encoder's (decoder = false) or the decoder's blocks among the
/// layers [first, first + count) of both stacks, the encoder's first.
T5StackPart stack_part(const ModelSpec& s, const StagePlacement& place, bool decoder) {
  const int offset = decoder ? s.num_layers : 0;
  const int size = decoder ? s.num_decoder_layers : s.num_layers;
  const int begin = std::clamp(place.first_layer - offset, 0, size);
  const int end = std::clamp(place.first_layer + place.num_layers - offset, 0, size);
  return {begin, end - begin, end == size && end > begin};
}

const StagePlacement& checked(const ModelSpec& s, const StagePlacement& place) {
  const T5StackPart encoder = stack_part(s, place, false), decoder = stack_part(s, place, true);
  const bool whole = encoder.count == s.num_layers && decoder.count == s.num_decoder_layers;
  MESH_REQUIRE(place.num_layers >= 1 &&
                   place.first_layer + place.num_layers <= s.num_layers + s.num_decoder_layers,
               "T5Model: stage layers [" << place.first_layer << ", "
                                         << place.first_layer + place.num_layers
                                         << ") outside the model's");
  MESH_REQUIRE(whole || encoder.count == 0 || decoder.count == 0,
               "T5Model: a pipeline stage holds blocks of one stack (layers ["
                   << place.first_layer << ", " << place.first_layer + place.num_layers
                   << ") cross the encoder's end at " << s.num_layers << ")");
  return place;
}

/// Whether a stage holds the word table: for its stack's first lookup, or
/// for a tied head.
bool holds_word_table(const ModelSpec& s, const StagePlacement& place) {
  const T5StackPart encoder = stack_part(s, place, false), decoder = stack_part(s, place, true);
  const bool head = decoder.final_norm;
  return (encoder.count > 0 && encoder.first == 0) || (decoder.count > 0 && decoder.first == 0) ||
         (head && s.tie_word_embeddings);
}
}  // namespace

T5Model::T5Model(const ModelSpec& s, const StagePlacement& place, LayerContext& ctx,
                 DType dtype, std::uint64_t seed)
    : encoder("encoder", /*decoder=*/false, checked(s, ctx), /*first_stream_layer=*/0,
              kStreamEncoderFinal, ctx, dtype, stack_part(s, checked(s, place), false)),
      decoder("decoder", /*decoder=*/true, s, /*first_stream_layer=*/s.num_layers,
              kStreamDecoderFinal, ctx, dtype, stack_part(s, place, true)),
      spec_(s),
      placement_(place) {
  const bool head = stack_part(s, place, true).final_norm;
  if (holds_word_table(s, place)) {
    embedding.emplace(s, ctx, dtype);
    embedding->word.stage_copy = place.first_layer > 0;  // the first encoder stage's is the original
  }
  if (head && !s.tie_word_embeddings) output_weight.emplace(untied_output_weight(s, ctx, dtype));
  if (head) head_.emplace(s, output_weight ? *output_weight : embedding->word);
  const T5StackPart enc = stack_part(s, place, false), dec = stack_part(s, place, true);
  placement_.has_embedding = (enc.count > 0 && enc.first == 0) || (dec.count > 0 && dec.first == 0);
  placement_.has_head = head;
  initialise(ctx, seed);
}

StagePlacement T5Model::stage_placement(const ModelSpec& s, int stage, int pp, int split) {
  if (pp == 1) return StagePlacement::whole_model(s.num_layers + s.num_decoder_layers);
  MESH_REQUIRE(split >= 1 && split < pp && s.num_layers % split == 0 &&
                   s.num_decoder_layers % (pp - split) == 0,
               "T5: the encoder's " << s.num_layers << " layers over " << split
                                    << " stages and the decoder's " << s.num_decoder_layers
                                    << " over " << pp - split << " must both divide evenly");
  const bool encoder = stage < split;
  const int per_stage = encoder ? s.num_layers / split : s.num_decoder_layers / (pp - split);
  const int first = encoder ? stage * per_stage : s.num_layers + (stage - split) * per_stage;
  return {first, per_stage, first == 0 || first == s.num_layers, stage == pp - 1};
}

void T5Model::require_whole_model(const char* what) const {
  MESH_REQUIRE(whole_model(), "model.arch = t5: " << what
                                  << " over pipeline stages is not built "
                                     "(parallel.pipeline_parallel = 1)");
}

void T5Model::initialise(const LayerContext& ctx, std::uint64_t seed) {
  const int r = ctx.tp.rank(), p = ctx.tp.size();
  const double h = spec_.hidden_size, inner = spec_.block.attention.context_width();
  const double q_std = 1.0 / std::sqrt(h * spec_.head_dim()), kv_std = 1.0 / std::sqrt(h);
  if (embedding) init_normal(embedding->word, seed, 1.0, r, p);
  if (output_weight) init_normal(*output_weight, seed, 1.0, r, p);
  const auto init_attention = [&](T5Attention& a) {
    if (a.kv) {
      init_normal(a.in.weight, seed, q_std, r, p);
      init_normal(a.kv->weight, seed, kv_std, r, p);
    } else {
      init_normal(a.in.weight, seed, 1.0, r, p);
      scale_column_parts(a.in.weight, {q_std, kv_std, kv_std});
    }
    init_normal(a.proj.weight, seed, 1.0 / std::sqrt(inner), r, p);
  };
  for (T5Stack* stack : {&encoder, &decoder}) {
    init_normal(stack->relative_bias, seed, 1.0 / std::sqrt(h), r, p);
    for (T5Block& block : stack->blocks) {
      init_attention(block.self_attention);
      if (block.cross_attention) init_attention(*block.cross_attention);
      init_normal(block.mlp.fc.weight, seed, 1.0 / std::sqrt(h), r, p);
      init_normal(block.mlp.proj.weight, seed, 1.0 / std::sqrt(double(spec_.ffn_hidden_size())),
                  r, p);
    }
  }
}

ParameterList T5Model::parameters() {
  ParameterList out;
  if (embedding) embedding->collect(out);
  encoder.collect(out);
  decoder.collect(out);
  if (output_weight) out.push_back(&*output_weight);
  return out;
}

double T5Model::head_scale() const {
  return spec_.tie_word_embeddings ? 1.0 / std::sqrt(double(spec_.hidden_size)) : 1.0;
}

LayerContext T5Model::stack_context(const LayerContext& ctx, index_t s) {
  LayerContext out = ctx;
  out.seq_length = s;
  return out;
}

void T5Model::check_batch(const T5Batch& in, const LayerContext& ctx) const {
  const index_t b = ctx.micro_batch;
  MESH_REQUIRE(b > 0, "T5Model: LayerContext::micro_batch must be positive");
  const auto require_rows = [&](const Tensor& t, const char* what) {
    MESH_REQUIRE(t.defined() && t.dtype() == DType::I32 && t.rank() == 1 && t.numel() > 0 &&
                     t.numel() % b == 0,
                 "T5Model: " << what << " must be int32 [s * b] with b = " << b);
    return t.numel() / b;
  };
  const index_t s_enc = require_rows(in.encoder_ids, "encoder_ids");
  const index_t s_dec = require_rows(in.decoder_ids, "decoder_ids");
  const auto require_mask = [&](const Tensor& m, index_t s, const char* what) {
    MESH_REQUIRE(m.defined() && m.dtype() == DType::I32 && m.rank() == 2 && m.dim(0) == b &&
                     m.dim(1) == s,
                 "T5Model: " << what << " must be int32 [b = " << b << ", s = " << s << "], got "
                             << (m.defined() ? shape_string(m.shape()) : std::string("none")));
    for (std::int32_t v : host_ints(m))
      MESH_REQUIRE(v == 0 || v == 1, "T5Model: " << what << " value " << v << " is not 0 or 1");
  };
  for (const index_t s : {s_enc, s_dec})
    MESH_REQUIRE(s % ctx.sp_size() == 0, "T5Model: under sequence parallelism the sequence length "
                                             << s << " must be a multiple of tp = "
                                             << ctx.sp_size());
  require_mask(in.encoder_mask, s_enc, "encoder_mask");
  if (in.decoder_mask.defined()) require_mask(in.decoder_mask, s_dec, "decoder_mask");
  MESH_REQUIRE(in.labels.defined() && in.labels.dtype() == DType::I32 &&
                   in.labels.numel() == s_dec * b,
               "T5Model: labels must be int32 with s_dec * b = " << s_dec * b << " entries");
  for (const Tensor* ids : {&in.encoder_ids, &in.decoder_ids})
    for (std::int32_t v : host_ints(*ids))
      MESH_REQUIRE(v >= 0 && v < spec_.vocab_size,
                   "T5Model: token " << v << " is outside the vocabulary [0, " << spec_.vocab_size
                                     << ")");
  for (std::int32_t v : host_ints(in.labels))
    MESH_REQUIRE(v == -100 || (v >= 0 && v < spec_.vocab_size),
                 "T5Model: label " << v << " is neither -100 nor in [0, " << spec_.vocab_size
                                   << ")");
}

Tensor T5Model::encode(const Tensor& input, const Tensor& mask, LayerContext& ctx) const {
  Cache c;
  const index_t s = input.dim(0) / ctx.micro_batch;
  LayerContext enc = stack_context(ctx, s);
  const Tensor x =
      placement_.has_embedding ? embedding->forward(input, enc, c.encoder_embedding) : input;
  return encoder.forward(x, in_space(mask, ctx.space), Tensor(), Tensor(), enc, c.encoder);
}

namespace {
/// ctx for one generation step: b rows of one position, no dropout, no SP.
LayerContext step_context(const LayerContext& ctx) {
  LayerContext out = ctx;
  out.training = false;
  out.sequence_parallel = false;
  out.seq_length = 1;
  return out;
}
}  // namespace

T5Model::DecoderState T5Model::start_decoding(const Tensor& encoder_out,
                                              const Tensor& encoder_mask, index_t capacity,
                                              LayerContext& ctx) const {
  LayerContext step = step_context(ctx);
  DecoderState state;
  state.capacity = capacity;
  state.encoder_mask = in_space(encoder_mask, ctx.space);
  for (const T5Block& block : decoder.blocks) {
    state.self.push_back(block.self_attention.make_cache(ctx.micro_batch, capacity,
                                                         encoder_out.dtype(), ctx.space));
    state.cross.push_back(block.cross_attention->key_values(encoder_out, step));
  }
  return state;
}

Tensor T5Model::decode_step(const Tensor& input, LayerContext& ctx, DecoderState& state) const {
  const index_t b = ctx.micro_batch, t = state.position;
  MESH_REQUIRE(input.dim(0) == b, "T5Model::decode_step: one row per sample (b = " << b << ")");
  MESH_REQUIRE(t < state.capacity,
               "T5Model::decode_step: the cache holds " << state.capacity << " tokens per sample");
  LayerContext step = step_context(ctx);
  Embedding::Cache embedding_cache;
  Tensor x = placement_.has_embedding ? embedding->forward(input, step, embedding_cache) : input;
  // Keys 0..t are filled: the rest hidden by the key mask.
  Tensor filled = Tensor::zeros({b, state.capacity}, DType::I32);
  for (index_t i = 0; i < b; ++i)
    for (index_t j = 0; j <= t; ++j) filled.data<std::int32_t>()[i * state.capacity + j] = 1;
  T5Masks masks;
  masks.self.heads = masks.cross.heads = decoder.blocks.front().self_attention.heads_local();
  masks.self.bias = decoder.position_bias(1, state.capacity, t, step);
  masks.self.key_mask = in_space(filled, ctx.space);
  masks.cross.key_mask = state.encoder_mask;
  for (std::size_t i = 0; i < decoder.blocks.size(); ++i)
    x = decoder.blocks[i].forward_step(x, t, masks, step, state.self[i], state.cross[i]);
  ++state.position;
  if (!placement_.has_head) return x;
  LayerNorm::Cache norm;
  Tensor sequence = decoder.final_norm->forward(x, norm);
  if (head_scale() != 1.0) ops::scale(sequence, head_scale());
  return head_->logits(sequence, step);
}

Tensor T5Model::decoder_embedding(const Tensor& ids, LayerContext& ctx, Cache& c) const {
  LayerContext lookup = ctx;  // the embedding's own dropout is the encoder's stream
  lookup.training = false;
  Tensor x = embedding->forward(ids, lookup, c.decoder_embedding);
  if (!ctx.training || spec_.hidden_dropout == 0) return x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.space());
  ops::dropout_forward(x, spec_.hidden_dropout,
                       ctx.hidden_site(kStreamDecoderEmbedding, spec_.hidden_size), y);
  return y;
}

void T5Model::decoder_embedding_backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  Tensor dx = dy;
  if (ctx.training && spec_.hidden_dropout > 0) {
    dx = Tensor::empty(dy.shape(), dy.dtype(), dy.space());
    ops::dropout_backward(dy, spec_.hidden_dropout,
                          ctx.hidden_site(kStreamDecoderEmbedding, spec_.hidden_size), dx);
  }
  LayerContext lookup = ctx;
  lookup.training = false;
  embedding->backward(dx, lookup, c.decoder_embedding);
}

void T5Model::start_cache(const T5Batch& in, const LayerContext& ctx, Cache& c) const {
  check_batch(in, ctx);
  const index_t b = ctx.micro_batch;
  c.encoder_length = in.encoder_ids.numel() / b;
  c.decoder_length = in.decoder_ids.numel() / b;
  c.encoder_mask = in_space(in.encoder_mask, ctx.space);
}

double T5Model::forward(const T5Batch& in, LayerContext& ctx, Cache& c) const {
  require_whole_model("T5Model::forward(T5Batch)");
  start_cache(in, ctx, c);
  c.encoder_out = encoder_stage_forward(in.encoder_ids, ctx, c);
  decoder_stage_forward(c.encoder_out, in, ctx, c);
  return c.loss;
}

Tensor T5Model::encoder_stage_forward(const Tensor& input, LayerContext& ctx, Cache& c) const {
  LayerContext enc = stack_context(ctx, c.encoder_length);
  const bool first = placement_.first_layer == 0;
  const Tensor x = first ? embedding->forward(input, enc, c.encoder_embedding) : input;
  return encoder.forward(x, c.encoder_mask, Tensor(), Tensor(), enc, c.encoder);
}

Tensor T5Model::decoder_stage_forward(const Tensor& input, const T5Batch& in, LayerContext& ctx,
                                      Cache& c) const {
  // input: the encoder output, then (after the first decoder stage) the
  // decoder's hidden rows.
  const index_t memory_rows = c.encoder_length * ctx.micro_batch / ctx.sp_size();
  c.encoder_out = input.slice_rows(0, memory_rows);
  LayerContext dec = stack_context(ctx, c.decoder_length);
  const Tensor y = placement_.has_embedding ? decoder_embedding(in.decoder_ids, dec, c)
                                            : input.slice_rows(memory_rows, input.dim(0));
  const Tensor decoder_mask =
      in.decoder_mask.defined() ? in_space(in.decoder_mask, ctx.space) : Tensor();
  Tensor out = decoder.forward(y, decoder_mask, c.encoder_out, c.encoder_mask, dec, c.decoder);
  if (placement_.has_head) {
    head_loss(out, in.labels, dec, c);
    return Tensor();
  }
  Tensor both = Tensor::empty({memory_rows + out.dim(0), out.dim(1)}, out.dtype(), out.space());
  both.slice_rows(0, memory_rows).copy_from(c.encoder_out);
  both.slice_rows(memory_rows, both.dim(0)).copy_from(out);
  return both;
}

double T5Model::head_loss(Tensor sequence, const Tensor& labels, LayerContext& dec,
                          Cache& c) const {
  if (head_scale() != 1.0) ops::scale(sequence, head_scale());

  const auto [targets, weights] = labelled_targets(labels, stats_dtype(sequence));
  c.weights = in_space(weights, dec.space);
  c.losses = head_->forward(sequence, targets, dec, c.head);
  const std::vector<double> loss = c.losses.to_doubles(), w = weights.to_doubles();
  c.loss = 0;
  for (std::size_t i = 0; i < loss.size(); ++i) c.loss += w[i] * loss[i];
  return c.loss;
}

void T5Model::backward(LayerContext& ctx, const Cache& c) { backward_from(c.weights, ctx, c); }

void T5Model::backward_from(const Tensor& dlosses, LayerContext& ctx, const Cache& c) {
  require_whole_model("T5Model::backward");
  encoder_stage_backward(decoder_stage_backward(dlosses, ctx, c), ctx, c);
}

Tensor T5Model::decoder_stage_backward(const Tensor& dout, LayerContext& ctx, const Cache& c) {
  LayerContext dec = stack_context(ctx, c.decoder_length);
  const index_t memory_rows = c.encoder_out.dim(0);
  Tensor dsequence, dmemory;  // every decoder block's cross-attention adds to dmemory
  if (placement_.has_head) {  // dout: d(loss)/d(each token's cross-entropy)
    dsequence = head_->backward(dout, dec, c.head);
    if (head_scale() != 1.0) ops::scale(dsequence, head_scale());
  } else {  // dout: [d(encoder output) ; d(hidden)], ours to add into
    dmemory = dout.slice_rows(0, memory_rows);
    dsequence = dout.slice_rows(memory_rows, dout.dim(0));
  }
  const Tensor dy = decoder.backward(dsequence, dec, c.decoder, &dmemory);
  if (placement_.has_embedding) {
    decoder_embedding_backward(dy, dec, c);
    return dmemory;
  }
  Tensor both = Tensor::empty({memory_rows + dy.dim(0), dy.dim(1)}, dy.dtype(), dy.space());
  both.slice_rows(0, memory_rows).copy_from(dmemory);
  both.slice_rows(memory_rows, both.dim(0)).copy_from(dy);
  return both;
}

Tensor T5Model::encoder_stage_backward(const Tensor& dout, LayerContext& ctx, const Cache& c) {
  LayerContext enc = stack_context(ctx, c.encoder_length);
  const Tensor dx = encoder.backward(dout, enc, c.encoder, nullptr);
  if (placement_.first_layer > 0) return dx;
  embedding->backward(dx, enc, c.encoder_embedding);
  return Tensor();
}

index_t T5Model::encoder_rows(const MicroBatch& mb, const LayerContext& ctx) {
  return mb.ids.numel() / ctx.sp_size();
}

index_t T5Model::decoder_rows(const MicroBatch& mb, const LayerContext& ctx) {
  return mb.decoder_ids.numel() / ctx.sp_size();
}

Shape T5Model::input_shape(const MicroBatch& mb, const LayerContext& ctx) const {
  const bool carries_decoder = !decoder.blocks.empty() && !placement_.has_embedding;
  return {encoder_rows(mb, ctx) + (carries_decoder ? decoder_rows(mb, ctx) : 0),
          spec_.hidden_size};
}

Shape T5Model::output_shape(const MicroBatch& mb, const LayerContext& ctx) const {
  const bool decoder_stage = !decoder.blocks.empty();
  return {encoder_rows(mb, ctx) + (decoder_stage ? decoder_rows(mb, ctx) : 0), spec_.hidden_size};
}

Tensor T5Model::per_token_losses(const Cache& c, const LayerContext& ctx) {
  return spread_by_weights(c.losses, c.weights, ctx.space);
}

Tensor T5Model::forward(const Tensor& input, const MicroBatch& mb, LayerContext& ctx,
                        StageCache& cache) const {
  if (ctx.param_gather) ctx.param_gather->before_forward(const_cast<T5Model&>(*this).parameters());
  auto& c = static_cast<Cache&>(cache);
  const T5Batch in{mb.ids, mb.padding_mask, mb.decoder_ids, mb.decoder_padding_mask, mb.targets};
  start_cache(in, ctx, c);
  Tensor out = input;
  if (!encoder.blocks.empty()) out = encoder_stage_forward(out, ctx, c);
  if (!decoder.blocks.empty()) out = decoder_stage_forward(out, in, ctx, c);
  return placement_.has_head ? per_token_losses(c, ctx) : out;
}

Tensor T5Model::dlosses_of(const Tensor& dout, const Cache& c, const LayerContext& ctx) {
  // The chain rule through forward()'s per-token loss (see the header).
  return spread_by_weights(dout, c.weights, ctx.space);
}

Tensor T5Model::backward(const Tensor& dout, LayerContext& ctx, const StageCache& cache,
                         const std::function<void(const ParameterList&)>& grads_done) {
  const auto& c = static_cast<const Cache&>(cache);
  Tensor d = placement_.has_head ? dlosses_of(dout, c, ctx) : dout;
  if (!decoder.blocks.empty()) d = decoder_stage_backward(d, ctx, c);
  if (!encoder.blocks.empty()) d = encoder_stage_backward(d, ctx, c);
  if (grads_done) grads_done(parameters());
  return d;
}

}  // namespace meshtron
