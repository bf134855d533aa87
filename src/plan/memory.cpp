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
  double logits = 0;  ///< of `stored`: the head's logits and their statistics
};

ChunkCost chunk_cost(const RunConfig& c, const ModelSpec& m, int layers, bool first, bool last) {
  const LayerShape x = layer_shape(c, m);
  const ActivationBytes w = meshtron_bytes(c);
  const Recompute r = parse_recompute(c.training.recompute);
  // training.recompute_num_layers: the chunk's first N layers (0 = all).
  const int n = c.training.recompute_num_layers;
  const int full = r != Recompute::Full ? 0 : n == 0 ? layers : std::min(layers, n);
  const Recompute rest = r == Recompute::Full ? Recompute::None : r;
  ChunkCost out;
  out.stored = full * layer_activation_bytes(x, w, Recompute::Full) +
               (layers - full) * layer_activation_bytes(x, w, rest);
  out.backward = layer_backward_workspace_bytes(x, w, full > 0 ? Recompute::Full : rest);
  const double sb = x.s * x.b, shard = x.sequence_parallel ? x.t : 1;
  if (first) out.stored += 8 * sb;  // token ids and positions (int32)
  if (last) {
    // The final norm's input, the head's gathered input, the logits in
    // logits_dtype with their fp32 row max and sum and the int32 targets.
    const double logits_bytes = c.training.logits_dtype == "fp32" ? 4 : w.element;
    const double vocab = double(m.padded_vocab_size) / x.t;
    const double head_in = w.element * sb * x.h * (1 + 1 / shard);
    out.logits = sb * vocab * logits_bytes + 3 * 4 * sb;
    out.stored += head_in + out.logits;
    out.backward = std::max(out.backward, 4 * sb * vocab + head_in);  // d logits (fp32), d x
  }
  return out;
}

/// Walks pipeline rank `rank`'s task order (train/schedule.cpp): each
/// forward adds its chunk's activations, each backward releases them after
/// running with its temporaries. The trainer also keeps every tensor it
/// sent to a neighbour stage until the end of the step (in_flight_sends),
/// and each micro-batch's losses on the last chunk. Sets activations,
/// in_flight and workspace of `r`.
void walk_schedule(const RunConfig& c, const ModelSpec& m, const std::vector<ChunkCost>& chunks,
                   RankMemory& r) {
  const int pp = c.parallel.pipeline_parallel, v = c.parallel.virtual_stages;
  const LayerShape x = layer_shape(c, m);
  const double sb = x.s * x.b;
  const double sent = meshtron_bytes(c).element * sb * x.h / (x.sequence_parallel ? x.t : 1);
  double live = 0, peak = 0, peak_work = 0;
  int alive = 0;
  for (const auto& task :
       schedule_tasks({c.parallel.schedule, pp, v, micro_batches_per_step(c)}, r.pp_rank)) {
    const int g = task.chunk * pp + r.pp_rank;
    const ChunkCost& cost = chunks[std::size_t(task.chunk)];
    if (task.kind == PipelineTask::Forward) {
      live += cost.stored + (g == pp * v - 1 ? 4 * sb : sent);
      ++alive;
      if (live > peak + peak_work) peak = live, peak_work = 0, r.in_flight = alive;
    } else {
      if (live + cost.backward > peak + peak_work)
        peak = live, peak_work = cost.backward, r.in_flight = alive;
      live -= cost.stored - (g == 0 ? 0 : sent);
      --alive;
    }
  }
  r.activations = peak;
  // cuBLASLt's workspace on the GPU (kernels/cuda/gemm.cu: 32 MiB).
  r.workspace = peak_work + (c.run.device == "cuda" ? 32.0 * 1024 * 1024 : 0);
}

}  // namespace

std::vector<RankMemory> plan_memory(const RunConfig& c, const ModelSpec& m) {
  const int pp = c.parallel.pipeline_parallel, v = c.parallel.virtual_stages;
  const std::vector<int> layers = c.parallel.chunk_layers(m.num_layers, head_cost_in_layers(m));
  const ParameterCount count = parameter_count(c, m);
  std::vector<RankMemory> out;
  for (int rank = 0; rank < pp; ++rank) {
    RankMemory r;
    r.pp_rank = rank;
    std::vector<ChunkCost> chunks;
    double n = 0;
    for (int k = 0; k < v; ++k) {  // global chunk k pp + rank (Trainer::global_chunk)
      const int g = k * pp + rank, chunk = layers[std::size_t(g)];
      const bool first = g == 0, last = g == pp * v - 1;
      r.layers += chunk;
      r.embedding = r.embedding || first;
      r.head = r.head || last;
      n += chunk * count.layer + (first ? count.embedding : 0) + (last ? count.head : 0);
      chunks.push_back(chunk_cost(c, m, chunk, first, last));
      r.logits += chunks.back().logits;
    }
    add_static(c, n, r);
    walk_schedule(c, m, chunks, r);
    out.push_back(r);
  }
  return out;
}

}  // namespace meshtron::plan
