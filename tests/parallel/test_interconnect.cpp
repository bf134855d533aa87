// Placement advice (parallel/interconnect.hpp) on made-up machines: tp
// within one node's NVLink is quiet; tp across nodes or over a PCIe-only
// pair warns; dp and pp across nodes are where they belong.
#include <gtest/gtest.h>

#include "parallel/interconnect.hpp"

namespace meshtron {
namespace {

/// Two 4-GPU nodes whose GPUs pair up over NVLink (0-1, 2-3), as on
/// PCIe boards with NVLink bridges.
GpuLinks bridged_pairs() {
  GpuLinks links = GpuLinks::pcie_only(4);
  links.set_nvlink(0, 1, true);
  links.set_nvlink(2, 3, true);
  return links;
}

TEST(Interconnect, TpWithinOneNvlinkNodeIsQuiet) {
  // tp 8 on one 8-GPU NVSwitch node, dp 2 over two nodes.
  const auto rows = planned_rank_map(/*tp=*/8, /*pp=*/1, /*dp=*/2, /*gpus_per_node=*/8);
  EXPECT_TRUE(tp_placement_warnings(rows, GpuLinks::all_nvlink(8)).empty());
}

TEST(Interconnect, TpAcrossTwoNodesWarns) {
  const auto rows = planned_rank_map(/*tp=*/4, /*pp=*/1, /*dp=*/1, /*gpus_per_node=*/2);
  const auto lines = tp_placement_warnings(rows, GpuLinks::all_nvlink(2));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "warning: tp group {0,1,2,3} spans nodes node0, node1: keep tp within a node "
            "(NVLink); put pp across nodes");
}

TEST(Interconnect, TpAcrossNodesWarnsWithoutNvml) {
  // Host names alone show it; the host path (gpu -1) too.
  auto rows = planned_rank_map(/*tp=*/2, /*pp=*/1, /*dp=*/1, /*gpus_per_node=*/1);
  for (auto& r : rows) r.gpu = -1;
  EXPECT_EQ(tp_placement_warnings(rows, std::nullopt).size(), 1u);
}

TEST(Interconnect, TpOnAPcieOnlyPairWarns) {
  // tp 4 on one node of bridged pairs: ranks 0 and 2 meet over PCIe.
  const auto rows = planned_rank_map(/*tp=*/4, /*pp=*/1, /*dp=*/1, /*gpus_per_node=*/4);
  const auto lines = tp_placement_warnings(rows, bridged_pairs());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("tp group {0,1,2,3} joins GPUs 0 and 2 of node0 over PCIe only"),
            std::string::npos)
      << lines[0];
  // tp 2 on the bridged pairs: NVLink inside every group.
  EXPECT_TRUE(tp_placement_warnings(planned_rank_map(2, 1, 2, 4), bridged_pairs()).empty());
}

TEST(Interconnect, DpAndPpAcrossNodesAreQuiet) {
  // tp 2 inside 2-GPU nodes; dp 2 and pp 2 cross the four nodes.
  const auto rows = planned_rank_map(/*tp=*/2, /*pp=*/2, /*dp=*/2, /*gpus_per_node=*/2);
  ASSERT_EQ(rows.back().host, "node3");
  EXPECT_TRUE(tp_placement_warnings(rows, GpuLinks::all_nvlink(2)).empty());
  EXPECT_TRUE(tp_placement_warnings(rows, std::nullopt).empty());
}

TEST(Interconnect, ManyGroupsAlikeAreSummarised) {
  // dp 16 replicas of a tp group that spans two 4-GPU nodes.
  const auto lines = tp_placement_warnings(planned_rank_map(8, 1, 16, 4), std::nullopt);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines.back(), "warning: and 12 more tp groups placed alike");
}

TEST(Interconnect, DescribesTheLinks) {
  EXPECT_EQ(describe_gpu_links(std::nullopt), "GPU interconnect: unknown (no NVML)");
  EXPECT_EQ(describe_gpu_links(GpuLinks::all_nvlink(8)),
            "GPU interconnect: 8 GPUs, NVLink between every pair");
  EXPECT_EQ(describe_gpu_links(GpuLinks::pcie_only(2)),
            "GPU interconnect: 2 GPUs, PCIe only (no NVLink)");
  EXPECT_EQ(describe_gpu_links(bridged_pairs()),
            "GPU interconnect: 4 GPUs, NVLink between 0-1, 2-3; PCIe between the other pairs");
}

}  // namespace
}  // namespace meshtron
