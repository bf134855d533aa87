// NcclCommunicator: the GPU backend of Communicator (communicator.hpp).
//
// Built over an MPI sub-communicator (a tp, dp, pp, model or embedding
// group): rank 0 of the group calls ncclGetUniqueId, MPI_Bcast hands the id
// to the others, and every rank calls ncclCommInitRank on the GPU already
// selected with cudaSetDevice (select_gpu below). A group of one rank makes
// no NCCL communicator: its collectives are local copies.
//
// Streams. Every operation runs on the legacy default stream, the stream of
// every meshtron kernel and of the caching allocator (device_allocator.hpp),
// so a collective is ordered after the kernels that produced its input and
// before those that read its output, with no events or host waits.
//
// Which transport each call takes:
//
//   buffer in device memory                buffer in host memory
//   all_reduce, reduce_scatter,            MPI on the same group (host
//   all_gather, broadcast: NCCL            scalars: loss sums, grad norms,
//   (bf16 reduced by NCCL as               peak memory, and the host
//   ncclBfloat16, in fp32 inside)          loops of mappings.cpp)
//   batch_p2p: NCCL, one ncclGroup
//   send, recv, isend: MPI through a host copy (see below)
//
// Overlapped gradient reduce-scatter (ireduce_scatter). The one exception
// to the single stream: it runs on comm_stream_, a cudaStreamNonBlocking
// stream (a blocking stream would serialize with the legacy default stream
// and overlap nothing). An event recorded on the default stream orders it
// after the kernels that wrote `send`; wait_collectives() makes the default
// stream wait on the event recorded after it, before anything reads `recv`.
// The per-rank counts are one ncclReduce per receiving rank in one group
// (ncclReduceScatter needs equal counts); for dp = 2 each element is a + b,
// the same bits as the single ncclReduceScatter. The caller keeps both
// buffers alive (and, for `send`, unchanged) until wait_collectives().
//
// Point-to-point. ncclSend and ncclRecv block the GPU stream until the
// matching call on the peer runs, and the operations of one communicator run
// in the order they were issued. The pipeline executor (trainer.cpp) posts a
// send as soon as its output is ready and receives only when it needs the
// input, which is deadlock-free only if sends never wait for their receive.
// Under 1F1B with pp = 2 on one stream they would: rank 0 issues
// send(activation k+1) before recv(gradient k), while rank 1 issues
// send(gradient k) before recv(activation k+1), and each send waits for a
// receive queued behind the other rank's send. So isend copies the device
// buffer to the host (synchronously, on the default stream, which also waits
// for the kernels that produced it) and posts MPI_Isend from that copy; recv
// receives with MPI into a host buffer and copies it to the device; send is
// the same blocking. Transfers stay correct on any schedule at the price of
// two PCIe copies of each boundary activation. Keeping them on the device
// needs the executor to pair each send with the receive that follows it in
// one ncclGroup (Megatron's send_forward_recv_backward), i.e. batch_p2p on
// both sides: a device batch_p2p must be matched by a batch_p2p on the peer.
//
// Teardown (NCCL's documented order): ~NcclCommunicator calls
// ncclCommFinalize then ncclCommDestroy; communicators are destroyed (with
// the ParallelRuntime that owns them) before MPI_Finalize, and the MPI
// sub-communicator (owned by Topology) outlives them.
#pragma once

#ifdef MESHTRON_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/topology.hpp"

namespace meshtron {

class NcclCommunicator final : public Communicator {
 public:
  /// Collective over `comm` (not owned; must outlive this object). The GPU
  /// must already be selected (cudaSetDevice).
  explicit NcclCommunicator(MPI_Comm comm);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }

  void all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype,
                      ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype) override;
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override;
  void barrier() override;
  void send(const void* buf, std::size_t count, DType dtype, int peer, int tag) override;
  void recv(void* buf, std::size_t count, DType dtype, int peer, int tag) override;
  void batch_p2p(std::span<const P2POp> ops) override;
  void isend(const void* buf, std::size_t count, DType dtype, int peer, int tag) override;
  void wait_sends() override;
  void ireduce_scatter(const void* send, void* recv, std::span<const std::size_t> recv_counts,
                       DType dtype, ReduceOp op) override;
  void wait_collectives() override;
  using Communicator::all_reduce;
  using Communicator::broadcast;

 private:
  MpiCommunicator host_;        ///< Host buffers and staged point-to-point.
  ncclComm_t comm_ = nullptr;   ///< Owned; null for a group of one rank.
  std::vector<std::vector<char>> staged_sends_;  ///< host copies until wait_sends()
  cudaStream_t comm_stream_ = nullptr;  ///< Owned; ireduce_scatter only (made on first use).
  cudaEvent_t inputs_ready_ = nullptr, reduced_ = nullptr;  ///< Owned.
  bool collectives_pending_ = false;
};

/// True when `ptr` points into device memory (cudaPointerGetAttributes).
bool is_device_pointer(const void* ptr);

/// Select this rank's GPU: local rank % visible GPUs (cudaSetDevice), and
/// return its index. Stops the job on a rank that sees no GPU. A process
/// must keep one GPU for its life (the GEMM engine's cuBLASLt handle and
/// workspace stay on the first GPU it used), so every runtime of a process
/// must select the same one.
int select_gpu(const Topology& topo);

}  // namespace meshtron

#endif  // MESHTRON_HAVE_CUDA
