// Communicator: the collectives and point-to-point operations of one group
// of ranks (a tp, dp, pp, model-parallel or embedding group).
//
// Layers never call MPI or NCCL; they go through the mapping pairs in
// mappings.hpp, which go through a Communicator. The MPI backend serves the
// host path; the NCCL backend (GPU path) implements the same interface.
// Every operation is counted by kind, so tests can assert how many
// collectives a layer issues.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "parallel/fiber_pair.hpp"
#include "parallel/watchdog.hpp"
#include "tensor/tensor.hpp"

namespace meshtron {

enum class ReduceOp { Sum, Max };

enum class CollectiveKind : int {
  AllReduce, ReduceScatter, AllGather, Broadcast, Barrier, Send, Recv, BatchP2P,
  kCount
};

/// Per-kind operation counts and payload bytes since the last reset().
struct CommStats {
  std::array<long, int(CollectiveKind::kCount)> calls{};
  std::array<long, int(CollectiveKind::kCount)> bytes{};
  long count(CollectiveKind k) const { return calls[int(k)]; }
  void reset() { *this = CommStats{}; }
};

/// One send or receive of a batched point-to-point exchange.
struct P2POp {
  enum Kind { Send, Recv } kind;
  void* buffer;  ///< Not owned.
  std::size_t count;
  DType dtype;
  int peer;  ///< rank in this communicator
  int tag = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// In place: buf[i] = op over ranks of buf[i].
  virtual void all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) = 0;
  /// send holds size() * recv_count elements; rank r receives block r reduced.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                              DType dtype, ReduceOp op) = 0;
  /// recv holds size() * send_count elements, block r from rank r.
  virtual void all_gather(const void* send, void* recv, std::size_t send_count,
                          DType dtype) = 0;
  virtual void broadcast(void* buf, std::size_t count, DType dtype, int root) = 0;
  virtual void barrier() = 0;
  // Point-to-point and lanes. The MPI backend matches a message by (peer,
  // tag). NCCL has no tags: the NCCL backend matches device messages in
  // issue order within each (sender, receiver, lane), every such triple on
  // its own NCCL communicator and stream, so messages of different lanes
  // never wait for each other. A caller must therefore receive the device
  // messages of one lane from one sender in the order they were sent (the
  // pipeline executor keeps activations and gradients on separate lanes;
  // see trainer.cpp), and must have called connect_ring_p2p(). The MPI
  // backend ignores lanes.
  virtual void send(const void* buf, std::size_t count, DType dtype, int peer,
                    int tag = 0, int lane = 0) = 0;
  virtual void recv(void* buf, std::size_t count, DType dtype, int peer, int tag = 0,
                    int lane = 0) = 0;
  /// Post all sends and receives, then wait for all (pipeline p2p).
  virtual void batch_p2p(std::span<const P2POp> ops) = 0;
  /// Start a send that completes in the background; the buffer must stay
  /// alive and unchanged until wait_sends() (pipeline schedules use this so
  /// that a stage never blocks on a send, only on the receive it needs).
  virtual void isend(const void* buf, std::size_t count, DType dtype, int peer, int tag,
                     int lane = 0) = 0;
  /// Complete every isend() posted so far.
  virtual void wait_sends() = 0;
  /// Collective over the group: make send/recv/isend of device buffers ready
  /// between ring neighbours (rank +- 1 mod size()) on lanes 0 .. lanes-1.
  /// Calling it again with no more lanes does nothing. A no-op on the MPI
  /// backend.
  virtual void connect_ring_p2p(int lanes) { (void)lanes; }
  /// Let posted sends advance without blocking. MPI moves a large message
  /// (rendezvous protocol) only while its sender is inside the MPI library,
  /// so a pipeline stage that computes for long between MPI calls would
  /// starve its neighbour; the schedule calls this between tasks.
  virtual void progress() {}

  /// Start a reduce-scatter in which rank r receives recv_counts[r] elements
  /// (send holds the blocks of ranks 0, 1, ... back to back; a count may be
  /// 0) and return at once. Both buffers must stay alive and unchanged until
  /// wait_collectives(). The overlapped gradient reduction (optimizer.hpp)
  /// starts one per bucket during the backward. Counted as a ReduceScatter.
  virtual void ireduce_scatter(const void* send, void* recv,
                               std::span<const std::size_t> recv_counts, DType dtype,
                               ReduceOp op) = 0;
  /// Complete every ireduce_scatter() started so far (on the GPU path: make
  /// the compute stream wait for them).
  virtual void wait_collectives() = 0;
  /// ireduce_scatter() calls since the last reset_stats() (tests check that
  /// buckets start before the backward ends).
  long nonblocking_started() const { return nonblocking_started_; }

  /// Start an all-gather in which rank r contributes counts[r] elements
  /// (`send` holds this rank's; `recv` receives the blocks of ranks 0, 1, ...
  /// back to back; a count may be 0) and return at once with a ticket for
  /// wait_collective(). Both buffers must stay alive, and `send` unchanged,
  /// until that wait or wait_collectives(). The overlapped parameter
  /// all-gather (optimizer.hpp) starts one per bucket at the end of step().
  /// Counted as an AllGather.
  virtual long iall_gather(const void* send, void* recv, std::span<const std::size_t> counts,
                           DType dtype) = 0;
  /// Start an in-place all-reduce of `buf` and return at once with a ticket
  /// for wait_collective(); `buf` must stay alive and untouched until then.
  /// The column-parallel backward without SP starts its input gradient's
  /// all-reduce before its weight-gradient GEMM (Megatron's async
  /// all-reduce). Counted as an AllReduce.
  virtual long iall_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) = 0;
  /// Complete the non-blocking collective `ticket` (on the GPU path: make the
  /// compute stream wait for it). A ticket already completed, by an earlier
  /// wait or by wait_collectives(), is a no-op.
  virtual void wait_collective(long ticket) = 0;
  /// iall_gather() calls since the last reset_stats().
  long nonblocking_gathers_started() const { return nonblocking_gathers_started_; }
  /// iall_reduce() calls since the last reset_stats().
  long nonblocking_all_reduces_started() const { return nonblocking_all_reduces_started_; }

  /// All-reduce every tensor of the list, each as its own payload. The NCCL
  /// backend issues them as one group (one launch, not one per tensor: the
  /// step reduces a few hundred small layernorm/bias gradients over tp). A
  /// group of one has nothing to add: no call at all (each would cost the
  /// host a pointer query on the NCCL backend).
  virtual void all_reduce_each(std::span<Tensor* const> tensors, ReduceOp op = ReduceOp::Sum) {
    if (size() == 1) return;
    for (Tensor* t : tensors) all_reduce(*t, op);
  }

  /// Whether all_reduce_adding takes a sum of `count` elements of `dtype`:
  /// a backend that adds the addends in its own reduction pass says so
  /// (the copy-engine tp sum); the others do not, and a row-parallel layer
  /// then adds its bias and residual in one rank's GEMM epilogue instead.
  virtual bool adds_in_all_reduce(std::size_t count, DType dtype) const {
    (void)count, (void)dtype;
    return false;
  }
  /// The Sum all-reduce of `buf` plus, once, `residual` (null or laid out
  /// as `buf`) and `bias` (null or `columns` elements broadcast over the
  /// rows of `buf` read as [count / columns, columns]), all of `dtype`.
  /// Only where adds_in_all_reduce(count, dtype) holds.
  virtual void all_reduce_adding(void* buf, std::size_t count, DType dtype,
                                 const void* residual, const void* bias, std::size_t columns) {
    (void)buf, (void)count, (void)dtype, (void)residual, (void)bias, (void)columns;
    MESH_VERIFY(false, "all_reduce_adding: this communicator adds nothing in its all-reduce");
  }

  /// As adds_in_all_reduce, for reduce_scatter_adding: the reduce-scatter
  /// of `recv_count` elements per rank of `dtype` (the row-parallel output
  /// under sequence parallelism) adds a bias and this rank's residual shard
  /// in its sum kernel. The same answer on every rank of the group.
  virtual bool adds_in_reduce_scatter(std::size_t recv_count, DType dtype) const {
    (void)recv_count, (void)dtype;
    return false;
  }
  /// The Sum reduce-scatter of `send` into `recv` plus, once, `residual`
  /// (null or laid out as `recv`: this rank's shard) and `bias` (null or
  /// `columns` elements broadcast over the rows of `recv`). Only where
  /// adds_in_reduce_scatter(recv_count, dtype) holds.
  virtual void reduce_scatter_adding(const void* send, void* recv, std::size_t recv_count,
                                     DType dtype, const void* residual, const void* bias,
                                     std::size_t columns) {
    (void)send, (void)recv, (void)recv_count, (void)dtype, (void)residual, (void)bias,
        (void)columns;
    MESH_VERIFY(false, "reduce_scatter_adding: this communicator adds nothing in its reduce-scatter");
  }

  // Tensor conveniences (whole tensor as the payload).
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) {
    all_reduce(t.raw(), std::size_t(t.numel()), t.dtype(), op);
  }
  void broadcast(Tensor& t, int root) {
    broadcast(t.raw(), std::size_t(t.numel()), t.dtype(), root);
  }
  double all_reduce_scalar(double v, ReduceOp op = ReduceOp::Sum) {
    all_reduce(&v, 1, DType::F64, op);
    return v;
  }

  /// parallel.tp_interleave: `fibers` (not owned; null to stop) yields where
  /// a collective has been queued and its caller is about to wait for it (on
  /// the GPU path it then runs on a side stream: the other job's compute,
  /// queued meanwhile, overlaps it), so that the other job (FiberPair) can
  /// queue its own work first. The MPI backend, whose collectives block the
  /// host, yields before each one: the same switching, testable on the host.
  /// Yield points: the blocking all_reduce, reduce_scatter and all_gather,
  /// and wait_collective() / wait_collectives() (the row-parallel backward,
  /// interleaving, moves its own token block after that wait, so that a
  /// layer's gradient accumulations never straddle a switch).
  /// Null (the default): no switching; collectives as before.
  void set_interleave(FiberPair* fibers) { fibers_ = fibers; }
  bool interleaving() const { return fibers_ != nullptr; }

  /// parallel.collective_timeout_s: from now on every wait of this group
  /// (blocking collective, point-to-point, wait of a non-blocking
  /// collective) has `dog`'s deadline (not owned; outlives this), and a
  /// report names the group `kind`. Never called: blocking calls as before.
  virtual void watch(CollectiveWatchdog& dog, GroupKind kind) { (void)dog, (void)kind; }

  const CommStats& stats() const { return stats_; }
  void reset_stats() {
    stats_.reset();
    nonblocking_started_ = 0;
    nonblocking_gathers_started_ = 0;
    nonblocking_all_reduces_started_ = 0;
  }

 protected:
  void record(CollectiveKind k, std::size_t bytes) {
    ++stats_.calls[int(k)];
    stats_.bytes[int(k)] += long(bytes);
  }
  void yield_point() {
    if (fibers_) fibers_->yield();
  }
  /// The job making this call while interleaving (0 or 1), else -1.
  int interleaved_job() const { return fibers_ ? fibers_->current_job() : -1; }
  void record_nonblocking() { ++nonblocking_started_; }
  void record_nonblocking_gather() { ++nonblocking_gathers_started_; }
  void record_nonblocking_all_reduce() { ++nonblocking_all_reduces_started_; }

 private:
  CommStats stats_;
  FiberPair* fibers_ = nullptr;
  long nonblocking_started_ = 0;
  long nonblocking_gathers_started_ = 0;
  long nonblocking_all_reduces_started_ = 0;
};

/// MPI backend over an MPI communicator (not owned: Topology owns it).
/// bf16 and fp16 payloads are reduced in fp32 by a user-defined MPI_Op.
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

  void all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                      DType dtype, ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t send_count,
                  DType dtype) override;
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override;
  void barrier() override;
  // Defaults as the base's (callers holding the concrete type).
  void send(const void* buf, std::size_t count, DType dtype, int peer, int tag = 0,
            int lane = 0) override;
  void recv(void* buf, std::size_t count, DType dtype, int peer, int tag = 0,
            int lane = 0) override;
  void batch_p2p(std::span<const P2POp> ops) override;
  void isend(const void* buf, std::size_t count, DType dtype, int peer, int tag,
             int lane = 0) override;
  void wait_sends() override;
  void progress() override;
  void ireduce_scatter(const void* send, void* recv, std::span<const std::size_t> recv_counts,
                       DType dtype, ReduceOp op) override;
  void wait_collectives() override;
  long iall_gather(const void* send, void* recv, std::span<const std::size_t> counts,
                   DType dtype) override;
  void wait_collective(long ticket) override;
  long iall_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override;
  void watch(CollectiveWatchdog& dog, GroupKind kind) override;
  using Communicator::all_reduce;
  using Communicator::broadcast;

 private:
  /// Watched: the number of the collective about to start in this group.
  long start_collective() { return dog_->start_collective(kind_); }
  /// Watched: wait for `requests` with the watchdog's deadline (`peer`: rank
  /// in this group of a point-to-point wait, -1 otherwise).
  void watched_wait(std::span<MPI_Request> requests, WaitOp op, long collective,
                    int peer = -1);

  MPI_Comm comm_;  ///< Not owned.
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> pending_sends_;
  /// Non-blocking collectives since the last wait_collectives(); the ticket
  /// of pending_collectives_[i] is first_ticket_ + i.
  std::vector<MPI_Request> pending_collectives_;
  long first_ticket_ = 0;
  CollectiveWatchdog* dog_ = nullptr;  ///< Not owned; null: not watched.
  GroupKind kind_ = GroupKind::World;
  std::vector<int> members_;  ///< world ranks of this group (watched only)
  /// Watched: the collective number of pending_collectives_[i].
  std::vector<long> pending_numbers_;
};

/// MPI datatype carrying one element of `dtype` (bf16/fp16 as 2-byte types).
MPI_Datatype mpi_datatype(DType dtype);
/// MPI_Op for `op` on `dtype` (custom ops for bf16/fp16).
MPI_Op mpi_op(ReduceOp op, DType dtype);

}  // namespace meshtron
