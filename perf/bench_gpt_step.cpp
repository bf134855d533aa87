// End-to-end host training throughput (fp32, one rank, tp = pp = dp = 1).
//
//   (a) gpt_tiny_step: one full training step of input_decks/gpt-tiny.deck
//       (2 layers, h 128, 4 heads, vocab 50257 padded to 50304): forward,
//       backward and AdamW (clipping, weight decay) with micro batch 4,
//       seq 64, dropout off, random tokens.
//   (b) gpt2_124m_layer: forward + backward of one GPT-2 124M transformer
//       layer (h 768, 12 heads, ffn 3072) at seq 1024, micro batch 1.
//
//   ./build/perf/bench_gpt_step               (the deck is found via MESHTRON_SOURCE_DIR)
//   OPENBLAS_NUM_THREADS=1 ./build/perf/bench_gpt_step --benchmark_repetitions=3
//
// Rates use wall-clock time (UseRealTime): OpenBLAS threads do not show in
// the benchmark thread's CPU time.
// Counters: tokens/s (micro_batch x seq per iteration, kIsRate) and, for the
// layer, FLOP/s of the matrix products: forward 24 b s h^2 + 4 b s^2 h
// (QKV, projection, MLP; Q K^T and P V, counting the causal half as full),
// backward twice that.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <random>

#include "config/model_spec_from_deck.hpp"
#include "config/run_config.hpp"
#include "model/gpt_model.hpp"
#include "parallel/communicator.hpp"
#include "train/optimizer.hpp"

namespace meshtron {
namespace {

const std::string kTinyDeck = std::string(MESHTRON_SOURCE_DIR) + "/input_decks/gpt-tiny.deck";

/// Random token ids in [0, vocab), int32 [n].
Tensor random_tokens(index_t n, int vocab, std::mt19937& rng) {
  Tensor t = Tensor::empty({n}, DType::I32);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  for (index_t i = 0; i < n; ++i) t.data<std::int32_t>()[i] = dist(rng);
  return t;
}

Tensor random_normal(Shape shape, double stddev, std::mt19937& rng) {
  Tensor t = Tensor::empty(std::move(shape), DType::F32);
  std::normal_distribution<float> dist(0.0f, float(stddev));
  for (index_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

/// One rank that is the whole grid: every group is MPI_COMM_SELF.
struct SingleRank {
  MpiCommunicator tp_comm{MPI_COMM_SELF}, dp_comm{MPI_COMM_SELF}, model_comm{MPI_COMM_SELF};
  TensorParallelGroup tp{tp_comm};
  LayerContext ctx{tp};
  OptimizerGroups groups{tp_comm, dp_comm, model_comm, nullptr};

  SingleRank(index_t seq, index_t micro_batch) {
    ctx.seq_length = seq;
    ctx.micro_batch = micro_batch;
    ctx.global_batch = micro_batch;
    ctx.training = true;
    ctx.seed = 1234;
  }
};

void BM_gpt_tiny_step(benchmark::State& state) {
  const RunConfig run = RunConfig::from_file(kTinyDeck);
  ModelSpec config = model_spec_from_deck(run, 50257, 1);
  config.hidden_dropout = config.attention_dropout = 0.0;
  const index_t micro_batch = 4, seq = config.seq_length;  // 64 in the deck
  SingleRank rank(seq, micro_batch);
  GptModel model(config, StagePlacement::whole_model(config.num_layers), rank.ctx,
                 DType::F32, run.run.seed);
  AdamWConfig adam{run.optimizer.beta1, run.optimizer.beta2, 1e-8,
                   run.optimizer.weight_decay, run.training.clip_grad};
  AdamW optimizer(model.parameters(), adam, nullptr);

  std::mt19937 rng(7);
  const index_t tokens = seq * micro_batch;
  const Tensor ids = random_tokens(tokens, config.vocab_size, rng);
  const Tensor targets = random_tokens(tokens, config.vocab_size, rng);
  Tensor dloss = Tensor::empty({tokens}, DType::F32);
  dloss.fill(1.0 / double(tokens));
  for (auto _ : state) {
    GptModel::Cache cache;
    Tensor loss = model.forward(ids, targets, rank.ctx, cache);
    model.backward(dloss, rank.ctx, cache);
    const StepStats stats = optimizer.step(run.optimizer.lr, rank.groups, true);
    benchmark::DoNotOptimize(stats.grad_norm);
    ++rank.ctx.step;
  }
  state.counters["tokens/s"] =
      benchmark::Counter(double(tokens) * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_gpt_tiny_step)
    ->Name("gpt_tiny_step/mb4_seq64")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_gpt2_124m_layer(benchmark::State& state) {
  ModelSpec config;
  config.hidden_size = 768;
  config.block.attention = AttentionSpec::multi_head(768, 12);
  config.block.mlp.ffn_hidden_size = 3072;
  config.seq_length = config.max_positions = 1024;
  const index_t seq = 1024, micro_batch = 1, tokens = seq * micro_batch, h = 768;
  SingleRank rank(seq, micro_batch);
  TransformerLayer layer(0, config, rank.ctx, DType::F32);
  ParameterList params;
  layer.collect(params);
  for (Parameter* p : params)
    if (p->value.rank() == 2) init_normal(*p, 1, config.init_std, 0, 1);

  std::mt19937 rng(7);
  const Tensor x = random_normal({tokens, h}, 1.0, rng);
  const Tensor dy = random_normal({tokens, h}, 1e-3, rng);
  for (auto _ : state) {
    TransformerLayer::Cache cache;
    Tensor y = layer.forward(x, rank.ctx, cache);
    Tensor dx = layer.backward(dy, rank.ctx, cache);
    benchmark::DoNotOptimize(dx.raw());
  }
  for (Parameter* p : params) p->grad.fill(0.0);
  const double forward_flop = 24.0 * tokens * h * h + 4.0 * micro_batch * seq * seq * h;
  const double n = double(state.iterations());
  state.counters["tokens/s"] = benchmark::Counter(double(tokens) * n, benchmark::Counter::kIsRate);
  state.counters["FLOP/s"] = benchmark::Counter(3 * forward_flop * n, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_gpt2_124m_layer)
    ->Name("gpt2_124m_layer_fwd_bwd/mb1_seq1024")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace meshtron

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  benchmark::Initialize(&argc, argv);
  const bool bad_arguments = benchmark::ReportUnrecognizedArguments(argc, argv);
  if (!bad_arguments) benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  Kokkos::finalize();
  MPI_Finalize();
  return bad_arguments ? 1 : 0;
}
