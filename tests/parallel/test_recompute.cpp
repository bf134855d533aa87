// Activation recomputation (training.recompute) on the host path:
//
//  * selective (attention core rebuilt from q, k, v) and full (whole layer
//    rebuilt from its input, for every layer or the first N of each chunk)
//    train to BITWISE the same losses, gradient norms and parameters as
//    none: 3 steps of the tiny GPT with dropout on, on 1 rank and, under
//    mpirun -np 4, on tp2 + sp x pp2 (collectives issued again by the
//    recomputed forward must not change anything either);
//  * the bytes a layer keeps between forward and backward fall by exactly
//    the tensors recomputation drops: selective drops the two
//    [b*heads, s, s] probability tensors (before and after dropout), full
//    keeps only the [s*b, h] layer input.
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include <mpi.h>

#include <cstdio>
#include <set>

#include "decomposition.hpp"
#include "model/transformer_layer.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;

int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// Bytes of every tensor a layer keeps between forward and backward, each
/// buffer counted once (caches alias, e.g. probs_kept = probs without dropout).
std::size_t cache_bytes(const TransformerLayer::Cache& c) {
  std::set<const void*> seen;
  std::size_t n = 0;
  for (const Tensor* t : {&c.ln_1.x, &c.ln_1.mean, &c.ln_1.rstd, &c.ln_2.x, &c.ln_2.mean,
                          &c.ln_2.rstd, &c.attention.qkv.x, &c.attention.proj.x,
                          &c.attention.q, &c.attention.k, &c.attention.v, &c.attention.qkv_out, &c.attention.probs,
                          &c.attention.probs_kept, &c.mlp.fc.x, &c.mlp.proj.x,
                          &c.mlp.pre_activation, &c.input})
    if (t->defined() && seen.insert(t->raw()).second) n += t->bytes();
  return n;
}

void expect_bitwise_equal(const RunResult& a, const RunResult& b, const std::string& what) {
  EXPECT_EQ(a.losses, b.losses) << what;
  EXPECT_EQ(a.grad_norms, b.grad_norms) << what;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, values] : b.params)
    EXPECT_TRUE(a.params.at(name) == values) << what << ": " << name << " differs";
}

Layout with_recompute(Layout l, const std::string& mode, int num_layers = 0) {
  l.overrides = {"training.recompute=" + mode,
                 "training.recompute_num_layers=" + std::to_string(num_layers)};
  return l;
}

void check_layout(MPI_Comm comm, const Layout& layout) {
  int world;
  MPI_Comm_size(comm, &world);
  ASSERT_EQ(tiny_config(with_recompute(layout, "full", 1), world).training.recompute, "full");
  const RunResult none = train_layout(comm, layout, DType::F32);
  ASSERT_EQ(none.losses.size(), 3u);
  expect_bitwise_equal(train_layout(comm, with_recompute(layout, "selective"), DType::F32), none,
                       layout.name() + " selective");
  expect_bitwise_equal(train_layout(comm, with_recompute(layout, "full"), DType::F32), none,
                       layout.name() + " full");
  expect_bitwise_equal(train_layout(comm, with_recompute(layout, "full", 1), DType::F32), none,
                       layout.name() + " full, first layer of each chunk");
}

TEST(Recompute, SingleRankBitwiseEqualToNone) {
  if (world_rank() != 0 && world_size() > 1) {
    // Only rank 0 runs the 1-rank layout; the others wait below.
  } else {
    check_layout(MPI_COMM_SELF, Layout{});
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Recompute, TensorSequenceAndPipelineParallelBitwiseEqualToNone) {
  if (world_size() != 4) GTEST_SKIP() << "needs mpirun -np 4";
  check_layout(MPI_COMM_WORLD, Layout{2, 2, 1, "1f1b", false, true});
  check_layout(MPI_COMM_WORLD, Layout{1, 2, 2, "interleaved", true, false});
}

/// One layer's cache on one rank (b = 2, s = 16, h = 32, 4 heads, dropout on).
std::size_t layer_cache_bytes(Recompute mode) {
  MpiCommunicator self(MPI_COMM_SELF);
  TensorParallelGroup g{self};
  LayerContext ctx{g};
  ctx.seq_length = 16;
  ctx.micro_batch = 2;
  ctx.global_batch = 2;
  ctx.recompute = mode;
  ModelSpec c;
  c.hidden_size = 32;
  c.block.attention = AttentionSpec::multi_head(32, 4);
  c.block.mlp.ffn_hidden_size = 128;
  c.attention_dropout = 0.1;
  c.hidden_dropout = 0.1;
  TransformerLayer layer(0, c, ctx, DType::F32);
  Tensor x = Tensor::empty({ctx.local_tokens(), 32});
  for (index_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(i % 7) * 0.1f;
  TransformerLayer::Cache cache;
  Tensor y = mode == Recompute::Full ? layer.forward_checkpointed(x, ctx, cache)
                                     : layer.forward(x, ctx, cache);
  const std::size_t bytes = cache_bytes(cache);
  layer.backward(y, ctx, cache);  // must work from what was kept
  return bytes;
}

TEST(Recompute, StoredActivationBytesPerLayerFall) {
  const std::size_t none = layer_cache_bytes(Recompute::None);
  const std::size_t selective = layer_cache_bytes(Recompute::Selective);
  const std::size_t full = layer_cache_bytes(Recompute::Full);
  const std::size_t probs = 2 * 4 * 16 * 16 * sizeof(float);  // [b*heads, s, s]
  EXPECT_EQ(none - selective, 2 * probs);  // probs and probs after dropout
  EXPECT_EQ(full, 16 * 2 * 32 * sizeof(float));  // the [s*b, h] input alone
  EXPECT_LT(full, selective);
  if (world_rank() == 0)
    std::printf("layer activation bytes (b=2, s=16, h=32, 4 heads, dropout on): none %zu, "
                "selective %zu, full %zu\n",
                none, selective, full);
}

}  // namespace
}  // namespace meshtron::testing
