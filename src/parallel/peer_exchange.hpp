// Copy-engine transfers between the GPUs of one group, without NCCL and
// without kernels: the building block of copy-engine tensor-parallel
// collectives (userbuffer-style), which perf/bench_collectives measured
// (2x H200, 774M tp 2's 10.5 MB shard: a peer copy 33 us against NCCL's
// all-gather 70 us, and 0.83 of it hidden behind a concurrent GEMM against
// 0.47 for NCCL, which takes SMs from the GEMM).
//
// Every rank cudaMallocs an arena of the same size and a flag array (one
// uint32 per rank of the group); the CUDA IPC handles go round the group's
// MPI communicator and each rank opens its peers' arenas and flags. A
// transfer is a cudaMemcpyAsync straight into a peer's arena, on the
// caller's stream: the copy engines move it over NVLink. Completion needs no
// host: after its copy into peer r's arena, a rank raises its slot of r's
// flags to the call's sequence number with cuStreamWriteValue32, and then
// waits on the same stream, with cuStreamWaitValue32 (>=), until every
// peer has raised its slot of its own flags to that number. Sequence numbers
// only grow (every rank makes the same calls in the same order), so no flag
// is reset and calls need no handshake. The driver's stream memory
// operations are fetched through cudaGetDriverEntryPointByVersion.
//
// The arena is plain cudaMalloc memory (IPC handles need a whole
// allocation), outside the caching allocator; callers place their tensors
// in it at offsets they agree on (every rank the same).
//
// CUDA builds only. Construction is collective over the group; destruction
// is local (see the destructor). Copies into a peer's arena made outside
// all_gather / reduce_scatter (peer_arena()) carry no such guarantee: their
// caller must synchronise with the peer before either side destroys it.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#include "tensor/types.hpp"

namespace meshtron {

class PeerExchange {
 public:
  /// Whether this process can use it: the driver has the stream memory
  /// operations. (Peer access is checked when the peers' memory is opened.)
  static bool available();
  /// Collective over `group`: stops every rank with one line unless
  /// available() holds on all of them.
  static void require_available(MPI_Comm group);

  PeerExchange(MPI_Comm group, std::size_t arena_bytes);
  ~PeerExchange();
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t arena_bytes() const { return arena_bytes_; }
  /// This rank's arena (device memory).
  char* arena() const { return peers_[std::size_t(rank_)]; }
  /// Rank r's arena as opened in this process (r = rank(): arena()).
  char* peer_arena(int r) const { return peers_[std::size_t(r)]; }

  /// Queues on `stream` the all-gather of every rank's `bytes` at `shard`
  /// into every rank's arena, rank r's block at offset + r * bytes; the
  /// stream continues once all blocks of this rank's arena have landed
  /// (later work on `stream` may read them). `shard` may itself be this
  /// rank's block of the arena. Every rank makes the same calls in the same
  /// order. The peers write into this rank's arena as soon as their streams
  /// get there: the caller must know that every rank is done reading a
  /// region before anyone gathers into it again (a region per use within a
  /// step, reused only after a point all ranks pass, e.g. the step's end).
  void all_gather(const void* shard, std::size_t bytes, std::size_t offset, cudaStream_t stream);
  /// all_gather without this rank's own block: `shard` goes to every peer's
  /// slot rank() of the region at `offset`, and the stream continues once
  /// the peers' blocks have landed in this rank's arena (this rank's slot
  /// there is left as it was). For callers that place their own block in
  /// the destination themselves, saving a local copy into the arena and out.
  void push_to_peers(const void* shard, std::size_t bytes, std::size_t offset,
                     cudaStream_t stream);
  /// Queues on `stream` the copy of every block of the region at `offset`
  /// but this rank's own into `out` (size() blocks of `bytes`, the same
  /// places): what push_to_peers brought in.
  void copy_peer_blocks(void* out, std::size_t bytes, std::size_t offset,
                        cudaStream_t stream) const;

  /// What a sum may add once besides the ranks' blocks (a row-parallel
  /// layer's epilogue without an out-of-place GEMM): `residual` (null or
  /// laid out as the call's result: a reduce-scatter's output block, an
  /// all-reduce's whole buffer, of which this rank adds its block's part)
  /// and `bias` (null or `columns` elements, broadcast over the rows of the
  /// buffer read as [elements / columns, columns]), both of the sum's dtype;
  /// added in the same pass as the blocks (add_residual_bias: one rounding
  /// of a + b + residual + bias).
  struct Addends {
    const void* residual = nullptr;
    const void* bias = nullptr;
    std::size_t columns = 1;
  };

  /// Reduce-scatter (sum) of every rank's `partial` (size() blocks of
  /// `count` elements of `dtype`): `out` (count elements) on rank r gets the
  /// sum over ranks q of block r of q's partial. Rank q copies its block r
  /// into rank r's arena, slot q of the region at `offset` (size() x block
  /// bytes), and raises its flag there; rank r waits for all, then adds its
  /// own block and the received ones in rank order (meshtron's add kernel,
  /// rounding after each add: for two ranks one rounding of a + b, NCCL's
  /// bits). Everything, the add kernel included, is queued on `stream`. The
  /// same rule for reusing a region as all_gather.
  void reduce_scatter(const void* partial, std::size_t count, DType dtype, void* out,
                      std::size_t offset, cudaStream_t stream);
  /// reduce_scatter in its two halves: the copies and flags on `stream`,
  /// then (once the compute stream is ordered after them) the adds on the
  /// compute stream. For parallel.tp_interleave, which moves the transfer
  /// off the compute stream. With `addends`, reduce_scatter_sum adds them
  /// (the residual laid out as `out`).
  void reduce_scatter_transfer(const void* partial, std::size_t count, DType dtype,
                               std::size_t offset, cudaStream_t stream);
  void reduce_scatter_sum(const void* partial, std::size_t count, DType dtype, void* out,
                          std::size_t offset, cudaStream_t stream,
                          const Addends* addends = nullptr);

  /// All-reduce (sum) of `buf` in place (count elements of `dtype`, count a
  /// multiple of size()), everything on `stream`, the adds included: a
  /// reduce-scatter of its size() blocks through the region at
  /// `scatter_offset` (size() blocks), each rank adding its block in place
  /// (the reduce_scatter order: one rounding of a + b for two ranks, NCCL's
  /// bits), then an all-gather of the summed blocks through the region at
  /// `gather_offset`: each rank's summed block stays in `buf`, the peers'
  /// are copied back from the arena. Two regions, the rule for reusing them
  /// as all_gather's.
  /// With `addends`, each rank adds their part of its block in its sum.
  void all_reduce(void* buf, std::size_t count, DType dtype, std::size_t scatter_offset,
                  std::size_t gather_offset, cudaStream_t stream,
                  const Addends* addends = nullptr);

 private:
  /// Stops unless size() blocks of `block` bytes at `offset` fit in the arena.
  void check_fits(const char* call, std::size_t block, std::size_t offset) const;
  CUdeviceptr flag(int owner, int writer) const;
  /// Raises this rank's flag on every peer to the next sequence number,
  /// then waits on `stream` until every peer has raised its flag here.
  void signal_and_wait(cudaStream_t stream);

  int rank_ = 0, size_ = 1;
  std::size_t arena_bytes_ = 0;
  void* own_arena_ = nullptr;    ///< Owned (cudaMalloc).
  void* own_flags_ = nullptr;    ///< Owned (cudaMalloc), size_ uint32 slots.
  std::vector<char*> peers_;     ///< Every rank's arena, opened here (own as is).
  std::vector<char*> peer_flags_;
  std::uint32_t sequence_ = 0;
};

}  // namespace meshtron
