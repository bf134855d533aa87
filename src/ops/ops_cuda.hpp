// Launchers of the CUDA kernels (kernels/cuda/*.cu), called by the op table
// (src/ops/ops_*.cpp) for device tensors after it has checked every argument.
//
// Like the Kokkos launchers they take raw device pointers and extents, never
// a Tensor, plus the storage dtype: `t` (fp32, bf16 or fp16) for activations and
// weights, `g` (fp32 or t) for accumulated parameter gradients. Per-row
// statistics (LayerNorm mean/rstd, cross-entropy row_max, sum_exp,
// target_logit, loss, dloss) are always fp32 on the device. All launches go
// to the compute stream (tensor/device_stream.hpp) and return without synchronising, except
// sum_of_squares(_many), which return their value to the host
// (sum_of_squares_many_to leaves it on the device).
//
// Only built with MESHTRON_HAVE_CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/types.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace meshtron::cuda {

// ------------------------------------------------------------------ GEMM ---
/// Row-major C = alpha op(A) op(B) + beta C over `batch` matrices spaced by
/// the strides (elements); A, B of dtype ab (fp32, bf16 or fp16), C of dtype c
/// (ab, or fp32 when ab is bf16 or fp16). fp32 runs without TF32 (CUBLAS_COMPUTE_32F);
/// bf16 and fp16 accumulate in fp32. lda/ldb/ldc are the stored row lengths.
/// A non-null `bias` [N] (dtype c, batch 1 only) is added to every row of C
/// in the GEMM's epilogue: C = alpha op(A) op(B) + beta C + bias.
///
/// Fused epilogues (batch 1, C contiguous, A, B and C of one dtype):
///  - `gelu_pre_out` non-null (needs `bias`): the MLP's first layer,
///    gelu_pre_out = op(A) op(B) + bias and C = gelu(gelu_pre_out) (tanh GeLU).
///  - `gelu_pre_in` non-null: the MLP's dgrad through its activation,
///    C = (op(A) op(B)) * gelu'(gelu_pre_in), gelu_pre_in [M, N] the tensor
///    the forward wrote to gelu_pre_out.
///  - `c_in` non-null (needs beta != 0): beta times c_in [M, N] is read in place
///    of C's own values, so C = alpha op(A) op(B) + beta c_in (+ bias) writes
///    a new tensor (a residual add riding in the GEMM).
/// When cuBLASLt has no algorithm for the epilogue, the same numbers (to
/// rounding) come from a plain GEMM and the elementwise kernels.
struct GemmArgs {
  DType ab, c;
  const void* A;
  const void* B;
  void* C;
  bool trans_a, trans_b;
  index_t M, N, K, lda, ldb, ldc;
  index_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  double alpha = 1.0, beta = 0.0;
  const void* bias = nullptr;
  void* gelu_pre_out = nullptr;
  const void* gelu_pre_in = nullptr;
  const void* c_in = nullptr;
};
void gemm(const GemmArgs& args);
/// GEMM algorithm choice: the heuristic's first (default) or, with
/// autotuning on (run.gemm_autotune), the fastest of its first eight, timed
/// once per problem (gemm.cu). Setting it forgets the cache.
void set_gemm_autotune(bool on);
/// Problems whose algorithm was chosen by timing, and of those, how many
/// took another than the heuristic's first.
std::uint64_t gemm_autotuned_problems();
std::uint64_t gemm_autotune_changed();
/// How many bias GEMMs ran as plain GEMM + bias_add because cuBLASLt had no
/// algorithm with the bias epilogue (so tests can insist the fused path ran).
std::uint64_t gemm_bias_fallbacks();
/// The same for the GeLU epilogues (forward GELU_AUX_BIAS and backward
/// DGELU, run unfused as GEMM + gelu_forward / gelu_backward) and for the
/// out-of-place C (run as GEMM + add).
std::uint64_t gemm_gelu_fallbacks();
std::uint64_t gemm_residual_fallbacks();

// ------------------------------------------------------------- LayerNorm ---
/// y's rows are ldy apart; ldy > H adds the ones column (ops::layernorm_forward).
void layernorm_forward(DType t, const void* x, const void* gamma, const void* beta, index_t N,
                       index_t H, double eps, void* y, index_t ldy, float* mean, float* rstd);
/// A layernorm backward's dgamma, dbeta left to add (ops::LayerNormGradChain):
/// its split kernel's partial rows [rows, 2 H] (fp32, a block allocated by
/// device::allocate and owned here) and where their column sums go.
struct LayerNormPendingSums {
  void* partial = nullptr;  ///< null: nothing pending
  index_t rows = 0, H = 0;
  bool accumulate = false;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
};
/// dgamma, dbeta: added to with `accumulate`, else written. With `pending`,
/// the sums pending holds are added first (inside this call's kernel where
/// it can, bit for bit as layernorm_add_pending would) and, with fp32
/// gradients on the split kernel, this call's own are left there in turn
/// instead of added by a second kernel.
void layernorm_backward(DType t, DType g, const void* dy, const void* x, const void* gamma,
                        const float* mean, const float* rstd, index_t N, index_t H, void* dx,
                        void* dgamma, void* dbeta, const void* residual_grad, bool accumulate,
                        LayerNormPendingSums* pending = nullptr);
/// Adds what pending holds (one kernel) and empties it; nothing if empty.
void layernorm_add_pending(LayerNormPendingSums& pending);
/// Empties pending without adding it (its gradients are left incomplete).
void layernorm_drop_pending(LayerNormPendingSums& pending);

// --------------------------------------------------------------- RMSNorm ---
/// kernels/cuda/rmsnorm.cu: y = gamma (x rstd rounded to t), rstd = 1 /
/// sqrt(mean(x^2) + eps) in fp32 per row (transformers' LlamaRMSNorm); x, y
/// [N, H], gamma [H]. rstd [N] (fp32) is written when non-null (the
/// backward's input).
void rmsnorm_forward(DType t, const void* x, const void* gamma, index_t N, index_t H, double eps,
                     void* y, float* rstd);
/// dx [N, H] (plus residual_grad [N, H] when non-null, as layernorm_backward
/// adds it); dgamma [H] (dtype g: fp32 or t) added to with `accumulate`,
/// else written.
void rmsnorm_backward(DType t, DType g, const void* dy, const void* x, const void* gamma,
                      const float* rstd, index_t N, index_t H, void* dx, void* dgamma,
                      const void* residual_grad, bool accumulate);

// --------------------------------------------------------------- Softmax ---
/// alibi_slopes: fp32 [heads] on the device, or null (ops.hpp).
void scaled_causal_softmax_forward(DType t, const void* scores, index_t batch_heads, index_t S,
                                   double scale, void* probs, const float* alibi_slopes = nullptr,
                                   index_t heads = 1);
void scaled_causal_softmax_backward(DType t, const void* dprobs, const void* probs,
                                    index_t batch_heads, index_t S, double scale, void* dscores);
/// key_mask: int32 [batch_heads / heads, S] on the device (ops.hpp).
void scaled_masked_softmax_forward(DType t, const void* scores, const std::int32_t* key_mask,
                                   index_t batch_heads, index_t heads, index_t S, double scale,
                                   void* probs);
void scaled_masked_softmax_backward(DType t, const void* dprobs, const void* probs,
                                    index_t batch_heads, index_t S, double scale, void* dscores);

// ------------------------------------------------ T5 relative position bias ---
/// table [num_buckets, H] (dtype t), buckets int32 [n = sq * sk], bias fp32 [H, n].
void relative_bias_forward(DType t, const void* table, index_t num_buckets, index_t H,
                           const std::int32_t* buckets, index_t n, float* bias);
/// dtable fp32 [num_buckets, H] += the scatter of dbias fp32 [H, n] (atomics).
void relative_bias_backward(const float* dbias, const std::int32_t* buckets, index_t n,
                            index_t num_buckets, index_t H, float* dtable);

// ----------------------------------------------------- Attention softmax ---
/// scores, probs [batch_heads, Sq, Sk] (dtype t); bias fp32 [heads, Sq, Sk]
/// or null; key_mask int32 [batch_heads / heads, Sk] or null (ops.hpp).
void attention_softmax_forward(DType t, const void* scores, index_t batch_heads, index_t Sq,
                               index_t Sk, double scale, index_t heads, const float* bias,
                               const std::int32_t* key_mask, bool causal, void* probs);
/// dlogits [rows, cols] = p (dp - sum p dp) per row (dtype t).
void attention_softmax_backward(DType t, const void* dprobs, const void* probs, index_t rows,
                                index_t cols, void* dlogits);
/// dbias fp32 [heads, n] += sum over samples of dlogits [batch_heads, n] (dtype t).
void attention_bias_backward(DType t, const void* dlogits, index_t batch_heads, index_t n,
                             index_t heads, float* dbias);

// --------------------------------------------------------------- Dropout ---
/// Same placement and Philox keying as kernels/kokkos/dropout.hpp.
struct DropoutPlacement {
  std::uint64_t seed;
  std::uint32_t step, stream;
  index_t b, c;
  index_t a_offset, b_offset, c_offset;
  index_t b_global, c_global;
  const std::uint32_t* live;  ///< see ops::DropoutSite::live
  int sample_axis;
};
/// out = dropout(in); with `residual`, out = residual + dropout(in) in the
/// same pass (the bits of the dropout then add).
void dropout_apply(DType t, const void* in, index_t n, double p, const DropoutPlacement& site,
                   void* out, const void* residual = nullptr);

/// The attention dropout of the fused attention kernels: with p > 0 the
/// probabilities [B, S, S] (B = b x heads) are dropped with the mask
/// dropout_apply would give them as the view [b, heads, S*S] at `site`
/// (site.c = site.c_global = S*S, c_offset 0) and the kept ones scaled by
/// 1 / (1 - p). p = 0: no dropout.
struct AttentionDropoutSite {
  double p = 0.0;
  DropoutPlacement site{};
  /// Optional [B, S, keep_bits_words] words (ops::attention_keep_bits_shape):
  /// the forward stores its decisions there (bit j % 32 of word j / 32 of
  /// row (entry, i): P_ij kept) and the backward reads them instead of
  /// drawing the mask twice more. Null: every pass draws it.
  std::uint32_t* keep_bits = nullptr;
  index_t keep_bits_words = 0;
  /// keep_bits already holds the decisions (draw_attention_mask): the
  /// forward skips its own draw (S % 8 == 0, where it draws them ahead).
  bool mask_drawn = false;
  /// The token-major entry points run cuDNN's fused attention with its own
  /// generator (CudnnDropout, seeded from `site`) instead of this mask;
  /// keep_bits unused. Aborts where cuDNN cannot run the shape.
  bool cudnn_rng = false;
};

/// The stored decisions of `dropout` (p > 0, keep_bits set; S % 8 == 0) for
/// B entries of S x S probabilities, as the fused forward draws them ahead
/// of its pass, on `stream` (a cudaStream_t; null: the compute stream):
/// ops::draw_attention_mask's kernel.
void draw_attention_mask(const AttentionDropoutSite& dropout, index_t B, index_t S,
                         void* stream = nullptr);

// ------------------------------------------------------- Fused attention ---
/// ops::FusedAttentionScores on the device: entry e (of B = batch x heads)
/// gets the ALiBi slope alibi_slopes[e % alibi_heads] (causal), or sees the
/// keys of key_mask row e / mask_heads ([B / mask_heads, S] int32, non-zero:
/// real; bidirectional). Neither: causal, no bias. Never both.
struct FlashScores {
  const float* alibi_slopes = nullptr;
  index_t alibi_heads = 1;
  const std::int32_t* key_mask = nullptr;
  index_t mask_heads = 1;
  bool plain() const { return alibi_slopes == nullptr && key_mask == nullptr; }
};
/// kernels/cuda/flash_attention.cu: t bf16 or fp16, D 64 or 128; q, k, v,
/// out, dout, dq, dk, dv [B, S, D] 16-byte aligned; lse [B, S]; delta is a
/// [B, S] fp32 workspace of the backward. The backward takes the forward's
/// dropout.
void fused_attention_forward(DType t, const void* q, const void* k, const void* v, index_t B,
                             index_t S, index_t D, double scale, void* out, float* lse,
                             const AttentionDropoutSite& dropout = {},
                             const FlashScores& scores = {});
void fused_attention_backward(DType t, const void* dout, const void* q, const void* k,
                              const void* v, const void* out, const float* lse, index_t B,
                              index_t S, index_t D, double scale, float* delta, void* dq,
                              void* dk, void* dv, const AttentionDropoutSite& dropout = {},
                              const FlashScores& scores = {});
/// The same on the linear layers' token-major layout, read and written in
/// place: qkv and dqkv [s * b, 3 * heads * D], context and dcontext
/// [s * b, heads * D] (rows in [s, b] order); lse and delta [b * heads, s].
void fused_attention_forward_token_major(DType t, const void* qkv, index_t s, index_t b,
                                         index_t heads, index_t D, double scale, void* context,
                                         float* lse, const AttentionDropoutSite& dropout = {},
                                         const FlashScores& scores = {});
void fused_attention_backward_token_major(DType t, const void* dcontext, const void* qkv,
                                          const void* context, const float* lse, index_t s,
                                          index_t b, index_t heads, index_t D, double scale,
                                          float* delta, void* dqkv,
                                          const AttentionDropoutSite& dropout = {},
                                          const FlashScores& scores = {});
/// The two implementations behind the token-major entry points above, which
/// pick one per shape (cuDNN when built, loaded and able to plan the shape,
/// unless set_fused_attention_kernels(Own); see flash_attention.cu), except
/// that attention dropout runs ours (cuDNN's dropout draws other bits) unless
/// the site asks for cuDNN's generator (cudnn_rng).
/// Ours (kernels/cuda/flash_attention.cu), whatever the choice:
void flash_attention_forward_token_major(DType t, const void* qkv, index_t s, index_t b,
                                         index_t heads, index_t D, double scale, void* context,
                                         float* lse, const AttentionDropoutSite& dropout = {},
                                         const FlashScores& scores = {});
void flash_attention_backward_token_major(DType t, const void* dcontext, const void* qkv,
                                          const void* context, const float* lse, index_t s,
                                          index_t b, index_t heads, index_t D, double scale,
                                          float* delta, void* dqkv,
                                          const AttentionDropoutSite& dropout = {},
                                          const FlashScores& scores = {});
/// cuDNN's fused flash attention (kernels/cuda/cudnn_attention.cu), usable
/// where cudnn_attention_support() says so (else they abort). lse is cuDNN's
/// softmax Stats (natural log, as ours); the backward uses delta as cuDNN's
/// softmax-sum workspace and writes dq, dk, dv straight into dqkv.
struct CudnnAttentionSupport {
  bool forward = false;   ///< a forward plan finalized for the shape
  bool backward = false;  ///< a deterministic backward plan finalized for the shape
  std::string library;    ///< "cuDNN 9.19.0", or empty when cuDNN is not built in / not loaded
  std::string why_not;    ///< when not both: the reason
  std::string plans;      ///< the engines chosen and their workspace bytes
};
/// Attention dropout drawn by cuDNN's own generator (its RNG operation,
/// Bernoulli(1 - p), inside the fused kernels): P is dropped after the
/// softmax and the kept entries scaled by 1 / (1 - p), as ours, but with
/// cuDNN's bits, which depend on (seed, offset) and on the entry's place in
/// this call's [b, heads, s, s] only: not the same mask as meshtron's Philox
/// (the host path, our kernels), and not invariant under a change of
/// decomposition. The backward redraws the forward's mask from the same
/// seed and offset. p = 0: none.
struct CudnnDropout {
  double p = 0.0;
  /// Device int64 values, each 8-byte aligned, read when the kernels run
  /// (so a captured CUDA graph may change them between replays).
  const std::int64_t* seed = nullptr;
  const std::int64_t* offset = nullptr;
  /// Tests: when set (forward only), the keep mask (1 kept, 0 dropped) as
  /// fp32 [b, heads, s, s] (cuDNN's RNG output written out).
  float* mask_out = nullptr;
};
/// Builds (once per device, dtype, shape and dropout probability; cached)
/// the forward and backward plans. Thread-safe.
CudnnAttentionSupport cudnn_attention_support(DType t, index_t s, index_t b, index_t heads,
                                              index_t D, double dropout_p = 0.0);
void cudnn_attention_forward_token_major(DType t, const void* qkv, index_t s, index_t b,
                                         index_t heads, index_t D, double scale, void* context,
                                         float* lse, const CudnnDropout& dropout = {});
void cudnn_attention_backward_token_major(DType t, const void* dcontext, const void* qkv,
                                          const void* context, const float* lse, index_t s,
                                          index_t b, index_t heads, index_t D, double scale,
                                          float* delta, void* dqkv,
                                          const CudnnDropout& dropout = {});
/// The backends fused_attention_*_token_major use for this shape on the
/// current device ("cudnn", "own", or "cudnn forward, own backward"), deciding
/// it now if no call has yet.
std::string attention_backend(DType t, index_t s, index_t b, index_t heads, index_t D);
/// training.fused_attention_kernels: Auto lets the token-major entry points
/// take cuDNN's fused attention where it plans the shape, Own keeps
/// meshtron's flash kernels. The choices are cached per shape for the
/// process (as the GEMM algorithms are), so this is set once, by the trainer
/// before its first step; setting it forgets the choices made so far.
enum class FusedAttentionKernels { Auto, Own };
void set_fused_attention_kernels(FusedAttentionKernels kernels);

// ------------------------------------------------------ Rotary embedding ---
/// Which values of a head's first rotary_dim rotate together: HalfSplit
/// pairs (i, i + rotary_dim / 2) (Llama, GPT-NeoX: rotate_half),
/// Interleaved pairs (2 i, 2 i + 1) (GPT-J: rotate_every_two).
enum class RotaryLayout { HalfSplit, Interleaved };
/// kernels/cuda/rotary.cu: `tokens` rows of `heads` heads of head_dim
/// values, row r at x + r ldx (elements), head h at + h head_dim. Made for
/// the token-major qkv projection's output [s*b, 3*heads*head_dim] (rows in
/// [s, b] order, q at column 0, k at heads*head_dim), rotated in place
/// before the attention core reads it: q and k are one call of 2*heads
/// heads (with kv groups, heads + kv_heads), ldx = ldy = the qkv row, and
/// positions[r] = offset + r / b. Pair i of a head's first rotary_dim
/// (even, <= head_dim) values rotates by positions[r] inv_freq[i],
/// inv_freq[i] = base^(-2i / rotary_dim), all in fp32 as transformers
/// computes them; the values past rotary_dim pass through. y (rows ldy
/// apart) may be x itself (in place: ldy == ldx; the values past rotary_dim
/// are then left as they are) or other rows, which get them copied.
void rotary_forward(DType t, const void* x, index_t ldx, void* y, index_t ldy,
                    const std::int32_t* positions, index_t tokens, index_t heads,
                    index_t head_dim, index_t rotary_dim, double base, RotaryLayout layout);
/// The transpose: dx = dy rotated by -angle; dx may be dy (in place).
void rotary_backward(DType t, const void* dy, index_t lddy, void* dx, index_t lddx,
                     const std::int32_t* positions, index_t tokens, index_t heads,
                     index_t head_dim, index_t rotary_dim, double base, RotaryLayout layout);

// ------------------------------------------------------ GeLU and biases ---
void gelu_forward(DType t, const void* x, index_t n, void* y);
void gelu_backward(DType t, const void* dy, const void* x, index_t n, void* dx);
/// Fused y = gelu(x + bias) over x [N, C] (MLP's first GEMM epilogue); also
/// writes pre = x + bias when pre is non-null (the backward's input).
void bias_gelu_forward(DType t, const void* x, const void* bias, index_t N, index_t C, void* pre,
                       void* y);
void bias_add(DType t, void* y, const void* bias, index_t N, index_t C);
/// dbias (+)= column sums of dy: added with `accumulate`, else written.
void bias_backward(DType t, DType g, const void* dy, index_t N, index_t C, void* dbias,
                   bool accumulate);
void add(DType t, const void* a, const void* b, index_t n, void* out);
/// add() on `stream` instead of the compute stream: the sums of the
/// copy-engine collectives, queued behind their transfers (PeerExchange).
void add_on_stream(DType t, const void* a, const void* b, index_t n, void* out,
                   CUstream_st* stream);
/// out[i] = a[i] + b[i] + residual[i] + bias[(first + i) % C] on `stream`
/// (residual or bias may be null), in fp32 with one rounding: the sum of a
/// tp all-reduce's two blocks with a row-parallel layer's bias and residual
/// added in the same pass (elements [first, first + n) of a row-major
/// [rows, C] output). out may alias a or b.
void add_residual_bias_on_stream(DType t, const void* a, const void* b, const void* residual,
                                 const void* bias, index_t C, index_t first, index_t n,
                                 void* out, CUstream_st* stream);
void axpy(DType t, double alpha, const void* x, index_t n, void* y);
void scale(DType t, void* x, index_t n, double alpha);
double sum_of_squares(DType t, const void* x, index_t n);
/// The sum over `count` tensors, block partials of all of them reduced in one
/// fixed order, one copy to the host.
double sum_of_squares_many(int count, const DType* types, const void* const* xs,
                           const index_t* ns);
/// The same sum written to `total` (device memory) by the last block, on the
/// compute stream, without waiting for it.
void sum_of_squares_many_to(int count, const DType* types, const void* const* xs,
                            const index_t* ns, double* total);

// ------------------------------------------------------ MLP activations ---
/// act of a gated MLP: SwiGLU (silu), GeGLU with tanh or erf GeLU, ReGLU;
/// of a plain MLP (activation_forward): the erf GeLU or ReLU.
enum class GluActivation { Silu, GeluTanh, GeluErf, Relu, Tanh };
/// kernels/cuda/glu.cu: y[i] = act(x[i]) over n values (y may be x).
void activation_forward(DType t, GluActivation act, const void* x, index_t n, void* y);
/// dx[i] = dy[i] act'(x[i]) (dx may be dy).
void activation_backward(DType t, GluActivation act, const void* dy, const void* x, index_t n,
                         void* dx);
/// kernels/cuda/glu.cu: x [N, 2 F] = (gate | up) halves of each row
/// (Megatron's --swiglu chunk), y [N, F] = act(gate) up.
void glu_forward(DType t, GluActivation act, const void* x, index_t N, index_t F, void* y);
/// dx [N, 2 F] = (dy up act'(gate) | dy act(gate)), written.
void glu_backward(DType t, GluActivation act, const void* dy, const void* x, index_t N, index_t F,
                  void* dx);

// ------------------------------------------------------------- Embedding ---
void embedding_forward(DType t, const std::int32_t* ids, index_t N, const void* table,
                       index_t V_local, index_t H, index_t vocab_begin, void* out);
void embedding_backward(DType t, DType g, const std::int32_t* ids, index_t N, const void* dout,
                        index_t V_local, index_t H, index_t vocab_begin, void* dtable);
void position_embedding_forward(DType t, const void* table, index_t seq_len, index_t N, index_t H,
                                void* out);
void position_embedding_backward(DType t, DType g, const void* dout, index_t N, index_t H,
                                 index_t seq_len, void* dtable);

// --------------------------------------------------------- Cross-entropy ---
/// valid_local: local columns [0, valid_local) are real tokens.
void cross_entropy_row_max(DType t, const void* logits, index_t N, index_t V_local,
                           index_t valid_local, float* row_max);
void cross_entropy_partials(DType t, const void* logits, const std::int32_t* targets,
                            const float* row_max, index_t N, index_t V_local, index_t vocab_begin,
                            index_t valid_local, float* sum_exp, float* target_logit);
void cross_entropy_row_stats(DType t, const void* logits, const std::int32_t* targets,
                             index_t N, index_t V_local, index_t vocab_begin, index_t valid_local,
                             float* row_max, float* sum_exp, float* target_logit);
void cross_entropy_loss(const float* sum_exp, const float* target_logit, index_t N, float* loss);
void cross_entropy_backward(DType t, DType out, const void* logits, const std::int32_t* targets,
                            const float* row_max, const float* sum_exp, const float* dloss,
                            index_t N, index_t V_local, index_t vocab_begin, index_t valid_local,
                            void* dlogits);

// ----------------------------------------------------------------- AdamW ---
struct AdamWCoefficients {
  double lr, beta1, beta2, eps, weight_decay, step_size, inv_sqrt_bias2;
  float grad_scale;  ///< g = fp32(grad_scale * grad) first (1: grad as is)
  /// Non-null: the global sum of squared gradients in device memory; each
  /// block derives grad_scale = clip_factor(sqrt(sum), clip_grad) from it
  /// and, with skip_nonfinite, updates nothing when that norm is not finite
  /// (ops::AdamWParams::grad_sum_of_squares).
  const double* grad_sum_of_squares = nullptr;
  double clip_grad = 0.0;
  bool skip_nonfinite = false;
};
/// fp32 master weights, gradients and moments; with a non-null `copy`, also
/// copy[i] = the updated param[i] rounded to copy_dtype (bf16 or fp16)
/// exactly as cuda::cast rounds (the compute copy, in the same pass).
void adamw_step(float* param, const float* grad, float* m, float* v, index_t n,
                const AdamWCoefficients& k, DType copy_dtype = DType::BF16,
                void* copy = nullptr);

/// One tensor of a multi-tensor AdamW step; weight_decay replaces
/// AdamWCoefficients::weight_decay for it (0 for biases and norms).
struct AdamWTensorPtrs {
  float* param;
  const float* grad;
  float* m;
  float* v;
  void* copy;  ///< compute copy (bf16/fp16) or null
  index_t n;
  double weight_decay;
};

/// AdamW over many tensors in one launch (kernels/cuda/adamw.cu), bit for
/// bit adamw_step on each. Keeps its table of pointers in device memory
/// between steps and uploads it again only when it changes (pointers, sizes,
/// weight decays); lr and the bias corrections are kernel arguments.
class AdamWTable {
 public:
  AdamWTable() = default;
  ~AdamWTable();
  AdamWTable(const AdamWTable&) = delete;
  AdamWTable& operator=(const AdamWTable&) = delete;
  /// Every non-null copy has dtype copy_dtype (bf16 or fp16).
  void step(const std::vector<AdamWTensorPtrs>& tensors, DType copy_dtype,
            const AdamWCoefficients& k);
  /// Uploads of the table so far (one while the tensors stay the same).
  long uploads() const { return uploads_; }

 private:
  /// The table's entries (`image`) and the per-block work list they imply.
  void upload(const std::vector<unsigned char>& image);
  std::vector<unsigned char> image_;  ///< the entries the device copy holds
  void* device_ = nullptr;            ///< Owned (device allocator).
  std::size_t capacity_ = 0, blocks_ = 0;
  long uploads_ = 0;
};

// ----------------------------------------------------------- Head layout ---
/// Token-major x [s*b, parts*heads*d] <-> head-major part [b*heads, s, d] for
/// one part p; element_size 1, 2, 4 or 8 bytes.
void split_heads_part(const void* x, std::size_t element_size, index_t s, index_t b,
                      index_t heads, index_t d, int parts, int p, void* out);
void merge_heads_part(const void* in, std::size_t element_size, index_t s, index_t b,
                      index_t heads, index_t d, int parts, int p, void* x);
/// ops::expand_kv_groups / reduce_kv_groups on the device (rows of `tokens`).
void expand_kv_groups(const void* qkv, std::size_t element_size, index_t tokens, index_t heads,
                      index_t groups, index_t d, void* out);
void reduce_kv_groups(DType t, const void* dout, index_t tokens, index_t heads, index_t groups,
                      index_t d, void* dqkv);

// ------------------------------------------------------ Cached attention ---
/// ops::cached_attention on the device (kernels/cuda/cached_attention.cu):
/// qkv [rows, (heads + 2 groups) d]; k_cache, v_cache [num_slots, groups,
/// capacity, d]; slots, positions int32 [rows] on the device; context
/// [rows, heads d]. With splits > 1 the cache is cut in that many ranges
/// whose partial results go through `workspace` (fp32, rows x heads x
/// splits x (d + 2)); d at most 256.
struct CachedAttentionArgs {
  DType dtype;
  const void* qkv;
  index_t rows, heads, groups, d, num_slots, capacity;
  const std::int32_t* slots;
  const std::int32_t* positions;
  double scale;
  void* k_cache;
  void* v_cache;
  void* context;
  int splits = 1;
  float* workspace = nullptr;
};
void cached_attention(const CachedAttentionArgs& args);
/// Splits of the cache that keep the GPU busy for rows x heads blocks.
int cached_attention_splits(index_t rows, index_t heads, index_t capacity);

// ------------------------------------------------------ Logit candidates ---
/// ops::logit_candidates on the device: out fp32 [rows, 2 + 2n] on the
/// device; n at most kMaxCandidates.
inline constexpr int kMaxCandidates = 1024;
void logit_candidates(DType t, const void* logits, index_t rows, index_t cols, index_t real,
                      int n, float* out);

}  // namespace meshtron::cuda
