// The MLP without biases (add_bias_linear = false) and with the gated
// activations on tp 2, with and without sequence parallelism, against the
// same MLP on one rank, in fp64: the output, the input gradient and every
// weight gradient (each local element against its global one through the
// shard map, so a wrong split of fc's [gate | up] halves shows; partial
// gradients under SP summed over tp first, as the optimizer does). The model
// runs of the decomposition suite cover the MLP with biases; the attention
// keeps its biases there.
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include <mpi.h>

#include <cmath>
#include <random>

#include "model/mlp.hpp"

namespace meshtron::testing {
namespace {

using testing_util::world_size;

constexpr index_t kSeq = 8, kBatch = 2, kTokens = kSeq * kBatch, kHidden = 16;
constexpr int kFfn = 24;

Tensor random_rows(index_t rows, index_t cols, unsigned seed) {
  Tensor t = Tensor::empty({rows, cols}, DType::F64);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  for (index_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(rng);
  return t;
}

struct MlpRun {
  Tensor y, dx;
  ParameterList params;
};

/// Forward and backward of `mlp` on this rank's rows of the global x and dy.
MlpRun run(Mlp& mlp, LayerContext& ctx, int tp_size) {
  MlpRun out;
  mlp.collect(out.params);
  for (Parameter* p : out.params) init_normal(*p, 11, 0.3, ctx.tp.rank(), tp_size);
  const index_t rows = kTokens / ctx.sp_size(), first = ctx.sp_rank() * rows;
  const Tensor x = random_rows(kTokens, kHidden, 1).slice_rows(first, first + rows).clone();
  const Tensor dy = random_rows(kTokens, kHidden, 2).slice_rows(first, first + rows).clone();
  Mlp::Cache cache;
  out.y = mlp.forward(x, ctx, cache);
  out.dx = mlp.backward(dy, ctx, cache);
  return out;
}

void expect_rows_match(const Tensor& got, const Tensor& ref, index_t first, const char* what) {
  const index_t cols = got.dim(1);
  for (index_t i = 0; i < got.numel(); ++i) {
    const double want = ref.data<double>()[first * cols + i];
    ASSERT_NEAR(got.data<double>()[i], want, 1e-12 * (1 + std::fabs(want)))
        << what << "[" << i << "]";
  }
}

void expect_tp2_matches_one_rank(const MlpSpec& spec, bool sp) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm pair;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pair);
  {
    MpiCommunicator self(MPI_COMM_SELF), comm(pair);
    TensorParallelGroup one{self}, two{comm};
    LayerContext ref_ctx{one}, ctx{two};
    for (LayerContext* c : {&ref_ctx, &ctx}) {
      c->seq_length = kSeq;
      c->micro_batch = kBatch;
      c->global_batch = kBatch;
    }
    ctx.sequence_parallel = sp;
    Mlp ref_mlp("mlp", 0, kHidden, spec, ref_ctx, DType::F64);
    Mlp mlp("mlp", 0, kHidden, spec, ctx, DType::F64);
    const MlpRun ref = run(ref_mlp, ref_ctx, 1);
    const MlpRun got = run(mlp, ctx, 2);
    const index_t first = ctx.sp_rank() * (kTokens / ctx.sp_size());
    expect_rows_match(got.y, ref.y, first, "y");
    expect_rows_match(got.dx, ref.dx, first, "dx");
    ASSERT_EQ(got.params.size(), ref.params.size());
    for (std::size_t k = 0; k < got.params.size(); ++k) {
      Parameter& p = *got.params[k];
      if (p.shard.tp_partial_grad) comm.all_reduce(p.grad);  // the optimizer's sum over tp
      const double* g = p.grad.data<double>();
      const double* r = ref.params[k]->grad.data<double>();
      for_each_global_index(p, ctx.tp.rank(), 2, [&](index_t local, index_t global) {
        ASSERT_NEAR(g[local], r[global], 1e-12 * (1 + std::fabs(r[global])))
            << p.name << " local " << local << " global " << global;
      });
    }
  }
  MPI_Comm_free(&pair);
}

class MlpOnTwoTpRanks : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (world_size() % 2) GTEST_SKIP() << "needs an even world";
  }
};

TEST_P(MlpOnTwoTpRanks, SwigluWithoutBiasMatchesOneRank) {
  expect_tp2_matches_one_rank({.ffn_hidden_size = kFfn, .activation = Activation::Swiglu,
                               .bias = false},
                              GetParam());
}

TEST_P(MlpOnTwoTpRanks, GegluWithBiasMatchesOneRank) {
  expect_tp2_matches_one_rank({.ffn_hidden_size = kFfn, .activation = Activation::Geglu},
                              GetParam());
}

TEST_P(MlpOnTwoTpRanks, TanhGeluWithoutBiasMatchesOneRank) {
  expect_tp2_matches_one_rank({.ffn_hidden_size = kFfn, .bias = false}, GetParam());
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, MlpOnTwoTpRanks, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "sp" : "no_sp"; });

}  // namespace
}  // namespace meshtron::testing
