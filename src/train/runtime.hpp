// ParallelRuntime: the topology and one Communicator per group, built once
// from MPI_COMM_WORLD (or any communicator: tests build a 1-rank reference
// over MPI_COMM_SELF beside the decomposed run).
//
// On the host path every group is an MpiCommunicator. With space = Cuda the
// runtime first selects this rank's GPU (local rank % GPUs on the node),
// then builds an NcclCommunicator for the tp, dp, pp, model-parallel and
// embedding groups (device buffers over NCCL, host scalars over MPI: see
// communicator_nccl.hpp). `world` stays MPI: it carries host values only.
#pragma once

#include <memory>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/mappings.hpp"
#include "parallel/topology.hpp"
#include "train/optimizer.hpp"

namespace meshtron {

class ParallelRuntime {
  /// parallel.collective_timeout_s; null when off. Declared first: it
  /// outlives the communicators, whose teardown may still wait.
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  // Declared before the references below, which point into it.
  std::vector<std::unique_ptr<Communicator>> owned_;  ///< Owned group communicators.
  MemorySpace space_;
  int gpu_ = -1;  ///< this rank's GPU, selected before the first NCCL communicator

 public:
  /// Collective over `world`. Cuda needs the CUDA path built (UserError
  /// otherwise) and a GPU on every rank. A timeout in `watch` puts every
  /// group, `world` included, under a CollectiveWatchdog.
  ParallelRuntime(MPI_Comm world, const ParallelDegrees& degrees,
                  MemorySpace space = MemorySpace::Host, const WatchdogSettings& watch = {});
  ParallelRuntime(const ParallelRuntime&) = delete;
  ParallelRuntime& operator=(const ParallelRuntime&) = delete;

  OptimizerGroups optimizer_groups() { return {tp, dp, model, embedding, stack}; }
  /// Where the groups' collectives expect their tensors.
  MemorySpace space() const { return space_; }
  /// This rank's GPU, -1 on the host path.
  int gpu() const { return gpu_; }
  /// GPUs visible to this rank (0 on the host path), for the rank map.
  int num_gpus() const;
  /// The collective watchdog, null when parallel.collective_timeout_s = 0:
  /// the trainer tells it the step and micro-batch it is at.
  CollectiveWatchdog* watchdog() { return watchdog_.get(); }

  Topology topo;
  MpiCommunicator world;
  Communicator &tp, &dp, &pp, &model;
  /// First + last stage (tied word table) when pp > 1 and this rank is on
  /// one of them; null otherwise (no reduction needed).
  Communicator* embedding = nullptr;
  /// Under a pipeline split, the other stages of this rank's stack (the
  /// stack's relative-bias table) when it has several; null otherwise.
  Communicator* stack = nullptr;
  TensorParallelGroup tp_group;

 private:
  static MemorySpace checked_space(MemorySpace space);
  /// The communicator of one group in this runtime's space.
  Communicator& make(MPI_Comm comm);
  /// Puts every group under watchdog_ (the world's named first).
  void watch_groups();
};

/// Peak memory of this rank in MiB for the step line: the caching device
/// allocator's peak bytes (device_allocator.hpp) on Cuda, the process's peak
/// resident set (getrusage) on the host.
double peak_memory_mib(MemorySpace space);
/// Peak bytes of this rank's tensors in MiB: the device allocator's peak on
/// Cuda, the host tensors' (host_tensor_stats) on the host; what `meshtron
/// plan` estimates (the resident set adds the binary, MPI and libraries).
double peak_tensor_mib(MemorySpace space);

}  // namespace meshtron
