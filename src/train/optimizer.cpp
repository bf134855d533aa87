#include "train/optimizer.hpp"

#include <cmath>

namespace meshtron {

AdamW::AdamW(ParameterList params, const AdamWConfig& config, Parameter* tied_head_copy)
    : params_(std::move(params)), config_(config), tied_head_copy_(tied_head_copy) {
  for (Parameter* p : params_) {
    m_.push_back(Tensor::zeros(p->value.shape(), p->value.dtype()));
    v_.push_back(Tensor::zeros(p->value.shape(), p->value.dtype()));
  }
}

std::size_t AdamW::state_bytes() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < m_.size(); ++i) n += m_[i].bytes() + v_[i].bytes();
  return n;
}

void AdamW::zero_grad() {
  for (Parameter* p : params_) p->grad.fill(0.0);
}

void AdamW::reduce_gradients(OptimizerGroups& g) {
  for (Parameter* p : params_) {
    if (p->shard.tp_partial_grad) g.tp.all_reduce(p->grad);
    const bool tied = p->name == "embedding.word.weight";
    if (tied && g.embedding != nullptr) g.embedding->all_reduce(p->grad);
    g.dp.all_reduce(p->grad);
  }
}

double AdamW::global_grad_norm(OptimizerGroups& g) const {
  double local = 0;
  for (Parameter* p : params_) {
    // Count a tensor held identically by several ranks once: replicated ones
    // on tp rank 0, the tied table on the first stage only.
    if (p->tp_replicated() && g.tp.rank() != 0) continue;
    if (p == tied_head_copy_) continue;
    local += ops::sum_of_squares(p->grad);
  }
  return std::sqrt(g.model.all_reduce_scalar(local));
}

StepStats AdamW::step(double lr, OptimizerGroups& groups, bool skip_on_nonfinite) {
  reduce_gradients(groups);
  StepStats stats;
  stats.grad_norm = global_grad_norm(groups);
  if (skip_on_nonfinite && !std::isfinite(stats.grad_norm)) {
    stats.skipped = true;
    zero_grad();
    return stats;
  }
  if (config_.clip_grad > 0 && stats.grad_norm > config_.clip_grad) {
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6).
    const double factor = config_.clip_grad / (stats.grad_norm + 1e-6);
    for (Parameter* p : params_) ops::scale(p->grad, factor);
  }
  ++step_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    ops::AdamWParams hp;
    hp.lr = lr;
    hp.beta1 = config_.beta1;
    hp.beta2 = config_.beta2;
    hp.eps = config_.eps;
    hp.weight_decay = params_[i]->weight_decay ? config_.weight_decay : 0.0;
    hp.step = step_;
    ops::adamw_step(params_[i]->value, params_[i]->grad, m_[i], v_[i], hp);
  }
  zero_grad();
  return stats;
}

}  // namespace meshtron
