// Step metrics: throughput, model FLOPs and MFU, and their output as a step
// line (stdout) and as JSON lines (the run folder).
//
// Model FLOPs per token (stated on rank 0 at start; attention counted dense,
// as Megatron-LM and the PaLM paper count it; backward = 2 x forward):
//   F = 3 x 2 x [ L (4 h^2 + 2 h f + 2 s h) + h V ]
// for L layers, hidden h, MLP width f, sequence s and padded vocabulary V.
// T5 (encoder-decoder; tokens are encoder tokens, as the step line counts
// them): per sample, s_e encoder tokens through L_e layers, s_d decoder
// tokens through L_d layers with their cross-attention over s_e keys, the
// head on the decoder's tokens, divided by s_e (model_flops_formula).
// MFU = achieved model FLOP/s per rank / peak FLOP/s per rank.
#pragma once

#include <cstdio>
#include <string>

#include "model/model_spec.hpp"

namespace meshtron {

/// Forward multiply-adds (FLOPs / 2) per token, the GEMMs' and the
/// attention core's apart.
struct MultiplyAdds {
  double gemm = 0, core = 0;
  double total() const { return gemm + core; }
};
/// One transformer layer whose attention sees `keys` keys (F's bracket
/// term: 4h^2 + 2hf + 2sh for GPT-2).
MultiplyAdds layer_multiply_adds(const ModelSpec& c, double keys);
/// A T5 decoder block's cross-attention beyond its GPT-like layer.
struct CrossAttentionMultiplyAdds {
  MultiplyAdds per_decoder_token;  ///< q and o, and the core over the s_e encoder outputs
  double per_encoder_token = 0;    ///< k and v of each encoder output
};
CrossAttentionMultiplyAdds cross_attention_multiply_adds(const ModelSpec& c);
/// Training FLOPs per token of the model `c` (forward and backward of the
/// GEMMs, Megatron-LM's count; src/train/metrics.cpp lists the terms).
double model_flops_per_token(const ModelSpec& c);
/// The formula model_flops_per_token evaluates for `c`, as the banner states it.
std::string model_flops_formula(const ModelSpec& c);
/// The LM head's FLOPs (the logits GEMM, forward and backward: hV of F's
/// bracket) in units of one transformer layer's: GPT-2 774M 2.89, 124M 3.97.
/// What the last pipeline stage runs on top of its layers
/// (parallel.pipeline_layers = balanced).
double head_cost_in_layers(const ModelSpec& c);
/// Peak resident memory of this process in MiB (getrusage).
double peak_rss_mib();

/// The run folder (run.output_dir/run.name) holds logging.metrics_file and
/// this file: the resolved deck of the run (section.key = value, readable by
/// RunConfig::from_text), so the metrics can be read with their layout.
inline constexpr const char* kResolvedDeckFile = "resolved.deck";

struct StepLine {
  long iteration = 0, train_iters = 0;
  long consumed_samples = 0;
  double ms_per_step = 0, tokens_per_s_per_rank = 0, tflops_per_rank = 0, mfu = 0;
  double lr = 0, loss = 0, grad_norm = 0, loss_scale = 1;
  long skipped = 0, nan = 0;
  double memory_mib = 0;
  double tensor_memory_mib = 0;  ///< peak_tensor_mib, max over ranks (JSON only)

  std::string text() const;
  std::string json() const;
};

/// Prints a one-line progress bar ("\r[#####.....] 120/300") to stdout when
/// it is a terminal (or when forced), nothing otherwise.
class ProgressBar {
 public:
  ProgressBar(const std::string& mode, long total);
  void update(long done);
  void clear();

 private:
  bool enabled_ = false;
  long total_ = 0;
};

}  // namespace meshtron
