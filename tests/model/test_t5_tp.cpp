// T5Model on tp 2 against the same model on one rank, fp64: the loss, this
// rank's vocabulary shard of the logits, and every parameter's gradient
// (each local element against its global one through the shard map: heads,
// the relative-bias tables' head columns, MLP columns and rows, the
// vocab-parallel word table and untied head) to 1e-10; v1.0 and v1.1,
// without dropout and with it (masks keyed by global positions), without
// and with sequence parallelism (the norms' partial gradients summed over
// tp first, as the optimizer does); and each generation step's logits.
//
// Run: ctest -R model_t5_tp --output-on-failure   (from the build folder)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <tuple>

#include "common/mpi_test_util.hpp"
#include "common/tp_pair.hpp"
#include "tests/model/t5_fixture.hpp"

namespace meshtron::t5_test {
namespace {

class T5ModelTp2 : public ::testing::TestWithParam<std::tuple<bool, double, bool>> {};

/// The whole gradient of a replicated parameter whose ranks hold partial sums.
void sum_partial_grad(Parameter& p, MPI_Comm pair) {
  if (!p.shard.tp_partial_grad) return;
  MPI_Allreduce(MPI_IN_PLACE, p.grad.data<double>(), int(p.grad.numel()), MPI_DOUBLE, MPI_SUM,
                pair);
}

TEST_P(T5ModelTp2, LossLogitsAndGradientsMatchOneRank) {
  if (testing_util::world_size() % 2) GTEST_SKIP() << "needs an even world";
  const auto [v11, dropout, sequence_parallel] = GetParam();
  testing_util::TpPair pair;
  LayerContext ref_ctx = context(pair.one), ctx = context(pair.two);
  ctx.sequence_parallel = sequence_parallel;
  ModelSpec spec = tiny_spec(v11, 2);
  spec.hidden_dropout = spec.attention_dropout = dropout;
  T5Model ref(spec, ref_ctx, DType::F64, 3), model(spec, ctx, DType::F64, 3);
  const T5Batch batch = tiny_batch();
  T5Model::Cache ref_cache, cache;
  const double ref_loss = loss_and_grads(ref, batch, ref_ctx, &ref_cache);
  const double loss = loss_and_grads(model, batch, ctx, &cache);
  EXPECT_NEAR(loss, ref_loss, 1e-10 * std::fabs(ref_loss));
  if (dropout > 0) {  // the masks drop something
    T5Model plain(tiny_spec(v11, 2), ref_ctx, DType::F64, 3);
    EXPECT_NE(loss_and_grads(plain, batch, ref_ctx), ref_loss);
  }
  const Tensor& full = T5Model::logits(ref_cache);
  const Tensor& shard = T5Model::logits(cache);
  const index_t width = shard.dim(1), first = width * ctx.tp.rank();
  ASSERT_EQ(full.dim(1), 2 * width);
  for (index_t row = 0; row < shard.dim(0); ++row)
    for (index_t col = 0; col < width; ++col) {
      const double want = full.data<double>()[row * full.dim(1) + first + col];
      ASSERT_NEAR(shard.data<double>()[row * width + col], want, 1e-10 * (1 + std::fabs(want)))
          << "logit row " << row << " column " << first + col;
    }
  if (dropout == 0 && !sequence_parallel) {  // generation: each decode step's logit shard
    T5Batch prefix = batch;
    prefix.decoder_mask = Tensor();
    auto ref_state = ref.start_decoding(
        ref.encode(prefix.encoder_ids, prefix.encoder_mask, ref_ctx), prefix.encoder_mask,
        kDecSeq, ref_ctx);
    auto state = model.start_decoding(model.encode(prefix.encoder_ids, prefix.encoder_mask, ctx),
                                      prefix.encoder_mask, kDecSeq, ctx);
    for (index_t t = 0; t < kDecSeq; ++t) {
      const std::int32_t* row = prefix.decoder_ids.data<std::int32_t>() + t * kBatch;
      const Tensor want_step =
          ref.decode_step(ints({kBatch}, {row[0], row[1]}), ref_ctx, ref_state);
      const Tensor got_step = model.decode_step(ints({kBatch}, {row[0], row[1]}), ctx, state);
      for (index_t i = 0; i < kBatch; ++i)
        for (index_t col = 0; col < width; ++col) {
          const double want_logit = want_step.data<double>()[i * 2 * width + first + col];
          ASSERT_NEAR(got_step.data<double>()[i * width + col], want_logit,
                      1e-10 * (1 + std::fabs(want_logit)))
              << "decode step " << t << " sample " << i << " column " << first + col;
        }
    }
  }
  for (Parameter* p : model.parameters()) sum_partial_grad(*p, pair.comm());
  testing_util::expect_tp2_grads_match(model.parameters(), ref.parameters(), ctx.tp.rank());
}

INSTANTIATE_TEST_SUITE_P(
    Versions, T5ModelTp2,
    ::testing::Combine(::testing::Values(false, true), ::testing::Values(0.0, 0.2),
                       ::testing::Values(false, true)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "v11_untied" : "v10_tied") +
             (std::get<1>(info.param) > 0 ? "_dropout" : "_no_dropout") +
             (std::get<2>(info.param) ? "_sp" : "");
    });

}  // namespace
}  // namespace meshtron::t5_test
