// Topology groups for every factorisation of the world size, checked against
// an independent formula: with tp fastest, ranks r and q share a
//   tensor group   iff r / tp == q / tp
//   data group     iff r % tp == q % tp and r / (tp*dp) == q / (tp*dp)
//   pipeline group iff r % (tp*dp) == q % (tp*dp)
//   model group    iff (r / tp) % dp == (q / tp) % dp
#include <gtest/gtest.h>

#include "common/mpi_test_util.hpp"
#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "parallel/topology.hpp"

namespace meshtron {
namespace {

using testing_util::world_size;

/// World ranks of the members of `comm`, in comm rank order.
std::vector<int> members(MPI_Comm comm) {
  int n, me;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::vector<int> out(n);
  MPI_Allgather(&me, 1, MPI_INT, out.data(), 1, MPI_INT, comm);
  return out;
}

template <class Pred>
std::vector<int> expected(int world, Pred same_group) {
  std::vector<int> out;
  for (int q = 0; q < world; ++q)
    if (same_group(q)) out.push_back(q);
  return out;
}

std::vector<ParallelDegrees> factorisations(int world) {
  std::vector<ParallelDegrees> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; tp * pp <= world; ++pp)
      if (world % (tp * pp) == 0) out.push_back({tp, pp, world / (tp * pp)});
  return out;
}

TEST(Topology, GroupsMatchFormulaForEveryFactorisation) {
  const int world = world_size();
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  for (const ParallelDegrees& d : factorisations(world)) {
    SCOPED_TRACE(testing::Message() << "tp=" << d.tensor_parallel
                                    << " pp=" << d.pipeline_parallel
                                    << " dp=" << d.data_parallel);
    Topology topo(MPI_COMM_WORLD, d);
    const int tp = d.tensor_parallel, dp = d.data_parallel, pp = d.pipeline_parallel;
    ASSERT_EQ(topo.tp(), tp);
    ASSERT_EQ(topo.dp(), dp);
    ASSERT_EQ(topo.pp(), pp);
    EXPECT_EQ(members(topo.tp_comm()),
              expected(world, [&](int q) { return q / tp == r / tp; }));
    EXPECT_EQ(members(topo.dp_comm()), expected(world, [&](int q) {
                return q % tp == r % tp && q / (tp * dp) == r / (tp * dp);
              }));
    EXPECT_EQ(members(topo.pp_comm()), expected(world, [&](int q) {
                return q % (tp * dp) == r % (tp * dp);
              }));
    EXPECT_EQ(members(topo.model_parallel_comm()), expected(world, [&](int q) {
                return (q / tp) % dp == (r / tp) % dp;
              }));
    const int stage = r / (tp * dp);
    EXPECT_EQ(topo.pp_rank(), stage);
    EXPECT_EQ(topo.tp_rank(), r % tp);
    EXPECT_EQ(topo.dp_rank(), (r / tp) % dp);
    EXPECT_EQ(topo.is_first_stage(), stage == 0);
    EXPECT_EQ(topo.is_last_stage(), stage == pp - 1);
    EXPECT_EQ(topo.prev_stage_rank(), stage == 0 ? -1 : r - tp * dp);
    EXPECT_EQ(topo.next_stage_rank(), stage == pp - 1 ? -1 : r + tp * dp);
    if (stage == 0 || stage == pp - 1) {
      ASSERT_TRUE(topo.in_embedding_group());
      EXPECT_EQ(members(topo.embedding_comm()), expected(world, [&](int q) {
                  const int qs = q / (tp * dp);
                  return q % (tp * dp) == r % (tp * dp) && (qs == 0 || qs == pp - 1);
                }));
    } else {
      EXPECT_FALSE(topo.in_embedding_group());
    }
    for (int q = 0; q < world; ++q) EXPECT_EQ(topo.rank_of(topo.coord_of(q)), q);
  }
}

TEST(Topology, AutoDataParallelAndErrorsNameEveryFactor) {
  EXPECT_EQ(Topology::resolve({2, 2, 0}, 8).data_parallel, 2);
  try {
    Topology::resolve({2, 1, 3}, 4);
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tensor_parallel (2)"), std::string::npos) << m;
    EXPECT_NE(m.find("pipeline_parallel (1)"), std::string::npos) << m;
    EXPECT_NE(m.find("data_parallel (3)"), std::string::npos) << m;
  }
  EXPECT_THROW(Topology::resolve({3, 1, 0}, 4), UserError);
  EXPECT_THROW(Topology::resolve({0, 1, 1}, 1), UserError);
}

TEST(Topology, RankMapGathersEveryRank) {
  Topology topo(MPI_COMM_WORLD, {1, 1, 0});
  const auto rows = gather_rank_map(topo, /*num_gpus=*/2);
  ASSERT_EQ(int(rows.size()), world_size());
  for (const auto& row : rows) {
    EXPECT_EQ(row.coord, topo.coord_of(row.world_rank));
    EXPECT_EQ(row.gpu, row.local_rank % 2);
  }
  EXPECT_NE(format_rank_map(rows).find("rank"), std::string::npos);
}

// parallel.tp_copy_engine's check: CUDA IPC needs each tp group on one node.
TEST(Topology, HostsPerTensorParallelGroupFromTheRankMap) {
  // 4 ranks, tp 2 x dp 2, two ranks per host: tp fastest keeps each tp
  // group on one host; a round-robin placement splits both.
  const auto map = [](std::vector<std::string> hosts) {
    std::vector<RankMapRow> rows;
    for (int r = 0; r < 4; ++r) rows.push_back({r, {r % 2, r / 2, 0}, hosts[r], 0, -1});
    return rows;
  };
  EXPECT_EQ(max_hosts_per_tp_group(map({"a", "a", "b", "b"})), 1);
  EXPECT_EQ(max_hosts_per_tp_group(map({"a", "b", "a", "b"})), 2);
  EXPECT_EQ(max_hosts_per_tp_group(map({"a", "a", "a", "b"})), 2);
  // This job's own map: one host, so every tp group is on it.
  Topology topo(MPI_COMM_WORLD, {world_size() % 2 ? 1 : 2, 1, 0});
  EXPECT_EQ(max_hosts_per_tp_group(gather_rank_map(topo, 0)), 1);
}

}  // namespace
}  // namespace meshtron
