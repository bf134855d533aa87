// T5 generation (src/generate/t5_generator.hpp) against full T5Model
// forwards over the whole decoder prefix, no cache:
//   * each T5Decoding step's logits, with beam copies of each prompt and a
//     reorder of the self caches between steps, equal the full forward's
//     last row (fp32 1e-5, fp64 1e-10), prompts of different lengths padded;
//   * greedy ids equal an argmax loop over full forwards of each prompt
//     alone (no padding), a stop id ending one sequence early;
//   * beam search equals a plain transcription of transformers' beam search
//     (BeamSearchScorer.process / finalize) over full forwards of every beam;
//   * tp 2 (NP 2): greedy, sampled and beam ids equal one rank's.
//
// Run: ctest -R generate_t5 --output-on-failure   (from the build folder)
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "common/expect_user_error.hpp"
#include "common/mpi_test_util.hpp"
#include "common/tp_pair.hpp"
#include "generate/t5_generator.hpp"
#include "parallel/communicator.hpp"
#include "tests/model/t5_fixture.hpp"

namespace meshtron::t5_test {
namespace {

using generate::Decoding;
using generate::GenerateParams;
using generate::Request;
using generate::Result;
using generate::T5Decoding;
using generate::T5Generator;
using Ids = std::vector<std::int32_t>;
using testing_util::expect_user_error;

struct OneRank {
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx = context(tp);
};

/// Two prompts of different lengths (the shorter padded in a batch).
std::vector<Request> prompts() {
  return {{0, {5, 7, 11, 3, 19, 1}}, {1, {8, 5, 3, 1}}};
}

/// Every sequence's full-forward logits [sequences, vocab] (fp64, all
/// columns of this one rank) at the last position of `decoder` (each
/// sequence's decoder ids, equal lengths), sequence j encoding encoder[j].
std::vector<std::vector<double>> full_forward_last(const T5Model& model,
                                                   const std::vector<Ids>& encoder,
                                                   const std::vector<Ids>& decoder,
                                                   TensorParallelGroup& tp) {
  const index_t b = index_t(encoder.size());
  std::size_t s_enc = 0;
  for (const Ids& e : encoder) s_enc = std::max(s_enc, e.size());
  std::vector<Ids> enc(encoder.size(), Ids(s_enc, 0));
  Tensor mask = Tensor::zeros({b, index_t(s_enc)}, DType::I32);
  for (std::size_t j = 0; j < encoder.size(); ++j)
    for (std::size_t t = 0; t < encoder[j].size(); ++t) {
      enc[j][t] = encoder[j][t];
      mask.data<std::int32_t>()[j * s_enc + t] = 1;
    }
  std::vector<Ids> labels(decoder.size(), Ids(decoder[0].size(), 2));
  T5Batch batch{sb_rows(enc), mask, sb_rows(decoder), Tensor(), sb_rows(labels)};
  LayerContext ctx = context(tp);
  ctx.training = false;
  ctx.micro_batch = ctx.global_batch = b;
  T5Model::Cache cache;
  model.forward(batch, ctx, cache);
  const Tensor& logits = T5Model::logits(cache);
  const std::vector<double> all = logits.to_doubles();
  const index_t v = logits.dim(1), last = index_t(decoder[0].size()) - 1;
  std::vector<std::vector<double>> out(static_cast<std::size_t>(b));
  for (index_t j = 0; j < b; ++j) {
    const auto row = all.begin() + (last * b + j) * v;
    out[std::size_t(j)].assign(row, row + kVocab);
  }
  return out;
}

class T5DecodingSteps : public ::testing::TestWithParam<std::tuple<bool, DType>> {};

TEST_P(T5DecodingSteps, EqualTheFullForwardOverThePrefixThroughReorders) {
  const auto [v11, dtype] = GetParam();
  const double tolerance = dtype == DType::F64 ? 1e-10 : 1e-5;
  OneRank r;
  T5Model model(tiny_spec(v11), r.ctx, dtype, 7);
  const std::vector<Request> batch = prompts();
  constexpr int kCopies = 2, kSteps = 5;
  T5Decoding decoding(model, batch, kCopies, kSteps, 0, r.ctx);
  std::vector<Ids> encoder, decoder;
  for (const Request& q : batch)
    for (int k = 0; k < kCopies; ++k) {
      encoder.push_back(q.prompt);
      decoder.push_back({});
    }
  Ids next(decoder.size(), 0);
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t j = 0; j < decoder.size(); ++j) decoder[j].push_back(next[j]);
    const std::vector<double> got = decoding.step(next).to_doubles();
    const auto want = full_forward_last(model, encoder, decoder, r.tp);
    const index_t v = index_t(got.size()) / index_t(decoder.size());
    double worst = 0;
    for (std::size_t j = 0; j < decoder.size(); ++j)
      for (index_t c = 0; c < kVocab; ++c) {
        const double w = want[j][std::size_t(c)];
        worst = std::max(worst, std::fabs(got[j * std::size_t(v) + std::size_t(c)] - w) /
                                    (1 + std::fabs(w)));
      }
    EXPECT_LE(worst, tolerance) << "step " << step;
    for (std::size_t j = 0; j < decoder.size(); ++j) next[j] = std::int32_t(3 + 5 * j + 7 * step) % kVocab;
    if (step % 2 == 1) {
      // Beam-style reorder: copy 0 of each prompt takes copy 1's past, copy 1 keeps its own.
      const std::vector<index_t> to{0, 2}, from{1, 3};
      decoding.reorder(to, from);
      decoder[0] = decoder[1];
      decoder[2] = decoder[3];
    }
  }
  EXPECT_EQ(decoding.position(), kSteps);
}

INSTANTIATE_TEST_SUITE_P(VersionsAndPrecisions, T5DecodingSteps,
                         ::testing::Combine(::testing::Values(false, true),
                                            ::testing::Values(DType::F32, DType::F64)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "v11_" : "v10_") +
                                  (std::get<1>(info.param) == DType::F64 ? "fp64" : "fp32");
                         });

/// The argmax over the vocabulary (lowest id among equals, as torch.argmax).
std::int32_t argmax(const std::vector<double>& row) {
  return std::int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

/// Greedy decoding by full forwards of one prompt alone.
Ids greedy_by_full_forwards(const T5Model& model, const Ids& prompt, int max_new,
                            std::int32_t stop, TensorParallelGroup& tp) {
  Ids decoder{0}, out;
  while (int(out.size()) < max_new) {
    const std::int32_t id = argmax(full_forward_last(model, {prompt}, {decoder}, tp)[0]);
    out.push_back(id);
    decoder.push_back(id);
    if (id == stop) break;
  }
  return out;
}

class T5Versions : public ::testing::TestWithParam<bool> {};

TEST_P(T5Versions, GreedyEqualsArgmaxOverFullForwards) {
  OneRank r;
  T5Model model(tiny_spec(GetParam()), r.ctx, DType::F64, 9);
  const std::vector<Request> batch = prompts();
  constexpr int kNew = 7;
  // A stop id that prompt 0 reaches at its fourth token (if it repeats
  // earlier, earlier), so one sequence stops while the other goes on.
  const std::int32_t stop = greedy_by_full_forwards(model, batch[0].prompt, kNew, -1, r.tp)[3];
  T5Generator generator(model, r.tp, MemorySpace::Host);
  GenerateParams p;
  p.max_new_tokens = kNew;
  p.stop_ids = {stop};
  const std::vector<Result> got = generator.generate(batch, p);
  ASSERT_EQ(got.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Ids want = greedy_by_full_forwards(model, batch[i].prompt, kNew, stop, r.tp);
    EXPECT_EQ(got[i].ids, want) << "prompt " << i;
    EXPECT_EQ(got[i].finish_reason, want.back() == stop ? "stop" : "length");
    EXPECT_EQ(got[i].prompt, batch[i].prompt);
  }
  EXPECT_EQ(got[0].finish_reason, "stop");
  EXPECT_LE(got[0].ids.size(), 4u);
}

/// log softmax over the vocabulary.
std::vector<double> log_softmax(const std::vector<double>& row) {
  const double m = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (double x : row) sum += std::exp(x - m);
  std::vector<double> out;
  for (double x : row) out.push_back(x - m - std::log(sum));
  return out;
}

/// transformers' beam search (BeamSearchScorer.process, BeamHypotheses,
/// finalize) for one prompt alone, every beam's log-probabilities from a
/// full forward over its prefix.
Ids beam_by_full_forwards(const T5Model& model, const Ids& prompt, const GenerateParams& p,
                          TensorParallelGroup& tp) {
  const int K = p.num_beams;
  struct Beam {
    Ids ids;
    double score;
  };
  std::vector<Beam> running{{{}, 0.0}};
  std::vector<std::pair<double, Ids>> kept;  // (score, ids with the stop token)
  const auto worst = [&] {
    double w = std::numeric_limits<double>::infinity();
    for (const auto& h : kept) w = std::min(w, h.first);
    return w;
  };
  const auto add = [&](Ids ids, double sum, int length) {
    const double score = sum / std::pow(double(length), p.length_penalty);
    if (int(kept.size()) >= K && score <= worst()) return;
    kept.push_back({score, std::move(ids)});
    if (int(kept.size()) > K) {
      std::size_t w = 0;
      for (std::size_t i = 1; i < kept.size(); ++i)
        if (kept[i].first < kept[w].first) w = i;
      kept.erase(kept.begin() + long(w));
    }
  };
  const std::int32_t stop = p.stop_ids.empty() ? -1 : p.stop_ids[0];
  for (int length = 1;; ++length) {
    struct Candidate {
      double score;
      int beam;
      std::int32_t id;
    };
    std::vector<Candidate> all;
    for (std::size_t k = 0; k < running.size(); ++k) {
      Ids decoder{0};
      decoder.insert(decoder.end(), running[k].ids.begin(), running[k].ids.end());
      const auto lp = log_softmax(full_forward_last(model, {prompt}, {decoder}, tp)[0]);
      for (std::size_t id = 0; id < lp.size(); ++id)
        all.push_back({running[k].score + lp[id], int(k), std::int32_t(id)});
    }
    std::stable_sort(all.begin(), all.end(),
                     [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
    all.resize(std::size_t(2 * K));
    std::vector<Beam> next;
    for (std::size_t rank = 0; rank < all.size() && int(next.size()) < K; ++rank) {
      Ids ids = running[std::size_t(all[rank].beam)].ids;
      ids.push_back(all[rank].id);
      if (all[rank].id == stop) {
        if (int(rank) < K) add(ids, all[rank].score, length);
      } else {
        next.push_back({ids, all[rank].score});
      }
    }
    running = next;
    const bool done = int(kept.size()) >= K &&
                      (p.early_stopping ||
                       worst() >= running[0].score / std::pow(double(length), p.length_penalty));
    if (done) break;
    if (length >= p.max_new_tokens) {
      for (const Beam& b : running) add(b.ids, b.score, int(b.ids.size()));
      break;
    }
  }
  std::size_t best = 0;
  for (std::size_t i = 1; i < kept.size(); ++i)
    if (kept[i].first >= kept[best].first) best = i;
  return kept[best].second;
}

TEST_P(T5Versions, BeamSearchEqualsTransformersAlgorithmOverFullForwards) {
  OneRank r;
  T5Model model(tiny_spec(GetParam()), r.ctx, DType::F64, 9);
  const std::vector<Request> batch = prompts();
  T5Generator generator(model, r.tp, MemorySpace::Host);
  GenerateParams p;
  p.decoding = Decoding::Beam;
  p.num_beams = 3;
  p.max_new_tokens = 6;
  // A stop id greedy reaches early, so hypotheses finish before the end.
  p.stop_ids = {greedy_by_full_forwards(model, batch[1].prompt, 6, -1, r.tp)[2]};
  int stopped = 0;
  for (const double length_penalty : {1.0, 2.0, -0.5})
    for (const bool early_stopping : {false, true}) {
      p.length_penalty = length_penalty;
      p.early_stopping = early_stopping;
      const std::vector<Result> got = generator.generate(batch, p);
      for (std::size_t i = 0; i < batch.size(); ++i) {
        EXPECT_EQ(got[i].ids, beam_by_full_forwards(model, batch[i].prompt, p, r.tp))
            << "prompt " << i << " length_penalty " << length_penalty << " early_stopping "
            << early_stopping;
        stopped += got[i].finish_reason == "stop";
      }
    }
  EXPECT_GT(stopped, 0) << "no hypothesis ended on the stop id: the test misses that path";
}

INSTANTIATE_TEST_SUITE_P(Versions, T5Versions, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "v11_untied" : "v10_tied"; });

TEST(T5Generate, EmptyPromptAndSmallVocabularyAreOneLineErrors) {
  OneRank r;
  T5Model model(tiny_spec(false), r.ctx, DType::F32, 9);
  T5Generator generator(model, r.tp, MemorySpace::Host);
  GenerateParams p;
  expect_user_error([&] { generator.generate({{0, {}}}, p); }, {"prompt 0 is empty"});
  expect_user_error([&] { generator.generate({{4, {3, 40}}}, p); },
                    {"prompt 4 holds token 40, outside the vocabulary [0, 30)"});
  p.decoding = Decoding::Beam;
  p.num_beams = 16;  // 32 candidates of a 30-token vocabulary
  expect_user_error([&] { generator.generate({{0, {3, 4}}}, p); },
                    {"num_beams = 16 takes 32 candidates", "the vocabulary has 30"});
}

TEST(T5GenerateTp2, SameIdsAsOneRank) {
  if (testing_util::world_size() % 2) GTEST_SKIP() << "needs an even world";
  testing_util::TpPair pair;
  LayerContext ref_ctx = context(pair.one), ctx = context(pair.two);
  for (const bool v11 : {false, true}) {
    T5Model ref(tiny_spec(v11, 2), ref_ctx, DType::F32, 4),
        model(tiny_spec(v11, 2), ctx, DType::F32, 4);
    T5Generator ref_generator(ref, pair.one, MemorySpace::Host),
        generator(model, pair.two, MemorySpace::Host);
    GenerateParams greedy, sample, beam;
    greedy.max_new_tokens = sample.max_new_tokens = beam.max_new_tokens = 6;
    sample.decoding = Decoding::Sample;
    sample.temperature = 0.8;
    sample.top_k = 7;
    sample.top_p = 0.9;
    beam.decoding = Decoding::Beam;
    beam.num_beams = 3;
    for (const GenerateParams* p : {&greedy, &sample, &beam}) {
      const std::vector<Result> want = ref_generator.generate(prompts(), *p);
      const std::vector<Result> got = generator.generate(prompts(), *p);
      for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].ids, want[i].ids) << "v11 " << v11 << " prompt " << i;
        EXPECT_EQ(got[i].ids.size(), 6u);
      }
    }
  }
}

}  // namespace
}  // namespace meshtron::t5_test
