#include "plan/step_time.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/error.hpp"
#include "io/hf/hf_json.hpp"
#include "plan/memory.hpp"
#include "train/metrics.hpp"

namespace meshtron::plan {

namespace {

Link read_link(const nlohmann::json& j, const std::string& key, const std::string& path) {
  MESH_REQUIRE(j.contains(key) && j[key].is_object(), path << ": rates need '" << key << "'");
  return {j[key].value("bandwidth", 0.0), j[key].value("latency", 0.0)};
}

double require_rate(const nlohmann::json& j, const std::string& key, const std::string& path) {
  MESH_REQUIRE(j.contains(key) && j[key].is_number() && j[key].get<double>() > 0,
               path << ": rates need a positive '" << key << "'");
  return j[key].get<double>();
}

}  // namespace

Rates read_rates(const std::string& path) {
  MESH_REQUIRE(std::filesystem::is_regular_file(path),
               "plan: rates file '" << path << "' does not exist (plan --calibrate writes one)");
  const nlohmann::json j = io::parse_json_file(path);
  Rates r;
  r.name = j.value("name", path);
  r.source = j.value("source", "");
  r.peak_flops = require_rate(j, "peak_flops", path);
  r.gemm_flops = require_rate(j, "gemm_flops", path);
  r.attention_flops = require_rate(j, "attention_flops", path);
  r.memory_bandwidth = require_rate(j, "memory_bandwidth", path);
  r.memory_gib = require_rate(j, "memory_gib", path);
  r.gpus_per_node = int(require_rate(j, "gpus_per_node", path));
  r.intra_node = read_link(j, "intra_node", path);
  r.inter_node = read_link(j, "inter_node", path);
  return r;
}

void write_rates(const Rates& r, const std::string& path) {
  const auto link = [](const Link& l) {
    return nlohmann::json{{"bandwidth", l.bandwidth}, {"latency", l.latency}};
  };
  io::write_json_file(path, {{"name", r.name},
                             {"source", r.source},
                             {"peak_flops", r.peak_flops},
                             {"gemm_flops", r.gemm_flops},
                             {"attention_flops", r.attention_flops},
                             {"memory_bandwidth", r.memory_bandwidth},
                             {"memory_gib", r.memory_gib},
                             {"gpus_per_node", r.gpus_per_node},
                             {"intra_node", link(r.intra_node)},
                             {"inter_node", link(r.inter_node)}});
}

double collective_seconds(double bytes, int ranks, const Link& link, bool all_reduce) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const double n = ranks;
  return link.latency * (n - 1) * (all_reduce ? 2 : 1) +
         bytes * (n - 1) / n * (all_reduce ? 2 : 1) / link.bandwidth;
}

namespace {

struct Placement {
  const Link* tp;
  const Link* pp;
  const Link* dp;
};
/// Which link each group crosses: tp fastest-varying, then dp, then pp.
Placement place_groups(const RunConfig& c, const Rates& r, int gpus_per_node) {
  const int t = c.parallel.tensor_parallel, d = c.parallel.data_parallel;
  const int world = t * d * c.parallel.pipeline_parallel;
  const auto link = [&](int span) { return span <= gpus_per_node ? &r.intra_node : &r.inter_node; };
  return {link(t), link(world), link(t * d)};
}

/// Forward and backward of one micro-batch on one rank: compute, tp
/// collectives, and the model's forward FLOPs (train/metrics' count, no
/// recompute).
struct Work {
  double compute = 0, tp = 0, tp_bytes = 0, flops = 0;
  Work& operator+=(const Work& o) {
    compute += o.compute, tp += o.tp, tp_bytes += o.tp_bytes, flops += o.flops;
    return *this;
  }
  Work times(double n) const { return {n * compute, n * tp, n * tp_bytes, n * flops}; }
};

/// `tokens` (per tp rank) through GEMMs and an attention core of `ma`
/// multiply-adds per token, forward + backward, with the recompute's
/// extra forward where `recomputed` (full: the GEMMs and the core;
/// selective: the core).
Work gemm_seconds(const RunConfig& c, const Rates& rates, double tokens, const MultiplyAdds& ma,
                  bool recomputed = true) {
  const Recompute rc = recomputed ? parse_recompute(c.training.recompute) : Recompute::None;
  const double gemm_passes = 3 + (rc == Recompute::Full ? 1 : 0);
  const double core_passes = 3 + (rc == Recompute::None ? 0 : 1);
  Work out;
  out.compute = tokens * 2 * (gemm_passes * ma.gemm / rates.gemm_flops +
                              core_passes * ma.core / rates.attention_flops);
  out.flops = tokens * 2 * ma.total();
  return out;
}

/// `n` all-reduces of `rows` [*, h] rows over the tp group (as many
/// all-gather + reduce-scatter pairs under SP: the same traffic).
Work tp_all_reduces(const RunConfig& c, const LayerShape& x, const Link& link, double n,
                    double rows) {
  const double bytes = meshtron_bytes(c).element * rows * x.h;
  Work out;
  out.tp = n * collective_seconds(bytes, x.t, link, true);
  out.tp_bytes = x.t > 1 ? n * 2 * bytes * (x.t - 1) / x.t : 0;
  return out;
}

/// One GPT-like layer of shape x (attention over x.s keys) for one
/// micro-batch: its GEMMs and core, the elementwise traffic of its
/// activations, and its tp collectives: 4 all-reduces of s b h (6 under
/// full recompute), two all-gathers fewer when SP keeps its inputs gathered.
Work layer_seconds(const RunConfig& c, const ModelSpec& m, const Rates& rates, const Link& tp_link,
                   const LayerShape& x) {
  const bool full = parse_recompute(c.training.recompute) == Recompute::Full;
  Work out = gemm_seconds(c, rates, x.s * x.b / x.t, layer_multiply_adds(m, x.s));
  out.compute += 3 * layer_activation_bytes(x, meshtron_bytes(c), Recompute::None) /
                 rates.memory_bandwidth;
  out += tp_all_reduces(c, x, tp_link, full ? 6 : 4, x.s * x.b);
  if (x.sequence_parallel && x.keep_gathered) {
    const double act = meshtron_bytes(c).element * x.s * x.b * x.h;
    out.tp -= 2 * collective_seconds(act, x.t, tp_link, false);
    if (x.t > 1) out.tp_bytes -= 2 * act * (x.t - 1) / x.t;
  }
  return out;
}

/// A T5 decoder block's cross-attention (x: the decoder's shape) for one
/// micro-batch: q and o over the s_d decoder rows, k and v over the s_e
/// encoder rows, the core over s_d x s_e; q's input and o's output cross
/// the tp group as in the self-attention (1 all-reduce each, o's repeated
/// under full recompute), the encoder output's gradient once more.
Work cross_attention_seconds(const RunConfig& c, const ModelSpec& m, const Rates& rates,
                             const Link& tp_link, const LayerShape& x) {
  const bool full = parse_recompute(c.training.recompute) == Recompute::Full;
  const double se = m.seq_length;
  const CrossAttentionMultiplyAdds ma = cross_attention_multiply_adds(m);
  Work out = gemm_seconds(c, rates, x.s * x.b / x.t, ma.per_decoder_token);
  out += gemm_seconds(c, rates, se * x.b / x.t, {ma.per_encoder_token, 0});
  out.compute += 3 * cross_attention_bytes(x, se, meshtron_bytes(c), Recompute::None) /
                 rates.memory_bandwidth;
  out += tp_all_reduces(c, x, tp_link, full ? 3 : 2, x.s * x.b);
  out += tp_all_reduces(c, x, tp_link, 1, se * x.b);
  return out;
}

/// The LM head on `rows` tokens: its logits GEMMs and its input's all-reduce.
Work head_seconds(const RunConfig& c, const ModelSpec& m, const Rates& rates, const Link& tp_link,
                  const LayerShape& x, double rows) {
  Work out = gemm_seconds(c, rates, rows / x.t, {double(m.hidden_size) * m.padded_vocab_size, 0},
                          false);
  const Work reduce = tp_all_reduces(c, x, tp_link, 1, rows);
  out.compute += reduce.tp;  // on the critical path, not in the layers' tp time
  return out;
}

/// One pipeline rank's micro-batch: its layers and its head.
Work stage_work(const RunConfig& c, const ModelSpec& m, const Rates& rates, const Link& tp_link,
                const RankMemory& r) {
  Work out;
  if (m.model_class != ModelClass::T5) {
    const LayerShape x = layer_shape(c, m);
    out = layer_seconds(c, m, rates, tp_link, x).times(r.layers);
    if (r.head) out += head_seconds(c, m, rates, tp_link, x, x.s * x.b);
    return out;
  }
  const LayerShape enc = t5_layer_shape(c, m, false), dec = t5_layer_shape(c, m, true);
  out = layer_seconds(c, m, rates, tp_link, enc).times(r.layers - r.decoder_layers);
  Work decoder = layer_seconds(c, m, rates, tp_link, dec);
  decoder += cross_attention_seconds(c, m, rates, tp_link, dec);
  out += decoder.times(r.decoder_layers);
  if (r.head) out += head_seconds(c, m, rates, tp_link, dec, dec.s * dec.b);
  return out;
}

/// Bytes sent across the pipeline boundary after rank `k`, each way per
/// micro-batch and chunk: s b h (/t under SP); T5's encoder rows s_e b h
/// up to the split, [encoder output ; decoder rows] (s_e + s_d) b h
/// between decoder stages (their gradients back the same).
double boundary_bytes(const RunConfig& c, const ModelSpec& m, int k) {
  const LayerShape x = layer_shape(c, m);
  const double row = meshtron_bytes(c).element * x.b * x.h / (x.sequence_parallel ? x.t : 1);
  if (m.model_class != ModelClass::T5) return row * x.s;
  const bool decoder_side = k >= c.degrees().pipeline_split_rank;
  return row * (m.seq_length + (decoder_side ? m.decoder_seq_length : 0));
}

/// The dp exchange of the rank with the most parameters: fp32 gradients
/// all-reduced, or reduce-scattered and the values all-gathered.
void add_dp_exchange(const RunConfig& c, const RankMemory& big, const Link& link,
                     StepEstimate& out) {
  const int dp = c.parallel.data_parallel;
  const double grads = 4 * big.parameter_elements;
  if (c.parallel.distributed_optimizer) {
    out.dp_s = collective_seconds(grads, dp, link, false) +
               collective_seconds(big.parameters, dp, link, false);
    out.bytes.dp = (grads + big.parameters) * (dp - 1) / dp;
  } else {
    out.dp_s = collective_seconds(grads, dp, link, true);
    out.bytes.dp = 2 * grads * (dp - 1) / dp;
  }
}

/// Ranks of the embedding group: the stages holding a word table (GPT: the
/// first and, tied, the last; T5: the encoder's and decoder's first and,
/// tied, the last).
int embedding_ranks(const RunConfig& c, const ModelSpec& m) {
  const int pp = c.parallel.pipeline_parallel;
  if (pp == 1) return 1;
  if (m.model_class != ModelClass::T5) return m.tie_word_embeddings ? 2 : 1;
  const int split = c.degrees().pipeline_split_rank;
  return 2 + (m.tie_word_embeddings && split != pp - 1 ? 1 : 0);
}

}  // namespace

StepEstimate estimate_step(const RunConfig& c, const ModelSpec& m, const Rates& rates,
                           int gpus_per_node) {
  const int t = c.parallel.tensor_parallel, pp = c.parallel.pipeline_parallel,
            v = c.parallel.virtual_stages;
  const int mbs = micro_batches_per_step(c);
  const Placement links = place_groups(c, rates, gpus_per_node);
  const std::vector<RankMemory> ranks = plan_memory(c, m);
  StepEstimate out;
  // One micro-batch per rank: its work plus its p2p (the larger boundary
  // it sits on, sent forward and its gradient back, per chunk).
  double slowest = 0, stages = 0, flops = 0, largest_boundary = 0;
  Work most_tp;
  for (const RankMemory& r : ranks) {
    const Work w = stage_work(c, m, rates, *links.tp, r);
    double boundary = 0;
    if (r.pp_rank > 0) boundary = boundary_bytes(c, m, r.pp_rank - 1);
    if (r.pp_rank < pp - 1) boundary = std::max(boundary, boundary_bytes(c, m, r.pp_rank));
    const double p2p_s = 2 * v * collective_seconds(boundary, 2, *links.pp, false);
    const double stage = w.compute + w.tp + p2p_s;
    if (w.tp > most_tp.tp) most_tp = w;
    if (stage > slowest) {
      slowest = stage;
      out.compute_s = mbs * (w.compute + w.tp);
      out.pp_s = mbs * p2p_s;
    }
    largest_boundary = std::max(largest_boundary, boundary);
    stages += stage;
    flops += w.flops;
  }
  out.tp_s = mbs * most_tp.tp;
  out.bytes.tp = mbs * most_tp.tp_bytes;
  out.bytes.pp = mbs * 2.0 * v * largest_boundary;
  // The pipeline: (m - 1) passes of the slowest stage plus one through all
  // stages (fill and drain); for equal stages (pp - 1) / (m v) of the ideal
  // time (Narayanan et al. 2021, sec. 2.2). T5's encoder and decoder
  // stages differ (parallel.pipeline_split_rank), so it takes the sum.
  const bool equal_stages = m.model_class != ModelClass::T5;
  const double pipeline_s = equal_stages ? (mbs + double(pp - 1) / v) * slowest
                                         : (mbs - 1) * slowest + stages;
  out.bubble_formula = equal_stages ? "(pp - 1) / (m v)" : "(sum of stages - slowest) / (m slowest)";
  out.bubble = pp == 1        ? 0
               : equal_stages ? double(pp - 1) / (double(mbs) * v)
                              : (stages - slowest) / (mbs * slowest);
  const RankMemory& big = *std::max_element(ranks.begin(), ranks.end(), [](auto& a, auto& b) {
    return a.parameter_elements < b.parameter_elements;
  });
  add_dp_exchange(c, big, *links.dp, out);
  if (c.parallel.overlap_grad_reduce)  // hidden behind the last micro-batch's backward
    out.dp_s = std::max(0.0, out.dp_s - 2.0 / 3.0 * (slowest - out.pp_s / mbs));
  if (const int n = embedding_ranks(c, m); n > 1) {  // the word table's gradient
    const double table = 4.0 * m.padded_vocab_size / t * m.hidden_size;
    out.bytes.embedding = table;
    out.dp_s += collective_seconds(table, n, *links.pp, true);
  }
  // The update streams values, gradients, master and moments once each way.
  out.optimizer_s = 2 * big.static_bytes() / rates.memory_bandwidth;
  out.step_s = pipeline_s + out.dp_s + out.optimizer_s;
  const double world = double(t) * pp * c.parallel.data_parallel;
  out.model_flops = 3.0 * flops * mbs * t * c.parallel.data_parallel;
  const double step_tokens = double(c.training.global_batch_size) * m.seq_length;
  out.tokens_per_s_per_gpu = step_tokens / out.step_s / world;
  out.model_tflops_per_gpu = out.model_flops / out.step_s / world / 1e12;
  return out;
}

}  // namespace meshtron::plan
