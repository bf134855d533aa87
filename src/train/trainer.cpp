#include "train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "common/error.hpp"
#include "model/bert_model.hpp"
#include "model/t5_model.hpp"
#include "train/metrics.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "ops/ops_cuda.hpp"
#include "parallel/communicator_nccl.hpp"
#include "tensor/device_allocator.hpp"
#include "train/cuda_graph.hpp"
#endif

namespace meshtron {

namespace {

AdamWConfig adam_config(const RunConfig& run) {
  const auto& o = run.optimizer;
  return {o.beta1, o.beta2, o.eps, o.weight_decay, run.training.clip_grad};
}

/// Whether the block's column-parallel linears can take their bias through a
/// ones column (LayerContext::bias_in_weight_gemm): the norm before them
/// writes it (a LayerNorm with a bias) and they have a bias to put there.
bool takes_ones_column(const ModelSpec& m) {
  const NormSpec& n = m.block.norm;
  return n.kind == NormKind::LayerNorm && n.bias && (m.block.attention.bias || m.block.mlp.bias);
}

/// Per task: is it the last backward of its model chunk?
std::vector<bool> last_backward_per_chunk(const std::vector<PipelineTask>& tasks) {
  std::vector<bool> last(tasks.size(), false);
  std::map<int, std::size_t> latest;  // chunk -> index of its latest backward
  for (std::size_t k = 0; k < tasks.size(); ++k)
    if (tasks[k].kind == PipelineTask::Backward) latest[tasks[k].chunk] = k;
  for (const auto& [chunk, k] : latest) last[k] = true;
  return last;
}

// Pipeline point-to-point lanes: activations go rank r -> r + 1 on one lane,
// gradients r -> r - 1 on the other (the direction bit of the message tag).
// On the GPU path messages are matched not by tag but in send order within
// each (sender, receiver, lane) (communicator.hpp), so every lane must be
// received in the order it is sent. It is, for every schedule and for
// evaluate():
//  * An activation of micro-batch b leaves global chunk g in task F(b, g)
//    and is received in task F(b, g + 1). Every schedule (schedule.cpp)
//    runs its forwards in one order that does not depend on the rank (only
//    where the backwards fall between them does): index k of the forward of
//    (b, local chunk c) is (b / pp) pp v + c pp + b % pp under interleaving,
//    b for gpipe / 1f1b, and (b, c) lexicographic in evaluate(). Link
//    r -> r + 1 pairs local chunk c with c, the wrap-around link pp-1 -> 0
//    pairs c with c + 1, whose index is k + pp (evaluate: the next (b, c)):
//    a shift, so the receiver's order equals the sender's.
//  * Gradients likewise: backward k of (b, c) has chunk v - 1 - c in that
//    formula; link r -> r - 1 pairs c with c, wrap-around 0 -> pp-1 pairs c
//    with c - 1, index k + pp.
// tests/gpu/test_gpu_parallel.cpp checks this for many shapes.
constexpr int kActivationLane = 0, kGradientLane = 1, kPipelineLanes = 2;
int lane_of_tag(int tag) { return tag % 2; }  // tag = (...) * 2 + direction

/// `t` in `space`; a host tensor goes to the device through a copy queued
/// on the compute stream (device::upload_bytes), which waits neither for the
/// previous step's update still running there nor makes the host wait.
Tensor queued_in_space(const Tensor& t, MemorySpace space) {
  if (t.space() == space || space == MemorySpace::Host || !t.is_host()) return in_space(t, space);
  Tensor out = Tensor::empty(t.shape(), t.dtype(), space);
  device::upload_bytes(out.raw(), t.raw(), t.bytes());
  return out;
}

/// `batch` with its token ids and targets in `space`, before the schedule
/// (an upload inside it would be a host wait in the middle of the step).
std::vector<MicroBatch> staged_in(const std::vector<MicroBatch>& batch, MemorySpace space) {
  std::vector<MicroBatch> out = batch;
  for (MicroBatch& mb : out) {
    mb.ids = queued_in_space(mb.ids, space);
    mb.targets = queued_in_space(mb.targets, space);
    for (Tensor* optional : {&mb.token_types, &mb.padding_mask, &mb.next_sentence,
                             &mb.decoder_ids, &mb.decoder_padding_mask})
      if (optional->defined()) *optional = queued_in_space(*optional, space);
  }
  return out;
}

/// parallel.tp_copy_engine: the tp group's blocking collectives on the copy
/// engines (NcclCommunicator::use_copy_engine; the deck check makes sure
/// this is the GPU path). Collective over the world: every rank learns
/// whether some tp group spans nodes (CUDA IPC cannot), so all fail alike.
void use_copy_engine(ParallelRuntime& rt, long min_all_reduce_bytes) {
  const int hosts = max_hosts_per_tp_group(gather_rank_map(rt.topo, 0));
  MESH_REQUIRE(hosts == 1, "parallel.tp_copy_engine = true needs every tp group on one node "
                           "(CUDA IPC between its GPUs); a tp group here spans "
                               << hosts << " nodes");
#ifdef MESHTRON_HAVE_CUDA
  auto* nccl = dynamic_cast<NcclCommunicator*>(&rt.tp);
  MESH_REQUIRE(nccl != nullptr, "parallel.tp_copy_engine needs the tp group on NCCL (GPU path)");
  nccl->use_copy_engine(std::size_t(min_all_reduce_bytes));
#else
  (void)min_all_reduce_bytes;
  MESH_REQUIRE(false, "parallel.tp_copy_engine needs the CUDA path");
#endif
}

/// The per-token losses of a step's micro-batches, added in order (none
/// where this rank does not hold the head). With a mark, device losses are
/// read as of that point of the compute stream (StreamMark).
double sum_of_losses(const std::vector<Tensor>& losses, device::StreamMark* mark = nullptr) {
  double sum = 0;
  for (const Tensor& l : losses) {
    if (!l.defined()) continue;
    for (double v : mark ? l.to_doubles_at(*mark) : l.to_doubles()) sum += v;
  }
  return sum;
}

}  // namespace

/// training.cuda_graphs: one micro-batch's forward + backward as a graph
/// over fixed inputs (see cuda_graph.hpp for what a replay may depend on).
struct Trainer::GraphedMicroBatch {
  Tensor ids, targets;  ///< refilled (device copies) before each replay
  /// Dropout's {step, sample offset low, high} (LayerContext::dropout_live),
  /// refilled before each replay from `live_of_step` (all micro-batches'
  /// words, copied to the device once per step).
  Tensor live, live_of_step;
  Tensor dloss;         ///< the loss gradient, refilled when its value changes
  double dloss_value = 0;
  Tensor losses;  ///< per-token losses, written by each replay
  /// The gradients the captured backward overwrites (stale when captured,
  /// GradZeroing::Deferred): each replay writes them, as their first
  /// writer of a one-micro-batch step.
  ParameterList overwritten;
#ifdef MESHTRON_HAVE_CUDA
  std::unique_ptr<CapturedWork> work;
#endif
};

Trainer::~Trainer() = default;

Trainer::Trainer(const RunConfig& run, const ModelSpec& model, ParallelRuntime& rt, DType dtype,
                 const LossScalerConfig& scaler)
    : run_(run), model_spec_(model), rt_(rt), base_ctx_{rt.tp_group} {
  if (dtype == DType::F16) scaler_.emplace(scaler);
  base_ctx_.sequence_parallel = run.parallel.sequence_parallel;
  base_ctx_.keep_gathered_input = run.parallel.sequence_parallel_keep_gathered;
  base_ctx_.split_row_parallel_backward = run.parallel.split_row_parallel_backward;
  base_ctx_.split_column_parallel_forward = run.parallel.split_column_parallel_forward;
  if (run.parallel.tp_copy_engine) use_copy_engine(rt, run.parallel.tp_copy_engine_min_bytes);
  if (run.parallel.tp_interleave) fibers_ = std::make_unique<FiberPair>();
#ifdef MESHTRON_HAVE_CUDA
  if (run.parallel.tp_interleave_streams == 2)
    if (auto* nccl = dynamic_cast<NcclCommunicator*>(&rt.tp)) nccl->separate_interleaved_jobs();
  if (run.run.gemm_autotune) cuda::set_gemm_autotune(true);  // the deck check: run.device = cuda
  cuda::set_fused_attention_kernels(run.training.fused_attention_kernels == "own"
                                        ? cuda::FusedAttentionKernels::Own
                                        : cuda::FusedAttentionKernels::Auto);
#endif
  base_ctx_.seed = run.run.seed;
  base_ctx_.seq_length = model.seq_length;
  base_ctx_.micro_batch = run.training.micro_batch_size;
  base_ctx_.global_batch = run.training.global_batch_size;
  base_ctx_.space = run.run.device == "cuda" ? MemorySpace::Cuda : MemorySpace::Host;
  base_ctx_.recompute = recompute_from_string(run.training.recompute);
  base_ctx_.recompute_num_layers = run.training.recompute_num_layers;
  base_ctx_.logits_in_compute_dtype = run.training.logits_dtype == "compute";
  base_ctx_.attention_dropout_cudnn = run.training.attention_dropout_rng == "cudnn";
  const std::string& ones_column = run.training.bias_in_weight_gemm;
  MESH_REQUIRE(ones_column != "true" || takes_ones_column(model),
               "training.bias_in_weight_gemm = true needs a LayerNorm with a bias before "
               "linears with biases (normalization = LayerNorm, add_bias_linear = true)");
  base_ctx_.bias_in_weight_gemm =
      ones_column == "true" || (ones_column == "auto" && base_ctx_.space == MemorySpace::Cuda &&
                                takes_ones_column(model));

  const int pp = rt.topo.pp();
  if (pp > 1) rt.pp.connect_ring_p2p(kPipelineLanes);  // collective; once per runtime
  virtual_stages_ = run.parallel.schedule == "interleaved" ? run.parallel.virtual_stages : 1;
  const int total_chunks = pp * virtual_stages_;
  // Layers of each global chunk: uniform, the deck's split, or balanced.
  const std::vector<int> chunk_layers =
      run.parallel.chunk_layers(model.num_layers, head_cost_in_layers(model));
  MESH_REQUIRE(int(chunk_layers.size()) == total_chunks,
               "pipeline split of " << chunk_layers.size() << " chunks for " << total_chunks);
  for (int c = 0; c < virtual_stages_; ++c) {
    const int g = global_chunk(c);
    int first = 0;
    for (int k = 0; k < g; ++k) first += chunk_layers[std::size_t(k)];
    StagePlacement place{first, chunk_layers[std::size_t(g)], g == 0, g == total_chunks - 1};
    if (model.model_class == ModelClass::T5)  // Megatron's encoder | decoder split
      place = T5Model::stage_placement(model, g, total_chunks, rt.topo.pipeline_split_rank());
    chunks_.push_back(make_stage(model, place, dtype));
  }
  layers_per_chunk_ = chunks_.front()->placement().num_layers;
  Parameter* tied_copy = nullptr;
  for (auto& chunk : chunks_)
    if (chunk->placement().has_head && !chunk->placement().has_embedding)
      tied_copy = chunk->head_word_weight();
  const BucketOverlap overlap{index_t(run.parallel.grad_bucket_size),
                              run.parallel.overlap_grad_reduce,
                              run.parallel.overlap_param_gather};
  optimizer_ = make_optimizer(parameters(), adam_config(run), tied_copy,
                              run.parallel.distributed_optimizer, rt.dp, overlap);
  optimizer_->set_grad_zeroing(GradZeroing::Deferred);
  // Every forward's context carries it (null unless overlap_param_gather).
  base_ctx_.param_gather = optimizer_->param_gather_hook();
  lr_ = LrSchedule{run.optimizer.lr, run.optimizer.min_lr, run.lr_schedule.warmup_iters,
                   run.lr_schedule.decay_iters, run.lr_schedule.decay_style};
}

std::unique_ptr<StageModel> Trainer::make_stage(const ModelSpec& model,
                                                const StagePlacement& place, DType dtype) {
  if (model.model_class == ModelClass::BertPretraining)
    return std::make_unique<BertModel>(model, place, base_ctx_, dtype, run_.run.seed);
  if (model.model_class == ModelClass::T5)
    return std::make_unique<T5Model>(model, place, base_ctx_, dtype, run_.run.seed);
  return std::make_unique<GptModel>(model, place, base_ctx_, dtype, run_.run.seed);
}

index_t Trainer::loss_tokens_per_step() const {
  return index_t(model_spec_.loss_length()) * run_.training.global_batch_size;
}

std::vector<GptModel*> Trainer::gpt_chunks() {
  std::vector<GptModel*> out;
  for (auto& chunk : chunks_) {
    auto* gpt = dynamic_cast<GptModel*>(chunk.get());
    MESH_REQUIRE(gpt != nullptr, "generation needs a GPT model (model.arch), not BERT or T5");
    out.push_back(gpt);
  }
  return out;
}

OptimizerGroups Trainer::optimizer_groups() {
  OptimizerGroups groups = rt_.optimizer_groups();
  // T5's encoder and decoder stages share the word table even when untied.
  if (!model_spec_.tie_word_embeddings && model_spec_.model_class != ModelClass::T5)
    groups.embedding = nullptr;
  return groups;
}

ParameterList Trainer::parameters() {
  // Callers read the values (checkpoints, exports, tests): under
  // overlap_param_gather the last step's gathers may still be in flight.
  if (optimizer_) optimizer_->finish_param_gather();
  ParameterList out;
  for (auto& chunk : chunks_)
    for (Parameter* p : chunk->parameters()) out.push_back(p);
  return out;
}

LayerContext Trainer::context_for(const MicroBatch& mb, long step, bool training) const {
  LayerContext ctx = base_ctx_;
  ctx.step = std::uint32_t(step);
  ctx.training = training;
  ctx.sample_offset = mb.sample_offset;
  ctx.attention_masks_drawn = training && masks_ahead_for_ == mb.sample_offset;
  return ctx;
}

void Trainer::draw_masks_ahead(long step, const std::vector<MicroBatch>& batch) {
  masks_ahead_for_.reset();
  if (!run_.training.attention_masks_ahead || base_ctx_.space == MemorySpace::Host ||
      batch.empty())
    return;
  if (run_.training.cuda_graphs && batch.size() > 1) return;  // one graph replays every micro-batch
  const LayerContext ctx = context_for(batch.front(), step, /*training=*/true);
  const auto draws = [&](const auto& chunk) { return chunk->draws_attention_masks_ahead(ctx); };
  if (!std::any_of(chunks_.begin(), chunks_.end(), draws)) return;  // no fork, no join
  // After the previous step's backward, the last reader of the layers' mask
  // buffers; the first draws (which make the buffers) after everything.
  if (losses_written_.recorded())
    mask_stream_.fork_after(losses_written_);
  else
    mask_stream_.fork_now();
  for (auto& chunk : chunks_)
    if (draws(chunk)) chunk->draw_attention_masks_ahead(ctx, mask_stream_.raw());
  mask_stream_.join();
  masks_ahead_for_ = batch.front().sample_offset;
}

std::vector<Tensor> Trainer::run_schedule(const std::vector<PipelineTask>& tasks,
                                          const std::vector<MicroBatch>& host_batch, long step,
                                          bool training, const HeadCacheFn& on_head) {
  // Graphs from the second step on: the first, eager, chooses the GEMM
  // algorithms and makes the plans and workspaces a capture must not make.
  if (training && run_.training.cuda_graphs && steps_run_ > 0) return run_graphed(host_batch, step);
  const std::vector<MicroBatch> batch = staged_in(host_batch, base_ctx_.space);
  const int pp = rt_.topo.pp(), rank = rt_.topo.pp_rank();
  const int total_chunks = pp * virtual_stages_;
  // Every head backward of the step starts from this same constant (read
  // only): filled once, before the first kernel, not once per micro-batch.
  Tensor dloss;
  if (training) dloss = filled_dloss();
  // Messages are tagged by (micro-batch, receiving chunk, lane = direction).
  auto tag = [&](int mb, int g, int dir) { return (mb * total_chunks + g) * 2 + dir; };

  std::map<std::pair<int, int>, std::unique_ptr<StageCache>> caches;
  std::vector<Tensor> in_flight_sends;  // kept alive until wait_sends()
  // Per-token losses of the micro-batches this rank heads, by micro-batch
  // (summed in that order whatever order the forwards ran in).
  std::vector<Tensor> losses(batch.size());
  // A chunk's gradients are final during its last backward task: that task
  // reports them to the optimizer, which may start reducing them
  // (parallel.overlap_grad_reduce; earlier micro-batches only accumulate).
  const std::vector<bool> final_backward = last_backward_per_chunk(tasks);
  OptimizerGroups groups = optimizer_groups();
  auto grads_done = [&](const ParameterList& done) {
    optimizer_->grads_ready(done, groups);
    rt_.dp.progress();  // Open MPI advances the started buckets only inside MPI calls
  };
  auto run_task = [&](std::size_t k) {
    const PipelineTask& t = tasks[k];
    rt_.pp.progress();  // advance the sends of earlier tasks
    rt_.dp.progress();  // and the gradient buckets
    StageModel& chunk = *chunks_[std::size_t(t.chunk)];
    const int g = global_chunk(t.chunk);
    const MicroBatch& mb = batch[std::size_t(t.micro_batch)];
    if (training) tell_watchdog(step, t.micro_batch);
    LayerContext ctx = context_for(mb, step, training);
    std::unique_ptr<StageCache>& cached = caches[{t.micro_batch, t.chunk}];
    if (!cached) cached = chunk.make_cache();
    StageCache& cache = *cached;
    if (t.kind == PipelineTask::Forward) {
      Tensor input = mb.ids;
      if (g > 0) {
        input = Tensor::empty(chunk.input_shape(mb, ctx), chunk.parameters()[0]->value.dtype(),
                              ctx.space);
        receive(input, (rank + pp - 1) % pp, tag(t.micro_batch, g, kActivationLane));
      }
      Tensor out = chunk.forward(input, mb, ctx, cache);
      if (chunk.placement().has_head) {
        // Summed after the schedule: no host wait mid-step.
        losses[std::size_t(t.micro_batch)] = out;
        if (on_head) on_head(t.micro_batch, cache);
        if (!training) caches.erase({t.micro_batch, t.chunk});
      } else {
        rt_.pp.isend(out.raw(), std::size_t(out.numel()), out.dtype(), (rank + 1) % pp,
                     tag(t.micro_batch, g + 1, kActivationLane), kActivationLane);
        in_flight_sends.push_back(out);
        if (!training) caches.erase({t.micro_batch, t.chunk});
      }
    } else {
      Tensor dout;
      if (chunk.placement().has_head) {
        dout = dloss;
      } else {
        dout = Tensor::empty(chunk.output_shape(mb, ctx), chunk.parameters()[0]->value.dtype(),
                             ctx.space);
        receive(dout, (rank + 1) % pp, tag(t.micro_batch, g, kGradientLane));
      }
      Tensor dx = chunk.backward(dout, ctx, cache, training && final_backward[k]
                                                      ? grads_done
                                                      : std::function<void(const ParameterList&)>{});
      caches.erase({t.micro_batch, t.chunk});
      if (g > 0) {
        rt_.pp.isend(dx.raw(), std::size_t(dx.numel()), dx.dtype(), (rank + pp - 1) % pp,
                     tag(t.micro_batch, g - 1, kGradientLane), kGradientLane);
        in_flight_sends.push_back(dx);
      }
    }
  };
  if (training && fibers_)
    run_interleaved(tasks, run_task);
  else
    for (std::size_t k = 0; k < tasks.size(); ++k) run_task(k);
  if (training) tell_watchdog(step, -1);
  const auto t0 = std::chrono::steady_clock::now();
  rt_.pp.wait_sends();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return losses;
}

namespace {

/// Makes `comm` yield to `fibers` (Communicator::set_interleave) for a scope.
class ScopedInterleave {
 public:
  ScopedInterleave(Communicator& comm, FiberPair& fibers) : comm_(comm) {
    comm_.set_interleave(&fibers);
  }
  ~ScopedInterleave() { comm_.set_interleave(nullptr); }
  ScopedInterleave(const ScopedInterleave&) = delete;
  ScopedInterleave& operator=(const ScopedInterleave&) = delete;

 private:
  Communicator& comm_;
};

}  // namespace

void Trainer::run_interleaved(const std::vector<PipelineTask>& tasks,
                              const std::function<void(std::size_t)>& run_task) {
  // One stage (the deck check): each micro-batch's tasks, in schedule order.
  std::vector<std::vector<std::size_t>> of_micro_batch;
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    const auto m = std::size_t(tasks[k].micro_batch);
    if (m >= of_micro_batch.size()) of_micro_batch.resize(m + 1);
    of_micro_batch[m].push_back(k);
  }
  auto job = [&](std::size_t m) {
    return [&run_task, &of_micro_batch, m] {
      for (std::size_t k : of_micro_batch[m]) run_task(k);
    };
  };
  ScopedInterleave yield_at_tp_collectives(rt_.tp, *fibers_);
  std::size_t m = 0;
  for (; m + 1 < of_micro_batch.size(); m += 2) fibers_->run(job(m), job(m + 1));
  if (m < of_micro_batch.size()) job(m)();  // an odd one out runs alone
}

double Trainer::dloss_value() const {
  // Under fp16 the backward starts from the scaled dloss (loss_scaler.hpp).
  return (scaler_ ? scaler_->scale() : 1.0) /
         double(loss_tokens_per_step());
}

Tensor Trainer::filled_dloss() const {
  const DType activations = chunks_[0]->parameters()[0]->value.dtype();
  Tensor dloss = Tensor::empty({index_t(model_spec_.loss_length()) * base_ctx_.micro_batch},
                               stats_dtype(activations, base_ctx_.space), base_ctx_.space);
  dloss.fill(dloss_value());
  return dloss;
}

#ifdef MESHTRON_HAVE_CUDA
namespace {

/// Dropout's device words of every micro-batch of a step, 4 per micro-batch:
/// {step, sample offset low, sample offset high, 0}, in one tensor so that
/// one host -> device copy serves the step. That copy is queued on the
/// compute stream (queued_in_space): a blocking copy (Tensor::to_space) from
/// pageable memory first waits for the stream, so the host would sit idle
/// until the previous step's update had finished and the GPU then wait
/// ~0.15 ms for the host to launch the copies and the graph (124M on an
/// H100, a traced step of perf/e2e_gpu.py).
Tensor dropout_words(const std::vector<MicroBatch>& batch, long step, MemorySpace space) {
  Tensor words_host = Tensor::empty({index_t(4 * batch.size())}, DType::I32);
  auto* words = static_cast<std::uint32_t*>(words_host.raw());
  for (std::size_t m = 0; m < batch.size(); ++m) {
    const auto offset = std::uint64_t(batch[m].sample_offset);
    words[4 * m + 0] = std::uint32_t(step);
    words[4 * m + 1] = std::uint32_t(offset);
    words[4 * m + 2] = std::uint32_t(offset >> 32);
    words[4 * m + 3] = 0;
  }
  return queued_in_space(words_host, space);
}

}  // namespace

void Trainer::capture_micro_batch(const MicroBatch& first) {
  StageModel& model = *chunks_[0];
  auto g = std::make_unique<GraphedMicroBatch>();
  g->ids = Tensor::empty(first.ids.shape(), first.ids.dtype(), base_ctx_.space);
  g->targets = Tensor::empty(first.targets.shape(), first.targets.dtype(), base_ctx_.space);
  g->dloss = filled_dloss();
  g->dloss_value = dloss_value();
  // The eager step's cached blocks go back to CUDA: the graph's private
  // pool takes its own, and both would otherwise stay reserved.
  device::release_cached();
  g->live = Tensor::empty({4}, DType::I32, base_ctx_.space);
  // Dropout reads the step and sample offset from g->live at run time, so
  // the captured arguments hold neither.
  LayerContext ctx = context_for(first, 0, /*training=*/true);
  ctx.sample_offset = 0;
  ctx.dropout_live = static_cast<const std::uint32_t*>(g->live.raw());
  ParameterList stale;
  for (Parameter* p : model.parameters())
    if (p->grad_stale) stale.push_back(p);
  g->work = std::make_unique<CapturedWork>([&] {
    LayerContext c = ctx;
    const std::unique_ptr<StageCache> cache = model.make_cache();
    MicroBatch replayed = first;
    replayed.ids = g->ids;
    replayed.targets = g->targets;
    g->losses = model.forward(g->ids, replayed, c, *cache);
    model.backward(g->dloss, c, *cache, {});
  });
  for (Parameter* p : stale)
    if (!p->grad_stale) g->overwritten.push_back(p);
  graphed_ = std::move(g);
}
#endif

std::vector<Tensor> Trainer::run_graphed(const std::vector<MicroBatch>& host_batch, long step) {
#ifdef MESHTRON_HAVE_CUDA
  // The deck check (require_capturable) gives pp = 1: one chunk, whose
  // tasks are F0 B0 F1 B1 ..., no pipeline messages, no hooks; tp's NCCL
  // collectives (and their side-stream events) are captured like kernels.
  const std::vector<MicroBatch> batch = staged_in(host_batch, base_ctx_.space);
  if (!graphed_) {
    // One graph replays every micro-batch: only the first may overwrite
    // the gradients, so with more the optimizer zeroes them (now, too).
    if (batch.size() > 1 && optimizer_->grad_zeroing() == GradZeroing::Deferred) {
      optimizer_->set_grad_zeroing(GradZeroing::Memset);
      optimizer_->zero_grad();
    }
    capture_micro_batch(batch[0]);
  }
  GraphedMicroBatch& g = *graphed_;
  MESH_VERIFY(batch.size() == 1 || g.overwritten.empty(),
              "training.cuda_graphs: a graph that overwrites the gradients replays one "
              "micro-batch per step, not " << batch.size());
  if (g.dloss_value != dloss_value()) {  // fp16: the loss scale moved
    g.dloss_value = dloss_value();
    g.dloss.fill(g.dloss_value);
  }
  g.live_of_step = dropout_words(batch, step, base_ctx_.space);
  std::vector<Tensor> losses;
  for (std::size_t m = 0; m < batch.size(); ++m) {
    const MicroBatch& mb = batch[m];
    g.ids.copy_from(mb.ids);  // device copies, queued before the replay
    g.targets.copy_from(mb.targets);
    device::copy_device_bytes(g.live.raw(),
                              static_cast<const char*>(g.live_of_step.raw()) + 16 * m, 16);
    g.work->replay();
    for (Parameter* p : g.overwritten) p->grad_stale = false;  // what the capture's host code did
    losses.push_back(g.losses.clone());  // the next replay overwrites them
  }
  return losses;
#else
  (void)host_batch;
  (void)step;
  MESH_REQUIRE(false, "training.cuda_graphs needs the CUDA path");
  return {};
#endif
}

void Trainer::receive(Tensor& t, int peer, int tag) {
  const auto t0 = std::chrono::steady_clock::now();
  rt_.pp.recv(t.raw(), std::size_t(t.numel()), t.dtype(), peer, tag, lane_of_tag(tag));
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Trainer::tell_watchdog(long step, int micro_batch) {
  if (CollectiveWatchdog* dog = rt_.watchdog()) dog->set_position(step, micro_batch);
}

double Trainer::reduce_loss(double local_sum, index_t tokens) {
  // Only the last stage holds losses (identical on its tp ranks): sum over
  // the pipeline, then over dp.
  const double stage_sum = rt_.pp.all_reduce_scalar(local_sum);
  return rt_.dp.all_reduce_scalar(stage_sum) / double(tokens);
}

StepReport Trainer::train_step(long step, const std::vector<MicroBatch>& batch) {
  ScheduleShape shape{run_.parallel.schedule, rt_.topo.pp(), virtual_stages_,
                      int(batch.size())};
  const auto tasks = schedule_tasks(shape, rt_.topo.pp_rank());
  wait_seconds_ = 0;
  tell_watchdog(step, -1);
  const auto t0 = std::chrono::steady_clock::now();
  const long switches_before = fibers_ ? fibers_->switches() : 0;
  draw_masks_ahead(step, batch);
  const std::vector<Tensor> losses = run_schedule(tasks, batch, step, /*training=*/true);
  if (base_ctx_.space != MemorySpace::Host) losses_written_.record();
  ++steps_run_;
  StepReport r;
  r.schedule_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.wait_seconds = wait_seconds_;
  r.step = step;
  r.max_in_flight = fibers_ ? 2 : max_in_flight(tasks);
  r.interleave_switches = fibers_ ? fibers_->switches() - switches_before : 0;
  r.lr = lr_.at(step);
  r.loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const bool guard = run_.training.check_for_nan;
  OptimizerGroups groups = optimizer_groups();
  // The update is queued before the loss is read, so that the device never
  // waits for the host inside the step. check_for_nan still skips a step
  // whose loss is not finite: such a loss comes from non-finite logits, whose
  // gradients (and so the global norm) are not finite either, and the
  // update kernel skips on the norm. The loss scaler always skips a
  // non-finite step: overflow is its signal.
  const StepStats stats = optimizer_->step(r.lr, groups, guard || scaler_.has_value(),
                                           scaler_ ? scaler_->inverse_scale() : 1.0);
  r.loss = reduce_loss(sum_of_losses(losses, &losses_written_),
                       loss_tokens_per_step());
  MESH_REQUIRE(!guard || std::isfinite(r.loss) || stats.skipped,
               "iteration " << step << ": the loss is " << r.loss
                            << " but the gradient norm is finite (" << stats.grad_norm
                            << "), so check_for_nan could not skip the update");
  r.grad_norm = stats.grad_norm;
  r.skipped = stats.skipped;
  if (scaler_) {
    r.overflow = stats.skipped;
    scaler_->update(stats.skipped);
  }
  return r;
}

std::vector<Tensor> Trainer::forward_only(const std::vector<MicroBatch>& batch,
                                          const HeadCacheFn& on_head) {
  std::vector<PipelineTask> tasks;
  for (int m = 0; m < int(batch.size()); ++m)
    for (int c = 0; c < virtual_stages_; ++c) tasks.push_back({PipelineTask::Forward, m, c});
  // Chunks must run in dependency order per micro-batch: forward of chunk c
  // before c + 1, which the loop above gives.
  return run_schedule(tasks, batch, 0, /*training=*/false, on_head);
}

void Trainer::evaluate_heads(const std::vector<MicroBatch>& batch, const HeadCacheFn& on_head) {
  forward_only(batch, on_head);
}

double Trainer::evaluate(const std::vector<MicroBatch>& batch) {
  const double local = sum_of_losses(forward_only(batch));
  return reduce_loss(local, loss_tokens_per_step());
}

LossSum Trainer::evaluate_sum(const std::vector<MicroBatch>& batch) {
  // The masks apply to the per-token losses once read on the host, so the
  // loss kernels (host and CUDA) stay as they are: a padded target is a
  // valid id whose loss is computed and dropped, never added (even if it
  // were not finite).
  const std::vector<Tensor> losses = forward_only(batch);
  LossSum local;
  for (std::size_t m = 0; m < losses.size(); ++m) {
    if (!losses[m].defined()) continue;
    const std::vector<double> values = losses[m].to_doubles();
    const Tensor& mask = batch[m].loss_mask;
    MESH_VERIFY(!mask.defined() || mask.numel() == index_t(values.size()),
                "loss mask of " << mask.numel() << " for " << values.size() << " losses");
    const float* keep = mask.defined() ? mask.data<float>() : nullptr;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (keep && keep[i] == 0.0f) continue;
      local.sum += values[i];
      local.tokens += 1;
    }
  }
  // As reduce_loss: the last stage's tp ranks hold the same values; sum
  // over the pipeline (the other stages add zeros), then over dp.
  LossSum total;
  total.sum = rt_.dp.all_reduce_scalar(rt_.pp.all_reduce_scalar(local.sum));
  total.tokens = rt_.dp.all_reduce_scalar(rt_.pp.all_reduce_scalar(local.tokens));
  return total;
}

}  // namespace meshtron
