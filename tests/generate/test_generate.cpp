// Generation (src/generate/) on the host in fp64 and fp32:
//  * the KV cache: the logits of a prefill of prompts of different lengths
//    in one batch, and of each decode step after it, equal those of a full
//    forward over the same prefix, for GPT-2, Llama-style (rope, GQA,
//    RMSNorm, SwiGLU, untied head) and multi-query models;
//  * layouts (4 ranks): greedy, sampled (plain, top-k, top-p) and beam
//    search ids on tp 2 x pp 2 (also with 2 interleaved chunks per stage),
//    tp 4 and pp 4 equal those of one rank;
//  * pipelined decoding (4 ranks): greedy and sampled ids on pp 2, pp 4
//    and tp 2 x pp 2 equal one rank's for every number of micro-batches
//    (auto, 1, 2, 3, more than the prompts), five prompts of different
//    lengths; stage 0 runs one forward per (micro-batch, step), so the
//    micro-batches really are decoded apart;
//  * statistics: top-k / top-p draws follow the renormalised probabilities
//    (chi-square, fixed seed).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <map>
#include <memory>

#include "common/mpi_test_util.hpp"
#include "generate/beam_search.hpp"
#include "tests/generate/generate_test_util.hpp"

namespace meshtron {
namespace {

using generate::GenerateParams;
using generate::Request;
using generate_test::kFamilies;
using generate_test::Replica;
using generate_test::some_ids;
using testing_util::world_size;

/// Logits [V] of the last position of a full forward over `prefix` (no cache).
std::vector<double> full_forward_logits(Replica& r, const std::vector<std::int32_t>& prefix) {
  LayerContext ctx{r.rt.tp_group};
  ctx.training = false;
  ctx.seq_length = index_t(prefix.size());
  ctx.micro_batch = 1;
  ctx.global_batch = 1;
  GptModel::Cache cache;
  const Tensor targets = Tensor::zeros({index_t(prefix.size())}, DType::I32);
  r.trainer.gpt_chunks().front()->forward(generate::ids_tensor(prefix), targets, ctx, cache);
  const Tensor& logits = cache.head.logits;
  std::vector<double> out;
  const index_t last = logits.dim(0) - 1;
  for (index_t v = 0; v < 100; ++v)
    out.push_back(logits.dtype() == DType::F64
                      ? logits.data<double>()[last * logits.dim(1) + v]
                      : double(logits.data<float>()[last * logits.dim(1) + v]));
  return out;
}

void expect_row_equals(const Tensor& logits, index_t row, const std::vector<double>& expected,
                       double tol, const std::string& what) {
  double worst = 0, scale = 0;
  for (index_t v = 0; v < index_t(expected.size()); ++v) {
    const double got = logits.dtype() == DType::F64
                           ? logits.data<double>()[row * logits.dim(1) + v]
                           : double(logits.data<float>()[row * logits.dim(1) + v]);
    worst = std::max(worst, std::abs(got - expected[std::size_t(v)]));
    scale = std::max(scale, std::abs(expected[std::size_t(v)]));
  }
  EXPECT_LE(worst, tol * std::max(1.0, scale)) << what;
}

void check_cache(const std::string& family, DType dtype, double tol) {
  Replica r(MPI_COMM_SELF, family, 1, 1, dtype);
  std::vector<std::vector<std::int32_t>> seqs = {some_ids(3, 1), some_ids(5, 2)};
  std::vector<KvCache> kv = r.generator->make_cache(2, 16);
  // The cache holds the kv groups, not the query heads: 4 layers x k and v x
  // 2 slots x groups x 16 positions x head dim 8.
  const index_t groups = r.spec.block.attention.num_query_groups;
  EXPECT_EQ(kv[0].layers[0].k.dim(1), groups);
  EXPECT_EQ(kv[0].bytes(), 4 * 2 * 2 * groups * 16 * 8 * index_t(dtype_size(dtype)));
  EXPECT_EQ(r.generator->cache_bytes(2, 16), kv[0].bytes());
  // Prefill both prompts in one forward; every row's logits.
  std::vector<std::int32_t> ids;
  std::vector<index_t> slot, position;
  for (std::size_t s = 0; s < seqs.size(); ++s)
    for (std::size_t t = 0; t < seqs[s].size(); ++t) {
      ids.push_back(seqs[s][t]);
      slot.push_back(index_t(s));
      position.push_back(index_t(t));
    }
  Tensor logits = r.generator->forward(generate::ids_tensor(ids), CachedRows::make(slot, position), kv);
  for (std::size_t row = 0; row < ids.size(); ++row) {
    const auto& seq = seqs[std::size_t(slot[row])];
    const std::vector<std::int32_t> prefix(seq.begin(), seq.begin() + long(position[row]) + 1);
    expect_row_equals(logits, index_t(row), full_forward_logits(r, prefix), tol,
                      family + " prefill row " + std::to_string(row));
  }
  // Decode steps: one new token per sequence from the cache.
  for (int step = 0; step < 4; ++step) {
    std::vector<std::int32_t> next;
    std::vector<index_t> s_slot, s_position;
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      seqs[s].push_back(std::int32_t((step * 13 + int(s) * 29 + 3) % 100));
      next.push_back(seqs[s].back());
      s_slot.push_back(index_t(s));
      s_position.push_back(index_t(seqs[s].size()) - 1);
    }
    logits = r.generator->forward(generate::ids_tensor(next), CachedRows::make(s_slot, s_position), kv);
    for (std::size_t s = 0; s < seqs.size(); ++s)
      expect_row_equals(logits, index_t(s), full_forward_logits(r, seqs[s]), tol,
                        family + " decode step " + std::to_string(step) + " sequence " +
                            std::to_string(s));
  }
}

TEST(GenerateCache, DecodeStepsEqualFullForward) {
  if (world_size() != 1) GTEST_SKIP() << "one-rank test";
  for (const auto& [family, sets] : kFamilies) {
    check_cache(family, DType::F64, 1e-12);
    check_cache(family, DType::F32, 1e-5);
  }
}

/// Five prompts of different lengths: pp 2 and pp 4 split them unevenly.
std::vector<Request> prompts() {
  return {{0, some_ids(4, 3)}, {1, some_ids(9, 4)}, {2, some_ids(1, 5)},
          {3, some_ids(6, 6)}, {4, some_ids(2, 7)}};
}

std::map<std::string, GenerateParams> decodings() {
  std::map<std::string, GenerateParams> out;
  GenerateParams p;
  p.max_new_tokens = 12;
  p.stop_ids = {7};
  out["greedy"] = p;
  p.decoding = generate::Decoding::Sample;
  p.temperature = 1.3;
  out["sample"] = p;
  p.top_k = 5;
  out["sample_top_k"] = p;
  p.top_k = 20;
  p.top_p = 0.6;
  out["sample_top_k_top_p"] = p;
  p.top_k = 0;
  p.top_p = 0.7;
  out["sample_top_p"] = p;
  p.decoding = generate::Decoding::Beam;
  p.num_beams = 3;
  p.length_penalty = 0.7;
  out["beam"] = p;
  p.early_stopping = true;
  out["beam_early_stopping"] = p;
  return out;
}

std::vector<std::vector<std::int32_t>> generated(Replica& r, const GenerateParams& p) {
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& result : r.generator->generate(prompts(), p)) {
    out.push_back(result.ids);
    EXPECT_FALSE(result.ids.empty());
    EXPECT_TRUE(result.finish_reason == "length" || result.ids.back() == 7);
  }
  return out;
}

TEST(GenerateLayouts, SameTokensOnEveryLayout) {
  if (world_size() != 4) GTEST_SKIP() << "the 4-rank run compares layouts";
  struct Case {
    std::string family;
    int tp, pp;
    std::vector<std::string> more = {};
  };
  const std::vector<Case> cases = {
      {"gpt2", 2, 2},
      {"gpt2", 4, 1},
      {"gpt2", 1, 4},
      {"gpt2", 2, 2, {"parallel.virtual_stages=2", "parallel.schedule=interleaved"}},
      {"llama", 2, 2},
      {"multi_query", 1, 4}};
  for (const Case& c : cases) {
    Replica reference(MPI_COMM_SELF, c.family, 1, 1, DType::F64);
    Replica layout(MPI_COMM_WORLD, c.family, c.tp, c.pp, DType::F64, c.more);
    for (const auto& [name, params] : decodings())
      EXPECT_EQ(generated(layout, params), generated(reference, params))
          << c.family << " tp " << c.tp << " pp " << c.pp << " " << name;
  }
}

/// Forwards stage 0 runs for `results` in `parts` micro-batches (split as
/// Generator does: runs of consecutive prompts, the first ones one longer):
/// each micro-batch's prefill and decode steps until its last sequence ends.
long stage0_forwards(const std::vector<generate::Result>& results, int parts) {
  long forwards = 0;
  std::size_t next = 0;
  for (int m = 0; m < parts; ++m) {
    const std::size_t size =
        results.size() / std::size_t(parts) + (std::size_t(m) < results.size() % std::size_t(parts));
    std::size_t longest = 0;
    for (std::size_t k = 0; k < size; ++k) longest = std::max(longest, results[next++].ids.size());
    forwards += long(longest);
  }
  return forwards;
}

TEST(GeneratePipeline, MicroBatchesKeepTheTokensOfOneRank) {
  if (world_size() != 4) GTEST_SKIP() << "the 4-rank run compares pipelined layouts";
  MPI_Comm pair;  // pp 2 on ranks (0, 1) and on (2, 3)
  MPI_Comm_split(MPI_COMM_WORLD, testing_util::world_rank() / 2, 0, &pair);
  struct Case {
    MPI_Comm comm;
    int tp, pp;
  };
  const std::vector<Case> cases = {{pair, 1, 2}, {MPI_COMM_WORLD, 1, 4}, {MPI_COMM_WORLD, 2, 2}};
  Replica reference(MPI_COMM_SELF, "gpt2", 1, 1, DType::F64);
  auto params = decodings();
  for (const Case& c : cases) {
    Replica layout(c.comm, "gpt2", c.tp, c.pp, DType::F64);
    for (const std::string name : {"greedy", "sample", "sample_top_k"}) {
      const std::vector<std::vector<std::int32_t>> want = generated(reference, params[name]);
      for (const int micro_batches : {0, 1, 2, 3, 8}) {
        GenerateParams p = params[name];
        p.micro_batches = micro_batches;
        const int parts = layout.generator->micro_batches(prompts().size(), p);
        EXPECT_EQ(parts, micro_batches == 0 ? c.pp : std::min(micro_batches, 5));
        layout.rt.pp.reset_stats();
        const auto results = layout.generator->generate(prompts(), p);
        std::vector<std::vector<std::int32_t>> got;
        for (const auto& r : results) got.push_back(r.ids);
        const std::string where = "tp " + std::to_string(c.tp) + " pp " + std::to_string(c.pp) +
                                  " " + name + " micro_batches " + std::to_string(micro_batches);
        EXPECT_EQ(got, want) << where;
        if (layout.rt.topo.pp_rank() == 0)
          EXPECT_EQ(layout.rt.pp.stats().count(CollectiveKind::Send),
                    stage0_forwards(results, parts)) << where;
        EXPECT_EQ(layout.rt.pp.stats().count(CollectiveKind::Broadcast), 0) << where;
      }
    }
  }
  GenerateParams beam = params["beam"];
  beam.micro_batches = 3;
  EXPECT_EQ(Replica(MPI_COMM_WORLD, "gpt2", 1, 4, DType::F64).generator->micro_batches(5, beam), 1)
      << "beam search runs the batch as one";
  MPI_Comm_free(&pair);
}

/// Draws from one row of logits with top_k / top_p and compares the counts
/// with the renormalised probabilities: chi-square over the kept tokens
/// below 30 (df <= 6: p < 4e-5 for a correct sampler, so a fixed seed that
/// fails is a wrong distribution), and no draw outside them.
void check_distribution(const generate::SamplingParams& p, const std::vector<int>& kept) {
  MpiCommunicator self(MPI_COMM_SELF);
  const std::vector<double> logits = {1.0, 2.5, 0.3, 2.0, -1.0, 1.7, 0.9, 2.2};
  const index_t V = index_t(logits.size());
  const int draws = 20000, rows = 500;
  std::vector<double> counts(std::size_t(V), 0.0);
  for (int batch = 0; batch < draws / rows; ++batch) {
    Tensor t = Tensor::empty({rows, V}, DType::F64);
    std::vector<generate::DrawKey> keys;
    for (int r = 0; r < rows; ++r) {
      for (index_t v = 0; v < V; ++v) t.data<double>()[r * V + v] = logits[std::size_t(v)];
      keys.push_back({batch * rows + r, 17});
    }
    for (const auto& c : generate::choose_tokens(t, 0, V, p, keys, self)) counts[std::size_t(c.id)] += 1;
  }
  double z = 0;
  for (int v : kept) z += std::exp(logits[std::size_t(v)] / p.temperature);
  double chi2 = 0, inside = 0;
  for (int v : kept) {
    const double expected = draws * std::exp(logits[std::size_t(v)] / p.temperature) / z;
    chi2 += (counts[std::size_t(v)] - expected) * (counts[std::size_t(v)] - expected) / expected;
    inside += counts[std::size_t(v)];
  }
  EXPECT_EQ(inside, draws) << "a token outside the kept set was drawn";
  EXPECT_LT(chi2, 30.0);
}

TEST(GenerateSampler, DrawsFollowRenormalisedProbabilities) {
  if (world_size() != 1) GTEST_SKIP() << "one-rank test";
  generate::SamplingParams p;
  p.greedy = false;
  p.seed = 99;
  p.temperature = 0.8;
  p.top_k = 4;
  check_distribution(p, {1, 3, 5, 7});  // the 4 largest logits: 2.5, 2.2, 2.0, 1.7
  p.temperature = 1.0;
  p.top_k = 0;
  // softmax of the logits: tokens 1, 7, 3, 5 hold mass 0.297, 0.220,
  // 0.180, 0.134: the mass above token 5 is 0.698 < 0.7, above the next
  // (token 0) 0.832.
  p.top_p = 0.7;
  check_distribution(p, {1, 7, 3, 5});
  p.top_k = 0;
  p.top_p = 1.0;
  check_distribution(p, {0, 1, 2, 3, 4, 5, 6, 7});
}

TEST(GenerateBeam, HypothesesKeepTheBestAndStopAsTransformers) {
  // K = 2, length_penalty 2: scores sum / length^2.
  generate::BeamHypotheses h(2, 2.0, /*early_stopping=*/false);
  h.add({0, {1}, {-2.0}}, -2.0, 1);          // -2
  EXPECT_FALSE(h.is_done(-100.0, 1)) << "fewer than K hypotheses";
  h.add({0, {2, 3}, {-1.0, -3.0}}, -4.0, 2);  // -1
  h.add({0, {4, 5}, {-5.0, -7.0}}, -12.0, 2);  // -3: worse than both, not kept
  EXPECT_EQ(h.size(), 2u);
  EXPECT_EQ(h.best().ids, (std::vector<std::int32_t>{2, 3}));
  // Worst kept -2: a running beam at -8 over 2 tokens (-2) cannot beat it; at -7.9 it can.
  EXPECT_TRUE(h.is_done(-8.0, 2));
  EXPECT_FALSE(h.is_done(-7.9, 2));
  h.add({0, {6, 7, 8}, {-1.0, -1.0, -1.0}}, -3.0, 3);  // -1/3 replaces -2
  EXPECT_EQ(h.best().ids, (std::vector<std::int32_t>{6, 7, 8}));
  // The worst kept is now -1: -4 over 2 tokens (-1) cannot beat it, -3.9 can.
  EXPECT_TRUE(h.is_done(-4.0, 2));
  EXPECT_FALSE(h.is_done(-3.9, 2));
  generate::BeamHypotheses early(1, 1.0, /*early_stopping=*/true);
  early.add({0, {1}, {-9.0}}, -9.0, 1);
  EXPECT_TRUE(early.is_done(0.0, 1)) << "early_stopping: done once K are kept";
}

TEST(GenerateSampler, UniformsDependOnEveryKeyPart) {
  const double base = generate::draw_uniform(1, {3, 4}, 5);
  EXPECT_GT(base, 0.0);
  EXPECT_LT(base, 1.0);
  EXPECT_NE(base, generate::draw_uniform(2, {3, 4}, 5));
  EXPECT_NE(base, generate::draw_uniform(1, {4, 4}, 5));
  EXPECT_NE(base, generate::draw_uniform(1, {3, 5}, 5));
  EXPECT_NE(base, generate::draw_uniform(1, {3, 4}, 6));
  EXPECT_EQ(base, generate::draw_uniform(1, {3, 4}, 5));
}

}  // namespace
}  // namespace meshtron
