// NCCL backend of Communicator (see communicator_nccl.hpp for the design).
#ifdef MESHTRON_HAVE_CUDA

#include "parallel/communicator_nccl.hpp"

#include <cuda_runtime.h>

#include "common/error.hpp"
#include "tensor/device_allocator.hpp"
#include "tensor/device_stream.hpp"

namespace meshtron {

namespace {


ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    case DType::U16: break;  // no 16-bit integer type in NCCL
  }
  MESH_VERIFY(false, "NCCL has no datatype for " << dtype_name(dtype));
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : ncclSum; }

std::size_t bytes_of(std::size_t count, DType dtype) { return count * dtype_size(dtype); }

/// Whether every rank's block has the same size (NCCL's all-gather and
/// reduce-scatter then apply; otherwise grouped broadcasts / reduces).
bool equal_counts(std::span<const std::size_t> counts) {
  for (std::size_t c : counts)
    if (c != counts[0]) return false;
  return !counts.empty() && counts[0] > 0;
}

/// Device-to-device copy on the compute stream (a group of one rank).
void local_copy(void* dst, const void* src, std::size_t bytes) {
  if (dst != src && bytes > 0)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, device::compute_stream()));
}

/// The same answer on every rank of `comm` for "is this buffer on the
/// device?" is required (NCCL on some ranks and MPI on others would hang);
/// a buffer in different memory on different ranks is a programming error.
bool device_buffer(const void* ptr) { return ptr != nullptr && is_device_pointer(ptr); }

}  // namespace

bool is_device_pointer(const void* ptr) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // not a pointer CUDA knows: host memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

int select_gpu(const Topology& topo) {
  const int count = device::cuda_device_count();
  MESH_VERIFY(count > 0, "run.device = cuda, but rank " << topo.world_rank() << " on "
                                                        << topo.host_name() << " sees no GPU");
  const int gpu = topo.gpu_for_local_rank(count);
  CUDA_CHECK(cudaSetDevice(gpu));
  return gpu;
}

NcclCommunicator::NcclCommunicator(MPI_Comm comm) : host_(comm) {
  if (size() == 1) return;
  ncclUniqueId id;
  if (rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_CHECK(MPI_Bcast(&id, int(sizeof(id)), MPI_BYTE, 0, comm));
  NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
}

NcclCommunicator::~NcclCommunicator() {
  wait_sends();
  wait_collectives();
  destroy_links();  // before the group's communicator they were split from
  job1_ce_.exchange.reset();
  if (job1_comm_) {
    ncclCommFinalize(job1_comm_);
    ncclCommDestroy(job1_comm_);
    cudaStreamDestroy(job1_stream_);
  }
  if (comm_) {
    // Finalize flushes outstanding operations; only then is Destroy safe.
    ncclCommFinalize(comm_);
    ncclCommDestroy(comm_);
  }
  // Streams after the communicator (NCCL's teardown order).
  for (cudaEvent_t e : pending_events_) cudaEventDestroy(e);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  if (comm_stream_) {
    cudaEventDestroy(inputs_ready_);
    cudaEventDestroy(reduced_);
    cudaStreamDestroy(comm_stream_);
  }
}

void NcclCommunicator::all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  record(CollectiveKind::AllReduce, bytes_of(count, dtype));
  if (!device_buffer(buf)) {
    host_.all_reduce(buf, count, dtype, op);
    return;
  }
  if (!comm_) return;
  const bool copy_engines = copy_engine_sum(count, dtype, op);
  blocking([&](const JobLane& lane) {
    if (copy_engines)
      copy_engine_all_reduce(*lane.copy_engine, buf, count, dtype, lane.stream, nullptr);
    else
      NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), lane.comm,
                               lane.stream));
  });
}

bool NcclCommunicator::adds_in_all_reduce(std::size_t count, DType dtype) const {
  return comm_ && copy_engine_sum(count, dtype, ReduceOp::Sum);
}

void NcclCommunicator::all_reduce_adding(void* buf, std::size_t count, DType dtype,
                                         const void* residual, const void* bias,
                                         std::size_t columns) {
  MESH_VERIFY(adds_in_all_reduce(count, dtype) && device_buffer(buf),
              "all_reduce_adding: " << count << " elements of " << dtype_name(dtype)
                                    << " do not go over the copy engines");
  MESH_VERIFY(columns > 0 && count % columns == 0,
              "all_reduce_adding: " << count << " elements are not rows of " << columns);
  record(CollectiveKind::AllReduce, bytes_of(count, dtype));
  const PeerExchange::Addends addends{residual, bias, columns};
  blocking([&](const JobLane& lane) {
    copy_engine_all_reduce(*lane.copy_engine, buf, count, dtype, lane.stream, &addends);
  });
}

bool NcclCommunicator::copy_engine_sum(std::size_t count, DType dtype, ReduceOp op) const {
  // Sums whose blocks split evenly over the ranks (the row-parallel outputs
  // and column-parallel input gradients without SP; not the few-element
  // statistics).
  return copy_engine_ && op == ReduceOp::Sum && count % std::size_t(size()) == 0 &&
         bytes_of(count, dtype) >= copy_engine_min_bytes_;
}

void NcclCommunicator::all_reduce_each(std::span<Tensor* const> tensors, ReduceOp op) {
  // Host tensors go through MPI at once inside all_reduce(); the device ones
  // are queued by NCCL until the group ends.
  if (size() == 1) return;  // as Communicator::all_reduce_each
  NCCL_CHECK(ncclGroupStart());
  for (Tensor* t : tensors) Communicator::all_reduce(*t, op);
  NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                      DType dtype, ReduceOp op) {
  record(CollectiveKind::ReduceScatter, bytes_of(recv_count * size(), dtype));
  if (!device_buffer(send)) {
    host_.reduce_scatter(send, recv, recv_count, dtype, op);
    return;
  }
  if (!comm_) return local_copy(recv, send, bytes_of(recv_count, dtype));
  if (copy_engine_ && op == ReduceOp::Sum)
    return blocking_copy_engine_reduce_scatter(send, recv, recv_count, dtype, nullptr);
  blocking([&](const JobLane& lane) {
    NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), lane.comm,
                                 lane.stream));
  });
}

bool NcclCommunicator::adds_in_reduce_scatter(std::size_t recv_count, DType dtype) const {
  (void)recv_count, (void)dtype;
  return comm_ && copy_engine_;  // as reduce_scatter's copy-engine branch: any size
}

void NcclCommunicator::reduce_scatter_adding(const void* send, void* recv, std::size_t recv_count,
                                             DType dtype, const void* residual, const void* bias,
                                             std::size_t columns) {
  MESH_VERIFY(adds_in_reduce_scatter(recv_count, dtype) && device_buffer(send),
              "reduce_scatter_adding: " << recv_count << " elements of " << dtype_name(dtype)
                                        << " do not go over the copy engines");
  MESH_VERIFY(columns > 0 && recv_count % columns == 0,
              "reduce_scatter_adding: " << recv_count << " elements are not rows of " << columns);
  record(CollectiveKind::ReduceScatter, bytes_of(recv_count * size(), dtype));
  const PeerExchange::Addends addends{residual, bias, columns};
  blocking_copy_engine_reduce_scatter(send, recv, recv_count, dtype, &addends);
}

void NcclCommunicator::blocking_copy_engine_reduce_scatter(const void* send, void* recv,
                                                           std::size_t count, DType dtype,
                                                           const PeerExchange::Addends* addends) {
  const std::size_t bytes = bytes_of(count * std::size_t(size()), dtype);
  // The transfer on the lane's stream, the adds on the compute stream
  // (after the switch when interleaving). The exchange is held across the
  // switch: the other job's call may grow (replace) the arena.
  std::shared_ptr<PeerExchange> exchange;
  std::size_t at = 0;
  blocking(
      [&](const JobLane& lane) {
        at = lane.copy_engine->region(host_.comm(), bytes);
        exchange = lane.copy_engine->exchange;
        exchange->reduce_scatter_transfer(send, count, dtype, at, lane.stream);
      },
      [&] {
        exchange->reduce_scatter_sum(send, count, dtype, recv, at, device::compute_stream(),
                                     addends);
      });
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t send_count,
                                  DType dtype) {
  record(CollectiveKind::AllGather, bytes_of(send_count * size(), dtype));
  if (!device_buffer(send)) {
    host_.all_gather(send, recv, send_count, dtype);
    return;
  }
  if (!comm_) return local_copy(recv, send, bytes_of(send_count, dtype));
  const auto queue = [&](const JobLane& lane) {
    if (copy_engine_)
      copy_engine_all_gather(*lane.copy_engine, send, recv, bytes_of(send_count, dtype),
                             lane.stream);
    else
      NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type(dtype), lane.comm, lane.stream));
  };
  blocking(queue);
}

void NcclCommunicator::blocking(const std::function<void(const JobLane&)>& queue,
                                const std::function<void()>& finish) {
  if (interleaving()) return interleaved(queue, finish);
  queue({comm_, device::compute_stream(), &blocking_ce_});
  if (finish) finish();
}

void NcclCommunicator::separate_interleaved_jobs() {
  if (!comm_ || job1_comm_) return;  // every rank of the group takes the same branch
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.splitShare = 0;  // own resources: its collectives run beside comm_'s
  NCCL_CHECK(ncclCommSplit(comm_, 0, rank(), &job1_comm_, &config));
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&job1_stream_, cudaStreamNonBlocking, greatest));
}

NcclCommunicator::JobLane NcclCommunicator::lane_of_current_job() {
  make_comm_stream();
  if (job1_comm_ && interleaved_job() == 1) return {job1_comm_, job1_stream_, &job1_ce_};
  return {comm_, comm_stream_, &blocking_ce_};
}

void NcclCommunicator::interleaved(const std::function<void(const JobLane&)>& queue,
                                   const std::function<void()>& finish) {
  // The side stream starts after the compute work queued so far (the
  // collective's inputs). While this job is switched out, the other queues
  // its compute, which runs during the transfer; the event is this call's
  // own, since the other job records its collectives' events meanwhile.
  const JobLane lane = lane_of_current_job();
  CUDA_CHECK(cudaEventRecord(inputs_ready_, device::compute_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(lane.stream, inputs_ready_, 0));
  queue(lane);
  if (free_events_.empty()) {
    free_events_.emplace_back();
    CUDA_CHECK(cudaEventCreateWithFlags(&free_events_.back(), cudaEventDisableTiming));
  }
  const cudaEvent_t done = free_events_.back();
  free_events_.pop_back();
  CUDA_CHECK(cudaEventRecord(done, lane.stream));
  yield_point();
  // A wait captures the event's state now: the event is free again after it.
  CUDA_CHECK(cudaStreamWaitEvent(device::compute_stream(), done, 0));
  free_events_.push_back(done);
  if (finish) finish();
}

void NcclCommunicator::use_copy_engine(std::size_t min_all_reduce_bytes) {
  PeerExchange::require_available(host_.comm());  // at start-up, not at the first call
  copy_engine_ = true;
  copy_engine_min_bytes_ = min_all_reduce_bytes;
}

std::size_t NcclCommunicator::CopyEngine::region(MPI_Comm group, std::size_t bytes) {
  if (!exchange || exchange->arena_bytes() < kCopyEngineRegions * bytes) {
    exchange.reset();  // collective: every rank of the group makes the same calls
    exchange = std::make_shared<PeerExchange>(group, kCopyEngineRegions * bytes);
    calls = 0;
  }
  return (calls++ % kCopyEngineRegions) * (exchange->arena_bytes() / kCopyEngineRegions);
}

void NcclCommunicator::copy_engine_all_reduce(CopyEngine& ce, void* buf, std::size_t count,
                                              DType dtype, cudaStream_t stream,
                                              const PeerExchange::Addends* addends) {
  const std::size_t bytes = bytes_of(count, dtype);
  const std::size_t scatter_at = ce.region(host_.comm(), bytes);
  const std::size_t gather_at = ce.region(host_.comm(), bytes);
  ce.exchange->all_reduce(buf, count, dtype, scatter_at, gather_at, stream, addends);
}

void NcclCommunicator::copy_engine_reduce_scatter(CopyEngine& ce, const void* send, void* recv,
                                                  std::size_t count, DType dtype,
                                                  cudaStream_t stream) {
  const std::size_t at = ce.region(host_.comm(), bytes_of(count * std::size_t(size()), dtype));
  ce.exchange->reduce_scatter(send, count, dtype, recv, at, stream);
}

void NcclCommunicator::copy_engine_all_gather(CopyEngine& ce, const void* send, void* recv,
                                              std::size_t shard, cudaStream_t stream) {
  const std::size_t bytes = shard * std::size_t(size());
  const std::size_t at = ce.region(host_.comm(), bytes);
  // This rank's shard straight into `recv`; only the peers' pass through the arena.
  ce.exchange->push_to_peers(send, shard, at, stream);
  char* own = static_cast<char*>(recv) + std::size_t(rank()) * shard;
  if (own != send) CUDA_CHECK(cudaMemcpyAsync(own, send, shard, cudaMemcpyDeviceToDevice, stream));
  ce.exchange->copy_peer_blocks(recv, shard, at, stream);
}

void NcclCommunicator::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  record(CollectiveKind::Broadcast, bytes_of(count, dtype));
  if (!device_buffer(buf)) {
    host_.broadcast(buf, count, dtype, root);
    return;
  }
  if (!comm_) return;
  NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, device::compute_stream()));
}

void NcclCommunicator::barrier() {
  record(CollectiveKind::Barrier, 0);
  synchronize(device::compute_stream(), WaitOp::Barrier);
  host_.barrier();
}

void NcclCommunicator::watch(CollectiveWatchdog& dog, GroupKind kind) {
  host_.watch(dog, kind);
  dog_ = &dog;
  kind_ = kind;
  members_ = world_ranks_of(host_.comm(), dog.world());
}

void NcclCommunicator::synchronize(cudaStream_t stream, WaitOp op) {
  if (!dog_) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  auto done = [&] {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) CUDA_CHECK(e);
    ncclResult_t async = ncclSuccess;
    if (comm_) NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    NCCL_CHECK(async);
    return false;
  };
  // Which peers lag is not known from the stream: the report lists every
  // member's state (WaitSite with no collective number and no peer).
  dog_->wait_until(done, {kind_, op, 0, -1, members_, members_[std::size_t(rank())]},
                   [&] {
                     if (comm_) ncclCommAbort(comm_);
                   });
}

NcclCommunicator::P2PLink& NcclCommunicator::link(int peer, int lane, bool sending) {
  for (P2PLink& l : links_)
    if (l.peer == peer && l.lane == lane && l.sending == sending) return l;
  MESH_VERIFY(false, "device " << (sending ? "send to" : "receive from") << " rank " << peer
                               << " on lane " << lane << " of a group of " << size()
                               << ": no NCCL link (connect_ring_p2p(" << lane + 1
                               << ") joins ring neighbours only)");
  return links_.front();
}

void NcclCommunicator::after_compute(const P2PLink& l) {
  // Waiting captures the event's latest record: one event serves every link.
  CUDA_CHECK(cudaEventRecord(compute_ready_, device::compute_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(l.stream, compute_ready_, 0));
}

void NcclCommunicator::isend(const void* buf, std::size_t count, DType dtype, int peer, int tag,
                             int lane) {
  record(CollectiveKind::Send, bytes_of(count, dtype));
  if (!device_buffer(buf)) return host_.isend(buf, count, dtype, peer, tag, lane);
  // `tag` is not sent: the link's order matches the message (see the header).
  P2PLink& l = link(peer, lane, /*sending=*/true);
  after_compute(l);
  NCCL_CHECK(ncclSend(buf, count, nccl_type(dtype), /*receiver=*/1, l.comm, l.stream));
  l.unwaited_sends = true;
}

void NcclCommunicator::send(const void* buf, std::size_t count, DType dtype, int peer, int tag,
                            int lane) {
  if (!device_buffer(buf)) {
    record(CollectiveKind::Send, bytes_of(count, dtype));
    return host_.send(buf, count, dtype, peer, tag, lane);
  }
  isend(buf, count, dtype, peer, tag, lane);
  P2PLink& l = link(peer, lane, /*sending=*/true);
  CUDA_CHECK(cudaEventRecord(l.done, l.stream));
  CUDA_CHECK(cudaStreamWaitEvent(device::compute_stream(), l.done, 0));
  l.unwaited_sends = false;  // the event covers every earlier send of the link
}

void NcclCommunicator::recv(void* buf, std::size_t count, DType dtype, int peer, int tag,
                            int lane) {
  record(CollectiveKind::Recv, bytes_of(count, dtype));
  if (!device_buffer(buf)) return host_.recv(buf, count, dtype, peer, tag, lane);
  P2PLink& l = link(peer, lane, /*sending=*/false);
  after_compute(l);
  NCCL_CHECK(ncclRecv(buf, count, nccl_type(dtype), /*sender=*/0, l.comm, l.stream));
  CUDA_CHECK(cudaEventRecord(l.done, l.stream));
  CUDA_CHECK(cudaStreamWaitEvent(device::compute_stream(), l.done, 0));
}

void NcclCommunicator::wait_sends() {
  host_.wait_sends();
  for (P2PLink& l : links_) {
    if (!l.unwaited_sends) continue;
    CUDA_CHECK(cudaEventRecord(l.done, l.stream));
    CUDA_CHECK(cudaStreamWaitEvent(device::compute_stream(), l.done, 0));
    l.unwaited_sends = false;
  }
}

std::vector<DirectedLink> ring_links(int size, int first_lane, int end_lane) {
  std::vector<DirectedLink> links;
  if (size < 2) return links;
  for (int lane = first_lane; lane < end_lane; ++lane)
    for (int s = 0; s < size; ++s) {
      const int next = (s + 1) % size, prev = (s + size - 1) % size;
      links.push_back({lane, s, next});
      if (prev != next) links.push_back({lane, s, prev});  // two ranks: one link each way
    }
  return links;
}

void NcclCommunicator::connect_ring_p2p(int lanes) {
  MESH_VERIFY(lanes >= 1, "connect_ring_p2p: " << lanes << " lanes");
  // Every rank of the group takes the same branches: this is collective.
  if (!comm_ || lanes <= lanes_) return;
  if (!compute_ready_)
    CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
  // Every directed link of the new lanes, in one order on every rank. Each
  // is an ncclCommSplit of the whole group (collective, so the
  // common order cannot deadlock) that gives a communicator to its two
  // ranks only.
  const std::size_t first_new = links_.size();
  const int me = rank();
  for (const DirectedLink& d : ring_links(size(), lanes_, lanes)) {
    const bool member = me == d.sender || me == d.receiver;
    // Own resources (no splitShare): a link must not queue behind the
    // group's communicator or another link.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.splitShare = 0;
    ncclComm_t split = nullptr;
    NCCL_CHECK(ncclCommSplit(comm_, member ? 0 : NCCL_SPLIT_NOCOLOR,
                             /*key: sender is rank 0*/ me == d.sender ? 0 : 1, &split, &config));
    if (!member) continue;
    const bool sending = me == d.sender;
    P2PLink l{sending ? d.receiver : d.sender, d.lane, sending};
    l.comm = split;
    CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&l.done, cudaEventDisableTiming));
    links_.push_back(l);
  }
  // NCCL connects a peer lazily, inside its first send or receive, with a
  // host-side handshake that blocks until the peer's first call: that would
  // turn the first isend of a link into a blocking one. Connect now, link by
  // link in the common order (each rank waits only on a link whose other rank
  // has finished every earlier link, so this completes).
  device::Buffer probe(256);
  for (std::size_t k = first_new; k < links_.size(); ++k) connect_link(links_[k], probe);
  lanes_ = lanes;
}

void NcclCommunicator::connect_link(P2PLink& l, const device::Buffer& probe) {
  if (l.sending)
    NCCL_CHECK(ncclSend(probe.as<char>(), 1, ncclUint8, 1, l.comm, l.stream));
  else
    NCCL_CHECK(ncclRecv(probe.as<char>(), 1, ncclUint8, 0, l.comm, l.stream));
  CUDA_CHECK(cudaStreamSynchronize(l.stream));
}

void NcclCommunicator::destroy_links() {
  for (P2PLink& l : links_) {
    ncclCommFinalize(l.comm);
    ncclCommDestroy(l.comm);
    cudaEventDestroy(l.done);
    cudaStreamDestroy(l.stream);
  }
  links_.clear();
  if (compute_ready_) cudaEventDestroy(compute_ready_);
  compute_ready_ = nullptr;
}

void NcclCommunicator::ireduce_scatter(const void* send, void* recv,
                                       std::span<const std::size_t> recv_counts, DType dtype,
                                       ReduceOp op) {
  MESH_VERIFY(int(recv_counts.size()) == size(),
              "ireduce_scatter: " << recv_counts.size() << " counts for " << size() << " ranks");
  std::size_t total = 0;
  for (std::size_t c : recv_counts) total += c;
  if (!device_buffer(send)) return host_.ireduce_scatter(send, recv, recv_counts, dtype, op);
  record(CollectiveKind::ReduceScatter, bytes_of(total, dtype));
  record_nonblocking();
  if (!comm_) return local_copy(recv, send, bytes_of(total, dtype));
  after_compute_on_comm_stream();
  if (copy_engine_sum(total, dtype, op) && equal_counts(recv_counts)) {
    // The tp input gradient's reduce-scatter under SP (reduce_input_grad):
    // the transfer and the adds on comm_stream_, no SMs taken from the
    // weight-gradient GEMM beside it but the add kernel's.
    copy_engine_reduce_scatter(async_ce_, send, recv, recv_counts[0], dtype, comm_stream_);
  } else if (equal_counts(recv_counts)) {  // NCCL's own reduce-scatter kernel
    NCCL_CHECK(ncclReduceScatter(send, recv, recv_counts[0], nccl_type(dtype), nccl_op(op),
                                 comm_, comm_stream_));
  } else {
    const char* block = static_cast<const char*>(send);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size(); ++r) {
      const std::size_t count = recv_counts[std::size_t(r)];
      if (count > 0)
        NCCL_CHECK(ncclReduce(block, recv, count, nccl_type(dtype), nccl_op(op), r, comm_,
                              comm_stream_));
      block += bytes_of(count, dtype);
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  // Operations on one stream complete in order: the event after the last
  // call covers every earlier one.
  CUDA_CHECK(cudaEventRecord(reduced_, comm_stream_));
  collectives_pending_ = true;
}

void NcclCommunicator::make_comm_stream() {
  if (comm_stream_) return;
  // The highest priority: the block scheduler then places the collective's
  // few blocks ahead of the GEMM blocks it is meant to overlap, instead of
  // after them.
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest));
  CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming));
}

void NcclCommunicator::wait_collectives() {
  // Interleaving: the switch first; the wait below then covers the other
  // job's side-stream work too (reduced_ follows every op there): a longer
  // wait, never a missed one.
  yield_point();
  host_.wait_collectives();
  // reduced_ is recorded after every operation on comm_stream_ (reduce-
  // scatters and gathers): waiting on it covers them all.
  first_ticket_ += long(pending_.size());
  pending_.clear();
  if (!collectives_pending_) return;
  CUDA_CHECK(cudaStreamWaitEvent(device::compute_stream(), reduced_, 0));
  collectives_pending_ = false;
}

long NcclCommunicator::iall_gather(const void* send, void* recv,
                                   std::span<const std::size_t> counts, DType dtype) {
  MESH_VERIFY(int(counts.size()) == size(),
              "iall_gather: " << counts.size() << " counts for " << size() << " ranks");
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  record(CollectiveKind::AllGather, bytes_of(total, dtype));
  record_nonblocking_gather();
  if (!device_buffer(recv)) return pending_on_host(host_.iall_gather(send, recv, counts, dtype));
  if (!comm_) {
    local_copy(recv, send, bytes_of(total, dtype));
    return first_ticket_ - 1;  // stream-ordered already: nothing to wait for
  }
  after_compute_on_comm_stream();
  if (copy_engine_ && equal_counts(counts)) {
    copy_engine_all_gather(async_ce_, send, recv, bytes_of(counts[0], dtype), comm_stream_);
  } else if (equal_counts(counts)) {  // NCCL's own all-gather kernel
    NCCL_CHECK(ncclAllGather(send, recv, counts[0], nccl_type(dtype), comm_, comm_stream_));
  } else {
    char* block = static_cast<char*>(recv);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size(); ++r) {
      const std::size_t count = counts[std::size_t(r)];
      if (count > 0)  // `send` is read on the root only
        NCCL_CHECK(ncclBroadcast(send, block, count, nccl_type(dtype), r, comm_, comm_stream_));
      block += bytes_of(count, dtype);
    }
    NCCL_CHECK(ncclGroupEnd());
  }
  return pending_on_comm_stream();
}

void NcclCommunicator::after_compute_on_comm_stream() {
  make_comm_stream();
  CUDA_CHECK(cudaEventRecord(inputs_ready_, device::compute_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, inputs_ready_, 0));
}

long NcclCommunicator::pending_on_comm_stream() {
  const long ticket = first_ticket_ + long(pending_.size());
  if (pending_.size() == pending_events_.size()) {
    pending_events_.emplace_back();
    CUDA_CHECK(cudaEventCreateWithFlags(&pending_events_.back(), cudaEventDisableTiming));
  }
  cudaEvent_t done = pending_events_[pending_.size()];
  CUDA_CHECK(cudaEventRecord(done, comm_stream_));
  CUDA_CHECK(cudaEventRecord(reduced_, comm_stream_));  // for wait_collectives()
  collectives_pending_ = true;
  pending_.push_back({done, 0});
  return ticket;
}

long NcclCommunicator::pending_on_host(long host_ticket) {
  pending_.push_back({nullptr, host_ticket});
  return first_ticket_ + long(pending_.size()) - 1;
}

long NcclCommunicator::iall_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  record(CollectiveKind::AllReduce, bytes_of(count, dtype));
  record_nonblocking_all_reduce();
  if (!device_buffer(buf)) return pending_on_host(host_.iall_reduce(buf, count, dtype, op));
  if (!comm_) return first_ticket_ - 1;  // nothing to reduce, nothing to wait for
  after_compute_on_comm_stream();
  if (copy_engine_sum(count, dtype, op))
    copy_engine_all_reduce(async_ce_, buf, count, dtype, comm_stream_, nullptr);
  else
    NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), comm_, comm_stream_));
  return pending_on_comm_stream();
}

void NcclCommunicator::wait_collective(long ticket) {
  // Interleaving: the other job queues its compute while the gather runs.
  // The index after the switch: the other job's wait_collectives() may have
  // completed this gather (its wait on reduced_ covers every side-stream op).
  yield_point();
  const long index = ticket - first_ticket_;
  if (index < 0 || index >= long(pending_.size())) return;  // completed
  PendingCollective& g = pending_[std::size_t(index)];
  if (g.done)
    CUDA_CHECK(cudaStreamWaitEvent(device::compute_stream(), g.done, 0));
  else
    host_.wait_collective(g.host_ticket);
}

void NcclCommunicator::batch_p2p(std::span<const P2POp> ops) {
  std::size_t bytes = 0;
  bool device = false, host = false;
  for (const P2POp& op : ops) {
    bytes += bytes_of(op.count, op.dtype);
    (device_buffer(op.buffer) ? device : host) = true;
  }
  MESH_VERIFY(!(device && host), "batch_p2p: mixes host and device buffers");
  record(CollectiveKind::BatchP2P, bytes);
  if (!device) {
    host_.batch_p2p(ops);
    return;
  }
  MESH_VERIFY(comm_ != nullptr, "batch_p2p on a group of one rank");
  // One group: NCCL progresses every send and receive together, so no order
  // among them can deadlock. Completes before returning, as the MPI backend.
  NCCL_CHECK(ncclGroupStart());
  const cudaStream_t stream = device::compute_stream();
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::Send)
      NCCL_CHECK(ncclSend(op.buffer, op.count, nccl_type(op.dtype), op.peer, comm_, stream));
    else
      NCCL_CHECK(ncclRecv(op.buffer, op.count, nccl_type(op.dtype), op.peer, comm_, stream));
  }
  NCCL_CHECK(ncclGroupEnd());
  synchronize(stream, WaitOp::BatchP2P);
}

}  // namespace meshtron

#endif  // MESHTRON_HAVE_CUDA
