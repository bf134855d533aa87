#include "train/metrics.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <iomanip>
#include <sstream>

namespace meshtron {

/// Forward FLOPs per token / 2 (multiply-adds) of one transformer layer
/// whose attention sees s keys:
///   qkv and proj  h (n + 2g) d + n d h   (n heads, g kv groups, head dim d)
///   the core      2 s n d                (scores and their product with v)
///   the MLP       2 h f, or 3 h f gated  (gate, value and output matrices)
/// For GPT-2 (g = n, n d = h): 4h^2 + 2hf + 2sh, Megatron-LM's count. Norms,
/// biases and activations are left out, as there.
MultiplyAdds layer_multiply_adds(const ModelSpec& c, double s) {
  const auto& a = c.block.attention;
  const double h = c.hidden_size, f = c.ffn_hidden_size();
  const double n = a.num_heads, g = a.num_query_groups, d = a.head_dim;
  const double mlp_matrices = is_gated(c.block.mlp.activation) ? 3 : 2;
  return {h * (n + 2 * g) * d + n * d * h + mlp_matrices * h * f, 2 * s * n * d};
}

/// q and o on each decoder token (2 h i, i = heads x d_kv), the core over
/// the s_e encoder outputs (2 s_e i), k and v of each encoder output (2 h i).
CrossAttentionMultiplyAdds cross_attention_multiply_adds(const ModelSpec& c) {
  const auto& a = c.block.attention;
  const double h = c.hidden_size, inner = double(a.num_heads) * a.head_dim;
  return {{2 * h * inner, 2 * c.seq_length * inner}, 2 * h * inner};
}

static double layer_flops_half(const ModelSpec& c, double s) {
  return layer_multiply_adds(c, s).total();
}

/// T5's forward multiply-adds per encoder token (the tokens the step line
/// counts): one sample's encoder layers over its s_e tokens, decoder layers
/// over its s_d tokens (the causal self-attention dense over s_d keys, as
/// GPT's) with their cross-attention over the s_e encoder outputs, and the
/// head on the s_d decoder tokens, divided by s_e.
static double t5_forward_half_per_token(const ModelSpec& c) {
  const double h = c.hidden_size, se = c.seq_length, sd = c.decoder_seq_length;
  const CrossAttentionMultiplyAdds cross = cross_attention_multiply_adds(c);
  const double sample =
      se * c.num_layers * layer_flops_half(c, se) +
      c.num_decoder_layers * (sd * (layer_flops_half(c, sd) + cross.per_decoder_token.total()) +
                              se * cross.per_encoder_token) +
      sd * h * c.padded_vocab_size;
  return sample / se;
}

/// The layers plus the LM head's logits GEMM (hV per token, tied to the word
/// embedding or not: tying shares the table, not the work), x 3 for the
/// backward's two GEMMs per forward one, x 2 FLOPs per multiply-add.
double model_flops_per_token(const ModelSpec& c) {
  if (c.model_class == ModelClass::T5) return 3.0 * 2.0 * t5_forward_half_per_token(c);
  const double forward = c.num_layers * layer_flops_half(c, c.seq_length) +
                         double(c.hidden_size) * c.padded_vocab_size;
  return 3.0 * 2.0 * forward;
}

std::string model_flops_formula(const ModelSpec& c) {
  if (c.model_class == ModelClass::T5)
    return "3 x 2 x [s_e L_e A(s_e) + L_d (s_d (A(s_d) + 2hi + 2 s_e i) + 2 s_e h i) + s_d hV] "
           "/ s_e, A(s) = 4hi + 2hf + 2si, i = heads x d_kv";
  return "3 x 2 x [L(4h^2 + 2hf + 2sh) + hV]";
}

double head_cost_in_layers(const ModelSpec& c) {
  return double(c.hidden_size) * c.padded_vocab_size / layer_flops_half(c, c.seq_length);
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

std::string StepLine::text() const {
  std::ostringstream os;
  os << std::fixed << " iteration " << std::setw(6) << iteration << "/" << train_iters
     << " | consumed samples " << consumed_samples << std::setprecision(1)
     << " | ms/step " << ms_per_step << " | tokens/s/rank " << std::setprecision(0)
     << tokens_per_s_per_rank << std::setprecision(4) << " | TFLOP/s/rank " << tflops_per_rank
     << std::setprecision(1) << " | MFU " << 100 * mfu << "%" << std::scientific
     << std::setprecision(3) << " | lr " << lr << std::fixed << std::setprecision(4)
     << " | loss " << loss << std::setprecision(3) << " | grad norm " << grad_norm
     << std::setprecision(1) << " | loss scale " << loss_scale << " | skipped " << skipped
     << " | nan " << nan << " | mem " << std::setprecision(0) << memory_mib << " MiB";
  return os.str();
}

std::string StepLine::json() const {
  std::ostringstream os;
  os << std::setprecision(10) << "{\"iteration\": " << iteration
     << ", \"consumed_samples\": " << consumed_samples << ", \"ms_per_step\": " << ms_per_step
     << ", \"tokens_per_s_per_rank\": " << tokens_per_s_per_rank
     << ", \"tflops_per_rank\": " << tflops_per_rank << ", \"mfu\": " << mfu
     << ", \"lr\": " << lr << ", \"loss\": " << loss << ", \"grad_norm\": " << grad_norm
     << ", \"loss_scale\": " << loss_scale << ", \"skipped\": " << skipped
     << ", \"nan\": " << nan << ", \"memory_mib\": " << memory_mib
     << ", \"tensor_memory_mib\": " << tensor_memory_mib << "}";
  return os.str();
}

namespace {
/// Open MPI's mpirun hands every rank a pseudo-terminal, even when its own
/// output goes to a batch log, so isatty() cannot tell there: "auto" stays
/// off under Open MPI (force the bar with logging.progress = on).
bool stdout_is_terminal() {
  return isatty(STDOUT_FILENO) && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr;
}
}  // namespace

ProgressBar::ProgressBar(const std::string& mode, long total)
    : enabled_(mode == "on" || (mode == "auto" && stdout_is_terminal())), total_(total) {}

void ProgressBar::update(long done) {
  if (!enabled_) return;
  constexpr int kWidth = 40;
  const int filled = int(kWidth * done / std::max(total_, 1L));
  std::printf("\r[%s%s] %ld/%ld", std::string(std::size_t(filled), '#').c_str(),
              std::string(std::size_t(kWidth - filled), '.').c_str(), done, total_);
  std::fflush(stdout);
}

void ProgressBar::clear() {
  if (!enabled_) return;
  std::printf("\r%*s\r", 60, "");
  std::fflush(stdout);
}

}  // namespace meshtron
