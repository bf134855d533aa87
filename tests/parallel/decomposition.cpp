#include "decomposition.hpp"

#include <algorithm>
#include <cmath>

#include "config/model_spec_from_deck.hpp"
#include "model/bert_model.hpp"

namespace meshtron::testing {

std::string Layout::name() const {
  const bool bert = std::find(overrides.begin(), overrides.end(), "model.arch=bert") != overrides.end();
  std::string n = std::string(bert ? "bert" : "gpt") + "_tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" +
                  std::to_string(dp) + "_" + schedule;
  if (distributed_optimizer) n += "_distopt";
  if (sequence_parallel) n += "_sp";
  return n;
}

RunConfig tiny_config(const Layout& l, int world, MemorySpace space) {
  std::vector<std::string> overrides{
      "parallel.tensor_parallel=" + std::to_string(l.tp),
      "parallel.pipeline_parallel=" + std::to_string(l.pp),
      "parallel.data_parallel=" + std::to_string(l.dp),
      "parallel.schedule=" + l.schedule,
      "parallel.virtual_stages=" + std::string(l.schedule == "interleaved" ? "2" : "1"),
      "parallel.distributed_optimizer=" + std::string(l.distributed_optimizer ? "true" : "false"),
      "parallel.sequence_parallel=" + std::string(l.sequence_parallel ? "true" : "false")};
  overrides.insert(overrides.end(), l.overrides.begin(), l.overrides.end());
  // The GPU path's device before validation (deck checks depend on it),
  // unless the layout's overrides name it (a key may be set only once).
  const bool names_device = std::any_of(l.overrides.begin(), l.overrides.end(), [](const auto& o) {
    return o.rfind("run.device=", 0) == 0;
  });
  if (space == MemorySpace::Cuda && !names_device) overrides.push_back("run.device=cuda");
  RunConfig c = RunConfig::from_text(R"(
[run]
seed = 42
[model]
num_layers = 8
hidden_size = 32
num_attention_heads = 8
seq_length = 8
vocab_size = 100
make_vocab_size_divisible_by = 8
hidden_dropout = 0.1
attention_dropout = 0.1
[training]
micro_batch_size = 1
global_batch_size = 16
train_iters = 3
clip_grad = 0.5
[optimizer]
lr = 3e-3
min_lr = 3e-4
weight_decay = 0.1

[lr_schedule]
warmup_iters = 1
decay_style = cosine
)",
                                     overrides);
  c.validate(world);
  return c;
}

namespace {

/// Global tensor of `name` assembled from every rank's shard (sum over the
/// communicator, each element contributed by exactly one rank).
std::vector<double> gather_global(Trainer& trainer, const std::string& name,
                                  const Shape& global_shape, MPI_Comm comm) {
  auto& topo = trainer.runtime().topo;
  std::vector<double> global(std::size_t(shape_numel(global_shape)), 0.0);
  for (Parameter* p : trainer.parameters()) {
    if (p->name != name) continue;
    const bool is_head_copy = [&] {
      for (auto& chunk : trainer.chunks())
        if (chunk->head_word_weight() == p && !chunk->placement().has_embedding) return true;
      return false;
    }();
    if (topo.dp_rank() != 0 || is_head_copy || p->stage_copy ||
        (p->tp_replicated() && topo.tp_rank() != 0))
      continue;
    const Tensor value = p->value.is_host() ? p->value : p->value.to_host();
    for_each_global_index(*p, topo.tp_rank(), topo.tp(), [&](index_t local, index_t g) {
      if (g < index_t(global.size()))
        global[std::size_t(g)] = element_as_double(value, local);
    });
  }
  MPI_Allreduce(MPI_IN_PLACE, global.data(), int(global.size()), MPI_DOUBLE, MPI_SUM, comm);
  return global;
}

/// Names and global shapes of the whole model (from a 1-rank model).
std::vector<std::pair<std::string, Shape>> all_parameters(const RunConfig& config) {
  MpiCommunicator self(MPI_COMM_SELF);
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  const ModelSpec model = model_spec_from_deck(config, 100, 1);
  const StagePlacement whole = StagePlacement::whole_model(model.num_layers);
  std::unique_ptr<StageModel> full;
  if (model.model_class == ModelClass::BertPretraining)
    full = std::make_unique<BertModel>(model, whole, ctx, DType::F32, 0);
  else
    full = std::make_unique<GptModel>(model, whole, ctx, DType::F32, 0);
  std::vector<std::pair<std::string, Shape>> out;
  for (Parameter* p : full->parameters()) out.push_back({p->name, p->global_shape});
  return out;
}

}  // namespace

RunResult train_layout(MPI_Comm comm, const Layout& layout, DType dtype, int steps,
                       MemorySpace space) {
  int world = 1;
  MPI_Comm_size(comm, &world);
  RunConfig config = tiny_config(layout, world, space);
  ParallelRuntime rt(comm, config.degrees(), space);
  const ModelSpec model = model_spec_from_deck(config, 100, rt.topo.tp());
  Trainer trainer(config, model, rt, dtype);
  DataLayout data{model.seq_length, config.training.micro_batch_size,
                  config.training.global_batch_size, rt.topo.dp_rank(), rt.topo.dp(),
                  config.training.train_iters, 1, config.run.seed};
  auto source = model.model_class == ModelClass::BertPretraining
                    ? make_synthetic_bert_data(data, 100)
                    : make_synthetic_data(data, 100);
  RunResult result;
  for (long step = 1; step <= steps; ++step) {
    rt.dp.reset_stats();
    const StepReport r = trainer.train_step(step, source->train_step(step));
    result.buckets_started_early.push_back(trainer.optimizer().buckets_started_early());
    result.dp_nonblocking_started.push_back(rt.dp.nonblocking_started());
    result.losses.push_back(r.loss);
    result.grad_norms.push_back(r.grad_norm);
    result.max_in_flight.push_back(r.max_in_flight);
    result.interleave_switches.push_back(r.interleave_switches);
  }
  result.optimizer_state_bytes = trainer.optimizer().moment_bytes();
  if (auto* d = dynamic_cast<DistributedAdamW*>(&trainer.optimizer()))
    result.bucket_count = d->bucket_count();
  for (const auto& [name, shape] : all_parameters(config))
    result.params[name] = gather_global(trainer, name, shape, comm);
  return result;
}

double norm_rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

std::vector<double> MemorisedRun::losses() const {
  std::vector<double> out;
  for (const StepReport& r : steps) out.push_back(r.loss);
  return out;
}

MemorisedRun memorise(const std::vector<std::string>& overrides, DType dtype, int steps,
                      const LossScalerConfig& scaler) {
  Layout layout;
  layout.overrides = overrides;
  layout.overrides.push_back("training.train_iters=" + std::to_string(steps));
  RunConfig config = tiny_config(layout, 1);
  const MemorySpace space = config.run.device == "cuda" ? MemorySpace::Cuda : MemorySpace::Host;
  ParallelRuntime rt(MPI_COMM_SELF, config.degrees(), space);
  const ModelSpec model = model_spec_from_deck(config, 100, 1);
  Trainer trainer(config, model, rt, dtype, scaler);
  DataLayout data{model.seq_length, config.training.micro_batch_size,
                  config.training.global_batch_size, 0, 1, steps, 1, config.run.seed};
  const auto batch = make_synthetic_data(data, 100)->train_step(1);
  MemorisedRun run;
  for (long step = 1; step <= steps; ++step) run.steps.push_back(trainer.train_step(step, batch));
  run.optimizer_steps = trainer.optimizer().step_count();
  for (Parameter* p : trainer.parameters()) run.params[p->name] = p->value.to_doubles();
  return run;
}

ops::DropoutSite attention_probs_site(index_t batch, index_t heads, index_t S,
                                      index_t sample_offset, index_t head_offset,
                                      index_t heads_global) {
  ops::DropoutSite site;
  site.seed = 1234;
  site.step = 7;
  site.stream = 3;
  site.a = batch;
  site.b = heads;
  site.c = S * S;
  site.a_offset = sample_offset;
  site.b_offset = head_offset;
  site.b_global = heads_global > 0 ? heads_global : heads;
  site.c_global = S * S;
  return site;
}

}  // namespace meshtron::testing
