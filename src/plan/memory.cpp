#include "plan/memory.hpp"

#include <algorithm>
#include <cmath>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "train/metrics.hpp"
#include "train/schedule.hpp"

namespace meshtron::plan {

Recompute parse_recompute(const std::string& s) {
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  MESH_REQUIRE(s == "none", "training.recompute = '" << s << "' is not one of none | selective | full");
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

double layer_backward_workspace_bytes(const LayerShape& x, const ActivationBytes& w,
                                      Recompute r) {
  // Selective recompute rebuilds the core's [s, s] tensors, full the layer.
  const double stored = layer_activation_bytes(x, w, Recompute::None);
  const double rebuilt = r == Recompute::None ? 0
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
  const bool fusable = c.run.device == "cuda" && c.training.precision != "fp32" &&
                       (x.d == 64 || x.d == 128);
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
  const double qkv_out = double(at.qkv_width()) / t, fc_out = f * (is_gated(m.block.mlp.activation) ? 2 : 1) / t;
  // Column-parallel biases fed by a ones column carry (kOnesColumnWidth - 1)
  // x out padding in the flat buffers (model/linear.cpp).
  const double ones = bias_in_weight_gemm(c) && norm == 2 * h ? 8 - 1 : 0;
  const double bias_a = at.bias ? qkv_out * (1 + ones) + h : 0;
  const double bias_m = m.block.mlp.bias ? fc_out * (1 + ones) + h : 0;
  ParameterCount p;
  p.layer = 2 * norm + h * qkv_out + at.context_width() / t * h + bias_a + h * fc_out + f / t * h +
            bias_m;
  const double word = double(m.padded_vocab_size) / t * h;
  p.embedding = word + (at.position == PositionEmbedding::LearnedAbsolute ? m.max_positions * h : 0);
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
  const double before = value * n + 4 * n + r.gradients + r.master + r.moments +
                        r.optimizer_buffers + (mixed ? r.parameters : 0) + r.gradients;
  const double after = before - 4 * n + (mixed ? 0 : r.parameters);
  r.setup_peak = std::max(before, after);
}

}  // namespace

std::vector<RankMemory> plan_memory(const RunConfig& c, const ModelSpec& m) {
  const int pp = c.parallel.pipeline_parallel, v = c.parallel.virtual_stages;
  const std::vector<int> chunk_layers = c.parallel.chunk_layers(m.num_layers, head_cost_in_layers(m));
  const ParameterCount count = parameter_count(c, m);
  const LayerShape shape = layer_shape(c, m);
  const ActivationBytes w = meshtron_bytes(c);
  const Recompute recompute = parse_recompute(c.training.recompute);
  const int mbs = micro_batches_per_step(c);
  const double sb = shape.s * shape.b;
  const double logits_bytes = c.training.logits_dtype == "fp32" ? 4 : w.element;
  const double logits = sb * m.padded_vocab_size / shape.t * logits_bytes + 3 * 4 * sb;  // + max, sum, targets
  const double head_in = w.element * sb * shape.h * (1 + 1.0 / (shape.sequence_parallel ? shape.t : 1));

  std::vector<RankMemory> out;
  for (int rank = 0; rank < pp; ++rank) {
    RankMemory r;
    r.pp_rank = rank;
    std::vector<double> chunk_bytes, chunk_work;
    double n = 0;
    for (int k = 0; k < v; ++k) {
      const int g = k * pp + rank;
      const int layers = chunk_layers[std::size_t(g)];
      const bool first = g == 0, last = g == pp * v - 1;
      r.layers += layers;
      r.embedding = r.embedding || first;
      r.head = r.head || last;
      n += layers * count.layer + (first ? count.embedding : 0) + (last ? count.head : 0);
      const int full = recompute != Recompute::Full ? 0
                       : c.training.recompute_num_layers == 0 ? layers
                       : std::min(layers, c.training.recompute_num_layers);
      double bytes = full * layer_activation_bytes(shape, w, Recompute::Full) +
                     (layers - full) * layer_activation_bytes(shape, w, recompute == Recompute::Full ? Recompute::None : recompute);
      double work = layer_backward_workspace_bytes(shape, w, full > 0 ? Recompute::Full : recompute);
      if (first) bytes += 8 * sb;  // token ids and positions
      if (last) {
        bytes += head_in + logits;  // final norm's input, the head's gathered input, logits
        work = std::max(work, sb * m.padded_vocab_size / shape.t * 4 + head_in);  // d logits
      }
      chunk_bytes.push_back(bytes);
      chunk_work.push_back(work);
    }
    add_static(c, n, r);
    r.logits = r.head ? logits : 0;
    // Walk this rank's task order (train/schedule.cpp) and keep the largest
    // stored activations plus the running backward's temporaries. The
    // trainer keeps every tensor it sent to a neighbour stage until the end
    // of the step (in_flight_sends), and each micro-batch's losses.
    const auto tasks = schedule_tasks({c.parallel.schedule, pp, v, mbs}, rank);
    const double boundary = w.element * sb * shape.h / (shape.sequence_parallel ? shape.t : 1);
    double live = 0, peak = 0, peak_work = 0;
    int alive = 0;
    for (const auto& task : tasks) {
      const int g = task.chunk * pp + rank;
      const double bytes = chunk_bytes[std::size_t(task.chunk)];
      if (task.kind == PipelineTask::Forward) {
        live += bytes + (g == pp * v - 1 ? 4 * sb : boundary);
        ++alive;
        if (live > peak + peak_work) peak = live, peak_work = 0, r.in_flight = alive;
      } else {
        const double work = chunk_work[std::size_t(task.chunk)];
        if (live + work > peak + peak_work) peak = live, peak_work = work, r.in_flight = alive;
        live -= bytes - (g == 0 ? 0 : boundary);
        --alive;
      }
    }
    r.activations = peak;
    // cuBLASLt's workspace on the GPU (32 MiB per handle, ops_cuda).
    r.workspace = peak_work + (c.run.device == "cuda" ? 32.0 * 1024 * 1024 : 0);
    out.push_back(r);
  }
  return out;
}

}  // namespace meshtron::plan
