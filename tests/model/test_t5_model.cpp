// T5Model on one rank, fp64: finite differences of the whole model's loss
// against its backward on a few elements of every parameter (v1.0: ReLU and
// the tied head; v1.1: gated gelu_new and the untied head), without and
// with dropout (its masks fixed); the feed-forward's inner dropout against
// masks drawn here; one relative bias table per stack; encoder padding and
// the decoder's causal mask; selective and full recompute bit-equal to
// none; the StageModel per-token loss; bad batches as one-line errors.
//
// Run: ctest -R model_t5 --output-on-failure   (from the build folder)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/expect_user_error.hpp"
#include "parallel/communicator.hpp"
#include "tests/model/t5_fixture.hpp"
#include "tests/model/recompute_check.hpp"

namespace meshtron::t5_test {
namespace {

using testing_util::expect_user_error;

struct OneRank {
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx = context(tp);
};

class T5ModelVersions : public ::testing::TestWithParam<bool> {};

/// Central differences of the loss (the dropout masks fixed: the same
/// counters every forward) against the backward on the first, middle, last
/// and largest-gradient elements of every parameter.
void expect_finite_differences_match(const ModelSpec& spec, bool untied) {
  OneRank r;
  T5Model model(spec, r.ctx, DType::F64, 5);
  const T5Batch batch = tiny_batch();
  loss_and_grads(model, batch, r.ctx);
  const auto objective = [&] {
    T5Model::Cache cache;
    return model.forward(batch, r.ctx, cache);
  };
  int checked = 0;
  for (Parameter* p : model.parameters()) {
    const Tensor analytic = p->grad.clone();
    const index_t n = p->value.numel();
    double scale = 1e-8;
    for (index_t i = 0; i < n; ++i)
      scale = std::max(scale, std::fabs(element_as_double(analytic, i)));
    index_t largest = 0;  // first, middle and last elements, and the largest gradient's
    for (index_t i = 0; i < n; ++i)
      if (std::fabs(element_as_double(analytic, i)) == scale) largest = i;
    for (index_t i : {index_t(0), n / 2, n - 1, largest}) {
      const double v = element_as_double(p->value, i), h = 1e-6;
      set_element_from_double(p->value, i, v + h);
      const double up = objective();
      set_element_from_double(p->value, i, v - h);
      const double down = objective();
      set_element_from_double(p->value, i, v);
      const double numeric = (up - down) / (2 * h);
      EXPECT_LE(std::fabs(numeric - element_as_double(analytic, i)), 1e-6 * scale)
          << p->name << "[" << i << "] numeric " << numeric << " analytic "
          << element_as_double(analytic, i);
      ++checked;
    }
    EXPECT_GT(scale, 1e-8) << p->name << " has no gradient";
  }
  // word table, 2 x (relative bias, final norm), 2 encoder blocks of 6,
  // 2 decoder blocks of 10, and the untied head (v1.1)
  const int parameters = 1 + 2 * 2 + 2 * 6 + 2 * 10 + (untied ? 1 : 0);
  EXPECT_EQ(checked, 4 * parameters);
}

TEST_P(T5ModelVersions, GradientsMatchFiniteDifferences) {
  expect_finite_differences_match(tiny_spec(GetParam()), GetParam());
}

TEST_P(T5ModelVersions, GradientsMatchFiniteDifferencesWithDropout) {
  ModelSpec spec = tiny_spec(GetParam());
  spec.hidden_dropout = spec.attention_dropout = 0.2;
  expect_finite_differences_match(spec, GetParam());
}

TEST_P(T5ModelVersions, FeedForwardDropsBetweenActivationAndProj) {
  // transformers' T5DenseActDense / T5DenseGatedActDense: proj's input is
  // dropout(act(fc x)), the mask drawn here from dropout_keep at the block's
  // kStreamMlpInner site and global index ((t * b_global + sample) * d_ff +
  // column).
  OneRank r;
  ModelSpec spec = tiny_spec(GetParam());
  const double p = 0.3;
  spec.hidden_dropout = p;
  T5Model model(spec, r.ctx, DType::F64, 5);
  T5Model::Cache cache;
  model.forward(tiny_batch(), r.ctx, cache);
  const auto act = GetParam() ? ops::GatedActivation::GeLUTanh : ops::GatedActivation::ReLU;
  const index_t ff = spec.block.mlp.ffn_hidden_size;
  const std::pair<const Mlp::Cache*, int> blocks[] = {
      {&cache.encoder.blocks[1].mlp, 1},                 // encoder block 1
      {&cache.decoder.blocks[0].mlp, spec.num_layers}};  // decoder block 0
  int dropped = 0;
  for (const auto& [mlp, stream_layer] : blocks) {
    const Tensor& pre = mlp->pre_activation;
    Tensor activated = Tensor::empty({pre.dim(0), ff}, DType::F64);
    if (GetParam()) ops::gated_activation_forward(pre, act, activated);
    else ops::activation_forward(pre, act, activated);
    const Tensor& got = mlp->proj.x;
    ASSERT_EQ(got.shape(), activated.shape());
    const std::uint32_t stream = std::uint32_t(stream_layer) * kStreamsPerLayer + kStreamMlpInner;
    for (index_t row = 0; row < got.dim(0); ++row)
      for (index_t col = 0; col < ff; ++col) {
        const index_t t = row / kBatch, sample = row % kBatch;
        const auto global = std::uint64_t((t * kBatch + sample) * ff + col);
        const bool keep = ops::dropout_keep(r.ctx.seed, r.ctx.step, stream, global, p);
        const double a = activated.data<double>()[row * ff + col];
        EXPECT_DOUBLE_EQ(got.data<double>()[row * ff + col], keep ? a / (1 - p) : 0.0)
            << "stream layer " << stream_layer << " row " << row << " column " << col;
        dropped += !keep && a != 0;
      }
  }
  EXPECT_GT(dropped, 0);
}

TEST_P(T5ModelVersions, NamesAndShapesAreTheDesignTable) {
  OneRank r;
  T5Model model(tiny_spec(GetParam()), r.ctx, DType::F32, 5);
  std::vector<std::string> tables;
  for (Parameter* p : model.parameters())
    if (p->name.find("relative_bias") != std::string::npos) tables.push_back(p->name);
  // One table per stack: the blocks share it (transformers' block 0 owns it).
  EXPECT_EQ(tables, (std::vector<std::string>{"encoder.relative_bias.weight",
                                              "decoder.relative_bias.weight"}));
  const index_t ff = GetParam() ? 40 : 20;
  const std::vector<std::pair<std::string, Shape>> expected{
      {"embedding.word.weight", {kVocab, 16}},
      {"encoder.relative_bias.weight", {8, 4}},
      {"encoder.layers.1.ln_1.weight", {16}},
      {"encoder.layers.1.attention.qkv.weight", {16, 36}},
      {"encoder.layers.1.attention.proj.weight", {12, 16}},
      {"encoder.layers.1.ln_2.weight", {16}},
      {"encoder.layers.1.mlp.fc.weight", {16, ff}},
      {"encoder.layers.1.mlp.proj.weight", {20, 16}},
      {"encoder.final_norm.weight", {16}},
      {"decoder.layers.0.self_attention.qkv.weight", {16, 36}},
      {"decoder.layers.0.cross_attention.q.weight", {16, 12}},
      {"decoder.layers.0.cross_attention.kv.weight", {16, 24}},
      {"decoder.layers.0.cross_attention.proj.weight", {12, 16}},
      {"decoder.layers.0.ln_3.weight", {16}},
      {"decoder.final_norm.weight", {16}}};
  const ParameterList params = model.parameters();
  for (const auto& [name, shape] : expected) {
    const auto it = std::find_if(params.begin(), params.end(),
                                 [&](const Parameter* p) { return p->name == name; });
    ASSERT_NE(it, params.end()) << name;
    EXPECT_EQ((*it)->global_shape, shape) << name;
  }
  const bool untied = std::any_of(params.begin(), params.end(), [](const Parameter* p) {
    return p->name == "output_layer.weight";
  });
  EXPECT_EQ(untied, GetParam());
  EXPECT_EQ(model.head_word_weight() != nullptr, !GetParam());
}

TEST_P(T5ModelVersions, RecomputeGivesTheSameLossAndGradients) {
  OneRank r;
  ModelSpec spec = tiny_spec(GetParam());
  spec.hidden_dropout = spec.attention_dropout = 0.2;  // the rebuilt masks must match too
  T5Model model(spec, r.ctx, DType::F64, 5);
  const T5Batch batch = tiny_batch();
  testing_util::expect_recompute_bit_equal([&] { return loss_and_grads(model, batch, r.ctx); },
                                           model.parameters(), r.ctx);
}

TEST_P(T5ModelVersions, DecodeStepsMatchTheFullForward) {
  // encode() is the forward's encoder output; feeding the decoder ids one
  // position at a time (a cache of more positions than fed) gives the
  // forward's logits row by row.
  OneRank r;
  T5Model model(tiny_spec(GetParam()), r.ctx, DType::F64, 5);
  T5Batch batch = tiny_batch();
  batch.decoder_mask = Tensor();
  T5Model::Cache full;
  model.forward(batch, r.ctx, full);
  const Tensor memory = model.encode(batch.encoder_ids, batch.encoder_mask, r.ctx);
  EXPECT_EQ(memory.to_doubles(), full.encoder_out.to_doubles());
  T5Model::DecoderState state =
      model.start_decoding(memory, batch.encoder_mask, kDecSeq + 2, r.ctx);
  const Tensor& want = T5Model::logits(full);
  const index_t v = want.dim(1);
  for (index_t t = 0; t < kDecSeq; ++t) {
    const std::int32_t* row = batch.decoder_ids.data<std::int32_t>() + t * kBatch;
    const Tensor got = model.decode_step(ints({kBatch}, {row[0], row[1]}), r.ctx, state);
    ASSERT_EQ(got.dim(1), v);
    for (index_t i = 0; i < kBatch; ++i)
      for (index_t c = 0; c < v; ++c) {
        const double w = want.data<double>()[(t * kBatch + i) * v + c];
        ASSERT_NEAR(got.data<double>()[i * v + c], w, 1e-12 * (1 + std::fabs(w)))
            << "position " << t << " sample " << i << " column " << c;
      }
  }
  EXPECT_EQ(state.position, kDecSeq);
}

TEST(T5Model, SelectSamplesReordersTheDecoderState) {
  // After two steps the samples swap places (caches and encoder state);
  // the next steps, fed swapped ids, give the forward's rows swapped.
  OneRank r;
  T5Model model(tiny_spec(false), r.ctx, DType::F64, 5);
  T5Batch batch = tiny_batch();
  batch.decoder_mask = Tensor();
  T5Model::Cache full;
  model.forward(batch, r.ctx, full);
  const Tensor& want = T5Model::logits(full);
  const index_t v = want.dim(1);
  auto state = model.start_decoding(model.encode(batch.encoder_ids, batch.encoder_mask, r.ctx),
                                    batch.encoder_mask, kDecSeq, r.ctx);
  const std::int32_t* ids = batch.decoder_ids.data<std::int32_t>();
  for (index_t t = 0; t < kDecSeq; ++t) {
    const Tensor got =
        model.decode_step(ints({kBatch}, {ids[t * kBatch], ids[t * kBatch + 1]}), r.ctx, state);
    for (index_t i = 0; i < kBatch; ++i)
      for (index_t c = 0; c < v; ++c) {
        const double w = want.data<double>()[(t * kBatch + i) * v + c];
        ASSERT_NEAR(got.data<double>()[i * v + c], w, 1e-12 * (1 + std::fabs(w)))
            << "position " << t << " sample " << i;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Versions, T5ModelVersions, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "v11_untied" : "v10_tied"; });

TEST(T5Model, EncoderPaddingChangesNothing) {
  OneRank r;
  T5Model model(tiny_spec(false), r.ctx, DType::F64, 5);
  T5Batch batch = tiny_batch();
  T5Model::Cache a, b;
  const double loss = model.forward(batch, r.ctx, a);
  for (index_t j : {4, 5}) batch.encoder_ids.data<std::int32_t>()[j * kBatch + 1] = 13;
  EXPECT_EQ(model.forward(batch, r.ctx, b), loss);
  EXPECT_EQ(T5Model::logits(a).to_doubles(), T5Model::logits(b).to_doubles());
  batch.encoder_mask.data<std::int32_t>()[kEncSeq + 4] = 1;  // a real key there moves the loss
  T5Model::Cache c;
  EXPECT_NE(model.forward(batch, r.ctx, c), loss);
}

TEST(T5Model, DecoderIsCausal) {
  // Changing decoder token 3 leaves the logits of rows 0..2 as they were,
  // and moves those of rows 3.. .
  OneRank r;
  T5Model model(tiny_spec(true), r.ctx, DType::F64, 5);
  T5Batch batch = tiny_batch();
  T5Model::Cache a, b;
  model.forward(batch, r.ctx, a);
  batch.decoder_ids.data<std::int32_t>()[3 * kBatch + 0] = 21;
  model.forward(batch, r.ctx, b);
  const Tensor la = T5Model::logits(a), lb = T5Model::logits(b);
  const index_t v = la.dim(1);
  for (index_t t = 0; t < kDecSeq; ++t) {
    const index_t row = t * kBatch + 0;
    const bool same = std::memcmp(la.data<double>() + row * v, lb.data<double>() + row * v,
                                  std::size_t(v) * sizeof(double)) == 0;
    EXPECT_EQ(same, t < 3) << "decoder position " << t;
  }
}

TEST(T5Model, StageModelPerTokenLossAndBackward) {
  // The per-token loss's mean is forward()'s loss; a backward from
  // dout = 1 / n gives forward()'s gradients.
  OneRank r;
  T5Model model(tiny_spec(true), r.ctx, DType::F64, 5);
  const T5Batch batch = tiny_batch();
  const double loss = loss_and_grads(model, batch, r.ctx);
  std::vector<std::vector<double>> grads;
  for (Parameter* p : model.parameters()) grads.push_back(p->grad.to_doubles());
  zero_grads(model);
  MicroBatch mb;
  mb.ids = batch.encoder_ids;
  mb.padding_mask = batch.encoder_mask;
  mb.decoder_ids = batch.decoder_ids;
  mb.decoder_padding_mask = batch.decoder_mask;
  mb.targets = batch.labels;
  StageModel& stage = model;
  auto cache = stage.make_cache();
  const Tensor per_token = stage.forward(mb.ids, mb, r.ctx, *cache);
  ASSERT_EQ(per_token.numel(), kDecSeq * kBatch);
  double mean = 0;
  for (double v : per_token.to_doubles()) mean += v / double(per_token.numel());
  EXPECT_NEAR(mean, loss, 1e-12 * loss);
  Tensor dout = Tensor::empty({per_token.numel()}, DType::F64);
  dout.fill(1.0 / double(per_token.numel()));
  int reported = 0;
  stage.backward(dout, r.ctx, *cache,
                 [&](const ParameterList& done) { reported += int(done.size()); });
  EXPECT_EQ(reported, int(model.parameters().size()));
  const ParameterList params = model.parameters();
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::vector<double> g = params[k]->grad.to_doubles();
    for (std::size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], grads[k][i], 1e-12 * (1 + std::fabs(grads[k][i]))) << params[k]->name;
  }
}

TEST(T5Model, BadBatchesAreOneLineErrors) {
  OneRank r;
  T5Model model(tiny_spec(false), r.ctx, DType::F64, 5);
  T5Model::Cache cache;
  T5Batch wrong_mask = tiny_batch();
  wrong_mask.encoder_mask = ints({kEncSeq, kBatch}, std::vector<std::int32_t>(kEncSeq * kBatch, 1));
  expect_user_error([&] { model.forward(wrong_mask, r.ctx, cache); },
                    {"encoder_mask must be int32 [b = 2, s = 6]", "[6, 2]"});
  T5Batch wrong_decoder_mask = tiny_batch();
  wrong_decoder_mask.decoder_mask = ints({kBatch, kEncSeq}, std::vector<std::int32_t>(12, 1));
  expect_user_error([&] { model.forward(wrong_decoder_mask, r.ctx, cache); },
                    {"decoder_mask must be int32 [b = 2, s = 4]"});
  T5Batch wrong_label = tiny_batch();
  wrong_label.labels.data<std::int32_t>()[3] = kVocab;
  expect_user_error([&] { model.forward(wrong_label, r.ctx, cache); },
                    {"label 30 is neither -100 nor in [0, 30)"});
  T5Batch wrong_id = tiny_batch();
  wrong_id.decoder_ids.data<std::int32_t>()[2] = -1;
  expect_user_error([&] { model.forward(wrong_id, r.ctx, cache); },
                    {"token -1 is outside the vocabulary [0, 30)"});
  T5Batch wrong_length = tiny_batch();
  wrong_length.labels = ints({kEncSeq * kBatch}, std::vector<std::int32_t>(12, 1));
  expect_user_error([&] { model.forward(wrong_length, r.ctx, cache); },
                    {"labels must be int32 with s_dec * b = 8 entries"});
  ModelSpec gpt = tiny_spec(false);
  gpt.model_class = ModelClass::CausalLm;
  expect_user_error([&] { T5Model m(gpt, r.ctx, DType::F64, 1); }, {"does not describe a T5"});
  ModelSpec biased = tiny_spec(false);
  biased.block.mlp.bias = true;
  expect_user_error([&] { T5Model m(biased, r.ctx, DType::F64, 1); },
                    {"biases on the linear layers"});
  const ModelSpec spec = tiny_spec(false);
  const StagePlacement decoder_stage = T5Model::stage_placement(spec, 1, 2, 1);
  T5Model stage(spec, decoder_stage, r.ctx, DType::F64, 1);
  expect_user_error([&] { stage.require_whole_model("T5Model::forward(T5Batch)"); },
                    {"model.arch = t5: T5Model::forward(T5Batch) over pipeline stages"});
  expect_user_error([&] { T5Model::stage_placement(spec, 0, 4, 3); }, {"must both divide evenly"});
  expect_user_error([&] { T5Model m(spec, StagePlacement{1, 2, false, false}, r.ctx, DType::F64, 1); },
                    {"a pipeline stage holds blocks of one stack"});
}

}  // namespace
}  // namespace meshtron::t5_test
