// BertModel on tp 2 against the same model on one rank, fp64: the loss, and
// every parameter's gradient (each local element against its global one
// through the shard map: heads, MLP columns and rows, the vocab-parallel
// word table and MLM bias) to 1e-10; without dropout and with it (hidden
// and attention dropout, whose masks do not depend on the rank); MegatronBert's
// layout and Google BERT's (post-norm blocks, the embedding norm).
//
// Run: ctest -R model_bert_tp --output-on-failure   (from the build folder)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <tuple>

#include "common/mpi_test_util.hpp"
#include "common/tp_pair.hpp"
#include "tests/model/bert_fixture.hpp"

namespace meshtron::bert_test {
namespace {

/// (dropout, Google BERT's layout: post-norm blocks and the embedding norm)
class BertModelTp2 : public ::testing::TestWithParam<std::tuple<double, bool>> {};

TEST_P(BertModelTp2, LossAndGradientsMatchOneRank) {
  if (testing_util::world_size() % 2) GTEST_SKIP() << "needs an even world";
  const auto [dropout, google] = GetParam();
  testing_util::TpPair pair;
  LayerContext ref_ctx = context(pair.one), ctx = context(pair.two);
  ModelSpec spec = tiny_spec(2, google);
  spec.hidden_dropout = spec.attention_dropout = dropout;  // masks keyed by global index
  BertModel ref(spec, ref_ctx, DType::F64, 3), model(spec, ctx, DType::F64, 3);
  const BertBatch batch = tiny_batch();
  const double ref_loss = loss_and_grads(ref, batch, ref_ctx);
  const double loss = loss_and_grads(model, batch, ctx);
  EXPECT_NEAR(loss, ref_loss, 1e-10 * std::fabs(ref_loss));
  if (dropout > 0) {  // the masks drop something
    BertModel plain(tiny_spec(2, google), ref_ctx, DType::F64, 3);
    EXPECT_NE(loss_and_grads(plain, batch, ref_ctx), ref_loss);
  }
  testing_util::expect_tp2_grads_match(model.parameters(), ref.parameters(), ctx.tp.rank());
}

INSTANTIATE_TEST_SUITE_P(Dropout, BertModelTp2,
                         ::testing::Combine(::testing::Values(0.0, 0.2),
                                            ::testing::Values(false, true)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) > 0 ? "dropout"
                                                                          : "no_dropout") +
                                  (std::get<1>(info.param) ? "_google" : "_megatron");
                         });

}  // namespace
}  // namespace meshtron::bert_test
