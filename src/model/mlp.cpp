#include "model/mlp.hpp"

namespace meshtron {

namespace {
int fc_width(const MlpSpec& spec) {
  return is_gated(spec.activation) ? 2 * spec.ffn_hidden_size : spec.ffn_hidden_size;
}
ops::GatedActivation kernel_activation(Activation a) {
  switch (a) {
    case Activation::Swiglu: return ops::GatedActivation::SiLU;
    case Activation::Relu: return ops::GatedActivation::ReLU;
    case Activation::GeluTanh:
    case Activation::GegluTanh: return ops::GatedActivation::GeLUTanh;
    case Activation::Gelu:
    case Activation::Geglu: return ops::GatedActivation::GeLUErf;
  }
  return ops::GatedActivation::GeLUErf;
}
}  // namespace

// The projection's adds take the tp rank after the attention's (Attention:
// layer), so every rank has its share of both kinds: at tp 2 rank 0 adds in
// the even layers' attention and the odd layers' MLP, rank 1 in the others.
// (The MLP's fused add costs more than the attention's: its GEMM, K = ffn /
// tp, takes a slower out-of-place algorithm.)
Mlp::Mlp(const std::string& name, int layer, index_t hidden, const MlpSpec& spec,
         const LayerContext& ctx, DType dtype, const MlpInnerDropout& inner)
    : fc(name + ".fc", hidden, fc_width(spec), /*fused_parts=*/is_gated(spec.activation) ? 2 : 1,
         ctx, dtype, spec.bias),
      proj(name + ".proj", spec.ffn_hidden_size, hidden, ctx, dtype, /*epilogue_rank=*/layer + 1,
           spec.bias),
      gated_(is_gated(spec.activation)),
      gelu_in_gemm_(spec.activation == Activation::GeluTanh && inner.p == 0),
      act_(kernel_activation(spec.activation)),
      inner_(inner) {}

// fc's output [s * b, ffn / tp] viewed as [s, b, ffn]: every token (fc
// gathers them under SP) and this rank's block of the ffn columns, so a
// column's mask does not depend on tp.
ops::DropoutSite Mlp::inner_site(const LayerContext& ctx) const {
  const index_t ffn = proj.weight.global_shape[0];
  ops::DropoutSite s = ctx.hidden_site(inner_.stream, ffn);
  s.a = ctx.seq_length;
  s.a_offset = 0;
  s.c = ffn / ctx.tp.size();
  s.c_offset = index_t(ctx.tp.rank()) * s.c;
  return s;
}

Tensor Mlp::activated(const Tensor& x, LayerContext& ctx, Cache& c) const {
  if (gelu_in_gemm_) return fc.forward_gelu(x, ctx, c.fc, c.pre_activation);
  c.pre_activation = fc.forward(x, ctx, c.fc);
  const Tensor& pre = c.pre_activation;
  Tensor out = Tensor::empty({pre.dim(0), pre.dim(1) / (gated_ ? 2 : 1)}, pre.dtype(),
                             pre.space());
  if (gated_) ops::gated_activation_forward(pre, act_, out);
  else ops::activation_forward(pre, act_, out);
  if (drops_inner(ctx)) ops::dropout_forward(out, inner_.p, inner_site(ctx), out);
  return out;
}

// The GeLU rides in the GEMMs next to it (cuBLASLt epilogues on the device;
// on the host the same ops run one after the other, as before): fc's
// forward writes both pre_gelu and gelu(pre_gelu), and proj's dgrad GEMM
// applies gelu'(pre_gelu), so d(activated) is never stored. The other
// activations run as a kernel of their own between the GEMMs.
Tensor Mlp::forward(const Tensor& x, LayerContext& ctx, Cache& c) const {
  return proj.forward(activated(x, ctx, c), ctx, c.proj);
}

Tensor Mlp::forward_residual(const Tensor& x, const Tensor& residual, LayerContext& ctx,
                            Cache& c) const {
  return proj.forward_residual(activated(x, ctx, c), residual, ctx, c.proj);
}

// fc's bias gradient (the column sums of dpre) is taken right after proj's
// dgrad GEMM writes dpre (ops::gemm_dgelu), by the column-sum kernel: a
// GPT-2 774M step on one H100 takes 97.1 ms that way against 97.3 with
// cuBLASLt's BGRADA epilogue in fc's weight-gradient GEMM. Except under
// sequence parallelism on tp > 1: there the sums run with fc's
// weight-gradient GEMM (linear_weight_grads) beside dX's reduce-scatter,
// off the path to the next layer. With the ones column fc's weight-gradient
// GEMM computes it (ColumnParallelLinear).
Tensor Mlp::backward(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  if (!gelu_in_gemm_) return backward_unfused(dy, ctx, c);
  const bool bias_grad_after_dgelu =
      fc.has_bias() && !ctx.sequence_sharded() && !fc.takes_ones_column();
  const Tensor dpre = proj.backward_through_gelu(dy, ctx, c.proj, c.pre_activation,
                                                 bias_grad_after_dgelu ? &fc.bias : nullptr);
  return fc.backward(dpre, ctx, c.fc, /*bias_grad_accumulated=*/bias_grad_after_dgelu);
}

Tensor Mlp::backward_unfused(const Tensor& dy, LayerContext& ctx, const Cache& c) {
  Tensor dactivated = proj.backward(dy, ctx, c.proj);
  if (drops_inner(ctx)) ops::dropout_backward(dactivated, inner_.p, inner_site(ctx), dactivated);
  Tensor dpre = Tensor::empty(c.pre_activation.shape(), dy.dtype(), dy.space());
  if (gated_) ops::gated_activation_backward(dactivated, c.pre_activation, act_, dpre);
  else ops::activation_backward(dactivated, c.pre_activation, act_, dpre);
  return fc.backward(dpre, ctx, c.fc);
}

}  // namespace meshtron
