// GPU interconnect: which local GPUs NVLink joins (read through NVML), and
// the placement advice that follows from it and the rank map.
//
// Megatron-LM's guidance (Narayanan et al. 2021, arXiv 2104.04473, sec. 3.2
// and takeaway #1): tensor parallelism moves 4 all-reduces per layer and
// micro-batch, so its group belongs on one node's NVLink; pipeline
// parallelism only sends activations between neighbours and goes across
// nodes. The advice here is a pure function of the rank map and a link
// matrix, so it is tested on made-up machines.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "parallel/topology.hpp"

namespace meshtron {

/// NVLink between the GPUs of one node, indexed as the rank map's `gpu`
/// column (CUDA's visible order). Every node is taken to be alike.
struct GpuLinks {
  int count = 0;
  std::vector<char> nvlink;  ///< count x count, row-major; the diagonal is true

  static GpuLinks all_nvlink(int count);
  static GpuLinks pcie_only(int count);
  bool nvlink_between(int a, int b) const;
  void set_nvlink(int a, int b, bool on);
};

/// This node's links through NVML (libnvidia-ml.so.1, opened at run time),
/// in the order CUDA_VISIBLE_DEVICES gives when it lists indices; nullopt
/// when there is no driver, no GPU, or the visible list names UUIDs.
std::optional<GpuLinks> read_gpu_links();

/// One line: "GPU interconnect: ..." (NVLink between every pair, the pairs
/// that have it, or "unknown (no NVML)").
std::string describe_gpu_links(const std::optional<GpuLinks>& links);

/// One warning line per tensor-parallel group (the ranks sharing dp and pp)
/// that spans more than one host, or joins two GPUs without NVLink between
/// them. Host-path rows (gpu -1) and GPUs outside `links` are only checked
/// for hosts. Data- and pipeline-parallel groups never warn: across nodes
/// is where they belong.
std::vector<std::string> tp_placement_warnings(const std::vector<RankMapRow>& rows,
                                               const std::optional<GpuLinks>& links);

/// The rank map a launch of tp x pp x dp ranks would get with
/// `gpus_per_node` ranks per node, filled in order (mpirun's and srun's
/// default block placement): host "node<k>", GPU = node-local rank.
std::vector<RankMapRow> planned_rank_map(int tp, int pp, int dp, int gpus_per_node);

}  // namespace meshtron
