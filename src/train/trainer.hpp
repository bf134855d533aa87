// Trainer: one training step = the pipeline schedule over this rank's
// micro-batches, then the optimizer step. Works for any (tp, pp, dp),
// with or without sequence parallelism and the distributed optimizer.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "config/run_config.hpp"
#include "model/gpt_model.hpp"
#include "parallel/fiber_pair.hpp"
#include "train/data_source.hpp"
#include "train/loss_scaler.hpp"
#include "train/lr_schedule.hpp"
#include "train/runtime.hpp"
#include "train/schedule.hpp"

namespace meshtron {

/// Per-token losses added over the tokens that count, and their number.
struct LossSum {
  double sum = 0;
  double tokens = 0;
};

struct StepReport {
  long step = 0;
  double loss = 0;       ///< mean over the global batch's tokens
  double grad_norm = 0;  ///< before clipping
  double lr = 0;
  bool skipped = false;  ///< NaN/Inf: no update
  bool overflow = false; ///< skipped by the fp16 loss scaler (counted apart from NaN)
  double loss_scale = 1; ///< the scale this step's backward ran with
  int max_in_flight = 0; ///< micro-batches alive at once on this rank
  double schedule_seconds = 0;  ///< forward + backward of all micro-batches
  double wait_seconds = 0;      ///< of which blocked on pipeline receives (bubble)
  /// parallel.tp_interleave: switches between the paired micro-batches.
  long interleave_switches = 0;
};

class Trainer {
 public:
  /// `dtype` F16 adds a dynamic loss scaler (`scaler`'s settings).
  Trainer(const RunConfig& run, const ModelSpec& model, ParallelRuntime& rt, DType dtype,
          const LossScalerConfig& scaler = {});
  ~Trainer();

  /// Forward, backward and update for step `step` (1-based) on `batch`
  /// (this dp rank's micro-batches).
  StepReport train_step(long step, const std::vector<MicroBatch>& batch);
  /// Mean loss of `batch` without dropout or update.
  double evaluate(const std::vector<MicroBatch>& batch);
  /// `batch` without dropout or update: the per-token losses its loss masks
  /// keep (MicroBatch::loss_mask), added, and their count, each summed over
  /// the pipeline and dp (everyone's copy). Any number of micro-batches, the
  /// same on every dp rank.
  LossSum evaluate_sum(const std::vector<MicroBatch>& batch);

  /// Called with each micro-batch's index and the cache of the stage that
  /// heads it, on that (last) stage only, after its forward.
  using HeadCacheFn = std::function<void(int micro_batch, const StageCache& cache)>;
  /// `batch` without dropout or update through the evaluation schedule (any
  /// pipeline): the scores a model keeps beside its per-token loss (BERT's
  /// binary head, T5's labelled tokens) read from the head's cache.
  void evaluate_heads(const std::vector<MicroBatch>& batch, const HeadCacheFn& on_head);

  /// The layers' context of `mb` in a forward without dropout.
  LayerContext evaluation_context(const MicroBatch& mb) const {
    return context_for(mb, 0, /*training=*/false);
  }

  /// This rank's parameters over all its model chunks, with their updated
  /// values (completes an overlapped parameter all-gather still in flight).
  ParameterList parameters();
  std::vector<std::unique_ptr<StageModel>>& chunks() { return chunks_; }
  /// The chunks as GPT models, for generation (a UserError for BERT).
  std::vector<GptModel*> gpt_chunks();
  Optimizer& optimizer() { return *optimizer_; }
  const LrSchedule& schedule() const { return lr_; }
  /// The fp16 loss scaler; null under fp32 and bf16 (scale 1).
  DynamicLossScaler* loss_scaler() { return scaler_ ? &*scaler_ : nullptr; }
  ParallelRuntime& runtime() { return rt_; }
  /// The runtime's groups for the optimizer, without the embedding group
  /// when the head is untied (no word table copy to keep in sync).
  OptimizerGroups optimizer_groups();

  /// Layers of this rank's first model chunk (interleaving makes more,
  /// smaller chunks; parallel.pipeline_layers may make stages unequal).
  int layers_per_chunk() const { return layers_per_chunk_; }
  /// Whether the last train_step drew its first micro-batch's attention
  /// masks ahead (training.attention_masks_ahead where it applies).
  bool masks_drawn_ahead() const { return masks_ahead_for_.has_value(); }

 private:
  /// Runs `tasks` over the micro-batches; returns the per-token losses of
  /// each micro-batch on the last stage (none elsewhere), not yet read.
  /// `on_head` (evaluation) sees the head's cache after each forward.
  std::vector<Tensor> run_schedule(const std::vector<PipelineTask>& tasks,
                                   const std::vector<MicroBatch>& batch, long step,
                                   bool training, const HeadCacheFn& on_head = {});
  /// parallel.tp_interleave: the micro-batches' tasks in pairs on fibers_,
  /// switching at the tp group's collectives.
  void run_interleaved(const std::vector<PipelineTask>& tasks,
                       const std::function<void(std::size_t)>& run_task);
  /// training.cuda_graphs from the second step of this process on: each
  /// micro-batch's forward + backward replayed from one graph.
  std::vector<Tensor> run_graphed(const std::vector<MicroBatch>& batch, long step);
  /// Makes graphed_: buffers shaped like `first`, and the capture of one
  /// micro-batch's forward + backward over them (CUDA builds).
  void capture_micro_batch(const MicroBatch& first);
  /// Per-token losses of a step, whose mean is its loss: global batch x
  /// ModelSpec::loss_length() (T5: the decoder's positions).
  index_t loss_tokens_per_step() const;
  /// The loss gradient's value at this step (the scale under fp16).
  double dloss_value() const;
  /// The head backward's input: dloss_value() for each of a micro-batch's tokens.
  Tensor filled_dloss() const;
  /// A blocking receive from the pipeline neighbour, timed into wait_seconds_.
  void receive(Tensor& t, int peer, int tag);
  LayerContext context_for(const MicroBatch& mb, long step, bool training) const;
  /// The model part of `place`: a GptModel, a BertModel, or a T5Model (whole model only).
  std::unique_ptr<StageModel> make_stage(const ModelSpec& model, const StagePlacement& place,
                                         DType dtype);
  /// training.attention_masks_ahead: batch[0]'s attention-dropout masks
  /// drawn on mask_stream_ before the step's work is queued (sets
  /// masks_ahead_for_ where the layers drew them).
  void draw_masks_ahead(long step, const std::vector<MicroBatch>& batch);
  int global_chunk(int chunk) const { return chunk * rt_.topo.pp() + rt_.topo.pp_rank(); }
  /// The position a watchdog report names (micro_batch -1: outside the
  /// schedule); nothing when parallel.collective_timeout_s is off.
  void tell_watchdog(long step, int micro_batch);
  /// Sum over the pipeline and dp of a last-stage quantity: everyone's copy.
  double reduce_loss(double local_sum, index_t tokens);
  /// The per-token losses of `batch`, forward only (none off the last stage).
  std::vector<Tensor> forward_only(const std::vector<MicroBatch>& batch,
                                   const HeadCacheFn& on_head = {});

  const RunConfig& run_;
  ModelSpec model_spec_;
  ParallelRuntime& rt_;
  LayerContext base_ctx_;
  int virtual_stages_ = 1;
  int layers_per_chunk_ = 0;
  std::vector<std::unique_ptr<StageModel>> chunks_;
  std::unique_ptr<Optimizer> optimizer_;
  LrSchedule lr_;
  std::optional<DynamicLossScaler> scaler_;  ///< fp16 only
  double wait_seconds_ = 0;
  long steps_run_ = 0;  ///< train_step calls so far in this process
  struct GraphedMicroBatch;  ///< training.cuda_graphs (CUDA builds)
  std::unique_ptr<GraphedMicroBatch> graphed_;
  std::unique_ptr<FiberPair> fibers_;  ///< parallel.tp_interleave only
  /// The end of a training step's backward: its losses are read from there
  /// once the optimizer update is queued behind it.
  device::StreamMark losses_written_;
  /// Draws the masks of the step's first micro-batch after the previous
  /// step's backward (losses_written_), beside its update.
  device::SideStream mask_stream_;
  /// The sample offset of the micro-batch whose masks mask_stream_ drew
  /// for this step (its LayerContext says attention_masks_drawn).
  std::optional<index_t> masks_ahead_for_;
};

}  // namespace meshtron
