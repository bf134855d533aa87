// Communication volume, pipeline bubble and step time of one training step,
// from the deck and a set of hardware rates (plan/rates/*.json, or what
// `meshtron plan --calibrate` measured).
//
//   compute   GEMM FLOPs / gemm rate + attention-core FLOPs / attention rate
//             + elementwise bytes / memory bandwidth, per micro-batch; full
//             recompute adds one forward of the layers, selective the core's
//   tp        per layer and micro-batch: 2 all-reduces of s b h forward and 2
//             backward (Shoeybi et al. 2019, fig. 4), each an all-gather +
//             reduce-scatter pair under SP (Korthikanti et al. 2022, fig. 5);
//             a T5 decoder block's cross-attention 2 more of s_d b h and
//             one of s_e b h (the encoder output's gradient)
//   pp        per micro-batch and chunk boundary: s b h (/t under SP) sent
//             forward, its gradient back; T5: s_e b h up to the split,
//             (s_e + s_d) b h between decoder stages
//   T5        encoder layers at s_e, decoder layers at s_d with their
//             cross-attention (q over decoder tokens, k and v over encoder
//             tokens), the head on the s_d decoder tokens
//   dp        fp32 gradients all-reduced, or reduce-scattered and the values
//             all-gathered (distributed optimizer)
//   bubble    (pp - 1) / (m v) of the ideal time (Narayanan et al. 2021,
//             arXiv 2104.04473, sec. 2.2); T5's unequal encoder and decoder
//             stages: (m - 1) x the slowest stage + one pass through all
// A collective of B bytes over n ranks takes latency x (n - 1) + B x
// (n - 1) / n x (2 for an all-reduce) / bandwidth: the ring's bus bandwidth.
#pragma once

#include <string>

#include "config/run_config.hpp"
#include "model/model_spec.hpp"

namespace meshtron::plan {

struct Link {
  double bandwidth = 0;  ///< bytes/s each rank sends (bus bandwidth)
  double latency = 0;    ///< seconds per ring hop
};

struct Rates {
  std::string name, source;
  double peak_flops = 0;        ///< per device, for MFU
  double gemm_flops = 0;        ///< achieved by large GEMMs
  double attention_flops = 0;   ///< achieved by the attention core
  double memory_bandwidth = 0;  ///< bytes/s
  double memory_gib = 0;        ///< device memory
  int gpus_per_node = 1;
  Link intra_node, inter_node;
};
Rates read_rates(const std::string& path);
void write_rates(const Rates& r, const std::string& path);

/// Bytes each rank moves per step, per group.
struct CommVolume {
  double tp = 0, pp = 0, dp = 0, embedding = 0;
};

struct StepEstimate {
  CommVolume bytes;
  double compute_s = 0;                 ///< per step, all micro-batches, no bubble
  double tp_s = 0, pp_s = 0, dp_s = 0;  ///< exposed communication per step
  double optimizer_s = 0;
  double bubble = 0;  ///< of the ideal time, as bubble_formula states it
  std::string bubble_formula;
  double step_s = 0;
  double tokens_per_s_per_gpu = 0;
  double model_flops = 0;  ///< per step, summed over the stages' layers and head (no recompute)
  double model_tflops_per_gpu = 0;  ///< model_flops / step / GPUs
};

/// `gpus_per_node`: how the ranks sit on nodes (tp fastest, then dp, then
/// pp, as the Topology orders them); a group inside one node uses
/// rates.intra_node, else rates.inter_node.
StepEstimate estimate_step(const RunConfig& c, const ModelSpec& m, const Rates& rates,
                           int gpus_per_node);

/// Time of one collective (all_reduce doubles the ring's traffic).
double collective_seconds(double bytes, int ranks, const Link& link, bool all_reduce);

}  // namespace meshtron::plan
