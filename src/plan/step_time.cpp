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

/// Forward FLOPs per token of one layer, split into the GEMMs and the
/// attention core (4 s a d: scores and their product with v), from
/// train/metrics' model count: F = 6 [L layer + h V].
struct LayerFlops {
  double gemm = 0, core = 0;
};
LayerFlops layer_forward_flops(const ModelSpec& m) {
  const double head = 6.0 * m.hidden_size * m.padded_vocab_size;
  const double layer = (model_flops_per_token(m) - head) / (3.0 * m.num_layers);
  const double core = 4.0 * m.seq_length * m.num_heads() * m.head_dim();
  return {layer - core, core};
}

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

}  // namespace

namespace {

/// One layer's forward + backward for one micro-batch on one rank: its
/// compute (GEMMs, core, elementwise traffic) and its tp collectives.
struct LayerSeconds {
  double compute = 0, tp = 0, tp_bytes = 0;
};
LayerSeconds layer_seconds(const RunConfig& c, const ModelSpec& m, const Rates& rates,
                           const Link& tp_link) {
  const LayerShape x = layer_shape(c, m);
  const Recompute rc = parse_recompute(c.training.recompute);
  const LayerFlops f = layer_forward_flops(m);
  const double tokens = x.s * x.b / x.t;
  const double gemm_passes = 3 + (rc == Recompute::Full ? 1 : 0);
  const double core_passes = 3 + (rc == Recompute::None ? 0 : 1);
  LayerSeconds out;
  out.compute =
      tokens *
          (gemm_passes * f.gemm / rates.gemm_flops + core_passes * f.core / rates.attention_flops) +
      3 * layer_activation_bytes(x, meshtron_bytes(c), Recompute::None) / rates.memory_bandwidth;
  // 4 all-reduces of s b h (6 under full recompute), or as many all-gather
  // + reduce-scatter pairs under SP, two gathers fewer when kept.
  const double act = meshtron_bytes(c).element * x.s * x.b * x.h;
  const double ops = gemm_passes == 4 ? 6 : 4;
  const bool kept = x.sequence_parallel && x.keep_gathered;
  out.tp = ops * collective_seconds(act, x.t, tp_link, true) -
           (kept ? 2 * collective_seconds(act, x.t, tp_link, false) : 0);
  out.tp_bytes = x.t > 1 ? (ops * 2 - (kept ? 2 : 0)) * act * (x.t - 1) / x.t : 0;
  return out;
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

}  // namespace

StepEstimate estimate_step(const RunConfig& c, const ModelSpec& m, const Rates& rates,
                           int gpus_per_node) {
  const LayerShape x = layer_shape(c, m);
  const int t = x.t, pp = c.parallel.pipeline_parallel, v = c.parallel.virtual_stages;
  const int mbs = micro_batches_per_step(c);
  const Placement links = place_groups(c, rates, gpus_per_node);
  const LayerSeconds layer = layer_seconds(c, m, rates, *links.tp);
  const double act = meshtron_bytes(c).element * x.s * x.b * x.h;
  // The LM head's logits GEMMs and its input's all-reduce.
  const double head_s =
      x.s * x.b / t * 6.0 * m.hidden_size * m.padded_vocab_size / rates.gemm_flops +
      collective_seconds(act, t, *links.tp, true);
  const std::vector<RankMemory> ranks = plan_memory(c, m);
  double slowest = 0;  // one micro-batch on the slowest pipeline rank
  for (const RankMemory& r : ranks)
    slowest = std::max(slowest, r.layers * (layer.compute + layer.tp) + (r.head ? head_s : 0));
  const double p2p = x.sequence_parallel ? act / t : act;
  const double p2p_s = pp > 1 ? 2 * v * collective_seconds(p2p, 2, *links.pp, false) : 0;

  StepEstimate out;
  out.bubble = pp > 1 ? double(pp - 1) / (double(mbs) * v) : 0;
  out.compute_s = mbs * slowest;
  out.tp_s = mbs * ranks.front().layers * layer.tp;
  out.pp_s = mbs * p2p_s;
  out.bytes.tp = mbs * ranks.front().layers * layer.tp_bytes;
  out.bytes.pp = pp > 1 ? mbs * 2.0 * v * p2p : 0;
  const RankMemory& big = *std::max_element(ranks.begin(), ranks.end(), [](auto& a, auto& b) {
    return a.parameter_elements < b.parameter_elements;
  });
  add_dp_exchange(c, big, *links.dp, out);
  if (c.parallel.overlap_grad_reduce)  // hidden behind the last micro-batch's backward
    out.dp_s = std::max(0.0, out.dp_s - 2.0 / 3.0 * slowest);
  if (pp > 1 && m.tie_word_embeddings) {  // the tied word table's gradient, first + last stage
    const double table = 4.0 * m.padded_vocab_size / t * m.hidden_size;
    out.bytes.embedding = table;
    out.dp_s += collective_seconds(table, 2, *links.pp, true);
  }
  // The update streams values, gradients, master and moments once each way.
  out.optimizer_s = 2 * big.static_bytes() / rates.memory_bandwidth;
  out.step_s = (mbs + double(pp - 1) / v) * (slowest + p2p_s) + out.dp_s + out.optimizer_s;
  const double world = double(t) * pp * c.parallel.data_parallel;
  const double step_tokens = double(c.training.global_batch_size) * m.seq_length;
  out.tokens_per_s_per_gpu = step_tokens / out.step_s / world;
  out.model_tflops_per_gpu = model_flops_per_token(m) * out.tokens_per_s_per_gpu / 1e12;
  return out;
}

}  // namespace meshtron::plan
