#include "train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.hpp"
#include "ops/cast.hpp"

namespace meshtron {

// ------------------------------------------------------------- shared ---

bool counts_in_grad_norm(const Parameter& p, const OptimizerGroups& g,
                         const Parameter* tied_head_copy) {
  // A tensor held identically by several ranks counts once: tp-replicated
  // ones on tp rank 0, the tied word table (and any table another stage
  // holds too) on the first stage holding it only.
  if (p.tp_replicated() && g.tp.rank() != 0) return false;
  return &p != tied_head_copy && !p.stage_copy;
}

namespace {

bool is_tied_word_table(const Parameter& p) { return p.name == "embedding.word.weight"; }

/// The group of pipeline stages that hold copies of `p` and sum its
/// gradient, or null: the word table's embedding group (first and last
/// stage, and the first decoder stage under a split), a T5 stack's
/// relative-bias table's stack group.
Communicator* stage_group(const Parameter& p, const OptimizerGroups& g) {
  if (is_tied_word_table(p)) return g.embedding;
  if (p.name.ends_with(".relative_bias.weight")) return g.stack;
  return nullptr;
}

/// Whether `p` may have copies on other pipeline stages (its own bucket).
bool is_stage_shared(const Parameter& p) {
  return is_tied_word_table(p) || p.name.ends_with(".relative_bias.weight");
}

/// The stage-shared tables' gradients summed over their groups, where there are any.
void reduce_stage_shared_tables(const ParameterList& params, OptimizerGroups& g) {
  for (Parameter* p : params)
    if (Communicator* group = stage_group(*p, g)) group->all_reduce(p->grad);
}

/// zero_grad()'s marks, for both optimizers: under Deferred every gradient
/// stale, and true (the zeros are left to the writers); under Memset none
/// stale, and false (the caller writes the zeros).
bool defer_zeroing(GradZeroing zeroing, const ParameterList& params) {
  const bool deferred = zeroing == GradZeroing::Deferred;
  for (Parameter* p : params) p->grad_stale = deferred;
  return deferred;
}

/// The zeros of the gradients no op wrote since a deferred zero_grad(),
/// written before anything reads them.
void zero_stale_grads(const ParameterList& params) {
  for (Parameter* p : params) p->zero_stale_grad();
}

}  // namespace

void reduce_model_gradients(const ParameterList& params, OptimizerGroups& g, bool dp) {
  // Reductions 1-2 of the file comment; each communicator's list goes out as
  // one group (a few hundred small tensors: one launch instead of one each).
  reduce_stage_shared_tables(params, g);
  std::vector<Tensor*> tp_partial, replicated;
  for (Parameter* p : params) {
    if (p->shard.tp_partial_grad) tp_partial.push_back(&p->grad);
    if (dp) replicated.push_back(&p->grad);
  }
  g.tp.all_reduce_each(tp_partial);
  if (dp) g.dp.all_reduce_each(replicated);
}

namespace {

ops::AdamWParams adam_params(const AdamWConfig& c, double lr, bool decay, long step) {
  ops::AdamWParams hp;
  hp.lr = lr;
  hp.beta1 = c.beta1;
  hp.beta2 = c.beta2;
  hp.eps = c.eps;
  hp.weight_decay = decay ? c.weight_decay : 0.0;
  hp.step = step;
  return hp;
}

Tensor flat_view(const Tensor& t, index_t begin, index_t end) {
  return t.reshape({t.numel()}).slice_rows(begin, end);
}

using Range = std::pair<index_t, index_t>;  ///< [begin, end) of a flat buffer

/// Views of `flat` over increasing `ranges`, touching ranges merged: the
/// gradient norm then reads a few long runs (one kernel each on the device)
/// instead of one short tensor per parameter.
std::vector<Tensor> merged_views(const Tensor& flat, const std::vector<Range>& ranges) {
  std::vector<Range> runs;
  for (const Range& r : ranges) {
    if (!runs.empty() && runs.back().second == r.first)
      runs.back().second = r.second;
    else
      runs.push_back(r);
  }
  std::vector<Tensor> out;
  for (const Range& r : runs) out.push_back(flat_view(flat, r.first, r.second));
  return out;
}

/// Every parameter's `field` becomes the view of its range of `flat`
/// (starting at `offsets[i]`), after its contents are copied there:
/// Megatron's contiguous buffers, so that collectives and kernels over the
/// buffer read and write the parameters' own memory (the backward
/// accumulates into the gradient buffer; a gather lands in the values). The
/// ranges are packed densely: a view may be less than 16-byte aligned (odd
/// sizes in tiny models), which the GEMM's plan cache (keyed by pointer
/// alignment) and the kernels' unaligned paths handle.
void alias_parameters(const ParameterList& params, const std::vector<index_t>& offsets,
                      Tensor& flat, Tensor Parameter::*field) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor& t = params[i]->*field;
    Tensor view = flat_view(flat, offsets[i], offsets[i] + t.numel()).reshape(t.shape());
    view.copy_from(t);
    t = view;
  }
}

/// Whether every parameter's gradient has one dtype and space (then they
/// can share one buffer).
bool uniform_grads(const ParameterList& params) {
  return std::all_of(params.begin(), params.end(), [&](const Parameter* p) {
    return p->grad.dtype() == params[0]->grad.dtype() &&
           p->grad.space() == params[0]->grad.space();
  });
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(ParameterList params, const AdamWConfig& config,
                                          Parameter* tied_head_copy, bool distributed,
                                          Communicator& dp, BucketOverlap overlap) {
  // One dp rank has nothing to shard: the replicated AdamW is the same
  // update without the distributed one's local copies of every gradient
  // and value (a reduce-scatter and an all-gather of one rank).
  if (distributed && dp.size() > 1)
    return std::make_unique<DistributedAdamW>(std::move(params), config, tied_head_copy, dp,
                                              overlap);
  return std::make_unique<AdamW>(std::move(params), config, tied_head_copy);
}

// ---------------------------------------------------------- replicated ---

AdamW::AdamW(ParameterList params, const AdamWConfig& config, Parameter* tied_head_copy)
    : params_(std::move(params)), config_(config), tied_head_copy_(tied_head_copy) {
  // One gradient buffer for all parameters (each gradient a view of its
  // range): zero_grad is one memset, the norm reads long runs and the
  // gradient all-reduces are one each, where GPT-2 774M would launch 436 of
  // each. The tp-partial gradients (SP's norms and biases) come first, so
  // that their tp all-reduce is one range, then the other tp-replicated ones
  // (which only tp rank 0 counts in the norm), then the tp-split ones: every
  // tp rank's norm reads one run.
  auto group = [](const Parameter& p) {
    return p.shard.tp_partial_grad ? 0 : p.tp_replicated() ? 1 : 2;
  };
  index_t total = 0;
  grad_offsets_.assign(params_.size(), 0);
  for (const int g : {0, 1, 2})
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (group(*params_[i]) != g) continue;
      grad_offsets_[i] = total;
      total += params_[i]->flat_span();
      if (g == 0) tp_partial_elements_ = total;
    }
  if (!params_.empty() && uniform_grads(params_)) {
    grads_ = Tensor::zeros({total}, params_[0]->grad.dtype(), params_[0]->grad.space());
    alias_parameters(params_, grad_offsets_, grads_, &Parameter::grad);
  }
  for (Parameter* p : params_) {
    // Moments and master weights in the gradient's dtype (fp32 under bf16).
    const DType dtype = p->grad.dtype();
    m_.push_back(Tensor::zeros(p->value.shape(), dtype, p->value.space()));
    v_.push_back(Tensor::zeros(p->value.shape(), dtype, p->value.space()));
    master_.push_back(p->value.dtype() == dtype ? Tensor() : p->value.to(dtype));
  }
}

std::size_t AdamW::moment_bytes() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < m_.size(); ++i) n += m_[i].bytes() + v_[i].bytes();
  return n;
}

// In fp32 the parameters are themselves the master weights.
std::size_t AdamW::state_bytes() const {
  std::size_t n = moment_bytes();
  for (const Tensor& w : master_) n += w.defined() ? w.bytes() : 0;
  return n;
}

void AdamW::zero_grad() {
  if (defer_zeroing(zeroing_, params_)) return;
  if (grads_.defined()) {
    grads_.fill(0.0);
    return;
  }
  for (Parameter* p : params_) p->grad.fill(0.0);
}

void AdamW::full_state(std::vector<Tensor>& m, std::vector<Tensor>& v,
                       std::vector<Tensor>& master, OptimizerGroups&) {
  m.clear();
  v.clear();
  master.clear();
  for (std::size_t i = 0; i < m_.size(); ++i) {
    m.push_back(m_[i].clone());
    v.push_back(v_[i].clone());
  }
  const bool mixed = std::any_of(master_.begin(), master_.end(),
                                 [](const Tensor& w) { return w.defined(); });
  if (mixed)
    for (const Tensor& w : master_) master.push_back(w.defined() ? w.clone() : Tensor());
}

void AdamW::load_full_state(const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                            const std::vector<Tensor>& master) {
  for (std::size_t i = 0; i < m_.size(); ++i) {
    m_[i].copy_from(m[i]);
    v_[i].copy_from(v[i]);
    if (!master_[i].defined()) continue;
    if (i < master.size() && master[i].defined()) {
      master_[i].copy_from(master[i]);
      ops::cast(master_[i], params_[i]->value);  // as step() writes the compute copy
    } else {
      master_[i].copy_from(params_[i]->value);  // follows the (loaded) values
    }
  }
}

// ----------------------------------------------------- gradient norm ---

Tensor& GradNormOnDevice::sum_of_squares(const std::vector<Tensor>& counted,
                                         MemorySpace space) {
  if (!total_.defined() || total_.space() != space) total_ = Tensor::zeros({1}, DType::F64, space);
  ops::sum_of_squares_into(counted, total_);
  return total_;
}

double GradNormOnDevice::norm() { return std::sqrt(total_.to_doubles_at(mark_)[0]); }

ops::AdamWParams GradNormOnDevice::clip_by_this(ops::AdamWParams hp, double clip_grad,
                                                bool skip_nonfinite) const {
  hp.grad_sum_of_squares = &total_;
  hp.clip_grad = clip_grad;
  hp.skip_nonfinite = skip_nonfinite;
  return hp;
}

namespace {

/// What the host learns of a step once its update is queued: the norm and,
/// when a non-finite norm made the update kernel skip (skip_on_nonfinite),
/// that the step did not count.
StepStats finish_step(GradNormOnDevice& norm, bool skip_on_nonfinite, long& step) {
  StepStats stats;
  stats.grad_norm = norm.norm();
  if (skip_on_nonfinite && !std::isfinite(stats.grad_norm)) {
    stats.skipped = true;
    --step;
  }
  return stats;
}

}  // namespace

// ------------------------------------------------------------ replicated ---

Tensor& AdamW::local_grad_sum_of_squares(OptimizerGroups& g) {
  std::vector<Tensor> counted;  // per parameter, or runs of grads_ where they share it
  std::vector<Range> ranges;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    if (!counts_in_grad_norm(p, g, tied_head_copy_)) continue;
    if (grads_.defined())
      ranges.emplace_back(grad_offsets_[i], grad_offsets_[i] + p.flat_span());  // zeros after
    else
      counted.push_back(p.grad);
  }
  if (grads_.defined()) {
    std::sort(ranges.begin(), ranges.end());  // buffer order: the longest runs
    counted = merged_views(grads_, ranges);
  }
  const MemorySpace space = grads_.defined() ? grads_.space() : params_[0]->grad.space();
  return grad_norm_.sum_of_squares(counted, space);
}

void AdamW::reduce_gradients(OptimizerGroups& g) {
  if (!grads_.defined()) {
    reduce_model_gradients(params_, g, /*dp=*/true);
    return;
  }
  // Reductions 1-3 of the file comment over grads_, in the order of
  // reduce_model_gradients: the tied table's, one tp all-reduce of the
  // leading tp-partial range, then one dp all-reduce of the whole buffer.
  reduce_stage_shared_tables(params_, g);
  if (g.tp.size() > 1 && tp_partial_elements_ > 0) {
    Tensor partial = grads_.slice_rows(0, tp_partial_elements_);
    g.tp.all_reduce(partial);
  }
  if (g.dp.size() > 1) g.dp.all_reduce(grads_);
}

StepStats AdamW::step(double lr, OptimizerGroups& groups, bool skip_on_nonfinite,
                      double unscale) {
  zero_stale_grads(params_);
  reduce_gradients(groups);
  if (unscale != 1.0) {  // inf/NaN stay inf/NaN: the norm still sees an overflow
    if (grads_.defined())
      ops::scale(grads_, unscale);
    else
      for (Parameter* p : params_) ops::scale(p->grad, unscale);
  }
  groups.model.all_reduce(local_grad_sum_of_squares(groups));
  grad_norm_.mark();
  // Every parameter in one update (one kernel on the device), writing the
  // bf16/fp16 compute copy of the master in the same pass and applying the
  // clipping factor (or the skip) it derives from the norm to each gradient
  // as it is read.
  std::vector<ops::AdamWTensor> tensors;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    const bool mixed = master_[i].defined();
    tensors.push_back({mixed ? master_[i] : p.value, p.grad, m_[i], v_[i],
                       mixed ? p.value : Tensor(), p.weight_decay});
  }
  ++step_;
  update_.step(tensors, grad_norm_.clip_by_this(adam_params(config_, lr, /*decay=*/true, step_),
                                                config_.clip_grad, skip_on_nonfinite));
  zero_grad();
  return finish_step(grad_norm_, skip_on_nonfinite, step_);
}

// --------------------------------------------------------- distributed ---

DistributedAdamW::DistributedAdamW(ParameterList params, const AdamWConfig& config,
                                   Parameter* tied_head_copy, Communicator& dp,
                                   BucketOverlap overlap)
    : params_(std::move(params)),
      config_(config),
      tied_head_copy_(tied_head_copy),
      overlap_(overlap),
      dp_(&dp) {
  for (Parameter* p : params_) {
    offsets_.push_back(total_);
    total_ += p->flat_span();
  }
  const int n = dp.size();
  padded_total_ = (total_ + n - 1) / n * n;  // equal shards for reduce-scatter
  shard_size_ = padded_total_ / n;
  shard_begin_ = shard_size_ * dp.rank();
  // Master weights, moments and the flat buffers in the gradient's dtype
  // (fp32 under bf16 values).
  const DType dtype = params_.empty() ? DType::F32 : params_[0]->grad.dtype();
  space_ = params_.empty() ? MemorySpace::Host : params_[0]->value.space();
  Tensor flat = Tensor::zeros({padded_total_}, dtype, space_);
  pack(&Parameter::value, flat);
  master_ = flat.slice_rows(shard_begin_, shard_begin_ + shard_size_).clone();
  m_ = Tensor::zeros({shard_size_}, dtype, space_);
  v_ = Tensor::zeros({shard_size_}, dtype, space_);
  if (mixed_precision()) {  // the 16-bit copies the update writes and the ranks gather
    const DType compute = params_[0]->value.dtype();
    compute_shard_ = Tensor::zeros({shard_size_}, compute, space_);  // padding stays 0
    compute_flat_ = Tensor::zeros({padded_total_}, compute, space_);
  }
  // Megatron's contiguous buffers, with or without overlap: every gradient
  // and every value is a view of its range of one flat buffer, so the
  // reduce-scatter reads the gradients and the all-gather writes the values
  // where they live (no per-parameter pack or unpack, one memset to zero).
  grad_flat_ = Tensor::zeros({padded_total_}, dtype, space_);  // padding stays 0
  grad_shard_ = Tensor::zeros({shard_size_}, dtype, space_);
  alias_parameters(params_, offsets_, grad_flat_, &Parameter::grad);
  if (!mixed_precision()) param_flat_ = Tensor::zeros({padded_total_}, dtype, space_);
  alias_parameters(params_, offsets_, mixed_precision() ? compute_flat_ : param_flat_,
                   &Parameter::value);
  if (!overlap_.any() || params_.empty()) {
    overlap_ = BucketOverlap{};
    return;
  }
  make_buckets(overlap_.bucket_elements);
}

index_t DistributedAdamW::shard_offset_of(const Bucket& b) const {
  return std::clamp(b.begin - shard_begin_, index_t(0), shard_size_);
}

// Leave no gather in flight: it writes into buffers freed with us, and an
// MPI request must complete before MPI_Finalize.
DistributedAdamW::~DistributedAdamW() {
  if (gathers_pending_ > 0) dp_->wait_collectives();
}

// Walk the parameters backwards (the backward finishes the last ones first)
// and close a bucket once it holds bucket_elements; a stage-shared table (the
// tied word table, a T5 stack's relative-bias table) is always a bucket of
// its own. The first bucket also covers the padding.
void DistributedAdamW::make_buckets(index_t bucket_elements) {
  Bucket current;
  index_t size = 0;
  auto close = [&] {
    if (current.params.empty()) return;
    const std::size_t first = current.params.back(), last = current.params.front();
    current.begin = offsets_[first];
    current.end = buckets_.empty() ? padded_total_ : offsets_[last] + params_[last]->flat_span();
    for (std::size_t i : current.params) bucket_of_[params_[i]] = buckets_.size();
    buckets_.push_back(current);
    current = Bucket{};
    size = 0;
  };
  for (std::size_t i = params_.size(); i-- > 0;) {
    const bool tied = is_stage_shared(*params_[i]);
    if (tied) close();
    current.params.push_back(i);
    current.tied = tied;
    size += params_[i]->flat_span();
    if (tied || size >= bucket_elements) close();
  }
  close();
}

void DistributedAdamW::grads_ready(const ParameterList& ready, OptimizerGroups& g) {
  if (!overlap_.grad_reduce) return;
  for (const Parameter* p : ready) {
    const auto it = bucket_of_.find(p);
    MESH_VERIFY(it != bucket_of_.end(), "grads_ready: " << p->name << " is not optimized here");
    Bucket& b = buckets_[it->second];
    ++b.ready;
    // A stage-shared table's all-reduce would wait for the other stages
    // holding it, still in their backward: left to step().
    const bool deferred = b.tied && stage_group(*params_[b.params.front()], g) != nullptr;
    if (b.ready == b.params.size() && !b.started && !deferred) {
      start_bucket(b, g);
      ++started_early_;
    }
  }
}

void DistributedAdamW::start_bucket(Bucket& b, OptimizerGroups& g) {
  ParameterList bucket_params;
  for (std::size_t i : b.params) bucket_params.push_back(params_[i]);
  zero_stale_grads(bucket_params);
  reduce_model_gradients(bucket_params, g, /*dp=*/false);  // in grad_flat_ (alias_parameters)
  // Rank r receives the bucket's overlap with its shard [r S, (r + 1) S):
  // consecutive pieces in rank order, as the single reduce-scatter has them.
  const std::vector<std::size_t> counts = counts_per_rank(b, g.dp.size());
  const index_t mine = shard_offset_of(b);
  g.dp.ireduce_scatter(flat_view(grad_flat_, b.begin, b.end).raw(),
                       flat_view(grad_shard_, mine, mine).raw(), counts, grad_shard_.dtype(),
                       ReduceOp::Sum);
  b.started = true;
}

std::vector<std::size_t> DistributedAdamW::counts_per_rank(const Bucket& b, int ranks) const {
  std::vector<std::size_t> counts(std::size_t(ranks), 0);
  for (int r = 0; r < ranks; ++r) {
    const index_t lo = std::max(b.begin, shard_size_ * r);
    const index_t hi = std::min(b.end, shard_size_ * (r + 1));
    counts[std::size_t(r)] = std::size_t(std::max<index_t>(hi - lo, 0));
  }
  return counts;
}

// Rank r sends the bucket's overlap with its shard, which lands where the
// single all-gather would put it: the bucket's range of the gathered buffer
// is those pieces back to back in rank order. Started in forward order (the
// reverse of the buckets'), so the embedding's arrives first.
void DistributedAdamW::start_param_gather(Communicator& dp) {
  dp.wait_collectives();  // retire the last step's (completed) tickets
  const bool low = mixed_precision();
  const Tensor& shard = low ? compute_shard_ : master_;
  Tensor& flat = low ? compute_flat_ : param_flat_;
  for (std::size_t k = buckets_.size(); k-- > 0;) {
    Bucket& b = buckets_[k];
    const std::vector<std::size_t> counts = counts_per_rank(b, dp.size());
    const index_t mine = shard_offset_of(b);
    const index_t my_count = index_t(counts[std::size_t(dp.rank())]);
    b.gather_ticket = dp.iall_gather(flat_view(shard, mine, mine + my_count).raw(),
                                     flat_view(flat, b.begin, b.end).raw(), counts,
                                     flat.dtype());
    b.gathering = true;
  }
  gathers_pending_ = int(buckets_.size());
}

void DistributedAdamW::complete_param_gather(Bucket& b) {
  dp_->wait_collective(b.gather_ticket);  // the values are views of the gathered buffer
  b.gathering = false;
  --gathers_pending_;
}

void DistributedAdamW::before_forward(const ParameterList& params) {
  if (gathers_pending_ == 0) return;  // every forward after the step's first
  for (const Parameter* p : params) {
    const auto it = bucket_of_.find(p);
    if (it == bucket_of_.end()) continue;  // not optimized here
    Bucket& b = buckets_[it->second];
    if (!b.gathering) continue;
    complete_param_gather(b);
    ++waited_in_forward_;
  }
}

void DistributedAdamW::finish_param_gather() {
  if (gathers_pending_ == 0) return;
  for (std::size_t k = buckets_.size(); k-- > 0;)
    if (buckets_[k].gathering) complete_param_gather(buckets_[k]);
}

void DistributedAdamW::finish_buckets(OptimizerGroups& g) {
  for (Bucket& b : buckets_)
    if (!b.started) start_bucket(b, g);
  reset_buckets(g.dp);
}

// Called by finish_buckets, and by zero_grad() (after step(), where nothing
// is in flight, or for a step given up, whose buckets must complete before
// anything touches the buffers again).
void DistributedAdamW::reset_buckets(Communicator& dp) {
  const bool in_step = std::any_of(buckets_.begin(), buckets_.end(),
                                   [](const Bucket& b) { return b.ready > 0 || b.started; });
  if (!in_step) return;
  dp.wait_collectives();
  started_early_last_ = started_early_;
  started_early_ = 0;
  for (Bucket& b : buckets_) b.ready = 0, b.started = false;
}

std::size_t DistributedAdamW::moment_bytes() const { return m_.bytes() + v_.bytes(); }

std::size_t DistributedAdamW::state_bytes() const { return master_.bytes() + moment_bytes(); }

void DistributedAdamW::zero_grad() {
  reset_buckets(*dp_);  // a step given up (NaN loss) may have buckets in flight
  if (defer_zeroing(zeroing_, params_)) return;  // the padding is never written: it stays 0
  grad_flat_.fill(0.0);  // every gradient at once (they are views of it)
}

// copy_from is a memcpy on the host and a device-to-device cudaMemcpy on
// the GPU (the flat buffer lives where the parameters do).
void DistributedAdamW::pack(Tensor Parameter::*field, Tensor& flat) const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& t = params_[i]->*field;
    flat_view(flat, offsets_[i], offsets_[i] + t.numel()).copy_from(t);
  }
}

void DistributedAdamW::shard_segments(
    const std::function<void(std::size_t, index_t, index_t, index_t)>& f,
    bool with_padding) const {
  const index_t shard_end = shard_begin_ + shard_size_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = *params_[i];
    const index_t span = with_padding ? p.flat_span() : p.value.numel();
    const index_t begin = std::max(offsets_[i], shard_begin_);
    const index_t end = std::min(offsets_[i] + span, shard_end);
    if (begin < end) f(i, begin - offsets_[i], end - offsets_[i], begin - shard_begin_);
  }
}

StepStats DistributedAdamW::step(double lr, OptimizerGroups& g, bool skip_on_nonfinite,
                                 double unscale) {
  finish_param_gather();  // a step with no forward since the last (none in training)
  if (overlap_.grad_reduce) {
    finish_buckets(g);
  } else {
    zero_stale_grads(params_);
    reduce_model_gradients(params_, g, /*dp=*/false);
    g.dp.reduce_scatter(grad_flat_.raw(), grad_shard_.raw(), std::size_t(shard_size_),
                        grad_shard_.dtype(), ReduceOp::Sum);
  }
  Tensor& grad = grad_shard_;
  if (unscale != 1.0) ops::scale(grad, unscale);

  std::vector<Range> counted;
  shard_segments([&](std::size_t i, index_t begin, index_t end, index_t pos) {
    if (counts_in_grad_norm(*params_[i], g, tied_head_copy_))
      counted.emplace_back(pos, pos + end - begin);
  }, /*with_padding=*/true);
  Tensor& squares = grad_norm_.sum_of_squares(merged_views(grad, counted), space_);
  g.model.all_reduce(squares);
  g.dp.all_reduce(squares);
  grad_norm_.mark();
  zero_grad();
  ++step_;
  // One update over the shard's per-parameter ranges (one kernel on the
  // device). Under mixed precision the same pass writes the shard's 16-bit
  // compute copy, and the ranks gather those (half the bytes of the fp32
  // masters; the same bits as gathering the masters and rounding after).
  const bool low = mixed_precision();
  std::vector<ops::AdamWTensor> ranges;
  shard_segments([&](std::size_t i, index_t begin, index_t end, index_t pos) {
    const index_t len = end - begin;
    ranges.push_back({flat_view(master_, pos, pos + len), flat_view(grad, pos, pos + len),
                      flat_view(m_, pos, pos + len), flat_view(v_, pos, pos + len),
                      low ? flat_view(compute_shard_, pos, pos + len) : Tensor(),
                      params_[i]->weight_decay});
  });
  // The clipping factor or the skip, derived from the norm as grads are read.
  update_.step(ranges, grad_norm_.clip_by_this(adam_params(config_, lr, /*decay=*/true, step_),
                                               config_.clip_grad, skip_on_nonfinite));
  const StepStats stats = finish_step(grad_norm_, skip_on_nonfinite, step_);
  if (stats.skipped) return stats;  // nothing was updated: nothing to gather
  if (overlap_.param_gather) {
    waited_in_forward_last_ = waited_in_forward_;
    waited_in_forward_ = 0;
    start_param_gather(g.dp);  // completed by the next forward (before_forward)
  } else {
    const Tensor& shard = low ? compute_shard_ : master_;
    Tensor& values = low ? compute_flat_ : param_flat_;  // the parameters' own storage
    g.dp.all_gather(shard.raw(), values.raw(), std::size_t(shard_size_), values.dtype());
  }
  return stats;
}

bool DistributedAdamW::mixed_precision() const {
  return !params_.empty() && params_[0]->value.dtype() != master_.dtype();
}

std::vector<Tensor> DistributedAdamW::gather_per_parameter(const Tensor& shard,
                                                           Communicator& dp) const {
  Tensor flat = Tensor::empty({padded_total_}, shard.dtype(), space_);
  dp.all_gather(shard.raw(), flat.raw(), std::size_t(shard_size_), shard.dtype());
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    out.push_back(flat_view(flat, offsets_[i], offsets_[i] + params_[i]->value.numel())
                      .reshape(params_[i]->value.shape())
                      .clone());
  return out;
}

void DistributedAdamW::scatter_per_parameter(const std::vector<Tensor>& full,
                                             Tensor& shard) const {
  shard_segments([&](std::size_t i, index_t begin, index_t end, index_t pos) {
    Tensor dst = flat_view(shard, pos, pos + end - begin);
    dst.copy_from(flat_view(full[i], begin, end));
  });
}

void DistributedAdamW::full_state(std::vector<Tensor>& m, std::vector<Tensor>& v,
                                  std::vector<Tensor>& master, OptimizerGroups& g) {
  finish_param_gather();  // the checkpoint reads the values next
  m = gather_per_parameter(m_, g.dp);
  v = gather_per_parameter(v_, g.dp);
  master.clear();
  if (mixed_precision()) master = gather_per_parameter(master_, g.dp);
}

void DistributedAdamW::load_full_state(const std::vector<Tensor>& m,
                                       const std::vector<Tensor>& v,
                                       const std::vector<Tensor>& master) {
  finish_param_gather();  // a gather landing later would overwrite the loaded values
  scatter_per_parameter(m, m_);
  scatter_per_parameter(v, v_);
  if (mixed_precision() && !master.empty()) {
    // Every dp rank holds the full local master: no all-gather needed to
    // write the 16-bit values (the same rounding step() applies).
    scatter_per_parameter(master, master_);
    for (std::size_t i = 0; i < params_.size(); ++i) ops::cast(master[i], params_[i]->value);
    return;
  }
  // The master copy follows the (loaded) parameter values.
  Tensor flat = Tensor::zeros({padded_total_}, master_.dtype(), space_);
  pack(&Parameter::value, flat);
  master_.copy_from(flat.slice_rows(shard_begin_, shard_begin_ + shard_size_));
}

}  // namespace meshtron
