// Properties of the parallel machinery beyond equal answers: how many
// collectives a layer issues, how activation memory falls with sequence
// parallelism, the pipeline schedules' shapes, and optimizer-state bytes.
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include <mpi.h>

#include "config/model_spec_from_deck.hpp"
#include "decomposition.hpp"
#include "model/transformer_layer.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;

/// Bytes of every tensor a layer keeps between forward and backward.
std::size_t cache_bytes(const TransformerLayer::Cache& c) {
  std::size_t n = 0;
  for (const Tensor* t : {&c.ln_1.x, &c.ln_1.mean, &c.ln_1.rstd, &c.ln_2.x, &c.ln_2.mean,
                          &c.ln_2.rstd, &c.attention.qkv.x, &c.attention.proj.x,
                          &c.attention.q, &c.attention.k, &c.attention.v, &c.attention.qkv_out, &c.attention.probs,
                          &c.mlp.fc.x, &c.mlp.proj.x, &c.mlp.pre_activation})
    n += t->bytes();
  if (c.attention.probs_kept.raw() != c.attention.probs.raw()) n += c.attention.probs_kept.bytes();
  return n;
}

struct LayerRun {
  CommStats forward, backward;
  long backward_nonblocking_gathers = 0, backward_nonblocking_reduce_scatters = 0;
  long backward_nonblocking_all_reduces = 0;
  std::size_t activation_bytes = 0, norm_bytes = 0;
};

/// One transformer layer on a tp group of `tp` consecutive world ranks.
LayerRun run_layer(int tp, bool sp, bool keep_gathered = false) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm group;
  MPI_Comm_split(MPI_COMM_WORLD, rank / tp, rank, &group);
  LayerRun out;
  {
    MpiCommunicator comm(group);
    TensorParallelGroup g{comm};
    LayerContext ctx{g};
    ctx.sequence_parallel = sp;
    ctx.keep_gathered_input = keep_gathered;
    ctx.seq_length = 16;
    ctx.micro_batch = 2;
    ctx.global_batch = 2;
    ModelSpec c;
    c.hidden_size = 32;
    c.block.attention = AttentionSpec::multi_head(32, 4);
    c.block.mlp.ffn_hidden_size = 128;
    TransformerLayer layer(0, c, ctx, DType::F32);
    Tensor x = Tensor::empty({ctx.local_tokens(), 32});
    for (index_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(i % 7) * 0.1f;
    TransformerLayer::Cache cache;
    comm.reset_stats();
    Tensor y = layer.forward(x, ctx, cache);
    out.forward = comm.stats();
    comm.reset_stats();
    layer.backward(y, ctx, cache);
    out.backward = comm.stats();
    out.backward_nonblocking_gathers = comm.nonblocking_gathers_started();
    out.backward_nonblocking_reduce_scatters = comm.nonblocking_started();
    out.backward_nonblocking_all_reduces = comm.nonblocking_all_reduces_started();
    out.activation_bytes = cache_bytes(cache);
    out.norm_bytes = cache.ln_1.x.bytes() + cache.ln_2.x.bytes();
  }
  MPI_Comm_free(&group);
  return out;
}

TEST(TensorParallel, TwoAllReducesForwardAndTwoNonBlockingBackwardPerLayer) {
  for (int tp : {2, 4}) {
    if (world_size() % tp) continue;
    const LayerRun r = run_layer(tp, false);
    EXPECT_EQ(r.forward.count(CollectiveKind::AllReduce), 2) << "tp=" << tp;
    EXPECT_EQ(r.backward.count(CollectiveKind::AllReduce), 2) << "tp=" << tp;
    // Both started before the weight-gradient GEMM (Megatron's async all-reduce).
    EXPECT_EQ(r.backward_nonblocking_all_reduces, 2) << "tp=" << tp;
    for (auto k : {CollectiveKind::ReduceScatter, CollectiveKind::AllGather})
      EXPECT_EQ(r.forward.count(k) + r.backward.count(k), 0);
  }
}

TEST(SequenceParallel, ReduceScatterAllGatherPattern) {
  for (int tp : {2, 4}) {
    if (world_size() % tp) continue;
    const LayerRun r = run_layer(tp, true);
    // Forward: all-gather before qkv and fc, reduce-scatter after proj (x2).
    EXPECT_EQ(r.forward.count(CollectiveKind::AllGather), 2);
    EXPECT_EQ(r.forward.count(CollectiveKind::ReduceScatter), 2);
    // Backward: all-gather of dY after each row-parallel layer and of the
    // saved input shard of each column-parallel layer; reduce-scatter of dX.
    EXPECT_EQ(r.backward.count(CollectiveKind::AllGather), 4);
    EXPECT_EQ(r.backward.count(CollectiveKind::ReduceScatter), 2);
    EXPECT_EQ(r.forward.count(CollectiveKind::AllReduce) + r.backward.count(CollectiveKind::AllReduce), 0);
    // The column-parallel layers' (qkv, fc) input gathers and dX
    // reduce-scatters are started without blocking, to overlap their GEMMs.
    EXPECT_EQ(r.backward_nonblocking_gathers, 2) << "tp=" << tp;
    EXPECT_EQ(r.backward_nonblocking_reduce_scatters, 2) << "tp=" << tp;
  }
}

TEST(SequenceParallel, KeepingTheGatheredInputSavesTheBackwardGathers) {
  for (int tp : {2, 4}) {
    if (world_size() % tp) continue;
    const LayerRun regather = run_layer(tp, true), kept = run_layer(tp, true, true);
    EXPECT_EQ(kept.forward.count(CollectiveKind::AllGather), 2);
    // Only the row-parallel layers' dY gathers remain in the backward.
    EXPECT_EQ(kept.backward.count(CollectiveKind::AllGather), 2) << "tp=" << tp;
    EXPECT_EQ(kept.backward_nonblocking_gathers, 0) << "tp=" << tp;
    EXPECT_EQ(kept.backward.count(CollectiveKind::ReduceScatter), 2);
    // The price: qkv's and fc's saved inputs are whole (tp times larger).
    EXPECT_GT(kept.activation_bytes, regather.activation_bytes) << "tp=" << tp;
  }
}

TEST(SequenceParallel, ShardedActivationsFallByTp) {
  // Korthikanti et al. (2022): with SP the layernorm/dropout/residual
  // activations (and the saved linear inputs) are stored for s/t tokens.
  for (int tp : {2, 4}) {
    if (world_size() % tp) continue;
    const LayerRun without = run_layer(tp, false), with = run_layer(tp, true);
    EXPECT_EQ(without.norm_bytes, std::size_t(tp) * with.norm_bytes) << "tp=" << tp;
    EXPECT_LT(with.activation_bytes, without.activation_bytes);
    if (world_size() == 8 && tp == 4) {
      int rank;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0)
        std::printf("tp=%d layer activation bytes per rank: %zu without SP, %zu with SP\n", tp,
                    without.activation_bytes, with.activation_bytes);
    }
  }
}

TEST(PipelineSchedule, OneFOneBBoundsInFlightAndInterleavedMakesMoreSmallerStages) {
  for (int pp : {2, 4}) {
    const int m = 8;
    for (int rank = 0; rank < pp; ++rank) {
      EXPECT_EQ(max_in_flight(schedule_tasks({"gpipe", pp, 1, m}, rank)), m);
      EXPECT_EQ(max_in_flight(schedule_tasks({"1f1b", pp, 1, m}, rank)), pp - rank);
    }
    // Every task exactly once, forwards before their backwards.
    const auto tasks = schedule_tasks({"interleaved", pp, 2, m}, 0);
    EXPECT_EQ(int(tasks.size()), 2 * m * 2);
  }
  // The trainer: interleaving gives pp * v chunks of L / (pp * v) layers.
  if (world_size() == 4) {
    Layout one{1, 4, 1, "1f1b"};
    const RunConfig c1 = tiny_config(one, 4);
    ParallelRuntime rt(MPI_COMM_WORLD, c1.parallel.degrees());
    Trainer t1(c1, model_spec_from_deck(c1, 100, 1), rt, DType::F32);
    const RunConfig c2 = tiny_config({1, 4, 1, "interleaved"}, 4);
    Trainer t2(c2, model_spec_from_deck(c2, 100, 1), rt, DType::F32);
    EXPECT_EQ(t1.chunks().size(), 1u);
    EXPECT_EQ(t2.chunks().size(), 2u);
    EXPECT_EQ(t1.layers_per_chunk(), 2);
    EXPECT_EQ(t2.layers_per_chunk(), 1);
  }
}

TEST(PipelineSchedule, MeasuredInFlightOnTheFirstStage) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const RunResult f1b = train_layout(MPI_COMM_WORLD, {1, 4, 1, "1f1b"}, DType::F32, 1);
  const RunResult gp = train_layout(MPI_COMM_WORLD, {1, 4, 1, "gpipe"}, DType::F32, 1);
  if (rank == 0) {  // first stage; 16 micro-batches per step
    EXPECT_EQ(f1b.max_in_flight[0], 4);
    EXPECT_EQ(gp.max_in_flight[0], 16);
  }
}

TEST(DistributedOptimizer, MomentBytesFallByDp) {
  const int world = world_size();
  if (world < 2) GTEST_SKIP() << "needs dp > 1";
  const RunResult plain = train_layout(MPI_COMM_WORLD, {1, 1, world, "1f1b", false}, DType::F32, 1);
  const RunResult dist = train_layout(MPI_COMM_WORLD, {1, 1, world, "1f1b", true}, DType::F32, 1);
  // Equal shards up to the padding of the flat buffer to a multiple of dp.
  const double ratio = double(dist.optimizer_state_bytes) / double(plain.optimizer_state_bytes);
  EXPECT_NEAR(ratio, 1.0 / world, 1e-3) << dist.optimizer_state_bytes << " vs "
                                        << plain.optimizer_state_bytes;
}

}  // namespace
}  // namespace meshtron::testing
