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
// Last, a whole all-gather on the copy engines (PeerExchange,
// src/parallel/peer_exchange.hpp): each rank copies its shard
// into every peer's gathered buffer (CUDA IPC) and into its own, then raises
// its flag in each peer's flag array with cuStreamWriteValue32; each rank's
// side stream waits for the peers' flags with cuStreamWaitValue32 (driver
// entry points through the runtime: no libcuda link). No kernel runs. The
// gathered bytes are checked once (after a device synchronisation), then
// timed alone and behind the GEMM. For use inside a step, kernels after the
// wait must also see the peer's data written before its flag: that takes
// CU_STREAM_WAIT_VALUE_FLUSH where the device has
// CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES (not measured here).
//
// Then the all-reduce of tp 2 without SP at micro-batch 4 ([4096, 1280]
// bf16, 10.5 MB; parallel.tp_interleave's no-SP shape) behind that shape's
// fc1 GEMM ([4096, 1280] x [1280, 2560]) the way tp_interleave runs it: a
// FiberPair whose first job all-reduces (queued on the communicator's side
// stream, then a switch) and whose second job queues the GEMM, so the first
// job's wait follows the GEMM. On NCCL and on the copy engines
// (PeerExchange::all_reduce: a reduce-scatter, the adds on the side stream,
// an all-gather), with the blocking all-reduce alone for reference.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#ifdef MESHTRON_HAVE_CUDA
#include <cuda_runtime.h>

#include "common/error.hpp"
#include "ops/ops.hpp"
#include "parallel/communicator_nccl.hpp"
#include "parallel/fiber_pair.hpp"
#include "parallel/peer_exchange.hpp"

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
    // This rank's shard lands in block `rank` of the next rank's arena.
    const PeerExchange exchange(MPI_COMM_WORLD, full_bytes);
    char* target = exchange.peer_arena(next) + std::size_t(comm.rank()) * shard_bytes;
    ce = median_ms([&] {
      CUDA_CHECK(cudaMemcpyAsync(target, shard, shard_bytes, cudaMemcpyDefault, 0));
    });
    CUDA_CHECK(cudaDeviceSynchronize());
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

/// The copy-engine all-gather of the file comment (PeerExchange); returns
/// {alone, behind the GEMM} in ms.
std::pair<double, double> ce_all_gather_ms(NcclCommunicator& comm, const void* shard,
                                           std::size_t shard_bytes,
                                           const std::function<void()>& gemm) {
  const int n = comm.size(), me = comm.rank();
  PeerExchange exchange(MPI_COMM_WORLD, shard_bytes * std::size_t(n));
  SideStream side;
  auto start = [&] {
    side.begin();
    exchange.all_gather(shard, shard_bytes, 0, side.get());
    side.end();
  };
  auto finish = [&] { side.join(); };
  // Correctness once: block r of every rank's gathered buffer is rank r's shard.
  CUDA_CHECK(cudaMemset(exchange.arena(), 0xff, shard_bytes * std::size_t(n)));
  CUDA_CHECK(cudaDeviceSynchronize());
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  start();
  finish();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> host(shard_bytes * std::size_t(n));
  CUDA_CHECK(cudaMemcpy(host.data(), exchange.arena(), host.size(), cudaMemcpyDeviceToHost));
  for (int r = 0; r < n; ++r) {
    // Each rank's shard holds the byte r + 1 (set by the caller).
    const bool ok = std::all_of(host.begin() + std::ptrdiff_t(std::size_t(r) * shard_bytes),
                                host.begin() + std::ptrdiff_t(std::size_t(r + 1) * shard_bytes),
                                [&](unsigned char b) { return b == (unsigned char)(r + 1); });
    MESH_VERIFY(ok, "CE all-gather: block " << r << " on rank " << me << " is wrong");
  }
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // every rank checked before the timed calls write
  std::pair<double, double> ms{0.0, 0.0};
  ms.first = median_ms([&] { start(); finish(); });
  ms.second = median_ms([&] { start(); gemm(); finish(); });
  CUDA_CHECK(cudaStreamSynchronize(side.get()));
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
    const PeerExchange exchange(MPI_COMM_WORLD, shard_bytes * std::size_t(n));
    char* target = exchange.peer_arena(next) + std::size_t(comm.rank()) * shard_bytes;
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
    overlap_row("CE all_gather", gemm_ms, ce_ag, ce_ag_both);
  }
  CUDA_CHECK(cudaFree(shard));
  CUDA_CHECK(cudaFree(full));
}

/// tp_interleave's all-reduce behind the other micro-batch's GEMM (see the
/// file comment) on `comm` (NCCL, or copy engines after use_copy_engine()).
void interleaved_all_reduce_row(NcclCommunicator& comm, const char* label, bool print) {
  const index_t tokens = 4096, hidden = 1280, out = 2560;
  const Tensor x = Tensor::zeros({tokens, hidden}, DType::BF16, MemorySpace::Cuda);
  const Tensor w = Tensor::zeros({hidden, out}, DType::BF16, MemorySpace::Cuda);
  Tensor y = Tensor::empty({tokens, out}, DType::BF16, MemorySpace::Cuda);
  Tensor buf = Tensor::zeros({tokens, hidden}, DType::BF16, MemorySpace::Cuda);
  auto gemm = [&] { ops::gemm(x, false, w, false, y); };
  auto all_reduce = [&] { comm.all_reduce(buf, ReduceOp::Sum); };
  const double gemm_ms = median_ms(gemm), alone = median_ms(all_reduce);
  FiberPair fibers;
  comm.set_interleave(&fibers);
  const double both = median_ms([&] { fibers.run(all_reduce, gemm); });
  comm.set_interleave(nullptr);
  if (print) overlap_row(label, gemm_ms, alone, both);
}

void bench_interleaved_all_reduce(NcclCommunicator& comm, bool print) {
  if (print)
    std::printf("\ntp_interleave, no SP, micro-batch 4: all-reduce of [4096, 1280] bf16 (10.5 MB) "
                "behind GEMM [4096, 1280] x [1280, 2560]\n");
  interleaved_all_reduce_row(comm, "NCCL all_reduce", print);
  NcclCommunicator copy_engines(MPI_COMM_WORLD);
  copy_engines.use_copy_engine();
  interleaved_all_reduce_row(copy_engines, "CE all_reduce", print);
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
  int have = meshtron::PeerExchange::available() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!have) {  // the copy-engine rows use PeerExchange (flags by stream memory operations)
    if (rank == 0) std::printf("bench_collectives: skipped (no stream memory operations)\n");
    MPI_Finalize();
    return 0;
  }
  {
    meshtron::NcclCommunicator comm(MPI_COMM_WORLD);
    if (rank == 0) meshtron::print_environment();
    for (std::size_t elements : {std::size_t(1) << 19, std::size_t(1) << 21,
                                 std::size_t(8192) * 1280 / 2, std::size_t(1) << 24})
      meshtron::bench_shard(comm, elements, rank == 0);
    meshtron::bench_overlap(comm, rank == 0);
    meshtron::bench_interleaved_all_reduce(comm, rank == 0);
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
