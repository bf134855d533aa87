// Copy-engine transfers between a group's GPUs (see peer_exchange.hpp).
#ifdef MESHTRON_HAVE_CUDA

#include "parallel/peer_exchange.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "ops/ops_cuda.hpp"
#include "tensor/device_stream.hpp"

namespace meshtron {
namespace {

using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

/// cuStreamWriteValue32 / cuStreamWaitValue32 from the driver, or null.
struct StreamMemOps {
  WriteValue32 write = nullptr;
  WaitValue32 wait = nullptr;
};

void* driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    fn = nullptr;
  (void)cudaGetLastError();  // a failed query is an answer, not an error
  return fn;
}

const StreamMemOps& stream_mem_ops() {
  static const StreamMemOps ops{reinterpret_cast<WriteValue32>(driver_entry("cuStreamWriteValue32")),
                                reinterpret_cast<WaitValue32>(driver_entry("cuStreamWaitValue32"))};
  return ops;
}

/// Whether `mine` holds on every rank of `group` (collective), so that a
/// check fails on all ranks alike.
bool on_every_rank(bool mine, MPI_Comm group) {
  int local = mine ? 1 : 0, all = 0;
  MPI_CHECK(MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, group));
  return all == 1;
}

void check_driver(CUresult r, const char* what) {
  MESH_VERIFY(r == CUDA_SUCCESS, "PeerExchange: " << what << " failed (CUresult " << int(r)
                                                  << ")");
}

/// Every rank's `mine`, opened in this process (its own as is). Collective:
/// when some rank cannot open a peer's memory (GPUs without peer access),
/// every rank stops with the same line.
std::vector<char*> open_peers(MPI_Comm group, int rank, int size, void* mine) {
  cudaIpcMemHandle_t handle;
  CUDA_CHECK(cudaIpcGetMemHandle(&handle, mine));
  std::vector<cudaIpcMemHandle_t> all(static_cast<std::size_t>(size));
  MPI_CHECK(MPI_Allgather(&handle, sizeof(handle), MPI_BYTE, all.data(), sizeof(handle),
                          MPI_BYTE, group));
  std::vector<char*> out(static_cast<std::size_t>(size), nullptr);
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      out[std::size_t(r)] = static_cast<char*>(mine);
      continue;
    }
    void* p = nullptr;
    if (cudaIpcOpenMemHandle(&p, all[std::size_t(r)], cudaIpcMemLazyEnablePeerAccess) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    out[std::size_t(r)] = static_cast<char*>(p);
  }
  const bool opened = std::count(out.begin(), out.end(), nullptr) == 0;
  MESH_VERIFY(on_every_rank(opened, group), "PeerExchange (parallel.tp_copy_engine): some rank cannot open "
                               "its peers' GPU memory over CUDA IPC (no peer access between "
                               "these GPUs?); set parallel.tp_copy_engine = false");
  return out;
}

}  // namespace

/// The wait's flags: >=, and where the device can, a flush of outstanding
/// remote writes after it, so that kernels after the wait see the peers'
/// copies that preceded their flags (the writer's flag write is fenced
/// after its copy: CU_STREAM_WRITE_VALUE_DEFAULT).
static unsigned wait_flags() {
  static const unsigned flags = [] {
    int device = 0, flush = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&flush, cudaDevAttrCanFlushRemoteWrites, device));
    return unsigned(CU_STREAM_WAIT_VALUE_GEQ) | (flush ? unsigned(CU_STREAM_WAIT_VALUE_FLUSH) : 0u);
  }();
  return flags;
}

bool PeerExchange::available() {
  return stream_mem_ops().write != nullptr && stream_mem_ops().wait != nullptr;
}

void PeerExchange::require_available(MPI_Comm group) {
  MESH_REQUIRE(on_every_rank(available(), group), "parallel.tp_copy_engine: the CUDA driver of some rank has no "
                                "stream memory operations (cuStreamWriteValue32 / "
                                "cuStreamWaitValue32)");
}

PeerExchange::PeerExchange(MPI_Comm group, std::size_t arena_bytes)
    : arena_bytes_(arena_bytes) {
  MPI_CHECK(MPI_Comm_rank(group, &rank_));
  MPI_CHECK(MPI_Comm_size(group, &size_));
  require_available(group);
  CUDA_CHECK(cudaMalloc(&own_arena_, arena_bytes_ > 0 ? arena_bytes_ : 1));
  CUDA_CHECK(cudaMalloc(&own_flags_, sizeof(cuuint32_t) * std::size_t(size_)));
  CUDA_CHECK(cudaMemset(own_flags_, 0, sizeof(cuuint32_t) * std::size_t(size_)));
  CUDA_CHECK(cudaDeviceSynchronize());
  peers_ = open_peers(group, rank_, size_, own_arena_);
  peer_flags_ = open_peers(group, rank_, size_, own_flags_);
  MPI_CHECK(MPI_Barrier(group));  // every flag array is zero before anyone raises one
}

PeerExchange::~PeerExchange() {
  // Local: a peer copies into this arena only inside a call this rank makes
  // too, and this rank's wait in that call covers the peer's copies; so once
  // this rank's own calls have run, nothing is in flight into its memory
  // (and its copies into the peers' have landed). No MPI here: the group's
  // communicator may already be freed when this runs at shutdown.
  cudaDeviceSynchronize();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    cudaIpcCloseMemHandle(peers_[std::size_t(r)]);
    cudaIpcCloseMemHandle(peer_flags_[std::size_t(r)]);
  }
  cudaFree(own_arena_);
  cudaFree(own_flags_);
}

void PeerExchange::check_fits(const char* call, std::size_t block, std::size_t offset) const {
  MESH_VERIFY(offset + block * std::size_t(size_) <= arena_bytes_,
              "PeerExchange::" << call << ": " << size_ << " blocks of " << block << " bytes at "
                               << offset << " overflow the " << arena_bytes_ << "-byte arena");
}

CUdeviceptr PeerExchange::flag(int owner, int writer) const {
  return CUdeviceptr(peer_flags_[std::size_t(owner)] + sizeof(cuuint32_t) * std::size_t(writer));
}

void PeerExchange::all_gather(const void* shard, std::size_t bytes, std::size_t offset,
                              cudaStream_t stream) {
  push_to_peers(shard, bytes, offset, stream);
  char* own = arena() + offset + std::size_t(rank_) * bytes;
  if (own != shard) CUDA_CHECK(cudaMemcpyAsync(own, shard, bytes, cudaMemcpyDefault, stream));
}

void PeerExchange::push_to_peers(const void* shard, std::size_t bytes, std::size_t offset,
                                 cudaStream_t stream) {
  check_fits("push_to_peers", bytes, offset);
  for (int k = 1; k < size_; ++k) {  // from the next rank on
    const int r = (rank_ + k) % size_;
    CUDA_CHECK(cudaMemcpyAsync(peers_[std::size_t(r)] + offset + std::size_t(rank_) * bytes,
                               shard, bytes, cudaMemcpyDefault, stream));
  }
  signal_and_wait(stream);
}

void PeerExchange::copy_peer_blocks(void* out, std::size_t bytes, std::size_t offset,
                                    cudaStream_t stream) const {
  // The blocks before this rank's and those after it: two contiguous copies.
  char* dst = static_cast<char*>(out);
  const char* src = arena() + offset;
  const std::size_t mine = std::size_t(rank_) * bytes, after = mine + bytes;
  const std::size_t end = std::size_t(size_) * bytes;
  if (mine > 0)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, mine, cudaMemcpyDeviceToDevice, stream));
  if (end > after)
    CUDA_CHECK(cudaMemcpyAsync(dst + after, src + after, end - after, cudaMemcpyDeviceToDevice,
                               stream));
}

void PeerExchange::signal_and_wait(cudaStream_t stream) {
  const StreamMemOps& ops = stream_mem_ops();
  const cuuint32_t seq = ++sequence_;
  // Each write is fenced after the copies queued before it on `stream`.
  for (int r = 0; r < size_; ++r)
    if (r != rank_)
      check_driver(ops.write(stream, flag(r, rank_), seq, CU_STREAM_WRITE_VALUE_DEFAULT),
                   "cuStreamWriteValue32");
  for (int r = 0; r < size_; ++r)
    if (r != rank_)
      check_driver(ops.wait(stream, flag(rank_, r), seq, wait_flags()), "cuStreamWaitValue32");
}

void PeerExchange::reduce_scatter(const void* partial, std::size_t count, DType dtype, void* out,
                                  std::size_t offset, cudaStream_t stream) {
  reduce_scatter_transfer(partial, count, dtype, offset, stream);
  reduce_scatter_sum(partial, count, dtype, out, offset, stream);
}

void PeerExchange::reduce_scatter_transfer(const void* partial, std::size_t count, DType dtype,
                                           std::size_t offset, cudaStream_t stream) {
  const std::size_t block = count * dtype_size(dtype);
  check_fits("reduce_scatter", block, offset);
  if (size_ == 1) return;
  const char* mine = static_cast<const char*>(partial);
  for (int k = 1; k < size_; ++k) {  // block r of this partial to rank r, slot rank_
    const int r = (rank_ + k) % size_;
    CUDA_CHECK(cudaMemcpyAsync(peers_[std::size_t(r)] + offset + std::size_t(rank_) * block,
                               mine + std::size_t(r) * block, block, cudaMemcpyDefault, stream));
  }
  signal_and_wait(stream);
}

void PeerExchange::reduce_scatter_sum(const void* partial, std::size_t count, DType dtype,
                                      void* out, std::size_t offset, cudaStream_t stream,
                                      const Addends* addends) {
  const std::size_t block = count * dtype_size(dtype);
  const char* mine = static_cast<const char*>(partial);
  MESH_VERIFY(size_ > 1 || !addends, "PeerExchange: addends on one rank");
  if (size_ == 1) {
    if (out != mine) CUDA_CHECK(cudaMemcpyAsync(out, mine, block, cudaMemcpyDefault, stream));
    return;
  }
  // out = own block + slot 0 + slot 1 + ... (rank order, own block at its rank's place).
  const char* slots = arena() + offset;
  const auto term = [&](int q) -> const void* {
    return q == rank_ ? mine + std::size_t(rank_) * block : slots + std::size_t(q) * block;
  };
  // `out` may be this rank's own block of `partial` (all_reduce): add reads
  // each element before writing it.
  if (addends) {
    const std::size_t first = std::size_t(rank_) * count;  // this block's first element
    cuda::add_residual_bias_on_stream(dtype, term(0), term(1), addends->residual, addends->bias,
                                      index_t(addends->columns), index_t(first), index_t(count),
                                      out, stream);
  } else {
    cuda::add_on_stream(dtype, term(0), term(1), index_t(count), out, stream);
  }
  for (int q = 2; q < size_; ++q)
    cuda::add_on_stream(dtype, out, term(q), index_t(count), out, stream);
}

void PeerExchange::all_reduce(void* buf, std::size_t count, DType dtype,
                              std::size_t scatter_offset, std::size_t gather_offset,
                              cudaStream_t stream, const Addends* addends) {
  MESH_VERIFY(count % std::size_t(size_) == 0, "PeerExchange::all_reduce: " << count
                                                   << " elements in " << size_ << " blocks");
  if (size_ == 1) return;
  const std::size_t block_count = count / std::size_t(size_);
  const std::size_t block = block_count * dtype_size(dtype);
  char* own_block = static_cast<char*>(buf) + std::size_t(rank_) * block;
  // The residual's part of this rank's block, laid out as the block's sum.
  Addends own_part;
  if (addends) {
    own_part = *addends;
    if (own_part.residual)
      own_part.residual = static_cast<const char*>(own_part.residual) + std::size_t(rank_) * block;
  }
  reduce_scatter_transfer(buf, block_count, dtype, scatter_offset, stream);
  reduce_scatter_sum(buf, block_count, dtype, own_block, scatter_offset, stream,
                     addends ? &own_part : nullptr);
  // The summed block is already in place in `buf`: only the peers' come
  // back through the arena (no copy of this rank's block into it and out).
  push_to_peers(own_block, block, gather_offset, stream);
  copy_peer_blocks(buf, block, gather_offset, stream);
}

}  // namespace meshtron

#endif  // MESHTRON_HAVE_CUDA
