// AdamW over a stage's parameters, with the gradient reductions that make
// the update identical on every decomposition:
//
//   1. sequence-parallel partial gradients (norms, row-parallel biases) are
//      all-reduced over tp;
//   2. the tied word-embedding gradient is all-reduced over the embedding
//      group (first + last pipeline stage; T5: also the first decoder stage)
//      when pp > 1, a T5 stack's relative-bias table over its stack's stages;
//   3. all gradients are all-reduced over dp (the loss is already divided
//      by the global token count, so the sum is the mean gradient);
//   4. under fp16 the gradients are unscaled (x 1/loss scale);
//   5. the global L2 norm is computed over the whole grid, counting every
//      tp-replicated parameter and the tied embedding once, and gradients are
//      clipped to training.clip_grad;
//   6. AdamW with decoupled weight decay (none on biases and norms).
//
// Steps 5-6 never wait for the device: the sum of squares is written, all-
// reduced and read by the update where the gradients are (GradNormOnDevice),
// the clipping factor and the skip of a non-finite step are decided in the
// update kernel, and the host reads the norm only once the update is queued.
//
// Mixed precision (bf16 or fp16 parameter values, fp32 gradients: see
// grad_dtype_for in model/parameter.hpp): the optimizer keeps fp32 master
// weights and fp32 moments, steps the master, and writes the bf16/fp16 compute
// copy back into Parameter::value (in the update's pass: ops::MultiTensorAdamW;
// the distributed optimizer casts after its all-gather). In fp32/fp64 the
// parameter values are their own master weights.
#pragma once

#include <memory>
#include <unordered_map>
#include <functional>
#include <vector>

#include "model/layer_context.hpp"
#include "model/parameter.hpp"
#include "ops/ops.hpp"
#include "parallel/communicator.hpp"
#include "tensor/device_allocator.hpp"

namespace meshtron {

struct OptimizerGroups {
  Communicator& tp;         ///< Not owned.
  Communicator& dp;         ///< Not owned.
  Communicator& model;      ///< tp x pp ranks (norm reduction). Not owned.
  Communicator* embedding;  ///< first+last stage; null when pp = 1 or middle stage.
  /// The stages of this rank's stack under a pipeline split (a T5 stack's
  /// relative-bias table); null without one or with one stage per stack.
  Communicator* stack = nullptr;
};

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double clip_grad = 0.0;  ///< 0 = no clipping
};

struct StepStats {
  double grad_norm = 0;  ///< before clipping
  bool skipped = false;  ///< NaN/Inf in the gradient norm: no update
};

/// How zero_grad() clears the gradients. Memset writes zeros into all of
/// them (one memset of the flat buffer, 3.1 GB per step at GPT-2 774M).
/// Deferred marks each one stale (Parameter::grad_stale) instead, and the
/// step's first op that writes it overwrites it (GEMM beta 0, column sums
/// stored, not added: ops::GradStore), as PyTorch's
/// zero_grad(set_to_none=True) leaves the first accumulation to allocate; a
/// gradient that no op wrote is zeroed before the reductions read it. The
/// trainer defers; Memset otherwise.
enum class GradZeroing { Memset, Deferred };

/// What the trainer needs of an optimizer (replicated or distributed).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  void set_grad_zeroing(GradZeroing z) { zeroing_ = z; }
  GradZeroing grad_zeroing() const { return zeroing_; }
  /// Reduce gradients, multiply them by `unscale` (1 / loss scale under
  /// fp16, see train/loss_scaler.hpp), clip, update with learning rate `lr`;
  /// zero the grads.
  virtual StepStats step(double lr, OptimizerGroups& groups, bool skip_on_nonfinite,
                         double unscale = 1.0) = 0;
  virtual void zero_grad() = 0;
  /// Bytes of optimizer state (fp32 master copies, Adam moments) on this rank.
  virtual std::size_t state_bytes() const = 0;
  /// Bytes of the Adam moments alone (m and v) on this rank.
  virtual std::size_t moment_bytes() const = 0;
  /// Adam moments and, when the parameter values are bf16/fp16, the fp32
  /// master weights, in each parameter's local shape (gathered over dp if
  /// the optimizer is distributed; collective then), for checkpoints.
  /// `master` is left empty when the values are their own master (fp32).
  virtual void full_state(std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                          std::vector<Tensor>& master, OptimizerGroups& groups) = 0;
  /// Inverse of full_state (each rank keeps its part). A non-empty `master`
  /// sets the master weights and makes each 16-bit value their rounding
  /// (exactly what a step writes), so a resumed run continues bit for bit;
  /// an empty one makes the master follow the (loaded) parameter values.
  virtual void load_full_state(const std::vector<Tensor>& exp_avg,
                               const std::vector<Tensor>& exp_avg_sq,
                               const std::vector<Tensor>& master = {}) = 0;
  virtual long step_count() const = 0;
  virtual void set_step_count(long s) = 0;
  /// Overlapped gradient reduction: the executor reports parameters whose
  /// gradient is final for this step (during the last backward); the
  /// optimizer may start reducing them. Ignored unless overlap is on.
  virtual void grads_ready(const ParameterList& /*params*/, OptimizerGroups& /*groups*/) {}
  /// Buckets whose reduction started in grads_ready (before step()) during
  /// the last step; 0 without overlap.
  virtual int buckets_started_early() const { return 0; }
  /// Overlapped parameter all-gather: the hook the forward calls (set in
  /// LayerContext::param_gather), null when off.
  virtual ParamGatherHook* param_gather_hook() { return nullptr; }
  /// Complete every parameter all-gather still in flight, so that
  /// Parameter::value holds the updated weights. Whatever reads the values
  /// outside a forward after step() (checkpoints, exports, tests) calls it
  /// first; a no-op when nothing is in flight.
  virtual void finish_param_gather() {}

 protected:
  GradZeroing zeroing_ = GradZeroing::Memset;
};

/// Bucketed overlap of the distributed optimizer's dp communication.
struct BucketOverlap {
  index_t bucket_elements = 0;  ///< about this many elements per bucket
  bool grad_reduce = false;     ///< parallel.overlap_grad_reduce
  bool param_gather = false;    ///< parallel.overlap_param_gather
  bool any() const { return bucket_elements > 0 && (grad_reduce || param_gather); }
};

/// Sum of squared gradients over the parameters this rank counts in the
/// global norm (tp-replicated ones on tp rank 0 only; not the tied copy).
bool counts_in_grad_norm(const Parameter& p, const OptimizerGroups& g,
                         const Parameter* tied_head_copy);

/// Reductions 1-3 of the file comment, on every parameter; with `dp` false
/// the data-parallel all-reduce is left to the caller (distributed optimizer).
void reduce_model_gradients(const ParameterList& params, OptimizerGroups& g, bool dp);

/// The squared global gradient norm kept where the gradients are: summed
/// there (ops::sum_of_squares_into), all-reduced there by the caller, read
/// there by the update (ops::AdamWParams::grad_sum_of_squares), and read by
/// the host only after the update is queued (mark(), then norm()): no host
/// round trip between the backward and the update.
class GradNormOnDevice {
 public:
  /// The local sum of squares of `counted` (queued), in `space`.
  Tensor& sum_of_squares(const std::vector<Tensor>& counted, MemorySpace space);
  /// The point after the caller's all-reduces that norm() waits for (on
  /// the device; the host's sum is final when the all-reduce returns).
  void mark() {
    if (!total_.is_host()) mark_.record();
  }
  /// sqrt of the reduced sum; waits for the mark only.
  double norm();
  /// AdamW's parameters with clipping and the skip decided from this norm.
  ops::AdamWParams clip_by_this(ops::AdamWParams hp, double clip_grad, bool skip_nonfinite) const;

 private:
  Tensor total_;  ///< one F64 element
  device::StreamMark mark_;
};

/// Replicated AdamW: every dp rank holds and steps the full optimizer state.
class AdamW final : public Optimizer {
 public:
  /// `tied_head_copy` is the last stage's copy of the word table (pp > 1),
  /// whose norm is not counted twice; null otherwise.
  AdamW(ParameterList params, const AdamWConfig& config, Parameter* tied_head_copy);

  StepStats step(double lr, OptimizerGroups& groups, bool skip_on_nonfinite,
                 double unscale = 1.0) override;
  void zero_grad() override;
  std::size_t state_bytes() const override;
  std::size_t moment_bytes() const override;
  void full_state(std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                  std::vector<Tensor>& master, OptimizerGroups& groups) override;
  void load_full_state(const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                       const std::vector<Tensor>& master = {}) override;
  long step_count() const override { return step_; }
  void set_step_count(long s) override { step_ = s; }


 private:
  /// The local part of the global gradient norm (reduction 5) into grad_norm_.
  Tensor& local_grad_sum_of_squares(OptimizerGroups& groups);
  ParameterList params_;
  AdamWConfig config_;
  Parameter* tied_head_copy_;  ///< Not owned.
  /// Every gradient, back to back (the parameters' grads are views of it);
  /// undefined if the gradients differ in dtype or space.
  Tensor grads_;
  std::vector<index_t> grad_offsets_;  ///< start of each gradient in grads_
  index_t tp_partial_elements_ = 0;    ///< grads_[0, this): the tp-partial gradients
  /// Reductions 1-3 (tp partial sums, tied table, dp) of every gradient.
  void reduce_gradients(OptimizerGroups& g);
  std::vector<Tensor> m_, v_;
  /// fp32 master weights where a value is bf16 (undefined tensors otherwise).
  std::vector<Tensor> master_;
  ops::MultiTensorAdamW update_;  ///< one launch for all parameters on the device
  GradNormOnDevice grad_norm_;
  long step_ = 0;
};

/// Distributed AdamW (ZeRO-1, Megatron's distributed optimizer): gradients
/// live in one contiguous fp32 buffer (each parameter's grad is a view of its
/// range, so the backward accumulates into it), reduce-scattered over dp, and
/// each dp rank holds the fp32 master weights and Adam moments of its 1/dp
/// of that buffer only; after the update the parameters are all-gathered
/// into one flat buffer whose ranges are the values themselves.
///
/// Overlap (parallel.overlap_grad_reduce, BucketOverlap::grad_reduce): the flat
/// buffer is cut into buckets of about bucket_elements, in reverse parameter
/// order (the order the backward finishes them). When grads_ready() has
/// reported every parameter of a bucket, its reductions 1-2 run and its part
/// of the reduce-scatter starts
/// (Communicator::ireduce_scatter, rank r receiving the bucket's overlap with
/// shard r), so the shard layout and every sum are those of the single
/// reduce-scatter; step() starts the buckets not yet started and waits for
/// all. The bucket holding the tied word table is its own
/// bucket and, when pp > 1, always waits for step(): its embedding-group
/// all-reduce needs the other end of the pipeline, which is still in its
/// backward.
///
/// Overlapped parameter all-gather (parallel.overlap_param_gather, Megatron's
/// --overlap-param-gather): on the same buckets, step() ends by starting one
/// Communicator::iall_gather per bucket (rank r contributing the bucket's
/// overlap with its shard: the same pieces in the same places as the single
/// all-gather, so the same bits), in forward order, into the values' flat
/// buffer, and returns. The forward's ParamGatherHook::before_forward waits for the
/// buckets of the part it is about to run; the first forward of
/// the step finds every bucket gathered after that, later ones nothing to
/// wait for. finish_param_gather() does the same for all buckets; full_state,
/// load_full_state and step() call it first.
class DistributedAdamW final : public Optimizer, public ParamGatherHook {
 public:
  DistributedAdamW(ParameterList params, const AdamWConfig& config,
                   Parameter* tied_head_copy, Communicator& dp, BucketOverlap overlap = {});
  ~DistributedAdamW() override;
  DistributedAdamW(const DistributedAdamW&) = delete;
  DistributedAdamW& operator=(const DistributedAdamW&) = delete;
  StepStats step(double lr, OptimizerGroups& groups, bool skip_on_nonfinite,
                 double unscale = 1.0) override;
  void zero_grad() override;
  std::size_t state_bytes() const override;
  std::size_t moment_bytes() const override;
  void full_state(std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq,
                  std::vector<Tensor>& master, OptimizerGroups& groups) override;
  void load_full_state(const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                       const std::vector<Tensor>& master = {}) override;
  long step_count() const override { return step_; }
  void set_step_count(long s) override { step_ = s; }
  void grads_ready(const ParameterList& params, OptimizerGroups& groups) override;
  int buckets_started_early() const override { return started_early_last_; }
  int bucket_count() const { return int(buckets_.size()); }
  ParamGatherHook* param_gather_hook() override {
    return overlap_.param_gather ? this : nullptr;
  }
  void before_forward(const ParameterList& params) override;
  void finish_param_gather() override;
  /// Parameter buckets whose all-gather is still in flight (started by the
  /// last step(), not yet waited for).
  int param_gathers_pending() const { return gathers_pending_; }
  /// Buckets the forward hook waited for between the previous step() and the
  /// last one (the last step's forwards).
  int buckets_waited_in_forward() const { return waited_in_forward_last_; }

 private:
  struct Bucket {
    index_t begin = 0, end = 0;        ///< range of the flat buffer
    std::vector<std::size_t> params;   ///< indices into params_
    std::size_t ready = 0;             ///< parameters reported this step
    bool started = false;
    bool tied = false;                 ///< holds a stage-shared table (word, relative bias)
    bool gathering = false;            ///< parameter all-gather in flight
    long gather_ticket = 0;            ///< its Communicator ticket
  };
  void make_buckets(index_t bucket_elements);
  /// Where bucket `b` starts within this rank's shard (clamped to the shard).
  index_t shard_offset_of(const Bucket& b) const;
  /// Elements of bucket `b` in each dp rank's shard (rank order).
  std::vector<std::size_t> counts_per_rank(const Bucket& b, int ranks) const;
  /// Start every bucket's parameter all-gather (end of step()).
  void start_param_gather(Communicator& dp);
  /// Wait for bucket `b`'s all-gather and write its parameters' values.
  void complete_param_gather(Bucket& b);
  /// Reductions 1-2, pack and ireduce_scatter of one bucket.
  void start_bucket(Bucket& b, OptimizerGroups& g);
  /// Start every bucket not started yet, wait for all; the reduced shard is
  /// then in grad_shard_.
  void finish_buckets(OptimizerGroups& g);
  /// Wait for buckets in flight (a step given up) and forget the step.
  void reset_buckets(Communicator& dp);
  /// Copy every parameter's `Tensor Parameter::*field` into a flat buffer.
  void pack(Tensor Parameter::*field, Tensor& flat) const;
  /// f(param, begin, end, shard_pos) for each parameter's part [begin, end)
  /// of this rank's shard (at shard_pos there); `with_padding`: its
  /// trailing_padding counted as part of it (zeros, for the norm's runs).
  void shard_segments(const std::function<void(std::size_t param, index_t begin,
                                                index_t end, index_t shard_pos)>& f,
                      bool with_padding = false) const;
  /// The full flat buffer of a shard, cut into each parameter's local shape.
  std::vector<Tensor> gather_per_parameter(const Tensor& shard, Communicator& dp) const;
  /// This rank's part of per-parameter tensors, into `shard`.
  void scatter_per_parameter(const std::vector<Tensor>& full, Tensor& shard) const;
  /// bf16/fp16 values: the master is more than a copy of them.
  bool mixed_precision() const;

  ParameterList params_;
  AdamWConfig config_;
  Parameter* tied_head_copy_;  ///< Not owned.
  std::vector<index_t> offsets_;  ///< start of each parameter in the flat buffer
  index_t total_ = 0, padded_total_ = 0, shard_begin_ = 0, shard_size_ = 0;
  Tensor master_, m_, v_;  ///< this rank's shard (fp32)
  ops::MultiTensorAdamW update_;  ///< one launch over the shard on the device
  GradNormOnDevice grad_norm_;
  MemorySpace space_ = MemorySpace::Host;  ///< where the parameters and the buffers live
  long step_ = 0;
  BucketOverlap overlap_;
  // Overlap only (buckets_ empty otherwise).
  std::vector<Bucket> buckets_;  ///< in the order the backward completes them
  std::unordered_map<const Parameter*, std::size_t> bucket_of_;  ///< parameter -> bucket
  /// Mixed precision: this rank's 16-bit compute copy of its shard (written
  /// by the update) and the gathered copy of all shards.
  Tensor compute_shard_, compute_flat_;
  /// Every parameter's gradient is a view of grad_flat_; this rank's reduced
  /// shard lands in grad_shard_.
  Tensor grad_flat_, grad_shard_;
  Communicator* dp_ = nullptr;  ///< Not owned; to wait in zero_grad().
  int started_early_ = 0, started_early_last_ = 0;
  /// fp32 values: the gathered masters, the values' storage (under mixed
  /// precision compute_flat_ is).
  Tensor param_flat_;
  int gathers_pending_ = 0, waited_in_forward_ = 0, waited_in_forward_last_ = 0;
};

/// The optimizer the deck asks for; `overlap` applies to the distributed one only.
std::unique_ptr<Optimizer> make_optimizer(ParameterList params, const AdamWConfig& config,
                                          Parameter* tied_head_copy, bool distributed,
                                          Communicator& dp, BucketOverlap overlap = {});

}  // namespace meshtron
