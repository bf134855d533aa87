#include "train/runtime.hpp"

#include "common/error.hpp"
#include "tensor/device_allocator.hpp"
#include "train/metrics.hpp"
#ifdef MESHTRON_HAVE_CUDA
#include "parallel/communicator_nccl.hpp"
#endif

namespace meshtron {

ParallelRuntime::ParallelRuntime(MPI_Comm world_comm, const ParallelDegrees& degrees,
                                 MemorySpace space, const WatchdogSettings& watch)
    : watchdog_(watch.timeout_s > 0 ? std::make_unique<CollectiveWatchdog>(
                                          world_comm, watch.timeout_s, watch.skip)
                                    : nullptr),
      space_(checked_space(space)),
      topo(world_comm, degrees),
      world(topo.world_comm()),
      tp(make(topo.tp_comm())),
      dp(make(topo.dp_comm())),
      pp(make(topo.pp_comm())),
      model(make(topo.model_parallel_comm())),
      tp_group{tp} {
  // The tied word table needs a reduction only when first and last stage
  // are different ranks.
  if (topo.pp() > 1 && topo.in_embedding_group()) embedding = &make(topo.embedding_comm());
  const int split = topo.pipeline_split_rank();
  const int stack_stages = topo.pp_rank() < split ? split : topo.pp() - split;
  if (split > 0 && stack_stages > 1) stack = &make(topo.stack_comm());
  if (watchdog_) watch_groups();
}

void ParallelRuntime::watch_groups() {
  world.watch(*watchdog_, GroupKind::World);
  tp.watch(*watchdog_, GroupKind::Tp);
  dp.watch(*watchdog_, GroupKind::Dp);
  pp.watch(*watchdog_, GroupKind::Pp);
  model.watch(*watchdog_, GroupKind::Model);
  if (embedding) embedding->watch(*watchdog_, GroupKind::Embedding);
  if (stack) stack->watch(*watchdog_, GroupKind::Stack);
}

MemorySpace ParallelRuntime::checked_space(MemorySpace space) {
#ifndef MESHTRON_HAVE_CUDA
  MESH_REQUIRE(space == MemorySpace::Host,
               "run.device = cuda, but this meshtron was built without the CUDA path "
               "(configure with -DMESHTRON_CUDA=ON on a machine with nvcc and NCCL)");
#endif
  return space;
}

Communicator& ParallelRuntime::make(MPI_Comm comm) {
#ifdef MESHTRON_HAVE_CUDA
  if (space_ == MemorySpace::Cuda) {
    if (gpu_ < 0) gpu_ = select_gpu(topo);  // NCCL binds a communicator to the current GPU
    owned_.push_back(std::make_unique<NcclCommunicator>(comm));
    return *owned_.back();
  }
#endif
  owned_.push_back(std::make_unique<MpiCommunicator>(comm));
  return *owned_.back();
}

int ParallelRuntime::num_gpus() const {
  return space_ == MemorySpace::Cuda ? device::cuda_device_count() : 0;
}

double peak_memory_mib(MemorySpace space) {
  if (space == MemorySpace::Cuda)
    return double(device::allocator_stats().peak_bytes) / (1024.0 * 1024.0);
  return peak_rss_mib();
}

double peak_tensor_mib(MemorySpace space) {
  const std::size_t bytes = space == MemorySpace::Cuda ? device::allocator_stats().peak_bytes
                                                       : host_tensor_stats().peak_bytes;
  return double(bytes) / (1024.0 * 1024.0);
}

}  // namespace meshtron
