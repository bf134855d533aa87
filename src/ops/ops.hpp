// The op table: every numerical operation the layers perform.
//
// Layers call these functions and nothing below them. Each op checks its
// arguments, then dispatches by the tensors' memory space: host tensors go
// to the portable Kokkos kernels in kernels/kokkos/, device tensors to the
// CUDA kernels in kernels/cuda/ (when built). Floating tensors may be fp32
// or fp64 on the host (fp64 is used by the gradient checks); all tensors of
// one call share a dtype unless stated. Integer index tensors are int32.
//
// Conventions: row-major; "[N, H]" means N rows of H features; "accumulate"
// means the op adds into its output (gradients), otherwise it overwrites.
//
// Each section below is implemented by one file of src/ops/, their shared
// argument checks and dispatch helpers in op_checks.hpp: GEMM and the GEMMs
// with fused epilogues (gemm_bias_gelu, gemm_gelu, gemm_dgelu,
// gemm_bias_residual, linear_weight_grads) ops_gemm.cpp; LayerNorm and
// RMSNorm ops_norm.cpp; Rotary position embedding ops_rotary.cpp;
// Softmax, Attention softmax and Fused attention ops_attention.cpp; T5
// relative position bias ops_relative_bias.cpp; Dropout ops_dropout.cpp;
// the rest of GeLU and biases, and MLP activations, ops_elementwise.cpp;
// Embedding ops_embedding.cpp; Cross-entropy ops_cross_entropy.cpp; AdamW
// ops_optimizer.cpp; Reductions ops_reductions.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "ops/grad_store.hpp"
#include "tensor/tensor.hpp"

namespace meshtron::ops {

// ------------------------------------------------------------------ GEMM ---
/// C = alpha * op(A) * op(B) + beta * C, with op(X) = X or X^T.
/// A, B, C are 2-D ([rows, cols] as stored); beta = 1 accumulates.
void gemm(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b,
          Tensor& C, double alpha = 1.0, double beta = 0.0);

/// C = op(A) * op(B) + bias, bias [N] broadcast over C's M rows (a linear
/// layer's forward). bias has C's dtype. On the device the bias add is the
/// GEMM's epilogue (one cuBLASLt call); on the host it is gemm() then
/// bias_add(), bit for bit.
void gemm_bias(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, const Tensor& bias,
               Tensor& C);

/// Batched GEMM over the leading dimension: A [batch, ...], B [batch, ...],
/// C [batch, ...]; each batch entry as gemm() above.
void gemm_batched(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b,
                  Tensor& C, double alpha = 1.0, double beta = 0.0);

// ------------------------------------------------------------- LayerNorm ---
/// Width of a ones column: one 1 and seven 0s after a row's H values, so
/// that 16-bit rows stay 16-byte aligned and a GEMM over them keeps a
/// multiple of 8 (a linear's bias row rides in its weight GEMMs:
/// model/linear.hpp, ColumnParallelLinear).
inline constexpr index_t kOnesColumnWidth = 8;

/// y = (x - mean) * rstd * gamma + beta over the last dim of x [N, H].
/// y is [N, H], or [N, H + kOnesColumnWidth] for the ones column: then
/// y[:, H] = 1 and y[:, H + 1:] = 0 as well.
/// Saves mean [N] and rstd [N] (always fp32/fp64 as x) for the backward.
/// On the GPU, gamma and beta are read while the kernel queued just before
/// this call may still run (kernels/cuda/layernorm.cu): that kernel must
/// not write them (x it may). A model's parameters are written by the
/// optimizer, by uploads, or by collectives waited on by event, and other
/// kernels (the embedding) run before its first layernorm.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       double eps, Tensor& y, Tensor& mean, Tensor& rstd);

/// The layernorm backwards of one model backward, one after another: each may
/// leave the last adds of its dgamma and dbeta to the next. On the device a
/// layernorm backward's kernel writes one partial row of dgamma and dbeta
/// sums per block, and a second kernel adds the rows: 1.5-3 us of an H200 per
/// call (at bf16 [8192, 768] the call moves its bytes at 0.72 of the copy's
/// bandwidth, 0.84 without that kernel; chained as GPT-2 124M's backward, 25
/// calls a flush, 0.81-0.82: perf/bench_cuda_ops memory). A call given a
/// chain leaves its rows here, and the next call given the same chain adds
/// them inside its own kernel, in the second kernel's order (the same bits);
/// flush() adds the last ones alone. So a gradient a call wrote is final only
/// once the chain no longer holds() it. On the host every call adds its own
/// (nothing is ever held). The chain and the calls share the compute
/// stream; the destructor flushes (it drops what is held when an exception
/// unwinds past it).
class LayerNormGradChain {
 public:
  LayerNormGradChain();
  ~LayerNormGradChain();
  LayerNormGradChain(const LayerNormGradChain&) = delete;
  LayerNormGradChain& operator=(const LayerNormGradChain&) = delete;

  /// Adds what is held; afterwards nothing is.
  void flush();
  /// Whether `grad` is the dgamma or dbeta of a call whose adds are held.
  bool holds(const Tensor& grad) const;

  struct DeviceSums;                             ///< the CUDA path's (ops_norm.cpp)
  DeviceSums& device_sums() { return *sums_; }  ///< for layernorm_backward

 private:
  std::unique_ptr<DeviceSums> sums_;
};

/// dx = d/dx (overwrite); dgamma, dbeta accumulate (or, with `store`
/// Overwrite, are written). With `residual_grad` (the gradient of a residual
/// branch around the layernorm, x's shape), dx = (d/dx rounded to dx's
/// dtype) + residual_grad: the same bits as the backward followed by add(),
/// without the extra pass over memory. With `chain`, dgamma and dbeta may be
/// completed only by the chain's next call or flush() (LayerNormGradChain).
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                        const Tensor& mean, const Tensor& rstd, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta, const Tensor* residual_grad = nullptr,
                        GradStore store = GradStore::Accumulate,
                        LayerNormGradChain* chain = nullptr);

// --------------------------------------------------------------- RMSNorm ---
// RMSNorm, rotary embedding and the gated activations take fp32, bf16 or
// fp16 on the host as well as on the device (and fp64 on the host, for the
// gradient checks); they compute in fp32 or wider (fp64 on the host) and
// round once to the storage dtype, except where stated.

/// y = round(round(x * rstd) * gamma), rstd = 1 / sqrt(mean_h(x^2) + eps),
/// over the last dim of x [N, H]; gamma [H]; y x's shape. No mean
/// subtraction, no bias (Llama, Megatron's RMSNorm). The order of
/// transformers' LlamaRMSNorm: the normalised x is rounded to x's dtype
/// before the multiplication by the weight (the inner round is exact in
/// fp32 and fp64). Saves rstd [N] for the backward: fp64 for fp64 x, fp32
/// otherwise.
void rmsnorm_forward(const Tensor& x, const Tensor& gamma, double eps, Tensor& y, Tensor& rstd);
/// With xhat = x * rstd and g = dy * gamma:
///   dx = rstd * (g - xhat * mean_h(g * xhat))   (overwrite)
///   dgamma += sum_n dy * xhat                   (or = with `store` Overwrite)
/// dgamma has x's dtype, or fp32 (the fp32 grad of bf16/fp16 weights).
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      Tensor& dx, Tensor& dgamma, GradStore store = GradStore::Accumulate);

// ---------------------------------------------- Rotary position embedding ---
/// Which dims of a head form the rotated pairs (i, j), i < rotary_dim / 2.
enum class RotaryLayout {
  HalfSplit,    ///< (i, i + rotary_dim / 2): GPT-NeoX, Llama (transformers' rotate_half)
  Interleaved,  ///< (2i, 2i + 1): GPT-J (rotate_every_two)
};

struct RotarySpec {
  /// Leading dims of each head that rotate (even, <= head_dim); the rest
  /// pass through unchanged (partial rotary: GPT-NeoX's rotary_pct).
  index_t rotary_dim = 0;
  double base = 10000.0;  ///< theta
  RotaryLayout layout = RotaryLayout::HalfSplit;
};

/// rotary_dim for a fraction of head_dim: int(head_dim * percent), as
/// transformers' GPT-NeoX (rotary_ndims) and Megatron (rotary_percent).
index_t rotary_dim_for(index_t head_dim, double percent);

/// Rotates pair (i, j) of head h of token t by angle positions[t] *
/// inv_freq[i]:  y_i = x_i cos - x_j sin,  y_j = x_j cos + x_i sin, with
/// inv_freq[i] = 1 / base^(2i / rotary_dim) and the angle computed in fp32,
/// as transformers computes them (fp32 pow and product); cos and sin in the
/// compute precision (not rounded to x's dtype as transformers' unfused bf16
/// path does).
/// x, y [tokens, heads, head_dim]; positions int32 [tokens] (the absolute
/// position of each token: start offset + index in its sequence, so that
/// decoding after a prefix works). Only heads [0, rotated_heads) rotate
/// (-1: all), the others are copied: the fused q|k|v projection output
/// [s*b, 3*heads*d] viewed as [s*b, 3*heads, d] has q and k rotated in
/// place with rotated_heads = 2*heads (heads + kv_heads with grouped keys).
/// y may alias x.
void rotary_forward(const Tensor& x, const Tensor& positions, const RotarySpec& rope, Tensor& y,
                    index_t rotated_heads = -1);
/// dx = the rotation by -angle of dy (the transpose of the forward's),
/// overwrite; the other dims and heads copied. dx may alias dy.
void rotary_backward(const Tensor& dy, const Tensor& positions, const RotarySpec& rope,
                     Tensor& dx, index_t rotated_heads = -1);

// ------------------------------------------------------- MLP activations ---
/// The activation of a gated MLP's gate half, or of a plain MLP's fc output
/// (activation_forward; the tanh GeLU there rides in fc's GEMM instead,
/// gemm_bias_gelu).
enum class GatedActivation {
  SiLU,      ///< SwiGLU: silu(a) = a * sigmoid(a)
  GeLUTanh,  ///< GeGLU with transformers' gelu_pytorch_tanh (gelu_forward's formula)
  GeLUErf,   ///< GeGLU with transformers' gelu: 0.5 a (1 + erf(a / sqrt 2))
  ReLU,      ///< max(a, 0), derivative 0 at a = 0 (torch's)
  Tanh,      ///< tanh(a) (BERT's pooler; activation_forward only, not a gate)
};

/// y = act(x) elementwise (same shapes; y may be x), computed in fp64 on
/// the host and fp32 on the device, rounded once: the plain MLP's exact
/// GeLU (GPT-NeoX's hidden_act "gelu") or ReLU.
void activation_forward(const Tensor& x, GatedActivation act, Tensor& y);
/// dx = dy * act'(x) (overwrite; dx may be dy).
void activation_backward(const Tensor& dy, const Tensor& x, GatedActivation act, Tensor& dx);

/// y[n, c] = act(x[n, c]) * x[n, F + c] for x [N, 2F] (gate | up, the fused
/// first linear layer's output as Megatron's --swiglu: torch.chunk(x, 2,
/// -1)), y [N, F].
void gated_activation_forward(const Tensor& x, GatedActivation act, Tensor& y);
/// dx [N, 2F] (overwrite) from dy [N, F]:
///   dx[n, c] = dy * act'(a) * b,  dx[n, F + c] = dy * act(a),  a | b = x[n].
void gated_activation_backward(const Tensor& dy, const Tensor& x, GatedActivation act,
                               Tensor& dx);

// --------------------------------------------------------------- Softmax ---
/// Scale, causal mask and softmax over the last dim of scores [B, S, S]
/// (B = batch x heads): probs[b,i,j] = softmax_j(scale * s[b,i,j]) for j <= i,
/// and exactly 0 for j > i.
///
/// With `alibi_slopes` (fp32 [H] where the scores live; the matrix b of the
/// B is head b mod H, as [batch, heads] flattened), ALiBi's bias enters each
/// logit in fp32: softmax_j(scale * s[b,i,j] - slope[b mod H] * (i - j)).
/// transformers' BLOOM adds slope * j instead (build_alibi_tensor): the two
/// differ by slope * i, a constant of each row, which the softmax cancels
/// exactly (exp(x + c) / sum exp(x + c)); -slope (i - j) keeps the logits
/// near the diagonal, the ones that carry the weight, small, so none of
/// their bits go to a large offset.
void scaled_causal_softmax_forward(const Tensor& scores, double scale, Tensor& probs,
                                   const Tensor& alibi_slopes = Tensor());
/// ALiBi's head slopes, as transformers' build_alibi_tensor makes them:
/// with n the largest power of two <= heads, 2^(-8k/n) for k = 1..n, and
/// for the remaining heads 2^(-4k/n) for k = 1, 3, 5, ... (interpolated
/// between the slopes of n and 2n heads).
std::vector<double> alibi_slopes(index_t heads);
/// dscores = scale * probs * (dprobs - sum_j(dprobs * probs)) (overwrite).
void scaled_causal_softmax_backward(const Tensor& dprobs, const Tensor& probs,
                                    double scale, Tensor& dscores);

/// Bidirectional attention's softmax with a key-padding mask (BERT, T5's
/// encoder): scores [B, S, S] with B = batch x heads (matrix m is sample
/// m / heads), key_mask int32 [batch, S] beside them (non-zero: a real
/// key). probs[m,i,j] = softmax_j(scale * s[m,i,j]) over the real keys of
/// sample m / heads, exactly 0 at padding keys (all 0 in a row without a
/// real key). No causal mask.
void scaled_masked_softmax_forward(const Tensor& scores, const Tensor& key_mask, double scale,
                                   Tensor& probs);
/// dscores = scale * probs * (dprobs - sum_j(dprobs * probs)) over whole
/// rows (overwrite): probs are 0 at padding keys, so their dscores are too.
void scaled_masked_softmax_backward(const Tensor& dprobs, const Tensor& probs, double scale,
                                    Tensor& dscores);

// ------------------------------------------------ T5 relative position bias ---
/// T5's bucket of each (query i, key j): transformers' _relative_position_bucket(
/// j - (i + query_offset), bidirectional, num_buckets, max_distance); int32 [sq, sk] on the
/// host. query_offset: the position of query row 0 (decoding one token after a prefix).
Tensor relative_position_buckets(index_t sq, index_t sk, bool bidirectional, int num_buckets,
                                 int max_distance, index_t query_offset = 0);
/// bias[h, i, j] = table[buckets[i, j], h]: table [num_buckets, H] (any float dtype),
/// buckets int32 [sq, sk] in the table's space; bias fp32 [H, sq, sk] (overwrite).
/// (On the host bias may also be fp64, for the fp64 gradient checks.)
void relative_bias_forward(const Tensor& table, const Tensor& buckets, Tensor& bias);
/// dtable[buckets[i, j], h] += dbias[h, i, j] (accumulate into the table's gradient dtype).
/// dbias fp32 and dtable fp32 (on the host also both fp64).
void relative_bias_backward(const Tensor& dbias, const Tensor& buckets, Tensor& dtable);

// ----------------------------------------------------- Attention softmax ---
/// The general attention softmax over scores [B, Sq, Sk], B = batch x heads (matrix m is
/// sample m / heads, head m % heads): logits = scale * s[m,i,j] + bias[m % heads, i, j]
/// (bias fp32 [heads, Sq, Sk], optional), softmax over j in fp32, probability exactly 0 where
/// key_mask[m / heads, j] == 0 (int32 [batch, Sk], optional) and, if causal, where
/// j > i + (Sk - Sq); a row with no key left is all 0.
/// (Host fp64 scores compute in fp64 and take an fp32 or fp64 bias.)
struct SoftmaxMasks {
  index_t heads = 1;
  Tensor bias;      ///< optional fp32 [heads, Sq, Sk]
  Tensor key_mask;  ///< optional int32 [batch, Sk]
  bool causal = false;
};
void attention_softmax_forward(const Tensor& scores, double scale, const SoftmaxMasks& masks,
                               Tensor& probs);
/// dlogits = probs * (dprobs - sum_j dprobs * probs) (overwrite; d of the logits, so
/// dscores = scale * dlogits and dbias = dlogits summed over the samples). Any Sq, Sk.
void attention_softmax_backward(const Tensor& dprobs, const Tensor& probs, Tensor& dlogits);
/// dbias[h, i, j] (fp32 [heads, Sq, Sk], accumulate) += sum over samples b of
/// dlogits[b * heads + h, i, j]. (Host fp64 dlogits: dbias fp32 or fp64.)
void attention_bias_backward(const Tensor& dlogits, index_t heads, Tensor& dbias);

// --------------------------------------------------------------- Dropout ---
/// Where a dropout call sits in the global (unsharded) problem, so that the
/// mask of every element depends on its global position, never on the rank.
/// The tensor is viewed as [A, B, C] (A * B * C = numel); element (a, b, c)
/// has global linear index ((a + a_offset) * b_global + (b + b_offset))
/// * c_global + (c + c_offset). It is kept iff h * 2^-16 >= p, where h is
/// 16-bit half (index & 1) of word ((index >> 1) & 3) of Philox4x32-10(key =
/// seed, counter = {q lo, q hi, step, stream}), q = index >> 3: one call
/// serves 8 consecutive indices (kernels/kokkos/dropout.hpp).
struct DropoutSite {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;    ///< training iteration
  std::uint32_t stream = 0;  ///< layer * 16 + site within the layer
  index_t a = 1, b = 1, c = 1;            ///< local view [A, B, C]
  index_t a_offset = 0, b_offset = 0, c_offset = 0;
  index_t b_global = 1, c_global = 1;
  /// Device path, CUDA graphs (training.cuda_graphs): when set, three device
  /// words {step, sample offset low, high} that the kernels read at run time
  /// instead of `step`, adding the sample offset to axis `sample_axis`'s
  /// offset (0: a, 1: b), so that one captured launch serves every step and
  /// micro-batch. Null: the values above, as they are.
  const std::uint32_t* live = nullptr;
  int sample_axis = 0;
};
/// y = x * keep / (1 - p), keep ~ Bernoulli(1 - p) from the site's counter.
/// p = 0 copies. y may alias x.
void dropout_forward(const Tensor& x, double p, const DropoutSite& site, Tensor& y);
/// out = residual + dropout_forward(x) in one pass (Megatron's dropout-add
/// fusion: the residual stream after the attention and MLP outputs), with
/// the bits of dropout_forward then add. out may alias residual or x.
void dropout_add(const Tensor& x, const Tensor& residual, double p, const DropoutSite& site,
                 Tensor& out);
/// dx = dy * keep / (1 - p) with the same mask (recomputed, not stored).
void dropout_backward(const Tensor& dy, double p, const DropoutSite& site, Tensor& dx);
/// The keep decision for one global linear index (exposed for tests).
bool dropout_keep(std::uint64_t seed, std::uint32_t step, std::uint32_t stream,
                  std::uint64_t global_index, double p);

// ------------------------------------------------- Cached attention (generation) ---
/// Self-attention of `rows` new tokens over a key/value cache (the decode
/// path of src/generate/). qkv [rows, (heads + 2 groups) * d] in the
/// attention's local layout [q | k | v]; k_cache, v_cache [slots, groups,
/// capacity, d]; slot, position int32 [rows] in qkv's memory space. First
/// every row's k and v are stored at (slot[r], position[r]); then row r's
/// query heads attend causally to its slot's positions 0..position[r]:
/// context[r, h] = sum_j softmax_j(scale q . k_j) v_j with query head h
/// reading group h / (heads / groups). A prompt's rows (prefill) and one row
/// per sequence (decode) are the same call. Host: fp32 or fp64; device
/// (kernels/cuda/cached_attention.cu): fp32, bf16 or fp16 storage, fp32
/// arithmetic, d <= 256. The device reads slot and position only there:
/// the caller checks them against the cache (KvCache::require_holds).
void cached_attention(const Tensor& qkv, index_t heads, index_t groups, const Tensor& slot,
                      const Tensor& position, double scale, Tensor& k_cache, Tensor& v_cache,
                      Tensor& context);

// ------------------------------------------------ Logit candidates (sampling) ---
/// What the sampler needs of a vocabulary shard's logits [rows, cols] (host
/// or device, any storage dtype) over its first `real` columns (the rest are
/// padding): per row, fp64 on the host, [max, sum_c exp(x_c - max), then n
/// pairs (x_c, c)]: the n largest entries, larger first, the lower column
/// first among equals; (-inf, -1) where fewer than n columns are real. On
/// the device n is at most 1024 and the logits never leave it (one
/// [rows, 2 + 2n] copy back).
Tensor logit_candidates(const Tensor& logits, index_t real, int n);

// ------------------------------------------------------- Fused attention ---
/// Causal self-attention without the [S, S] tensors (FlashAttention-2 on the
/// device): out[b, i] = sum_{j<=i} softmax_j(scale q[b,i] . k[b,j]) v[b, j]
/// for q, k, v, out [B, S, D] (B = batch x heads, ops::split_heads' layout);
/// lse [B, S] = log-sum-exp over j <= i of scale q[b,i] . k[b,j] (natural log;
/// the storage dtype on the host, fp32 on the device). Same numbers as
/// gemm_batched + scaled_causal_softmax_forward + gemm_batched.
///
/// With `dropout` (p > 0): the probabilities are dropped after the softmax
/// with the mask dropout_forward would apply to the unfused probabilities
/// [B, S, S] viewed as [b, heads, S*S] at dropout.site (so with the same bits
/// as the unfused path, on any decomposition), and the kept ones scaled by
/// 1 / (1 - p); lse stays that of the undropped softmax.
struct AttentionDropout {
  AttentionDropout() = default;
  AttentionDropout(double p_, const DropoutSite& site_, Tensor keep_bits_ = {})
      : p(p_), site(site_), keep_bits(std::move(keep_bits_)) {}
  double p = 0.0;
  DropoutSite site;
  /// Device path, optional: an I32 tensor of attention_keep_bits_shape(B, S)
  /// in which the forward stores its keep decisions (a bit per
  /// probability) for the backward to read, instead of drawing the mask
  /// again in both backward passes; the same tensor goes to both calls.
  /// Ignored on the host.
  Tensor keep_bits;
  /// keep_bits already holds this pass's decisions (draw_attention_mask ran
  /// with the same site): the device forward reads them without drawing.
  bool mask_drawn = false;
  /// Device, token-major ops only: the mask is drawn by cuDNN's fused
  /// attention with its own generator (training.attention_dropout_rng =
  /// cudnn; cuda::CudnnDropout), not with the site's Philox bits: other
  /// decisions, the same distribution. keep_bits and mask_drawn unused.
  bool cudnn_rng = false;
};
/// Words (32 keys each) per query row of AttentionDropout::keep_bits: S
/// rounded up to the kernels' widest key block, 128.
inline index_t attention_keep_bits_words(index_t S) { return (S + 127) / 128 * 4; }
/// AttentionDropout::keep_bits of B entries of S x S: [B, S, words], the
/// words of a query row side by side. (Word-major, [B, words, S], makes the
/// head dim 64 backward slower on an H100: perf/bench_cuda_ops attention.)
inline Shape attention_keep_bits_shape(index_t B, index_t S) {
  return {B, S, attention_keep_bits_words(S)};
}
/// Whether the device forward draws the keep_bits of S x S entries with its
/// own kernel ahead of its pass (whole 8-key Philox groups per row), so that
/// draw_attention_mask can draw them apart from it.
inline bool attention_mask_drawn_alone(index_t S) { return S % 8 == 0; }
/// Which keys the fused attention's queries see, and the bias of their
/// scores (none set: causal, no bias). Entry e of the B = batch x heads
/// entries is sample e / heads, head e % heads.
///  * alibi_slopes fp32 [heads] (causal): the scaled score of query i and key
///    j gains slope[e % heads] (j - i), as scaled_causal_softmax_forward's
///    ALiBi (the slopes of the call's own heads: a tp rank's global heads);
///  * key_mask int32 [batch, S]: bidirectional, over the keys j of sample
///    e / heads whose flag is non-zero, as scaled_masked_softmax_forward; a
///    query row without such a key gets out = 0 (lse +inf) and no gradient.
/// Not both. Beside the activations. The backward takes the forward's.
struct FusedAttentionScores {
  Tensor alibi_slopes;
  Tensor key_mask;
};
void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                             Tensor& out, Tensor& lse, const AttentionDropout& dropout = {},
                             const FusedAttentionScores& scores = {});
/// The decisions the device forward stores in dropout.keep_bits (p > 0, a
/// device keep_bits; S % 8 == 0, where the forward draws them with their
/// own kernel), drawn alone: row i of an entry gets its words w <= i / 32
/// (the ones holding its visible keys), the forward's bits. For drawing the
/// masks apart from the forward: ahead of the step, under the optimizer
/// update (training.attention_masks_ahead). `stream`: a cudaStream_t to
/// queue the draws on (null: the compute stream).
void draw_attention_mask(const AttentionDropout& dropout, index_t B, index_t S,
                         void* stream = nullptr);
/// dq, dk, dv (overwrite) from dout and the forward's out and lse (and the
/// forward's dropout). The device kernels are deterministic (no atomics).
void fused_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse, double scale,
                              Tensor& dq, Tensor& dk, Tensor& dv,
                              const AttentionDropout& dropout = {},
                              const FusedAttentionScores& scores = {});
/// The same attention read and written in the linear layers' token-major
/// layout (ops::split_heads' input), so the head split/merge copies vanish:
/// qkv [s*b, 3*heads*d] (q | k | v, rows in [s, b] order) -> context
/// [s*b, heads*d] (merge_heads' output), lse [b*heads, s]. On the host it
/// is split_heads + fused_attention_forward + merge_heads; on the device the
/// kernels address the token-major rows directly. Same numbers either way.
void fused_attention_forward_token_major(const Tensor& qkv, index_t s, index_t b, index_t heads,
                                         double scale, Tensor& context, Tensor& lse,
                                         const AttentionDropout& dropout = {},
                                         const FusedAttentionScores& scores = {});
/// dqkv [s*b, 3*heads*d] (overwrite) from dcontext and the forward's qkv,
/// context and lse, in the same layouts.
void fused_attention_backward_token_major(const Tensor& dcontext, const Tensor& qkv,
                                          const Tensor& context, const Tensor& lse, index_t s,
                                          index_t b, index_t heads, double scale, Tensor& dqkv,
                                          const AttentionDropout& dropout = {},
                                          const FusedAttentionScores& scores = {});
/// Whether the fused op takes these tensors: on the host any fp32/fp64 head
/// dim (the reference implementation); on the device bf16 or fp16 with head
/// dim 64 or 128, when the CUDA path is built. Both apply attention dropout.
bool fused_attention_supported(DType dtype, MemorySpace space, index_t head_dim);

// ------------------------------------------------------ GeLU and biases ---
/// GPT-2's tanh GeLU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(const Tensor& x, Tensor& y);
/// dx = dy * gelu'(x) (overwrite).
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);
/// The MLP's first linear layer and its GeLU in one call:
///   pre_gelu = op(A) op(B) + bias,  activated = gelu(pre_gelu)
/// (pre_gelu [M, N] is kept for the backward; bias [N]). A, B, bias and both
/// outputs share one dtype. On the device, for bf16 and fp16, one cuBLASLt
/// GEMM with the GELU_AUX_BIAS epilogue writes both outputs (activated from
/// the fp32 accumulator, so it may differ from gelu(pre_gelu) by a rounding);
/// fp32 on the device, and the host, run gemm_bias() then gelu_forward() (on
/// the host bit for bit).
void gemm_bias_gelu(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b,
                    const Tensor& bias, Tensor& pre_gelu, Tensor& activated);
/// gemm_bias_gelu without a bias (one riding in A's ones column, B's bias
/// row): the GELU_AUX epilogue on the device, gemm() then gelu_forward()
/// elsewhere.
void gemm_gelu(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b, Tensor& pre_gelu,
               Tensor& activated);
/// The dgrad GEMM through the GeLU: dpre = (op(A) op(B)) * gelu'(pre_gelu),
/// dpre and pre_gelu [M, N] (the MLP's d(activated) = dy W^T never stored).
/// On the device, for bf16 and fp16, one GEMM with the DGELU epilogue;
/// otherwise gemm() then gelu_backward() (on the host bit for bit).
/// With `dbias` ([N]): then dbias += the column sums of dpre (bias_backward;
/// the bias gradient of the layer that produced pre_gelu). cuBLASLt 12/13
/// offers no bf16 DGELU_BGRAD algorithm on sm_90 (measured); the column
/// sums here cost less than cuBLASLt's BGRADA in that layer's
/// weight-gradient GEMM (38-45 against 50 us at GPT-2 774M's fc on an
/// H100, perf/bench_cuda_ops: "proj dgrad: gemm_dgelu vs + fc dbias
/// colsum").
void gemm_dgelu(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b,
                const Tensor& pre_gelu, Tensor& dpre, Tensor* dbias = nullptr,
                GradStore bias_store = GradStore::Accumulate);
/// out = op(A) op(B) + bias + residual (a row-parallel projection and the
/// residual add after it), out and residual [M, N], distinct. On the device
/// one GEMM (bias epilogue, C = residual, D = out); on the host gemm_bias()
/// then add(), bit for bit.
void gemm_bias_residual(const Tensor& A, bool trans_a, const Tensor& B, bool trans_b,
                        const Tensor& bias, const Tensor& residual, Tensor& out);
/// y[n, c] += bias[c] for y [N, C] (in place).
void bias_add(Tensor& y, const Tensor& bias);
/// dbias[c] += sum_n dy[n, c] (accumulate; = with `store` Overwrite).
void bias_backward(const Tensor& dy, Tensor& dbias, GradStore store = GradStore::Accumulate);
/// A linear layer's parameter gradients, accumulated:
///   dweight += x^T dy   (x [tokens, in], dy [tokens, out], dweight [in, out])
///   dbias   += sum over tokens of dy
/// gemm() then bias_backward() on the host and on the device. (cuBLASLt's
/// BGRADA epilogue, which Megatron/TransformerEngine use, runs as a kernel of
/// its own after the GEMM, plus an add into dbias: 12-22 us per call at
/// 774M's shapes on an H200 against meshtron's one column-sum kernel
/// (perf/bench_cuda_ops, the BGRADA rows); without it 124M / 774M steps are
/// 0.8 / 0.6 % faster (perf/e2e_gpu.py).)
/// `weight_store`, `bias_store`: Overwrite writes that gradient instead.
void linear_weight_grads(const Tensor& x, const Tensor& dy, Tensor& dweight, Tensor& dbias,
                         GradStore weight_store = GradStore::Accumulate,
                         GradStore bias_store = GradStore::Accumulate);
/// out = a + b (elementwise; out may alias a or b).
void add(const Tensor& a, const Tensor& b, Tensor& out);
/// y += alpha * x (elementwise, accumulate).
void axpy(double alpha, const Tensor& x, Tensor& y);
/// x *= alpha (in place).
void scale(Tensor& x, double alpha);

// ------------------------------------------------------------- Embedding ---
/// out[n, :] = table[ids[n] - vocab_begin, :] if the id is in this shard's
/// rows [vocab_begin, vocab_begin + table.rows), else 0. ids int32 [N].
void embedding_forward(const Tensor& ids, const Tensor& table,
                       index_t vocab_begin, Tensor& out);
/// dtable[ids[n] - vocab_begin, :] += dout[n, :] for ids in the shard.
void embedding_backward(const Tensor& ids, const Tensor& dout,
                        index_t vocab_begin, Tensor& dtable);
/// out[n, :] += table[n mod S, :] for out [N = batch * S, H]
/// (learned absolute position embedding, positions 0..S-1 per sample).
void position_embedding_forward(const Tensor& table, index_t seq_len, Tensor& out);
/// dtable[n mod S, :] += dout[n, :] (accumulate).
void position_embedding_backward(const Tensor& dout, index_t seq_len, Tensor& dtable);

// ------------------------------------------- Cross-entropy (vocab-parallel) ---
// The loss over a vocabulary split across ranks is computed in three local
// passes with two all-reduces between them (max, then sum), as Megatron's
// vocab_parallel_cross_entropy. On one rank the all-reduces are identities.
// logits [N, V_local] hold global vocabulary rows [vocab_begin, +V_local);
// columns at or past `vocab_valid` (global index) are padding, ignored.

/// row_max[n] = max_v logits[n, v] over valid columns (overwrite).
void cross_entropy_row_max(const Tensor& logits, index_t vocab_begin,
                           index_t vocab_valid, Tensor& row_max);
/// sum_exp[n] = sum_v exp(logits[n, v] - row_max[n]) over valid columns;
/// target_logit[n] = logits[n, t - vocab_begin] - row_max[n] if target t is in
/// this shard, else 0. targets int32 [N] (overwrite both).
void cross_entropy_partials(const Tensor& logits, const Tensor& targets,
                            const Tensor& row_max, index_t vocab_begin,
                            index_t vocab_valid, Tensor& sum_exp,
                            Tensor& target_logit);
/// cross_entropy_row_max, then cross_entropy_partials with that local max,
/// in one pass over the logits: this shard's statistics, which are the
/// global ones where the shard is the whole vocabulary (one tp rank; the
/// LM head then reads its logits for the loss once instead of twice). On
/// the device an online softmax (the running max, the sum rescaled when it
/// grows), which rounds differently from the two passes; the two passes on
/// the host.
void cross_entropy_row_stats(const Tensor& logits, const Tensor& targets, index_t vocab_begin,
                             index_t vocab_valid, Tensor& row_max, Tensor& sum_exp,
                             Tensor& target_logit);
/// loss[n] = log(sum_exp[n]) - target_logit[n] (global sums given).
void cross_entropy_loss(const Tensor& sum_exp, const Tensor& target_logit, Tensor& loss);
/// dlogits[n, v] = dloss[n] * (softmax[n, v] - [v == target]) with softmax
/// from row_max and the global sum_exp; 0 in padded columns (overwrite).
void cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                            const Tensor& row_max, const Tensor& sum_exp,
                            const Tensor& dloss, index_t vocab_begin,
                            index_t vocab_valid, Tensor& dlogits);

// ----------------------------------------------------------------- AdamW ---
struct AdamWParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  std::int64_t step = 1;  ///< 1-based, for bias correction
  /// The update uses g = grad * grad_scale, rounded as ops::scale(grad,
  /// grad_scale) would store it (gradient clipping folded into the update:
  /// no separate pass over the gradients); grad itself is left unchanged.
  double grad_scale = 1.0;
  /// Clipping by a norm the host has not read: non-null, a one-element F64
  /// tensor in the tensors' memory space holding the global sum of squared
  /// gradients (sum_of_squares_into, all-reduced), read where the update
  /// runs; it then replaces grad_scale by clip_factor(sqrt(sum), clip_grad)
  /// (clip_factor.hpp) and, with skip_nonfinite, leaves every tensor
  /// unchanged when that norm is not finite. No host round trip in the step.
  const Tensor* grad_sum_of_squares = nullptr;
  double clip_grad = 0.0;
  bool skip_nonfinite = false;
};
/// torch.optim.AdamW: p -= lr * wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
/// p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& hp);
/// The same step, also writing the low-precision compute copy of the updated
/// param into *compute_copy (param's numel and memory space; bf16 or fp16 on
/// the device), bit for bit adamw_step then cast(param, *compute_copy), in
/// one pass over memory on the device. Null: no copy.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                const AdamWParams& hp, Tensor* compute_copy);

/// One tensor of a multi-tensor AdamW step.
struct AdamWTensor {
  Tensor param, grad, m, v;
  Tensor compute_copy;  ///< written as by adamw_step(..., &compute_copy); undefined: none
  bool decay = true;    ///< false: no weight decay (biases, norms)
};

/// AdamW over a list of tensors (apex's multi_tensor_apply): bit for bit
/// adamw_step on each tensor with weight_decay = decay ? hp.weight_decay : 0
/// and its compute copy. On the device ONE kernel launch updates every
/// tensor; the table of pointers it reads lives in device memory and is
/// uploaded again only when the tensors (pointers, sizes) or the weight
/// decay change, so a training loop over fixed buffers uploads it once. On
/// the host it loops over the tensors. All tensors share one memory space;
/// device compute copies share one dtype.
class MultiTensorAdamW {
 public:
  MultiTensorAdamW();
  ~MultiTensorAdamW();
  MultiTensorAdamW(MultiTensorAdamW&&) noexcept;
  MultiTensorAdamW& operator=(MultiTensorAdamW&&) noexcept;

  void step(const std::vector<AdamWTensor>& tensors, const AdamWParams& hp);
  /// Times the device table was uploaded (0 on the host).
  long table_uploads() const;

 private:
  struct DeviceTable;                   ///< the CUDA table, when built
  std::unique_ptr<DeviceTable> table_;  ///< Owned; created on the first device step.
};

// ------------------------------------------------------------ Reductions ---
/// Sum of squares of all elements, in double.
double sum_of_squares(const Tensor& x);
/// sum over the tensors of sum_of_squares(x), with one device-to-host copy
/// for device tensors (a gradient norm over a model's ~150 tensors would
/// otherwise wait for the GPU 150 times). Tensors share a memory space.
double sum_of_squares(const std::vector<Tensor>& xs);
/// The same sum written to `total` (one F64 element in xs' memory space)
/// instead of returned: on the device nothing waits for the GPU, and the
/// sum can go on to a collective and the AdamW update (AdamWParams) there.
void sum_of_squares_into(const std::vector<Tensor>& xs, Tensor& total);

}  // namespace meshtron::ops
