// Memory of one training step per rank, from the deck alone: what
// `meshtron plan` prints and ranks layouts by.
//
// Parameters, gradients and optimizer state count what meshtron allocates
// (model/*.cpp, train/optimizer.cpp): values in the compute dtype, fp32
// gradients (main_grad), fp32 master weights under bf16/fp16, two fp32 Adam
// moments; the distributed optimizer keeps master, moments and a gradient
// shard per dp rank (1/dp of the padded flat buffer) beside the full flat
// gradient and value buffers.
//
// Activations follow Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", arXiv 2205.05198, sec. 4 and
// Table 2), term by term, so that the same function gives the paper's
// 34 s b h + 5 a s^2 b bytes per layer (2-byte activations, 1-byte dropout
// masks) and meshtron's own count (activations in the compute dtype, no
// stored masks: dropout is redrawn from a counter-based RNG in the backward,
// plus the norms' per-token statistics). GQA's smaller k / v, gated MLPs'
// second projection and the fused attention core enter through the shape.
#pragma once

#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "model/model_spec.hpp"

namespace meshtron::plan {

enum class Recompute { None, Selective, Full };
Recompute parse_recompute(const std::string& s);

/// Byte widths of the stored activation terms.
struct ActivationBytes {
  double element = 2;    ///< an activation element (bf16 in the paper)
  double mask = 1;       ///< a dropout-mask element; 0 when the mask is redrawn
  double row_stats = 0;  ///< a norm's statistics per token (mean and / or rstd)
};
/// The paper's counting: 2-byte activations, 1-byte masks, no statistics.
inline constexpr ActivationBytes kKorthikantiBytes{2, 1, 0};

/// One transformer layer's activation shape on one rank.
struct LayerShape {
  double s = 0, b = 0, h = 0;  ///< sequence, micro-batch, hidden
  double a = 0, g = 0, d = 0;  ///< heads, kv groups, head dim
  double f = 0;                ///< MLP width
  bool gated = false;          ///< SwiGLU / GeGLU: fc writes 2 f
  int t = 1;                   ///< tensor-parallel degree
  bool sequence_parallel = false;
  bool keep_gathered = false;  ///< SP: the column-parallel inputs kept whole
  bool attention_dropout = true, hidden_dropout = true;
  bool fused_core = false;  ///< flash-style core: no [s, s] tensors, qkv + lse kept
  double norms_stats = 2;   ///< statistics per token per norm (LayerNorm 2, RMSNorm 1)
};

/// Korthikanti Table 2's closed forms, bytes per layer: sbh(34 + 5as/h)
/// without parallelism; sbh(10 + 24/t + 5as/(ht)) with tp; sbh/t(34 +
/// 5as/h) with tp + SP; the 5as/h term dropped by selective recompute;
/// 2sbh (2sbh/t with SP) under full recompute.
double korthikanti_layer_bytes(double s, double b, double h, double a, int t, bool sp, Recompute r);
/// The same terms for any shape and byte widths; equals the closed forms
/// for GPT (g = a, a d = h, f = 4h, dropout on) at kKorthikantiBytes.
double layer_activation_bytes(const LayerShape& x, const ActivationBytes& w, Recompute r);
/// What the backward of one layer allocates on top of the stored
/// activations: under full recompute the rebuilt activations, plus the
/// gradients of the largest tensors alive at once (d scores and d probs of
/// the unfused core, or d of the MLP's wide activations).
double layer_backward_workspace_bytes(const LayerShape& x, const ActivationBytes& w, Recompute r);

/// The layer shape a validated deck trains with (micro-batch, tp, SP, the
/// attention core the device takes).
LayerShape layer_shape(const RunConfig& c, const ModelSpec& m);
/// A T5 stack's layer shape: the deck's with the encoder's s_e or the
/// decoder's s_d, and the unfused core (the fused kernels take no
/// position bias).
LayerShape t5_layer_shape(const RunConfig& c, const ModelSpec& m, bool decoder);
/// What a T5 decoder block's cross-attention over `encoder_s` keys stores
/// beyond the GPT-like layer of shape `x` (the decoder's).
double cross_attention_bytes(const LayerShape& x, double encoder_s, const ActivationBytes& w,
                             Recompute r);
/// meshtron's byte widths: the compute dtype, no stored masks (dropout is
/// redrawn from Philox in the backward), fp32 norm statistics.
ActivationBytes meshtron_bytes(const RunConfig& c);

/// Element counts of one rank's parameters (its tp shard of each).
struct ParameterCount {
  double layer = 0;      ///< one transformer layer
  double embedding = 0;  ///< word (V_pad / t rows) + learned positions
  double head = 0;       ///< final norm + the head's weight where this stage holds one
};

/// Memory of one pipeline rank, bytes.
struct RankMemory {
  int pp_rank = 0;
  int layers = 0;  ///< transformer layers on this rank (all its chunks)
  int decoder_layers = 0;  ///< of `layers`, T5's decoder blocks (the rest: encoder blocks)
  bool embedding = false, head = false;
  double parameter_elements = 0;
  double parameters = 0;         ///< values in the compute dtype
  double gradients = 0;          ///< fp32 main_grad (the flat buffer)
  double master = 0;             ///< fp32 copies under bf16 / fp16
  double moments = 0;            ///< Adam m and v
  double optimizer_buffers = 0;  ///< distributed: gradient shard, 16-bit shard
  double activations = 0;        ///< stored by the micro-batches in flight at the peak
  int in_flight = 0;             ///< (micro-batch, chunk) pairs alive at the peak
  double logits = 0;             ///< the LM head's kept logits and statistics, per micro-batch
  double workspace = 0;          ///< backward temporaries at the peak, plus the GEMM workspace
  double setup_peak = 0;         ///< while the optimizer builds its flat buffers
  double static_bytes() const {
    return parameters + gradients + master + moments + optimizer_buffers;
  }
  double step_peak() const { return static_bytes() + activations + workspace; }
  double peak() const { return step_peak() > setup_peak ? step_peak() : setup_peak; }
};

/// A validated deck and its model: the plan of every pipeline rank (tp and
/// dp ranks of one stage hold the same amounts).
std::vector<RankMemory> plan_memory(const RunConfig& c, const ModelSpec& m);

/// Micro-batches each dp rank runs per step.
int micro_batches_per_step(const RunConfig& c);

}  // namespace meshtron::plan
