#include "plan/memory.hpp"

#include <algorithm>
#include <cmath>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "ops/ops.hpp"
#include "train/metrics.hpp"
#include "train/schedule.hpp"

namespace meshtron::plan {

Recompute parse_recompute(const std::string& s) {
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  MESH_REQUIRE(s == "none",
               "training.recompute = '" << s << "' is not one of none | selective | full");
  return Recompute::None;
}

double korthikanti_layer_bytes(double s, double b, double h, double a, int t, bool sp,
                               Recompute r) {
  const double sbh = s * b * h;
  if (r == Recompute::Full) return 2 * sbh / (sp ? t : 1);
  const double core = r == Recompute::Selective ? 0 : 5 * a * s / (h * t);
  if (sp) return sbh * (34.0 / t + core);
  return sbh * (10 + 24.0 / t + core);
}

namespace {

/// Stored bytes of the attention core: softmax output, its dropout mask and
/// output (unfused), or the log-sum-exp and the kept dropout bits (fused).
double core_bytes(const LayerShape& x, const ActivationBytes& w) {
  const double scores = x.a * x.s * x.s * x.b / x.t;
  if (x.fused_core) return 4 * x.a * x.s * x.b / x.t + (x.attention_dropout ? scores / 8 : 0);
  return w.element * scores + (x.attention_dropout ? (w.mask + w.element) * scores : 0);
}

}  // namespace

double layer_activation_bytes(const LayerShape& x, const ActivationBytes& w, Recompute r) {
  const double sb = x.s * x.b, sbh = sb * x.h;
  const double rep = x.sequence_parallel ? 1.0 / x.t : 1.0;  // tp-replicated unless SP
  const double gathered = x.sequence_parallel && !x.keep_gathered ? 1.0 / x.t : 1.0;
  if (r == Recompute::Full) return w.element * sbh * rep;
  const double e = w.element;
  const double norms = 2 * e * sbh * rep + 2 * x.norms_stats * w.row_stats * sb * rep;
  const double masks = x.hidden_dropout ? 2 * w.mask * sbh * rep : 0;
  const double qkv = e * sb * (x.a + 2 * x.g) * x.d / x.t;  // q, k, v (or the fused qkv output)
  const double attention = e * sbh * gathered + qkv + e * sb * x.a * x.d / x.t;
  const double mlp = e * sbh * gathered + e * sb * x.f * ((x.gated ? 2 : 1) + 1) / x.t;
  const double core = r == Recompute::Selective && !x.fused_core ? 0 : core_bytes(x, w);
  return norms + masks + attention + mlp + core;
}

double layer_backward_workspace_bytes(const LayerShape& x, const ActivationBytes& w, Recompute r) {
  // Selective recompute rebuilds the core's [s, s] tensors, full the layer.
  const double stored = layer_activation_bytes(x, w, Recompute::None);
  const double rebuilt = r == Recompute::None   ? 0
                         : r == Recompute::Full ? stored
                                                : stored - layer_activation_bytes(x, w, r);
  const double e = w.element, sb = x.s * x.b;
  // Unfused core: d probs and d scores ([b a/t, s, s] each) with dq, dk, dv;
  // the MLP: d of its fc output and d of the activation ([s b, f/t] each).
  const double core = x.fused_core ? 0 : 2 * e * x.a * x.s * x.s * x.b / x.t;
  const double grads = std::max(core + e * sb * (x.a + 2 * x.g) * x.d / x.t,
                                e * sb * x.f * ((x.gated ? 2 : 1) + 1) / x.t);
  return rebuilt + grads + 2 * e * sb * x.h;  // plus dy and dx of the layer
}

namespace {

double dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

bool bias_in_weight_gemm(const RunConfig& c) {
  const std::string& v = c.training.bias_in_weight_gemm;
  return v == "true" || (v == "auto" && c.run.device == "cuda");
}

}  // namespace

LayerShape layer_shape(const RunConfig& c, const ModelSpec& m) {
  const auto& at = m.block.attention;
  LayerShape x;
  x.s = m.seq_length;
  x.b = c.training.micro_batch_size;
  x.h = m.hidden_size;
  x.a = at.num_heads;
  x.g = at.num_query_groups;
  x.d = at.head_dim;
  x.f = m.ffn_hidden_size();
  x.gated = is_gated(m.block.mlp.activation);
  x.t = c.parallel.tensor_parallel;
  x.sequence_parallel = c.parallel.sequence_parallel;
  x.keep_gathered = c.parallel.sequence_parallel_keep_gathered;
  x.attention_dropout = m.attention_dropout > 0;
  x.hidden_dropout = m.hidden_dropout > 0;
  // model.attention_backend = auto takes the fused core on the GPU in
  // bf16 / fp16 with head dim 64 or 128 (ops::fused_attention_supported).
  const std::string& backend = c.model.attention_backend;
  const bool fusable =
      c.run.device == "cuda" && c.training.precision != "fp32" && (x.d == 64 || x.d == 128);
  x.fused_core = backend == "fused" || (backend == "auto" && fusable);
  x.norms_stats = m.block.norm.kind == NormKind::LayerNorm ? 2 : 1;
  return x;
}

ActivationBytes meshtron_bytes(const RunConfig& c) {
  return {dtype_bytes(app::compute_dtype(c)), 0, 4};
}

namespace {

ParameterCount parameter_count(const RunConfig& c, const ModelSpec& m) {
  const auto& at = m.block.attention;
  const double h = m.hidden_size, f = m.ffn_hidden_size(), t = c.parallel.tensor_parallel;
  const double norm = h * (m.block.norm.kind == NormKind::LayerNorm && m.block.norm.bias ? 2 : 1);
  const double qkv_out = double(at.qkv_width()) / t,
               fc_out = f * (is_gated(m.block.mlp.activation) ? 2 : 1) / t;
  // Column-parallel biases fed by a ones column carry (kOnesColumnWidth - 1)
  // x out padding in the flat buffers (model/linear.cpp).
  const double ones = bias_in_weight_gemm(c) && norm == 2 * h ? ops::kOnesColumnWidth - 1 : 0;
  const double bias_a = at.bias ? qkv_out * (1 + ones) + h : 0;
  const double bias_m = m.block.mlp.bias ? fc_out * (1 + ones) + h : 0;
  ParameterCount p;
  p.layer = 2 * norm + h * qkv_out + at.context_width() / t * h + bias_a + h * fc_out + f / t * h +
            bias_m;
  const double word = double(m.padded_vocab_size) / t * h;
  p.embedding =
      word + (at.position == PositionEmbedding::LearnedAbsolute ? m.max_positions * h : 0);
  const bool head_copies_word = !m.tie_word_embeddings || c.parallel.pipeline_parallel > 1;
  p.head = norm + (head_copies_word ? word : 0);
  return p;
}

}  // namespace

int micro_batches_per_step(const RunConfig& c) {
  return c.training.global_batch_size / (c.training.micro_batch_size * c.parallel.data_parallel);
}

namespace {

/// Parameters, gradients and optimizer state of a rank with `n` parameter
/// elements (train/optimizer.cpp: AdamW and DistributedAdamW).
void add_static(const RunConfig& c, double n, RankMemory& r) {
  const double value = dtype_bytes(app::compute_dtype(c));
  const bool mixed = value == 2;
  const double dp = c.parallel.data_parallel;
  r.parameter_elements = n;
  r.parameters = value * n;
  r.gradients = 4 * n;
  if (!c.parallel.distributed_optimizer) {
    r.master = mixed ? 4 * n : 0;
    r.moments = 8 * n;
    // Construction: the gradients move into one flat buffer while the
    // per-parameter ones are still alive.
    r.setup_peak = r.parameters + 2 * r.gradients;
    return;
  }
  const double shard = std::ceil(n / dp);
  r.master = 4 * shard;  // a clone of this rank's shard, in fp32 too
  r.moments = 8 * shard;
  r.optimizer_buffers = 4 * shard + (mixed ? value * shard : 0);  // grad shard, 16-bit shard
  r.parameters = value * shard * dp;  // values live in a padded flat buffer
  r.gradients = 4 * shard * dp;
  // Construction (DistributedAdamW's constructor): the layers' own values
  // and gradients, a packed fp32 copy of the values, master, moments and
  // shards, the flat gradient buffer; then the layers' gradients are
  // released and (fp32) the flat value buffer takes their values' place.
  const double packed = 4 * shard * dp;
  const double before = value * n + 4 * n + packed + r.master + r.moments + r.optimizer_buffers +
                        (mixed ? r.parameters : 0) + r.gradients;
  const double after = before - 4 * n + (mixed ? 0 : r.parameters);
  r.setup_peak = std::max(before, after);
}

}  // namespace

namespace {

/// One model chunk's stored activations per micro-batch and the most its
/// backward allocates on top of them.
struct ChunkCost {
  double stored = 0, backward = 0;
  double logits = 0;     ///< of `stored`: the head's logits and their statistics
  double sent = 0;       ///< kept after the forward: the output sent on, or the last chunk's losses
  double sent_back = 0;  ///< kept after the backward: the input's gradient sent back
};

/// Of the chunks' `layers`, how many full recompute checkpoints
/// (training.recompute_num_layers: the first N, 0 = all), and the
/// recompute of the rest.
int checkpointed_layers(const RunConfig& c, int layers) {
  const int n = c.training.recompute_num_layers;
  if (parse_recompute(c.training.recompute) != Recompute::Full) return 0;
  return n == 0 ? layers : std::min(layers, n);
}
Recompute uncheckpointed(const RunConfig& c) {
  const Recompute r = parse_recompute(c.training.recompute);
  return r == Recompute::Full ? Recompute::None : r;
}

/// The last chunk's head on `sb` tokens: the final norm's input, the
/// head's gathered input, the logits in logits_dtype with their fp32 row
/// max and sum and the int32 targets; its backward the fp32 d logits and d x.
void add_head(const RunConfig& c, const ModelSpec& m, const LayerShape& x, double sb,
              ChunkCost& out) {
  const ActivationBytes w = meshtron_bytes(c);
  const double shard = x.sequence_parallel ? x.t : 1;
  const double logits_bytes = c.training.logits_dtype == "fp32" ? 4 : w.element;
  const double vocab = double(m.padded_vocab_size) / x.t;
  const double head_in = w.element * sb * x.h * (1 + 1 / shard);
  out.logits = sb * vocab * logits_bytes + 3 * 4 * sb;
  out.stored += head_in + out.logits;
  out.backward = std::max(out.backward, 4 * sb * vocab + head_in);
  out.sent = 4 * sb;  // the per-token losses
}

ChunkCost chunk_cost(const RunConfig& c, const ModelSpec& m, int layers, bool first, bool last) {
  const LayerShape x = layer_shape(c, m);
  const ActivationBytes w = meshtron_bytes(c);
  const int full = checkpointed_layers(c, layers);
  const Recompute rest = uncheckpointed(c);
  ChunkCost out;
  out.stored = full * layer_activation_bytes(x, w, Recompute::Full) +
               (layers - full) * layer_activation_bytes(x, w, rest);
  out.backward = layer_backward_workspace_bytes(x, w, full > 0 ? Recompute::Full : rest);
  const double sb = x.s * x.b;
  const double boundary = w.element * sb * x.h / (x.sequence_parallel ? x.t : 1);
  out.sent = boundary;
  out.sent_back = first ? 0 : boundary;
  if (first) out.stored += 8 * sb;  // token ids and positions (int32)
  if (last) add_head(c, m, x, sb, out);
  return out;
}

/// Walks pipeline rank `rank`'s task order (train/schedule.cpp): each
/// forward adds its chunk's activations, each backward releases them after
/// running with its temporaries. The trainer also keeps every tensor it
/// sent to a neighbour stage until the end of the step (in_flight_sends),
/// and each micro-batch's losses on the last chunk. Sets activations,
/// in_flight and workspace of `r`.
void walk_schedule(const RunConfig& c, const std::vector<ChunkCost>& chunks, RankMemory& r) {
  const int pp = c.parallel.pipeline_parallel, v = c.parallel.virtual_stages;
  double live = 0, peak = 0, peak_work = 0;
  int alive = 0;
  for (const auto& task :
       schedule_tasks({c.parallel.schedule, pp, v, micro_batches_per_step(c)}, r.pp_rank)) {
    const ChunkCost& cost = chunks[std::size_t(task.chunk)];
    if (task.kind == PipelineTask::Forward) {
      live += cost.stored + cost.sent;
      ++alive;
      if (live > peak + peak_work) peak = live, peak_work = 0, r.in_flight = alive;
    } else {
      if (live + cost.backward > peak + peak_work)
        peak = live, peak_work = cost.backward, r.in_flight = alive;
      live -= cost.stored - cost.sent_back;
      --alive;
    }
  }
  r.activations = peak;
  // cuBLASLt's workspace on the GPU (kernels/cuda/gemm.cu: 32 MiB).
  r.workspace = peak_work + (c.run.device == "cuda" ? 32.0 * 1024 * 1024 : 0);
}

// T5 (model/t5_model.hpp): Megatron's encoder-decoder split puts the
// encoder's blocks evenly on pipeline ranks [0, split) and the decoder's on
// [split, pp), one chunk each. An encoder block is a GPT layer of the
// encoder's length s_e; a decoder block one of the decoder's s_d plus a
// cross-attention over the encoder output. The core is the unfused one
// everywhere (the fused kernels take no position bias).

/// The blocks and the shared parts pipeline rank `rank` holds
/// (T5Model::stage_placement).
struct T5Stage {
  int encoder_layers = 0, decoder_layers = 0;
  bool first_encoder = false, last_encoder = false;  ///< the encoder's first / last blocks here
  bool first_decoder = false, last = false;          ///< the decoder's first / last (the head)
};

T5Stage t5_stage(const RunConfig& c, const ModelSpec& m, int rank) {
  const int pp = c.parallel.pipeline_parallel, split = c.degrees().pipeline_split_rank;
  T5Stage st;
  if (pp == 1) return {m.num_layers, m.num_decoder_layers, true, true, true, true};
  if (rank < split) {
    st.encoder_layers = m.num_layers / split;
    st.first_encoder = rank == 0;
    st.last_encoder = rank == split - 1;
  } else {
    st.decoder_layers = m.num_decoder_layers / (pp - split);
    st.first_decoder = rank == split;
    st.last = rank == pp - 1;
  }
  return st;
}

}  // namespace

/// A stack's layer shape: the deck's with the stack's sequence length and
/// T5's unfused core.
LayerShape t5_layer_shape(const RunConfig& c, const ModelSpec& m, bool decoder) {
  LayerShape x = layer_shape(c, m);
  x.s = decoder ? m.decoder_seq_length : m.seq_length;
  x.fused_core = false;
  return x;
}

namespace {

/// A cross-attention's [b a/t, s_d, s_e] scores (x: the decoder's shape).
double cross_scores(const LayerShape& x, double encoder_s) {
  return x.a * x.s * encoder_s * x.b / x.t;
}

}  // namespace

/// What a decoder block's cross-attention stores beyond the GPT-like
/// layer (T5Attention::Cache, T5Block::Cache::ln_cross): its norm's input
/// and statistics, q's input and q, k and v of the encoder output, the
/// softmax output and its dropout, the projection's input. The kv
/// projection's input is the encoder output itself, unless SP keeps the
/// gathered copy. Full recompute keeps only the block's input.
double cross_attention_bytes(const LayerShape& x, double encoder_s, const ActivationBytes& w,
                             Recompute r) {
  if (r == Recompute::Full) return 0;
  const double e = w.element, sb = x.s * x.b, rep = x.sequence_parallel ? 1.0 / x.t : 1.0;
  const double gathered = x.sequence_parallel && !x.keep_gathered ? 1.0 / x.t : 1.0;
  const double kv_input = x.sequence_parallel && x.keep_gathered ? e * encoder_s * x.b * x.h : 0;
  const double norm = e * sb * x.h * rep + x.norms_stats * w.row_stats * sb * rep;
  const double mask = x.hidden_dropout ? w.mask * sb * x.h * rep : 0;
  const double q_and_proj_input = 2 * e * sb * x.a * x.d / x.t;
  const double kv = 2 * e * encoder_s * x.b * x.a * x.d / x.t;
  const double probs = r == Recompute::Selective
                           ? 0
                           : e * cross_scores(x, encoder_s) * (x.attention_dropout ? 2 : 1);
  return norm + mask + e * sb * x.h * gathered + q_and_proj_input + kv_input + kv + probs;
}

namespace {

/// The largest of an attention's backward temporaries on queries of x.s
/// and `keys` keys (T5Attention::backward): d probs and d logits, dq, dk,
/// dv and their merged copy, d context, and five [s b, h] rows around it
/// (the block's dy, the residual's gradient, the branch dropout's dx, the
/// input projection's dx and its gathered form); under selective
/// recompute the rebuilt softmax output and its dropout too.
double t5_attention_backward_bytes(const LayerShape& x, double keys, const ActivationBytes& w,
                                   Recompute r) {
  const double e = w.element, sb = x.s * x.b, rep = x.sequence_parallel ? 1.0 / x.t : 1.0;
  const double scores = x.a * x.s * keys * x.b / x.t;
  const double rebuilt = r == Recompute::Selective ? e * scores * (x.attention_dropout ? 2 : 1) : 0;
  const double qkv = e * x.b * (x.s + 2 * keys) * x.a * x.d / x.t;
  return rebuilt + 2 * e * scores + 2 * qkv + e * sb * x.a * x.d / x.t + 5 * e * sb * x.h * rep;
}

/// The most one block's backward allocates on top of the stored
/// activations: the rebuilt block under full recompute, then the larger of
/// its attentions' temporaries (self, and cross over `encoder_s` keys in
/// the decoder) and the MLP's.
double t5_block_backward_bytes(const LayerShape& x, double encoder_s, bool decoder,
                               const ActivationBytes& w, Recompute r) {
  const double e = w.element, sb = x.s * x.b;
  const Recompute kept = r == Recompute::Full ? Recompute::None : r;
  const double rebuilt =
      r == Recompute::Full ? layer_activation_bytes(x, w, Recompute::None) +
                                 (decoder ? cross_attention_bytes(x, encoder_s, w, kept) : 0)
                           : 0;
  double temporaries = std::max(t5_attention_backward_bytes(x, x.s, w, kept),
                                e * sb * x.f * ((x.gated ? 2 : 1) + 1) / x.t + 2 * e * sb * x.h);
  if (decoder)
    temporaries = std::max(temporaries, t5_attention_backward_bytes(x, encoder_s, w, kept));
  return rebuilt + temporaries;
}

/// One stack's part on a stage: its blocks, the relative position bias
/// [a/t, s, s] (fp32) they share, the final norm's input and statistics on
/// the stack's last stage (the decoder's: in add_head), and the backward's
/// d(bias) beside the block's temporaries.
void add_t5_stack(const RunConfig& c, const LayerShape& x, double encoder_s, bool decoder,
                  int layers, bool final_norm, ChunkCost& out) {
  const ActivationBytes w = meshtron_bytes(c);
  const int full = checkpointed_layers(c, layers);
  const Recompute rest = uncheckpointed(c);
  const auto block = [&](Recompute r) {
    return layer_activation_bytes(x, w, r) +
           (decoder ? cross_attention_bytes(x, encoder_s, w, r) : 0);
  };
  const double sb = x.s * x.b, rep = x.sequence_parallel ? 1.0 / x.t : 1.0;
  const double bias = 4 * x.a * x.s * x.s / x.t;
  out.stored += full * block(Recompute::Full) + (layers - full) * block(rest) + bias;
  if (final_norm) out.stored += w.element * sb * x.h * rep + x.norms_stats * w.row_stats * sb * rep;
  // The decoder's backward also holds d(encoder output), its cross-attentions' sum.
  const double dmemory = decoder ? w.element * encoder_s * x.b * x.h * rep : 0;
  out.backward = std::max(out.backward, bias + dmemory + t5_block_backward_bytes(
                                                              x, encoder_s, decoder, w,
                                                              full > 0 ? Recompute::Full : rest));
}

/// Parameter elements of a T5 stage (T5Model, T5Stack): its blocks (a
/// decoder block adds the cross-attention's norm, q, kv and projection),
/// each stack's relative-bias table [buckets, a/t] where it holds that
/// stack's blocks, the final norms, the word table on the first stage of
/// each stack and a tied head's, an untied head's own weight.
double t5_parameters(const RunConfig& c, const ModelSpec& m, const T5Stage& st) {
  const ParameterCount count = parameter_count(c, m);
  const double h = m.hidden_size, t = c.parallel.tensor_parallel;
  const double decoder_layer = count.layer + h + 4 * h * m.block.attention.context_width() / t;
  const double table = m.relative_attention_num_buckets * m.num_heads() / t;
  const bool word = st.first_encoder || st.first_decoder || (st.last && m.tie_word_embeddings);
  return st.encoder_layers * count.layer + st.decoder_layers * decoder_layer +
         (st.encoder_layers > 0 ? table : 0) + (st.decoder_layers > 0 ? table : 0) +
         (st.last_encoder ? h : 0) + (st.last ? h : 0) + (word ? count.embedding : 0) +
         (st.last && !m.tie_word_embeddings ? count.embedding : 0);
}

/// Pipeline rank `r.pp_rank`'s chunk of a T5: its parameter elements, with
/// layers, embedding and head set in `r`. What travels between stages:
/// the encoder's rows from an encoder stage, [encoder output ; decoder
/// rows] from a decoder stage, and their gradients back (the first decoder
/// stage's: d(encoder output) alone).
double t5_chunk(const RunConfig& c, const ModelSpec& m, RankMemory& r,
                std::vector<ChunkCost>& chunks) {
  const T5Stage st = t5_stage(c, m, r.pp_rank);
  const LayerShape enc = t5_layer_shape(c, m, false), dec = t5_layer_shape(c, m, true);
  const ActivationBytes w = meshtron_bytes(c);
  const double rows = w.element * enc.h / (enc.sequence_parallel ? enc.t : 1);
  const double encoder_out = rows * enc.s * enc.b, decoder_out = rows * dec.s * dec.b;
  ChunkCost out;
  if (st.encoder_layers > 0) {
    add_t5_stack(c, enc, enc.s, false, st.encoder_layers, st.last_encoder, out);
    if (st.first_encoder) out.stored += 4 * enc.s * enc.b;  // the encoder's ids (int32)
    out.sent = encoder_out;
    out.sent_back = st.first_encoder ? 0 : encoder_out;
  }
  if (st.decoder_layers > 0) {
    add_t5_stack(c, dec, enc.s, true, st.decoder_layers, false, out);
    out.stored += encoder_out;  // every cross-attention's memory
    if (st.first_decoder) out.stored += 4 * dec.s * dec.b;  // the decoder's ids
    out.sent = encoder_out + decoder_out;
    out.sent_back = st.first_encoder ? 0 : st.first_decoder ? encoder_out : encoder_out + decoder_out;
  }
  if (st.last) add_head(c, m, dec, dec.s * dec.b, out);
  chunks.push_back(out);

  r.layers = st.encoder_layers + st.decoder_layers;
  r.decoder_layers = st.decoder_layers;
  r.embedding = st.first_encoder || st.first_decoder;
  r.head = st.last;
  return t5_parameters(c, m, st);
}

/// Pipeline rank `r.pp_rank`'s chunks of a GPT or BERT model: its
/// parameter elements, with layers, embedding and head set in `r`.
double stack_chunks(const RunConfig& c, const ModelSpec& m, RankMemory& r,
                    std::vector<ChunkCost>& chunks) {
  const int pp = c.parallel.pipeline_parallel, v = c.parallel.virtual_stages;
  const std::vector<int> layers = c.parallel.chunk_layers(m.num_layers, head_cost_in_layers(m));
  const ParameterCount count = parameter_count(c, m);
  double n = 0;
  for (int k = 0; k < v; ++k) {  // global chunk k pp + rank (Trainer::global_chunk)
    const int g = k * pp + r.pp_rank, chunk = layers[std::size_t(g)];
    const bool first = g == 0, last = g == pp * v - 1;
    r.layers += chunk;
    r.embedding = r.embedding || first;
    r.head = r.head || last;
    n += chunk * count.layer + (first ? count.embedding : 0) + (last ? count.head : 0);
    chunks.push_back(chunk_cost(c, m, chunk, first, last));
  }
  return n;
}

}  // namespace

std::vector<RankMemory> plan_memory(const RunConfig& c, const ModelSpec& m) {
  std::vector<RankMemory> out;
  for (int rank = 0; rank < c.parallel.pipeline_parallel; ++rank) {
    RankMemory r;
    r.pp_rank = rank;
    std::vector<ChunkCost> chunks;
    const double n = m.model_class == ModelClass::T5 ? t5_chunk(c, m, r, chunks)
                                                      : stack_chunks(c, m, r, chunks);
    for (const ChunkCost& chunk : chunks) r.logits += chunk.logits;
    add_static(c, n, r);
    walk_schedule(c, chunks, r);
    out.push_back(r);
  }
  return out;
}

}  // namespace meshtron::plan
