// Collective and copy-engine bandwidth between the GPUs of a tp group: the
// ceilings tp 2's scaling runs into.
//
// Run: mpirun -np 2 ./perf/bench_collectives   (prints "skipped" with fewer
// than 2 ranks or GPUs). NCCL settings come from the environment
// (NCCL_PROTO, NCCL_MIN_NCHANNELS, NCCL_BUFFSIZE, ...; the values in effect
// are printed first).
//
// For each per-rank shard size (GPT-2 774M's [8192, 1280] bf16 activation
// split over 2 ranks is 10.5 MB) it times, as medians of 20 calls bracketed
// by CUDA events after 3 warm-ups, on the stream meshtron's collectives use:
//   - NcclCommunicator::all_gather, reduce_scatter and all_reduce (bf16),
//     with nccl-tests' bus bandwidth: (n - 1) / n x gathered bytes / time for
//     all-gather and reduce-scatter, 2 (n - 1) / n x bytes / time for
//     all-reduce;
//   - the copy engines: every rank writes its shard into the next rank's
//     buffer (opened with CUDA IPC) with cudaMemcpyAsync, all ranks at once
//     (the traffic of an all-gather without NCCL's kernels), GB/s per
//     direction;
//   - the baseline: a device-to-device copy of the shard on one GPU, read +
//     write bytes.
//
// Then, at GPT-2 774M's tp 2 shapes, how much of a transfer hides behind a
// GEMM running at the same time (the question for overlapping tp
// communication): the column-parallel GEMM [8192, 1280] x [1280, 2560]
// (bf16, cuBLASLt) alone, the transfer of the 10.5 MB shard alone, and both
// at once, for NCCL's all-gather (Communicator::iall_gather, its kernels on
// the communicator's side stream) and for a copy-engine peer copy on a side
// stream (no SMs taken). hidden = (gemm + transfer - both) / transfer.
//
// Last, a whole all-gather on the copy engines: each rank copies its shard
// into every peer's gathered buffer (CUDA IPC) and into its own, then raises
// its flag in each peer's flag array with cuStreamWriteValue32; each rank's
// side stream waits for the peers' flags with cuStreamWaitValue32 (driver
// entry points through the runtime: no libcuda link). No kernel runs. The
// gathered bytes are checked once (after a device synchronisation), then
// timed alone and behind the GEMM. For use inside a step, kernels after the
// wait must also see the peer's data written before its flag: that takes
// CU_STREAM_WAIT_VALUE_FLUSH where the device has
// CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES (not measured here).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#ifdef MESHTRON_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include "common/error.hpp"
#include "ops/ops.hpp"
#include "parallel/communicator_nccl.hpp"

namespace meshtron {
namespace {

constexpr int kWarmup = 3, kRuns = 20;

/// Median milliseconds of f() on the default stream, ranks in step.
double median_ms(const std::function<void()>& f) {
  for (int i = 0; i < kWarmup; ++i) f();
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < kRuns; ++i) {
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    CUDA_CHECK(cudaEventRecord(start, 0));
    f();
    CUDA_CHECK(cudaEventRecord(stop, 0));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// Every rank's allocation `mine`, opened in this process (its own as is).
class PeerTable {
 public:
  explicit PeerTable(void* mine) : mine_(mine) {
    cudaIpcMemHandle_t handle;
    CUDA_CHECK(cudaIpcGetMemHandle(&handle, mine));
    int world = 0, rank = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    std::vector<cudaIpcMemHandle_t> all(static_cast<std::size_t>(world));
    MPI_CHECK(MPI_Allgather(&handle, sizeof(handle), MPI_BYTE, all.data(), sizeof(handle),
                            MPI_BYTE, MPI_COMM_WORLD));
    ptrs_.assign(std::size_t(world), nullptr);
    for (int r = 0; r < world; ++r) {
      if (r == rank) {
        ptrs_[std::size_t(r)] = mine;
        continue;
      }
      CUDA_CHECK(cudaIpcOpenMemHandle(&ptrs_[std::size_t(r)], all[std::size_t(r)],
                                      cudaIpcMemLazyEnablePeerAccess));
    }
  }
  ~PeerTable() {
    for (void* p : ptrs_)
      if (p != mine_) cudaIpcCloseMemHandle(p);
  }
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;
  char* of(int rank) const { return static_cast<char*>(ptrs_[std::size_t(rank)]); }

 private:
  void* mine_;
  std::vector<void*> ptrs_;
};

/// A non-blocking stream for transfers beside the default stream: begin()
/// orders it after the default stream's work so far, end() marks what it
/// has queued, join() makes the default stream wait for that.
class SideStream {
 public:
  SideStream() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~SideStream() {
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void begin() {
    CUDA_CHECK(cudaEventRecord(ready_, 0));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  void end() { CUDA_CHECK(cudaEventRecord(done_, stream_)); }
  void join() { CUDA_CHECK(cudaStreamWaitEvent(0, done_, 0)); }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
};

void print_environment() {
  std::printf("NCCL settings:");
  for (const char* name : {"NCCL_PROTO", "NCCL_ALGO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS",
                           "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_NVLS_ENABLE"}) {
    const char* value = std::getenv(name);
    std::printf(" %s=%s", name, value ? value : "(default)");
  }
  std::printf("\n\n%-12s %12s %12s %12s %12s %12s\n", "shard MB", "op", "ms", "GB/s", "busbw",
              "/copy");
}

void row(double shard_mb, const char* op, double ms, double gbps, double busbw, double copy) {
  std::printf("%-12.2f %12s %12.4f %12.1f %12.1f %12.2f\n", shard_mb, op, ms, gbps, busbw,
              busbw / copy);
}

void bench_shard(NcclCommunicator& comm, std::size_t shard_elements, bool print) {
  const int n = comm.size(), next = (comm.rank() + 1) % n;
  const std::size_t shard_bytes = shard_elements * 2, full_bytes = shard_bytes * std::size_t(n);
  // Plain cudaMalloc: a CUDA IPC handle names a whole allocation, and the
  // caching allocator's blocks may be pieces of one.
  void *shard = nullptr, *full = nullptr;
  CUDA_CHECK(cudaMalloc(&shard, full_bytes));
  CUDA_CHECK(cudaMalloc(&full, full_bytes));
  CUDA_CHECK(cudaMemset(shard, 0, full_bytes));
  CUDA_CHECK(cudaMemset(full, 0, full_bytes));
  const double mb = double(shard_bytes) / 1e6, ring = double(n - 1) / n;

  const double copy_ms = median_ms([&] {
    CUDA_CHECK(cudaMemcpyAsync(full, shard, shard_bytes, cudaMemcpyDeviceToDevice, 0));
  });
  const double copy = 2.0 * double(shard_bytes) / (copy_ms * 1e6);
  const double ag = median_ms([&] { comm.all_gather(shard, full, shard_elements, DType::BF16); });
  const double rs = median_ms(
      [&] { comm.reduce_scatter(full, shard, shard_elements, DType::BF16, ReduceOp::Sum); });
  const double ar =
      median_ms([&] { comm.all_reduce(full, shard_elements * std::size_t(n), DType::BF16, ReduceOp::Sum); });
  double ce = 0;
  {
    const PeerTable peers(full);  // this rank's shard lands in block `rank` of the next's
    char* target = peers.of(next) + std::size_t(comm.rank()) * shard_bytes;
    ce = median_ms([&] {
      CUDA_CHECK(cudaMemcpyAsync(target, shard, shard_bytes, cudaMemcpyDefault, 0));
    });
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // no rank closes a buffer another still writes
  }
  if (print) {
    row(mb, "copy (1 GPU)", copy_ms, copy, copy, copy);
    row(mb, "all_gather", ag, double(full_bytes) / (ag * 1e6), ring * double(full_bytes) / (ag * 1e6), copy);
    row(mb, "reduce_scat", rs, double(full_bytes) / (rs * 1e6), ring * double(full_bytes) / (rs * 1e6), copy);
    row(mb, "all_reduce", ar, double(full_bytes) / (ar * 1e6),
        2 * ring * double(full_bytes) / (ar * 1e6), copy);
    row(mb, "CE peer copy", ce, double(shard_bytes) / (ce * 1e6), double(shard_bytes) / (ce * 1e6),
        copy);
  }
  CUDA_CHECK(cudaFree(shard));
  CUDA_CHECK(cudaFree(full));
}

void overlap_row(const char* transfer, double gemm, double alone, double both) {
  std::printf("%-16s gemm %8.4f ms  transfer %8.4f ms  both %8.4f ms  hidden %5.2f\n", transfer,
              gemm, alone, both, (gemm + alone - both) / alone);
}

/// cuStreamWriteValue32 / cuStreamWaitValue32 from the driver, or null.
struct StreamMemOps {
  using Write = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  using Wait = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  Write write = nullptr;
  Wait wait = nullptr;
  StreamMemOps() {
    void* w = nullptr;
    void* v = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &w, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess &&
        cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &v, 12000, cudaEnableDefault,
                                         &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      write = reinterpret_cast<Write>(w);
      wait = reinterpret_cast<Wait>(v);
    }
    (void)cudaGetLastError();
  }
};

#define CU_CHECK(call) MESH_VERIFY((call) == CUDA_SUCCESS, #call " failed")

/// The copy-engine all-gather of the file comment; returns {alone, behind
/// the GEMM} in ms, or {0, 0} without the driver's stream memory operations.
std::pair<double, double> ce_all_gather_ms(NcclCommunicator& comm, const void* shard,
                                           std::size_t shard_bytes,
                                           const std::function<void()>& gemm) {
  const StreamMemOps ops;
  int have = ops.write && ops.wait ? 1 : 0, all = 0;
  MPI_CHECK(MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (!all) return {0.0, 0.0};
  const int n = comm.size(), me = comm.rank();
  void *full = nullptr, *flags = nullptr;
  CUDA_CHECK(cudaMalloc(&full, shard_bytes * std::size_t(n)));
  CUDA_CHECK(cudaMalloc(&flags, sizeof(cuuint32_t) * std::size_t(n)));
  CUDA_CHECK(cudaMemset(flags, 0, sizeof(cuuint32_t) * std::size_t(n)));
  CUDA_CHECK(cudaDeviceSynchronize());
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // every flag array zeroed before anyone writes
  std::pair<double, double> ms{0.0, 0.0};
  {
    const PeerTable peer_full(full), peer_flags(flags);
    SideStream side;
    cuuint32_t seq = 0;
    auto flag = [&](int owner, int writer) {  // owner's flag raised by writer
      return CUdeviceptr(peer_flags.of(owner) + sizeof(cuuint32_t) * std::size_t(writer));
    };
    auto start = [&] {
      ++seq;
      side.begin();
      for (int k = 1; k <= n; ++k) {  // the peers from the next one on, then this rank
        const int r = (me + k) % n;
        CUDA_CHECK(cudaMemcpyAsync(peer_full.of(r) + std::size_t(me) * shard_bytes, shard,
                                   shard_bytes, cudaMemcpyDefault, side.get()));
        if (r != me)
          CU_CHECK(ops.write(side.get(), flag(r, me), seq, CU_STREAM_WRITE_VALUE_DEFAULT));
      }
      for (int r = 0; r < n; ++r)
        if (r != me) CU_CHECK(ops.wait(side.get(), flag(me, r), seq, CU_STREAM_WAIT_VALUE_GEQ));
      side.end();
    };
    auto finish = [&] { side.join(); };
    // Correctness once: block r of every rank's gathered buffer is rank r's shard.
    CUDA_CHECK(cudaMemset(full, 0xff, shard_bytes * std::size_t(n)));
    CUDA_CHECK(cudaDeviceSynchronize());
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    start();
    finish();
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<unsigned char> host(shard_bytes * std::size_t(n));
    CUDA_CHECK(cudaMemcpy(host.data(), full, host.size(), cudaMemcpyDeviceToHost));
    for (int r = 0; r < n; ++r) {
      // Each rank's shard holds the byte r + 1 (set by the caller).
      const bool ok = std::all_of(host.begin() + std::ptrdiff_t(std::size_t(r) * shard_bytes),
                                  host.begin() + std::ptrdiff_t(std::size_t(r + 1) * shard_bytes),
                                  [&](unsigned char b) { return b == (unsigned char)(r + 1); });
      MESH_VERIFY(ok, "CE all-gather: block " << r << " on rank " << me << " is wrong");
    }
    ms.first = median_ms([&] { start(); finish(); });
    ms.second = median_ms([&] { start(); gemm(); finish(); });
    CUDA_CHECK(cudaStreamSynchronize(side.get()));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // no rank closes a buffer another still writes
  }
  CUDA_CHECK(cudaFree(full));
  CUDA_CHECK(cudaFree(flags));
  return ms;
}

void bench_overlap(NcclCommunicator& comm, bool print) {
  const index_t tokens = 8192, hidden = 1280, out = 2 * 5120 / 4;  // fc1 at tp 2: 2560
  const Tensor x = Tensor::zeros({tokens, hidden}, DType::BF16, MemorySpace::Cuda);
  const Tensor w = Tensor::zeros({hidden, out}, DType::BF16, MemorySpace::Cuda);
  Tensor y = Tensor::empty({tokens, out}, DType::BF16, MemorySpace::Cuda);
  auto gemm = [&] { ops::gemm(x, false, w, false, y); };

  const int n = comm.size(), next = (comm.rank() + 1) % n;
  const std::size_t shard_elements = std::size_t(tokens / n * hidden), shard_bytes = shard_elements * 2;
  void *shard = nullptr, *full = nullptr;
  CUDA_CHECK(cudaMalloc(&shard, shard_bytes * std::size_t(n)));
  CUDA_CHECK(cudaMalloc(&full, shard_bytes * std::size_t(n)));
  CUDA_CHECK(cudaMemset(shard, comm.rank() + 1, shard_bytes));  // checked by ce_all_gather_ms
  const std::vector<std::size_t> counts(std::size_t(n), shard_elements);
  auto nccl = [&] { return comm.iall_gather(shard, full, counts, DType::BF16); };

  const double gemm_ms = median_ms(gemm);
  const double ag_ms = median_ms([&] { comm.wait_collective(nccl()); });
  const double ag_both = median_ms([&] {
    const long ticket = nccl();
    gemm();
    comm.wait_collective(ticket);
  });
  double ce_ms = 0, ce_both = 0;
  {
    const PeerTable peers(full);
    char* target = peers.of(next) + std::size_t(comm.rank()) * shard_bytes;
    SideStream side;
    auto start_copy = [&] {
      side.begin();
      CUDA_CHECK(cudaMemcpyAsync(target, shard, shard_bytes, cudaMemcpyDefault, side.get()));
      side.end();
    };
    ce_ms = median_ms([&] { start_copy(); side.join(); });
    ce_both = median_ms([&] { start_copy(); gemm(); side.join(); });
    CUDA_CHECK(cudaStreamSynchronize(side.get()));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // no rank closes a buffer another still writes
  }
  const auto [ce_ag, ce_ag_both] = ce_all_gather_ms(comm, shard, shard_bytes, gemm);
  if (print) {
    std::printf("\nOverlap at 774M tp 2: GEMM [%ld, %ld] x [%ld, %ld] bf16 against a %.1f MB shard\n",
                long(tokens), long(hidden), long(hidden), long(out), double(shard_bytes) / 1e6);
    overlap_row("NCCL all_gather", gemm_ms, ag_ms, ag_both);
    overlap_row("CE peer copy", gemm_ms, ce_ms, ce_both);
    if (ce_ag > 0)
      overlap_row("CE all_gather", gemm_ms, ce_ag, ce_ag_both);
    else
      std::printf("CE all_gather: skipped (no cuStreamWriteValue32/cuStreamWaitValue32)\n");
  }
  CUDA_CHECK(cudaFree(shard));
  CUDA_CHECK(cudaFree(full));
}

}  // namespace
}  // namespace meshtron

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 0, gpus = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  int enough = world >= 2 && gpus >= 2 ? 1 : 0, all = 0;
  MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (rank == 0) std::printf("bench_collectives: skipped (needs 2+ ranks with a GPU each)\n");
    MPI_Finalize();
    return 0;
  }
  CUDA_CHECK(cudaSetDevice(rank % gpus));
  {
    meshtron::NcclCommunicator comm(MPI_COMM_WORLD);
    if (rank == 0) meshtron::print_environment();
    for (std::size_t elements : {std::size_t(1) << 19, std::size_t(1) << 21,
                                 std::size_t(8192) * 1280 / 2, std::size_t(1) << 24})
      meshtron::bench_shard(comm, elements, rank == 0);
    meshtron::bench_overlap(comm, rank == 0);
  }
  MPI_Finalize();
  return 0;
}

#else
int main() {
  std::printf("bench_collectives: skipped (built without CUDA)\n");
  return 0;
}
#endif
