// meshtron plan: micro-batches in flight per schedule and the layouts
// --search keeps (those RunConfig::validate and the schedule accept).
#include <gtest/gtest.h>

#include <set>

#include "config/model_spec_from_deck.hpp"
#include "plan/search.hpp"

namespace meshtron::plan {
namespace {

RunConfig deck(const std::string& schedule, int pp, int v) {
  RunConfig c = RunConfig::from_text(R"(
[model]
num_layers = 8
hidden_size = 64
num_attention_heads = 4
num_query_groups = 2
seq_length = 32
vocab_size = 100
[training]
micro_batch_size = 1
global_batch_size = 8
)");
  c.parallel.pipeline_parallel = pp;
  c.parallel.schedule = schedule;
  c.parallel.virtual_stages = v;
  c.validate(pp);
  return c;
}

std::vector<int> in_flight(const RunConfig& c) {
  std::vector<int> out;
  for (const RankMemory& r : plan_memory(c, model_spec_from_deck(c, 100, 1)))
    out.push_back(r.in_flight);
  return out;
}

TEST(PlanSchedule, MicroBatchesInFlightPerSchedule) {
  EXPECT_EQ(in_flight(deck("gpipe", 4, 1)), (std::vector<int>{8, 8, 8, 8}));  // all m
  EXPECT_EQ(in_flight(deck("1f1b", 4, 1)), (std::vector<int>{4, 3, 2, 1}));   // pp - rank
  // Interleaved, in chunk passes: Megatron's 2 (pp - rank - 1) + (v - 1) pp
  // warm-up forwards plus one, i.e. v (pp + (pp - 1) / v) on rank 0: the
  // paper's pp (1 + (pp - 1) / (pp v)) stages' worth of activations.
  EXPECT_EQ(in_flight(deck("interleaved", 4, 2)), (std::vector<int>{11, 9, 7, 5}));
}

TEST(PlanSearch, KeepsOnlyLayoutsTheTrainerAccepts) {
  RunConfig base = deck("1f1b", 1, 1);
  const Rates cpu = read_rates(std::string(MESHTRON_SOURCE_DIR) + "/plan/rates/cpu.json");
  const auto found = search_layouts(base, 100, 8, 1e12, cpu, 8);
  ASSERT_FALSE(found.empty());
  std::set<int> tps;
  for (const Candidate& k : found) {
    RunConfig c = k.config;
    EXPECT_NO_THROW(c.validate(8)) << layout_name(c);
    tps.insert(c.parallel.tensor_parallel);
    // 2 kv groups: tp 4 and 8 cannot split them (RunConfig::validate).
    EXPECT_LE(c.parallel.tensor_parallel, 2) << layout_name(c);
    const int m = micro_batches_per_step(c);
    if (c.parallel.virtual_stages > 1) EXPECT_EQ(m % c.parallel.pipeline_parallel, 0);
    EXPECT_EQ(c.parallel.tensor_parallel * c.parallel.pipeline_parallel * c.parallel.data_parallel,
              8);
  }
  EXPECT_EQ(tps, (std::set<int>{1, 2}));
  for (std::size_t i = 1; i < found.size(); ++i)  // fitting layouts ranked by step time
    EXPECT_LE(found[i - 1].step.step_s, 1.005 * found[i].step.step_s);
}

TEST(PlanSearch, ALayoutThatDoesNotFitRanksBelowOneThatDoes) {
  RunConfig base = deck("1f1b", 1, 1);
  const Rates cpu = read_rates(std::string(MESHTRON_SOURCE_DIR) + "/plan/rates/cpu.json");
  const auto all = search_layouts(base, 100, 4, 1e12, cpu, 4);
  double smallest = 1e30, largest = 0;
  for (const Candidate& k : all)
    smallest = std::min(smallest, k.peak_bytes), largest = std::max(largest, k.peak_bytes);
  const double budget = 0.5 * (smallest + largest);
  const auto found = search_layouts(base, 100, 4, budget, cpu, 4);
  EXPECT_TRUE(found.front().fits);
  EXPECT_LE(found.front().peak_bytes, budget);
  EXPECT_FALSE(found.back().fits);
}

}  // namespace
}  // namespace meshtron::plan
