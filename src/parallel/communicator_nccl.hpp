// NcclCommunicator: the GPU backend of Communicator (communicator.hpp).
//
// Built over an MPI sub-communicator (a tp, dp, pp, model or embedding
// group): rank 0 of the group calls ncclGetUniqueId, MPI_Bcast hands the id
// to the others, and every rank calls ncclCommInitRank on the GPU already
// selected with cudaSetDevice (select_gpu below). A group of one rank makes
// no NCCL communicator: its collectives are local copies.
//
// Streams. Every collective runs on the compute stream (device_stream.hpp),
// the stream of every meshtron kernel and of the caching allocator
// (device_allocator.hpp), so a collective is ordered after the kernels that
// produced its input and before those that read its output, with no events
// or host waits. The two exceptions, ireduce_scatter and point-to-point,
// run on non-blocking side streams ordered by events (below).
//
// Which transport each call takes:
//
//   buffer in device memory                buffer in host memory
//   all_reduce, reduce_scatter,            MPI on the same group (host
//   all_gather, broadcast: NCCL            scalars: loss sums, grad norms,
//   (bf16 reduced by NCCL as               peak memory, and the host
//   ncclBfloat16, in fp32 inside)          loops of mappings.cpp)
//   batch_p2p: NCCL, one ncclGroup
//   send, recv, isend: NCCL, one two-rank
//   communicator and stream per directed
//   link and lane (see below)
//
// Overlapped gradient reduce-scatter (ireduce_scatter). It runs on comm_stream_, a cudaStreamNonBlocking
// stream (it must not wait for the host <-> device copies of the legacy
// default stream either). An event recorded on the compute stream orders it
// after the kernels that wrote `send`; wait_collectives() makes the compute
// stream wait on the event recorded after it, before anything reads `recv`.
// The per-rank counts are one ncclReduce per receiving rank in one group
// (ncclReduceScatter needs equal counts); for dp = 2 each element is a + b,
// the same bits as the single ncclReduceScatter. The caller keeps both
// buffers alive (and, for `send`, unchanged) until wait_collectives().
//
// Overlapped parameter all-gather (iall_gather). On comm_stream_ as well,
// after an event recorded on the compute stream (the update kernel that
// wrote `send` has run). NCCL's all-gather needs equal counts and a bucket's
// parts are not (its overlap with each rank's shard), so it is one
// ncclBroadcast per contributing rank, rooted there, into that rank's place
// in `recv`, in one group: every element is a copy, the same bits as
// ncclAllGather. Each call records its own event (a pool reused after
// wait_collectives()), and wait_collective(ticket) makes the compute stream
// wait on it alone, so the forward waits for the bucket it needs and not
// for the later ones.
//
// Point-to-point (send, recv, isend on device buffers): NCCL, device to
// device, no host staging. ncclSend may block its stream until the peer's
// matching ncclRecv runs (it does for messages larger than NCCL's buffers),
// the operations of one communicator must be taken to run one after another
// in issue order whatever their streams, and NCCL has no tags. So a stream
// (or communicator) that carries both sends and receives of a rank can
// deadlock: one per rank for everything does under 1F1B with pp = 2 (rank 0
// issues send(activation 1) before recv(gradient 0), rank 1 send(gradient
// 0) before recv(activation 1)), and one per direction (lane) still does
// under interleaved 1F1B, whose wrap-around links make every rank both send
// and receive activations: with pp = 2 rank 0 issues send(activation 1)
// before recv(wrap-around activation 0), rank 1 send(that wrap-around
// activation) before recv(activation 1). (tests/gpu/test_gpu_parallel.cpp
// simulates both.) So connect_ring_p2p() gives every *directed* link
// (sender, receiver, lane) between ring neighbours its own two-rank NCCL
// communicator (an ncclCommSplit of the group's, the sender its rank 0,
// resources not shared) and its own non-blocking stream. On each, a rank
// only sends or only receives, in program order, so the n-th send of a link
// meets the n-th receive of that link: a FIFO channel. With pp = 2, "next"
// and "previous" are the same rank: the lanes keep activations and
// gradients apart and the two directions of the pair are different links:
// two links per lane and rank (four with pp >= 3: to and from each
// neighbour, though a pipeline uses one direction of each lane, and the
// wrap-around links only when interleaved).
//
// Stream order:
//   isend: record an event on the compute stream, the link's stream waits on
//          it (the kernels that wrote `buf` have run), then ncclSend there.
//          The host returns at once.
//   recv:  the same wait (the block `buf` came from the caching allocator
//          may still be read by queued compute work: device_allocator.hpp),
//          ncclRecv on the link's stream, then the compute stream waits on an
//          event recorded after it. The host returns at once; every later
//          kernel (and any host copy, which waits for the compute stream)
//          sees the data.
//   send:  isend, then the compute stream waits for it (the caller may reuse
//          the buffer at once: it is stream-ordered after the send).
//   wait_sends: the compute stream waits on every send link's latest event,
//          so buffers freed afterwards are reused only after the sends read
//          them. No host wait.
//
// Deadlock freedom. Take a run of the same per-rank programs on the MPI
// backend that completes, with rendezvous semantics (isend never blocks, a
// receive returns once its tagged message is posted, a blocking send or
// wait_sends returns only once the matching receives have returned: a legal
// MPI execution, so a correct MPI program completes under it), and suppose
// that on every link the n-th send carries the message the receiver's n-th
// receive asks for (the caller's obligation above; trainer.cpp shows it for
// its schedules). Give every compute operation the time it returned in that
// run, and a matched send/receive pair the time its receive returned. Each
// operation of the NCCL run depends only on operations with earlier times: a
// compute operation on the compute-stream work before it, on receives that
// returned before it and on sends completed by an earlier send or wait_sends;
// a pair on the compute work before its send and before its receive (both
// issued before the receive returned) and on the earlier pairs of its link
// (whose receives precede it in the receiver's program). The host never
// blocks in send/recv/isend/wait_sends (link connections are set up by
// connect_ring_p2p, not lazily, for that), and a host copy waits only for
// compute work issued before it. By induction on the time every operation
// completes. Assumed, not shown: NCCL kernels of different communicators can
// be resident at once (p2p kernels use few CTAs; NCCL's general caution about
// concurrent communicators does not promise it); the host is not held up by
// full launch queues (a link has at most one operation per micro-batch
// queued); no cudaDeviceSynchronize runs mid-schedule (the allocator's out-
// of-memory retry does one).
//
// The staged fallback is gone: device point-to-point without
// connect_ring_p2p(), or to a rank that is not a ring neighbour, stops the
// job. batch_p2p ("exchange") stays a single ncclGroup on the group's own
// communicator and the compute stream.
//
// Teardown (NCCL's documented order): ~NcclCommunicator calls
// ncclCommFinalize then ncclCommDestroy, first on the link communicators
// (in their creation order, the same on every rank), then on the group's;
// streams and events after their communicators. Communicators are
// destroyed (with the ParallelRuntime that owns them) before MPI_Finalize,
// and the MPI sub-communicator (owned by Topology) outlives them.
#pragma once

#ifdef MESHTRON_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/peer_exchange.hpp"
#include "parallel/topology.hpp"
#include "tensor/device_allocator.hpp"

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

  /// From now on (collective: every rank of the group calls it), the
  /// blocking device all_gather and Sum reduce_scatter, the Sum all_reduce
  /// of min_all_reduce_bytes or more that splits evenly over the ranks (a
  /// reduce-scatter and an all-gather through two regions), and the
  /// equal-count iall_gather and Sum ireduce_scatter (the latter of
  /// min_all_reduce_bytes or more), run on the copy engines (PeerExchange)
  /// instead of NCCL: each call uses one of kCopyEngineRegions regions of an
  /// arena in turn, and an all-gather's result is copied out of the arena
  /// into `recv`. Blocking calls (compute stream, or comm_stream_ while
  /// interleaving) and iall_gather (comm_stream_) use two exchanges, each
  /// with its own flags: one exchange's calls must run on the device in
  /// their sequence order (the streams an exchange moves between are
  /// ordered by events). An arena grows (collectively) to the largest call.
  /// Four regions: a peer writes a region again 4 calls later, after it has
  /// passed my flags of the calls in between. Without interleaving the
  /// next-but-one call would do (my flags of the next one follow my reads of
  /// this one); while interleaving, a reduce-scatter's adds (which read the
  /// region) run after the other job's next call has raised my flags, so
  /// only the call after that one is ordered after them.
  /// Fails on every rank where some rank's driver lacks the stream memory
  /// operations.
  void use_copy_engine(std::size_t min_all_reduce_bytes = kCopyEngineMinBytes);
  /// parallel.tp_interleave_streams = 2: the second interleaved job's
  /// blocking collectives on a communicator (ncclCommSplit), side stream
  /// and copy-engine exchange of their own, so that they need not queue
  /// behind the first job's (one communicator's collectives must not run on
  /// two streams at once, and one exchange's calls must complete in order).
  /// Collective over the group; call before the first interleaved step.
  void separate_interleaved_jobs();

  void all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override;
  /// The copy-engine all-reduces (use_copy_engine) add a row-parallel
  /// layer's bias and residual in their sum kernel (PeerExchange::Addends).
  bool adds_in_all_reduce(std::size_t count, DType dtype) const override;
  void all_reduce_adding(void* buf, std::size_t count, DType dtype, const void* residual,
                         const void* bias, std::size_t columns) override;
  void all_reduce_each(std::span<Tensor* const> tensors, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype,
                      ReduceOp op) override;
  /// The copy-engine reduce-scatters add a bias and the residual shard in
  /// their sum kernel (PeerExchange::Addends), as the all-reduces do.
  bool adds_in_reduce_scatter(std::size_t recv_count, DType dtype) const override;
  void reduce_scatter_adding(const void* send, void* recv, std::size_t recv_count, DType dtype,
                             const void* residual, const void* bias,
                             std::size_t columns) override;
  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype) override;
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override;
  void barrier() override;
  // Defaults as the base's (callers holding the concrete type).
  void send(const void* buf, std::size_t count, DType dtype, int peer, int tag = 0,
            int lane = 0) override;
  void recv(void* buf, std::size_t count, DType dtype, int peer, int tag = 0,
            int lane = 0) override;
  void batch_p2p(std::span<const P2POp> ops) override;
  /// Host buffers' waits (host_) and this communicator's host waits for its
  /// stream (barrier, batch_p2p) under the watchdog.
  void watch(CollectiveWatchdog& dog, GroupKind kind) override;
  void isend(const void* buf, std::size_t count, DType dtype, int peer, int tag,
             int lane = 0) override;
  void wait_sends() override;
  void connect_ring_p2p(int lanes) override;
  /// Links of this rank made by connect_ring_p2p: per lane 2 in a group of
  /// two ranks, 4 in a larger one.
  int p2p_links() const { return int(links_.size()); }
  void ireduce_scatter(const void* send, void* recv, std::span<const std::size_t> recv_counts,
                       DType dtype, ReduceOp op) override;
  void wait_collectives() override;
  long iall_gather(const void* send, void* recv, std::span<const std::size_t> counts,
                   DType dtype) override;
  void wait_collective(long ticket) override;
  long iall_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override;
  using Communicator::all_reduce;
  using Communicator::broadcast;

 private:
  /// An iall_gather() or iall_reduce() not yet waited for: on the device
  /// (its event), or on host buffers (the MPI backend's ticket).
  struct PendingCollective {
    cudaEvent_t done = nullptr;  ///< Not owned (pending_events_).
    long host_ticket = 0;
  };
  void make_comm_stream();
  /// comm_stream_ (made if need be) waits for the compute stream's work so far.
  void after_compute_on_comm_stream();
  /// A ticket for the work just queued on comm_stream_ (its own event, and
  /// reduced_ for wait_collectives()).
  long pending_on_comm_stream();
  /// A ticket for a collective on host buffers (the MPI backend's ticket).
  long pending_on_host(long host_ticket);
  /// Whether an all-reduce of `count` elements goes over the copy engines.
  bool copy_engine_sum(std::size_t count, DType dtype, ReduceOp op) const;
  struct CopyEngine;
  /// Where an interleaved job's blocking collectives run.
  struct JobLane {
    ncclComm_t comm;
    cudaStream_t stream;
    CopyEngine* copy_engine;
  };
  /// comm_ / comm_stream_ / blocking_ce_, or job 1's own after
  /// separate_interleaved_jobs().
  JobLane lane_of_current_job();
  /// A blocking collective: `queue` on the compute stream's lane, then
  /// `finish`; or interleaved() while interleaving.
  void blocking(const std::function<void(const JobLane&)>& queue,
                const std::function<void()>& finish = {});
  /// parallel.tp_interleave (set_interleave): a blocking collective on the
  /// current job's lane (`queue` queues it there), the yield, then the
  /// compute stream waits for it, then `finish` (compute stream).
  void interleaved(const std::function<void(const JobLane&)>& queue,
                   const std::function<void()>& finish = {});

  /// One directed point-to-point link (see the header comment).
  struct P2PLink {
    int peer, lane;
    bool sending;                   ///< this rank's role on the link
    ncclComm_t comm = nullptr;      ///< Owned; two ranks, the sender is rank 0.
    cudaStream_t stream = nullptr;  ///< Owned; cudaStreamNonBlocking.
    cudaEvent_t done = nullptr;     ///< Owned; recorded after an operation.
    bool unwaited_sends = false;    ///< sends the compute stream has not waited for
  };
  P2PLink& link(int peer, int lane, bool sending);
  /// Order `link`'s stream after the work queued so far on the compute stream.
  void after_compute(const P2PLink& link);
  void connect_link(P2PLink& link, const device::Buffer& probe);
  void destroy_links();

  /// A PeerExchange used on one stream, and its calls so far.
  struct CopyEngine {
    /// Made on the first call; shared with an interleaved reduce-scatter
    /// whose adds are still to be queued (a grown arena replaces it).
    std::shared_ptr<PeerExchange> exchange;
    std::uint64_t calls = 0;
    /// The offset of this call's region (kCopyEngineRegions regions of
    /// `bytes`, in turn); creates or grows the exchange first (collective).
    std::size_t region(MPI_Comm group, std::size_t bytes);
  };
  static constexpr std::size_t kCopyEngineRegions = 4;
  /// Smallest all-reduce on the copy engines: below it (the vocab-parallel
  /// loss statistics, a few KB) NCCL's one kernel beats four copies, two
  /// flag round trips and an add.
  static constexpr std::size_t kCopyEngineMinBytes = 1 << 20;
  /// The copy-engine all-reduce of `buf` on `stream` (two regions of `ce`).
  void copy_engine_all_reduce(CopyEngine& ce, void* buf, std::size_t count, DType dtype,
                              cudaStream_t stream, const PeerExchange::Addends* addends);
  /// The copy-engine reduce-scatter (sum) of `send` into `recv` (`count`
  /// elements per rank), the transfer and the adds on `stream` (one region).
  /// The blocking one's adds (with `addends`, if any) run on the compute
  /// stream, after the switch while interleaving.
  void copy_engine_reduce_scatter(CopyEngine& ce, const void* send, void* recv, std::size_t count,
                                  DType dtype, cudaStream_t stream);
  void blocking_copy_engine_reduce_scatter(const void* send, void* recv, std::size_t count,
                                           DType dtype, const PeerExchange::Addends* addends);
  /// The copy-engine all-gather of `send` into `recv` on `stream`.
  void copy_engine_all_gather(CopyEngine& ce, const void* send, void* recv, std::size_t shard,
                              cudaStream_t stream);

  /// cudaStreamSynchronize, or under the watchdog a poll of the stream and
  /// of NCCL's asynchronous error with its deadline (NCCL kernels wait for
  /// their peers forever): on expiry ncclCommAbort, the report, MPI_Abort.
  void synchronize(cudaStream_t stream, WaitOp op);

  MpiCommunicator host_;        ///< Host buffers.
  CollectiveWatchdog* dog_ = nullptr;  ///< Not owned; null: not watched.
  GroupKind kind_ = GroupKind::World;
  std::vector<int> members_;  ///< world ranks of the group (watched only)
  bool copy_engine_ = false;
  std::size_t copy_engine_min_bytes_ = kCopyEngineMinBytes;  ///< use_copy_engine's
  CopyEngine blocking_ce_, async_ce_;  ///< compute stream / comm_stream_
  /// separate_interleaved_jobs(): job 1's lane (owned).
  ncclComm_t job1_comm_ = nullptr;
  cudaStream_t job1_stream_ = nullptr;
  CopyEngine job1_ce_;
  ncclComm_t comm_ = nullptr;   ///< Owned; null for a group of one rank.
  std::vector<P2PLink> links_;  ///< In creation order (the same on every rank).
  int lanes_ = 0;               ///< lanes connected so far
  cudaEvent_t compute_ready_ = nullptr;  ///< Owned; made with the first link.
  /// Owned (made on first use): the non-blocking collectives, and the
  /// interleaved blocking ones of job 0 (and of job 1 unless separated).
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr, reduced_ = nullptr;  ///< Owned.
  bool collectives_pending_ = false;
  /// iall_gather() / iall_reduce() calls since the last wait_collectives();
  /// the ticket of pending_[i] is first_ticket_ + i, its event
  /// pending_events_[i].
  std::vector<PendingCollective> pending_;
  std::vector<cudaEvent_t> pending_events_;  ///< Owned; grows to the most in flight.
  /// Owned; interleaved() events not in use (one per job in flight).
  std::vector<cudaEvent_t> free_events_;
  long first_ticket_ = 0;
};

/// A directed point-to-point link: sender -> receiver on one lane.
struct DirectedLink {
  int lane, sender, receiver;
  bool operator==(const DirectedLink&) const = default;
};

/// The links connect_ring_p2p makes in a group of `size` ranks for lanes
/// [first_lane, end_lane), in its (rank-independent) order: every s -> s + 1
/// and s -> s - 1 (mod size), once when those coincide (two ranks).
std::vector<DirectedLink> ring_links(int size, int first_lane, int end_lane);

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
