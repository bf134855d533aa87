// CUDA op table throughput: memory-bound kernels against the device's copy
// bandwidth, GEMMs and attention against a large bf16 GEMM's TFLOP/s.
//
// Baselines (ceilings), measured at the start of the same run: a 1 GiB
// device-to-device cudaMemcpy, counting bytes read plus bytes written, and
// cuBLASLt's bf16 GEMM at 8192^3 (bf16 C); GEMM and attention rows print
// their TFLOP/s as a fraction of it ("/gemm"). Each memory-bound op is timed at
// GPT-2 124M training sizes (8 x 1024 tokens, H = 768, 4H = 3072, 12 heads,
// vocab 50304; layernorm and embeddings also at GPT-2 774M's H = 1280, and
// the layernorm backward also with the residual gradient the transformer
// layer passes, and "chained" as a model's backward runs it: chain_calls(h)
// calls sharing an ops::LayerNormGradChain, each call's dgamma/dbeta adds
// done by the next call's kernel and the last by the flush, timed with the
// flush and reported per call) and reported as GB/s of its minimal traffic (each input read
// once, each output written once) and as a fraction of the copy's GB/s:
// 1.0 means the kernel moves its bytes as fast as the copy engine path does.
// GEMMs report TFLOP/s (2 M N K / time); the MLP's GEMMs with the GeLU (and
// the residual add) in cuBLASLt's epilogue are timed against the GEMM plus
// the separate kernels, with the speed-up. Times are medians of 20 runs timed
// with CUDA events after 3 warm-ups; inputs are random (never zeros).
//
// Memory-bound rows, four timings. "/copy" times a batch of 10 back-to-back
// calls between the two events and divides by 10, as the kernels run in
// training (one after another on the stream, the next launch queued while
// the previous kernel runs). "/copy 1x" times ONE call per event pair, so
// at these sizes (12-100 MB, a few to tens of microseconds) the launch, the
// event overhead and the ramp-up and tail of the grid count fully. The
// inputs are the same for every call of a batch: the ops are idempotent
// (out = f(in)) or accumulate into a gradient (dbias, dgamma, embedding's
// dtable), either way the same work per call. sum_of_squares (+sync) waits
// for its result on the host by design (the op returns a double), so its
// batch includes 10 synchronisations; sum_of_squares_into (device) leaves
// the total in device memory and does not wait: what the training step's
// gradient norm calls, once per step over all gradients (its row at [124M]
// fp32 is GPT-2 124M's). "graph" replays the same batch of 10 calls
// captured in one CUDA graph (CapturedWork, as training.cuda_graphs runs the
// step: no host launch work between the kernels; "-" for the row that waits
// on the host). "queued" times the same batch with the host ahead of the
// GPU, as in the training step without graphs (its GEMMs keep the host
// ahead): the events and the calls queued behind a kernel that holds the
// stream until the host has queued them all (perf/stream_hold.hpp, NVBench's
// method), as a fraction of the 1 GiB copy queued the same way; it drops
// the launch path's ~5 us before the first kernel and any gap where the
// host queues a call no faster than the GPU runs one ("/copy" keeps both).
// "host us" is the host's time to queue one call (the batch's
// launches, no wait): where it nears the kernel's time, the "/copy" column
// measures the host, not the kernel. "copy@size" is a device-to-device
// cudaMemcpy moving the row's bytes (half read, half written), batched the
// same way, as a fraction of the 1 GiB copy: the ramp-up and tail a copy of
// that size pays too, for reading the rows at 12-100 MB.
//
// Attention core, fused (ops::fused_attention_*, FlashAttention-2 kernels)
// against unfused (the path of src/model/attention.cpp: batched cuBLASLt
// GEMMs q k^T and P V, the softmax kernel, and the [B, S, S] tensors), bf16,
// forward and backward, at GPT-2 124M shapes (B = 8 x 12 heads, S = 1024,
// D = 64) and at D = 128 (B = 8 x 16 heads). TFLOP/s count the causal work
// only: 4 B S^2 D / 2 forward, 2.5 times that backward, for both paths (so
// the unfused path, which computes the full S x S, is credited with half).
// Each path also with attention dropout 0.1 ("p.1" rows: the fused kernels'
// own Philox mask, stored by the forward for the backward as the model runs
// it, and "drawn" by every pass; unfused: dropout_forward/backward on
// [B, S, S] as in Attention). Then with ALiBi (BLOOM's shape) and with a
// key padding mask (BERT-base's), against the unfused core with the
// matching softmax.
// On the token-major layout the model uses (qkv [s*b, 3*heads*d], what
// ops::fused_attention_*_token_major read in place), our kernels ("own tm")
// against cuDNN's fused attention ("cudnn tm", kernels/cuda/cudnn_attention.cu;
// a row saying why when cuDNN is not built or declines the shape), at the
// shapes above with b = 8 (the 8 x 12, 8 x 16 and GPT-2 774M's 8 x 20 heads),
// with the same FLOP count. The cuDNN times include building its variant
// pack and taking its workspace from the caching allocator, as in training.
//
// AdamW with the bf16 compute copy over GPT-2 774M's parameter shapes: the
// per-tensor loop (adamw_step + cast) against ops::MultiTensorAdamW.
//
// Google Benchmark: `bench_cuda_ops gbench [--benchmark_* flags]` registers the
// memory-bound rows ("memory/<op> <dtype> <shape>", 10 calls per timed
// batch as "/copy"), the GEMMs ("gemm/...") and the token-major attention
// forward and backward ("attention/<shape>/<own|cudnn>[ p.1]/<fwd|bwd>")
// with manual (CUDA event) time per call and the counters GB/s and
// per_copy, or TFLOP/s and per_gemm, against the ceilings in the context
// (copy_GBps, gemm_TFLOPs). A row's buffers are allocated when it runs and
// freed when the next one starts, so a filter's rows cost only their own
// (the largest row, the fp32 logits' cross entropy, ~3.3 GB).
//
// Run: ./perf/bench_cuda_ops        (prints "skipped" without a GPU)
//      ./perf/bench_cuda_ops gbench --benchmark_filter=layernorm --benchmark_format=json
//      ./perf/bench_cuda_ops attention [fused]   (attention only [fused rows only])
//      ./perf/bench_cuda_ops trace [ops]         (those rows' kernels, CUPTI)
//      ./perf/bench_cuda_ops memory [ops]        (the memory-bound table only
//                                                 [rows whose op contains one of
//                                                 the comma-separated ops])
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/cast.hpp"
#include "ops/ops.hpp"
#include "tensor/device_allocator.hpp"

#ifdef MESHTRON_HAVE_CUDA
#include <cuda_runtime.h>

#include "ops/ops_cuda.hpp"
#include "perf/stream_hold.hpp"
#include "tensor/device_stream.hpp"
#include "train/cuda_graph.hpp"
#include "train/gpu_trace.hpp"

namespace meshtron {
namespace {

constexpr int kWarmup = 3, kRuns = 20;

/// The stream the timing events go on: the legacy stream (0), or, with
/// `hold`, the compute stream the ops run on, as the training step's own
/// events (no legacy-stream work between the held calls).
cudaStream_t timing_stream(const perf::StreamHold* hold) {
  return hold ? device::compute_stream() : cudaStream_t(0);
}

/// Milliseconds per call of `batch` calls of f() back to back, bracketed by
/// CUDA events (time / batch). With `hold`, the events and the calls are
/// queued behind it and released together ("queued").
double batch_ms(const std::function<void()>& f, int batch, perf::StreamHold* hold = nullptr) {
  const cudaStream_t stream = timing_stream(hold);
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  if (hold) hold->hold(stream);
  CUDA_CHECK(cudaEventRecord(start, stream));
  for (int b = 0; b < batch; ++b) f();
  CUDA_CHECK(cudaEventRecord(stop, stream));
  if (hold) hold->release();
  CUDA_CHECK(cudaEventSynchronize(stop));
  float t = 0;
  CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  if (hold && hold->gave_up()) return std::nan("");  // the host was timed too
  return double(t) / batch;
}

/// Median milliseconds per call of f() over kRuns batches (batch_ms), after
/// kWarmup calls; NaN if a held batch's hold gave up.
double median_ms(const std::function<void()>& f, int batch = 1, perf::StreamHold* hold = nullptr) {
  for (int i = 0; i < kWarmup; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < kRuns; ++i) ms.push_back(batch_ms(f, batch, hold));
  if (std::any_of(ms.begin(), ms.end(), [](double m) { return std::isnan(m); }))
    return std::nan("");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// One hold for every queued timing of the run (its flags are pinned memory).
perf::StreamHold& stream_hold() {
  static perf::StreamHold hold;
  return hold;
}

/// The device ceilings every row is a fraction of, measured at the start of
/// the run: a 1 GiB device-to-device copy (GB/s, read + write) and a large
/// cuBLASLt bf16 GEMM (TFLOP/s); and, for `gbench`, each benchmark's minimum
/// GPU time (0: Google Benchmark's own, or the command line's).
struct Baselines {
  double copy_gbps = 0, gemm_tflops = 0;
  double copy_queued_gbps = 0;  ///< the copy queued behind a StreamHold (memory table only)
  double benchmark_min_time_s = 0;
};

/// A benchmark row's call, built when the row runs: its inputs are
/// allocated by the build and freed with the callable it returns, so one
/// row's buffers are alive at a time and a row nobody runs (a filter's, an
/// unselected op's) allocates nothing.
using MakeCall = std::function<std::function<void()>()>;

/// `bench_cuda_ops gbench`: the one row whose buffers are alive. Google
/// Benchmark calls a benchmark's function several times (to size the
/// iterations, per repetition); the row is built at its first call and kept
/// until another benchmark starts.
struct BuiltRow {
  std::string name;
  std::function<void()> call;
  const std::function<void()>& get(const std::string& want, const MakeCall& make) {
    if (name != want) {
      call = nullptr;  // the previous row's buffers back first
      call = make();
      name = want;
    }
    return call;
  }
};

/// `bench_cuda_ops gbench`: a Google Benchmark of the call `make` builds
/// (in `built`, when the benchmark runs). Each iteration times `batch` calls
/// between CUDA events and counts the time per call (manual time); counters
/// GB/s and per_copy where `bytes` > 0, TFLOP/s and per_gemm where `flop` >
/// 0, per call, against the run's ceilings.
void register_benchmark(const std::string& name, const MakeCall& make, int batch, double bytes,
                        double flop, const Baselines& baselines,
                        const std::shared_ptr<BuiltRow>& built) {
  auto run = [=](benchmark::State& state) {
    const std::function<void()>& f = built->get(name, make);
    for (int i = 0; i < kWarmup; ++i) f();
    double seconds = 0;  // per call, summed over the iterations
    for (auto _ : state) {
      const double s = batch_ms(f, batch) * 1e-3;
      state.SetIterationTime(s);
      seconds += s;
    }
    const double calls_per_s = seconds > 0 ? double(state.iterations()) / seconds : 0;
    if (bytes > 0) {
      state.counters["GB/s"] = bytes * calls_per_s * 1e-9;
      state.counters["per_copy"] = bytes * calls_per_s * 1e-9 / baselines.copy_gbps;
    }
    if (flop > 0) {
      state.counters["TFLOP/s"] = flop * calls_per_s * 1e-12;
      state.counters["per_gemm"] = flop * calls_per_s * 1e-12 / baselines.gemm_tflops;
    }
  };
  auto* b = benchmark::RegisterBenchmark(name.c_str(), run);
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
  if (baselines.benchmark_min_time_s > 0) b->MinTime(baselines.benchmark_min_time_s);
}

/// Random values in [lo, hi): 1M random elements uploaded, then tiled on
/// the device (generating gigabytes on the host would dominate the run).
Tensor random_device(const Shape& shape, DType dt, double lo = -1.0, double hi = 1.0) {
  Tensor out = Tensor::empty(shape, dt, MemorySpace::Cuda);
  const index_t n = out.numel(), tile = std::min<index_t>(n, 1 << 20);
  Tensor host = Tensor::empty({tile}, DType::F32);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t i = 0; i < tile; ++i) host.data<float>()[i] = float(dist(rng));
  const Tensor piece = host.to(dt).to_device();
  const std::size_t es = dtype_size(dt);
  for (index_t at = 0; at < n; at += tile)
    device::copy_bytes(static_cast<char*>(out.raw()) + at * es, piece.raw(),
                       std::size_t(std::min(tile, n - at)) * es);
  return out;
}

Tensor random_ids(index_t n, int vocab) {
  Tensor t = Tensor::empty({n}, DType::I32);
  std::mt19937 rng(7);
  for (index_t i = 0; i < n; ++i) t.data<std::int32_t>()[i] = int(rng() % unsigned(vocab));
  return t.to_device();
}

/// Calls per timed batch of the memory-bound rows ("/copy").
constexpr int kBatch = 10;
/// Layernorm backwards per ops::LayerNormGradChain in the "chained" rows of
/// width h: as many as the backward of the GPT-2 of that width makes (2 per
/// layer + the final norm: 124M's 25 at 768, 774M's 73 at 1280), so each
/// row pays its flush as often as that model's backward does.
int chain_calls(index_t h) { return h == 768 ? 2 * 12 + 1 : 2 * 36 + 1; }

/// A memory-bound row: per-call time and GB/s back to back (a batch of
/// kBatch calls) and of a single launch ("1x").
struct Row {
  std::string op, dtype, shape;
  double ms, gbps, ms_1x, gbps_1x;
  double gbps_graph;  // NaN: not capturable (waits on the host)
  double gbps_queued;  // the batch queued behind a StreamHold; NaN: waits on the host
  double host_us;     // host time to queue one call
  double gbps_copy_at_size;
};

/// "queued" is a fraction of the copy queued the same way (copy_queued_gbps).
void print_memory_bound(const std::vector<Row>& rows, double copy_gbps, double copy_queued_gbps) {
  std::printf("\n%-38s %-5s %-16s %9s %9s %7s %7s %7s %7s %9s %9s %8s\n", "memory-bound op",
              "dtype", "shape", "ms", "GB/s", "/copy", "graph", "queued", "host us", "copy@size",
              "ms 1x", "/copy 1x");
  const auto fraction = [](double gbps, double of) {  // "-" where not measured
    char text[16] = "      -";
    if (!std::isnan(gbps)) std::snprintf(text, sizeof text, "%7.2f", gbps / of);
    return std::string(text);
  };
  for (const Row& r : rows) {
    std::printf("%-38s %-5s %-16s %9.4f %9.1f %7.2f %s %s %7.1f %9.2f %9.4f %8.2f\n",
                r.op.c_str(), r.dtype.c_str(), r.shape.c_str(), r.ms, r.gbps, r.gbps / copy_gbps,
                fraction(r.gbps_graph, copy_gbps).c_str(),
                fraction(r.gbps_queued, copy_queued_gbps).c_str(), r.host_us,
                r.gbps_copy_at_size / copy_gbps, r.ms_1x, r.gbps_1x / copy_gbps);
  }
}

/// GB/s of `batch` calls of f captured into one CUDA graph and replayed
/// (f must not wait on the host).
double graph_gbps(const std::function<void()>& f, int batch, double bytes) {
  CapturedWork work([&] {
    for (int b = 0; b < batch; ++b) f();
  });
  const double ms = median_ms([&] { work.replay(); }) / batch;
  return bytes / (ms * 1e6);
}

/// Microseconds the host takes to queue one call of f (a batch, no wait).
double host_queue_us(const std::function<void()>& f, int batch) {
  CUDA_CHECK(cudaDeviceSynchronize());
  const auto start = std::chrono::steady_clock::now();
  for (int b = 0; b < batch; ++b) f();
  const auto stop = std::chrono::steady_clock::now();
  CUDA_CHECK(cudaDeviceSynchronize());
  return std::chrono::duration<double, std::micro>(stop - start).count() / batch;
}

/// GB/s (read + write) of a device-to-device cudaMemcpy of bytes / 2, in
/// batches as the rows are timed (queued behind `hold` if given). Scratch
/// buffers grow to the largest row.
double copy_at_size_gbps(double bytes, int batch, perf::StreamHold* hold = nullptr) {
  static void* a = nullptr;
  static void* b = nullptr;
  static std::size_t have = 0;
  const std::size_t half = std::size_t(bytes / 2) / 16 * 16;
  if (half > have) {
    if (a) device::deallocate(a), device::deallocate(b);
    a = device::allocate(half), b = device::allocate(half);
    CUDA_CHECK(cudaMemset(a, 1, half));
    have = half;
  }
  const double ms = median_ms(
      [&] {
        CUDA_CHECK(cudaMemcpyAsync(b, a, half, cudaMemcpyDeviceToDevice, timing_stream(hold)));
      },
      batch, hold);
  return 2.0 * double(half) / (ms * 1e6);
}

/// The baseline: a 1 GiB device-to-device copy, one per timed run (queued
/// behind `hold` if given: the baseline of the "queued" column).
double copy_bandwidth_gbps(perf::StreamHold* hold = nullptr) {
  return copy_at_size_gbps(2.0 * double(std::size_t(1) << 30), 1, hold);
}


/// Whether `op` is among the comma-separated substrings of `only` (all when
/// `only` is empty).
bool row_selected(const std::string& op, const std::string& only) {
  if (only.empty()) return true;
  std::size_t at = 0;
  while (at <= only.size()) {
    const std::size_t comma = std::min(only.find(',', at), only.size());
    const std::string want = only.substr(at, comma - at);
    if (!want.empty() && op.find(want) != std::string::npos) return true;
    at = comma + 1;
  }
  return false;
}

/// `bench_cuda_ops trace [ops]`: the kernels of a batch of calls of f as
/// the GPU ran them (CUPTI, device timestamps): per kernel its calls and
/// mean duration, and per call the window (first start to last end), the
/// time some kernel ran and the gaps between them.
void trace_row(const std::string& what, const std::function<void()>& f, int batch) {
  for (int i = 0; i < kWarmup; ++i) f();
  GpuTracer tracer;
  tracer.start();
  for (int b = 0; b < batch; ++b) f();
  tracer.stop();
  std::vector<TraceEvent> events = tracer.events();
  std::sort(events.begin(), events.end(),
            [](const TraceEvent& a, const TraceEvent& b) { return a.start_ns < b.start_ns; });
  std::printf("\n%s: %zu kernels in %d calls\n", what.c_str(), events.size(), batch);
  if (events.empty()) return;
  std::vector<std::pair<std::string, std::vector<double>>> kernels;
  std::uint64_t reach = events.front().start_ns;
  for (const TraceEvent& e : events) {
    auto it = std::find_if(kernels.begin(), kernels.end(), [&](const auto& k) { return k.first == e.name; });
    if (it == kernels.end()) it = kernels.insert(kernels.end(), {e.name, {}});
    it->second.push_back(double(e.end_ns - e.start_ns) / 1e3);
    reach = std::max(reach, e.end_ns);
  }
  for (const auto& [name, us] : kernels) {
    double sum = 0, lo = us.front(), hi = us.front();
    for (double u : us) sum += u, lo = std::min(lo, u), hi = std::max(hi, u);
    std::printf("  %-70.70s x%-3zu mean %7.2f us (min %7.2f, max %7.2f)\n", name.c_str(),
                us.size(), sum / double(us.size()), lo, hi);
  }
  // The training profile's split, a call as its "step": overlapping kernels (PDL) count once.
  const TraceSummary call = summarize_trace(events, events.front().start_ns, reach, batch, 0);
  std::printf("  per call: window %.2f us, busy %.2f us, gaps %.2f us\n", call.window_ms * 1e3,
              call.busy_ms * 1e3, call.idle_ms * 1e3);
}

/// MakeCall of op(inputs), inputs = make_inputs() at each build (the row's
/// own, shared by nothing).
template <class MakeInputs, class Op>
MakeCall on(MakeInputs make_inputs, Op op) {
  return [=] {
    auto in = std::make_shared<decltype(make_inputs())>(make_inputs());
    return std::function<void()>([in, op] { op(*in); });
  };
}

Tensor device_empty(const Shape& shape, DType dt) {
  return Tensor::empty(shape, dt, MemorySpace::Cuda);
}

// The memory-bound rows' inputs, one struct per family of rows (GPT-2
// 124M's and 774M's shapes: 8192 tokens, widths 768 / 1280 / 3072 / 5120).
constexpr index_t kTokens = 8 * 1024;

/// [8192, 3072] elementwise rows (124M's MLP width).
struct ElementwiseInputs {
  Tensor x, y, dy, dx, bias, dbias, total;
  std::vector<Tensor> xs;  // sum_of_squares_into's list
  ops::DropoutSite site;
  explicit ElementwiseInputs(DType dt)
      : x(random_device({kTokens, 3072}, dt, -4, 4)), y(random_device(x.shape(), dt)),
        dy(random_device(x.shape(), dt)), dx(device_empty(x.shape(), dt)),
        bias(random_device({3072}, dt)), dbias(Tensor::zeros({3072}, DType::F32, MemorySpace::Cuda)),
        total(device_empty({1}, DType::F64)), xs{x} {
    site.a = kTokens, site.b = 1, site.c = 3072, site.c_global = 3072;
  }
};

/// A bias gradient's input [8192, width] and its fp32 gradient.
struct BiasGradInputs {
  Tensor dy, dbias;
  BiasGradInputs(DType dt, index_t width)
      : dy(random_device({kTokens, width}, dt)),
        dbias(Tensor::zeros({width}, DType::F32, MemorySpace::Cuda)) {}
};

/// Layernorm forward and backward at [8192, h].
struct LayerNormInputs {
  Tensor x, y, y_ones, gamma, beta, mean, rstd, dy, dx, dgamma, dbeta, residual;
  LayerNormInputs(DType dt, index_t h)
      : x(random_device({kTokens, h}, dt, -2, 3)), y(device_empty(x.shape(), dt)),
        y_ones(device_empty({kTokens, h + ops::kOnesColumnWidth}, dt)),
        gamma(random_device({h}, dt)), beta(random_device({h}, dt)),
        mean(random_device({kTokens}, DType::F32, -0.1, 0.1)),
        rstd(random_device({kTokens}, DType::F32, 0.5, 2)), dy(random_device(x.shape(), dt)),
        dx(device_empty(x.shape(), dt)),
        dgamma(Tensor::zeros({h}, DType::F32, MemorySpace::Cuda)), dbeta(dgamma.clone()),
        residual(random_device(x.shape(), dt)) {}
};

/// The token embedding (vocabulary 50304) looked up for 8192 tokens of width h.
struct EmbeddingInputs {
  Tensor table, ids, y, dy, dtable;
  EmbeddingInputs(DType dt, index_t h, index_t vocab)
      : table(random_device({vocab, h}, dt)), ids(random_ids(kTokens, int(vocab))),
        y(device_empty({kTokens, h}, dt)), dy(random_device({kTokens, h}, dt)),
        dtable(Tensor::zeros({vocab, h}, DType::F32, MemorySpace::Cuda)) {}
};

/// The unfused attention's causal softmax over [96, 1024, 1024] scores.
struct SoftmaxInputs {
  Tensor s, p, dp, ds;
  explicit SoftmaxInputs(DType dt)
      : s(random_device({8 * 12, 1024, 1024}, dt, -8, 8)), p(random_device(s.shape(), dt, 0, 1)),
        dp(random_device(s.shape(), dt)), ds(device_empty(s.shape(), dt)) {}
};

/// The LM head's loss over [8192, vocab] logits (50257 real classes), with
/// row statistics of the right size for the rows that read them.
struct CrossEntropyInputs {
  Tensor logits, targets, row_max, sum_exp, tl, dloss, dlogits;
  CrossEntropyInputs(DType dt, index_t vocab)
      : logits(random_device({kTokens, vocab}, dt, -6, 6)), targets(random_ids(kTokens, 50257)),
        row_max(random_device({kTokens}, DType::F32, 5.9, 6)),
        sum_exp(random_device({kTokens}, DType::F32, 1e3, 2e3)),
        tl(random_device({kTokens}, DType::F32, -6, 6)),
        dloss(random_device({kTokens}, DType::F32, 0.1, 1)),
        dlogits(device_empty(logits.shape(), dt)) {}
};

/// AdamW's fp32 state over 124M parameters, and the gradient norm's sum.
struct AdamWInputs {
  Tensor p, g, m, v, total;
  std::vector<Tensor> gs;
  explicit AdamWInputs(index_t params)
      : p(random_device({params}, DType::F32)), g(random_device({params}, DType::F32)),
        m(random_device({params}, DType::F32, -0.01, 0.01)),
        v(random_device({params}, DType::F32, 0, 1e-4)), total(device_empty({1}, DType::F64)),
        gs{g} {}
};

/// Where the memory-bound rows go: the printed table, the CUPTI trace of
/// their kernels, or Google Benchmarks (`bench_cuda_ops gbench`).
enum class RowSink { Table, Trace, GoogleBenchmark };

/// `built`: where a GoogleBenchmark row is built when it runs.
void bench_memory_bound(const Baselines& baselines, RowSink sink = RowSink::Table,
                        const std::string& only = "",
                        const std::shared_ptr<BuiltRow>& built = nullptr) {
  using namespace ops;
  const index_t vocab = 50304, params = 124'000'000;
  std::vector<Row> rows;
  // waits_on_host: the call synchronises (not capturable in a graph).
  // calls_per_f: ops calls one call of f makes (the chained rows' chain_calls);
  // the table's ms and host us are per op call.
  auto add_row = [&](const std::string& op, DType dt, const std::string& shape, double bytes,
                     const MakeCall& make, bool waits_on_host = false, int calls_per_f = 1) {
    if (!row_selected(op, only)) return;
    const std::string name = op + " " + std::string(dtype_name(dt)) + " " + shape;
    if (sink == RowSink::GoogleBenchmark) {
      register_benchmark("memory/" + name, make, kBatch, bytes, 0, baselines, built);
      return;
    }
    const std::function<void()> f = make();
    if (sink == RowSink::Trace) {
      trace_row(name, f, kBatch);
      return;
    }
    const double ms = median_ms(f, kBatch), ms_1x = median_ms(f);
    const double ms_queued = waits_on_host ? std::nan("") : median_ms(f, kBatch, &stream_hold());
    rows.push_back({op, std::string(dtype_name(dt)), shape, ms / calls_per_f, bytes / (ms * 1e6),
                    ms_1x / calls_per_f, bytes / (ms_1x * 1e6),
                    waits_on_host ? std::nan("") : graph_gbps(f, kBatch, bytes),
                    bytes / (ms_queued * 1e6),
                    host_queue_us(f, kBatch) / calls_per_f,
                    copy_at_size_gbps(bytes / calls_per_f, kBatch)});
  };
  for (DType dt : {DType::BF16, DType::F32}) {
    const double es = double(dtype_size(dt));
    {
      const auto ew = [dt] { return ElementwiseInputs(dt); };
      const std::string shape = "[8192, 3072]";
      const double n = double(kTokens) * 3072;
      add_row("gelu_forward", dt, shape, 2 * n * es, on(ew, [](auto& t) { gelu_forward(t.x, t.y); }));
      add_row("gelu_backward", dt, shape, 3 * n * es, on(ew, [](auto& t) { gelu_backward(t.dy, t.x, t.dx); }));
      add_row("bias_add", dt, shape, 2 * n * es, on(ew, [](auto& t) { bias_add(t.y, t.bias); }));
      add_row("bias_backward (fp32 grad)", dt, shape, n * es, on(ew, [](auto& t) { bias_backward(t.dy, t.dbias); }));
      add_row("add", dt, shape, 3 * n * es, on(ew, [](auto& t) { add(t.x, t.dy, t.y); }));
      add_row("axpy", dt, shape, 3 * n * es, on(ew, [](auto& t) { axpy(0.5, t.x, t.y); }));
      add_row("scale", dt, shape, 2 * n * es, on(ew, [](auto& t) { scale(t.y, 0.999); }));
      add_row("sum_of_squares (+sync)", dt, shape, n * es, on(ew, [](auto& t) { (void)sum_of_squares(t.x); }), /*waits_on_host=*/true);
      add_row("sum_of_squares_into (device)", dt, shape, n * es, on(ew, [](auto& t) { sum_of_squares_into(t.xs, t.total); }));
      add_row("dropout_forward p=0.1", dt, shape, 2 * n * es, on(ew, [](auto& t) { dropout_forward(t.x, 0.1, t.site, t.y); }));
      add_row("dropout_add p=0.1", dt, shape, 3 * n * es, on(ew, [](auto& t) { dropout_add(t.x, t.dy, 0.1, t.site, t.y); }));
    }
    const auto add_bias_grad_row = [&](index_t width) {
      add_row("bias_backward (fp32 grad)", dt, "[8192, " + std::to_string(width) + "]", double(kTokens) * double(width) * es,
              on([dt, width] { return BiasGradInputs(dt, width); }, [](auto& t) { bias_backward(t.dy, t.dbias); }));
    };
    // 774M's fc bias gradient (4 x 1280 columns), taken after the MLP's dgelu GEMM
    add_bias_grad_row(5120);
    for (const index_t h : {index_t(768), index_t(1280)}) {  // GPT-2 124M's and 774M's width
      const std::string shape = "[8192, " + std::to_string(h) + "]";
      const double n = double(kTokens) * double(h);
      const auto ln = [dt, h] { return LayerNormInputs(dt, h); };
      // Attention proj's and fc2's bias gradients (the residual's width): the
      // step's own bias_backward launches (qkv's and fc's ride in their
      // weight-gradient GEMMs under training.bias_in_weight_gemm).
      add_bias_grad_row(h);
      add_row("layernorm_forward", dt, shape, 2 * n * es, on(ln, [](auto& t) { layernorm_forward(t.x, t.gamma, t.beta, 1e-5, t.y, t.mean, t.rstd); }));
      // With the ones column (the qkv / fc input under training.bias_in_weight_gemm).
      add_row("layernorm_forward (ones column)", dt, shape, n * es + double(kTokens) * (h + kOnesColumnWidth) * es, on(ln, [](auto& t) { layernorm_forward(t.x, t.gamma, t.beta, 1e-5, t.y_ones, t.mean, t.rstd); }));
      add_row("layernorm_backward", dt, shape, 3 * n * es, on(ln, [](auto& t) { layernorm_backward(t.dy, t.x, t.gamma, t.mean, t.rstd, t.dx, t.dgamma, t.dbeta); }));
      add_row("layernorm_backward + residual", dt, shape, 4 * n * es, on(ln, [](auto& t) { layernorm_backward(t.dy, t.x, t.gamma, t.mean, t.rstd, t.dx, t.dgamma, t.dbeta, &t.residual); }));
      // As a model's backward runs them (GptModel::backward): chain_calls(h)
      // calls sharing an ops::LayerNormGradChain, then its flush, per call.
      const int calls = chain_calls(h);
      const auto chained = [calls](bool with_residual) {
        return [with_residual, calls](LayerNormInputs& t) {
          LayerNormGradChain chain;
          for (int c = 0; c < calls; ++c)
            layernorm_backward(t.dy, t.x, t.gamma, t.mean, t.rstd, t.dx, t.dgamma, t.dbeta,
                               with_residual ? &t.residual : nullptr, GradStore::Accumulate, &chain);
          chain.flush();
        };
      };
      add_row("layernorm_backward chained", dt, shape, 3 * n * es * calls, on(ln, chained(false)), false, calls);
      add_row("layernorm_backward chained + residual", dt, shape, 4 * n * es * calls, on(ln, chained(true)), false, calls);
      const auto emb = [dt, h, vocab] { return EmbeddingInputs(dt, h, vocab); };
      add_row("embedding_forward", dt, shape, 2 * n * es, on(emb, [](auto& t) { embedding_forward(t.ids, t.table, 0, t.y); }));
      add_row("embedding_backward (fp32 grad)", dt, shape, n * es + 2 * n * 4, on(emb, [](auto& t) { embedding_backward(t.ids, t.dy, 0, t.dtable); }));
    }
    {
      const auto sm = [dt] { return SoftmaxInputs(dt); };
      const double n = 8.0 * 12 * 1024 * 1024;
      add_row("softmax_forward", dt, "[96, 1024, 1024]", 2 * n * es, on(sm, [](auto& t) { scaled_causal_softmax_forward(t.s, 0.125, t.p); }));
      add_row("softmax_backward", dt, "[96, 1024, 1024]", 3 * n * es, on(sm, [](auto& t) { scaled_causal_softmax_backward(t.dp, t.p, 0.125, t.ds); }));
    }
    {
      const auto ce = [dt, vocab] { return CrossEntropyInputs(dt, vocab); };
      const std::string shape = "[8192, 50304]";
      const double n = double(kTokens) * double(vocab);
      add_row("cross_entropy_row_max", dt, shape, n * es, on(ce, [](auto& t) { cross_entropy_row_max(t.logits, 0, 50257, t.row_max); }));
      add_row("cross_entropy_partials", dt, shape, n * es, on(ce, [](auto& t) { cross_entropy_partials(t.logits, t.targets, t.row_max, 0, 50257, t.sum_exp, t.tl); }));
      add_row("cross_entropy_row_stats", dt, shape, n * es, on(ce, [](auto& t) { cross_entropy_row_stats(t.logits, t.targets, 0, 50257, t.row_max, t.sum_exp, t.tl); }));
      add_row("cross_entropy_backward", dt, shape, 2 * n * es, on(ce, [](auto& t) { cross_entropy_backward(t.logits, t.targets, t.row_max, t.sum_exp, t.dloss, 0, 50257, t.dlogits); }));
    }
  }
  const auto adamw = [params] { return AdamWInputs(params); };
  AdamWParams hp;
  hp.weight_decay = 0.1;
  add_row("adamw_step", DType::F32, "[124M]", 28.0 * double(params), on(adamw, [hp](auto& t) { adamw_step(t.p, t.g, t.m, t.v, hp); }));
  // The gradient norm as training takes it: once per step over every
  // fp32 gradient of the model (here 124M of them), then the host waits.
  add_row("sum_of_squares (+sync)", DType::F32, "[124M]", 4.0 * double(params), on(adamw, [](auto& t) { (void)sum_of_squares(t.g); }), /*waits_on_host=*/true);
  add_row("sum_of_squares_into (device)", DType::F32, "[124M]", 4.0 * double(params), on(adamw, [](auto& t) { sum_of_squares_into(t.gs, t.total); }));
  if (sink == RowSink::Table)
    print_memory_bound(rows, baselines.copy_gbps, baselines.copy_queued_gbps);
}

/// GPT-2 774M's parameter tensors (36 layers x 12 + embeddings and the final
/// norm), as element counts.
std::vector<index_t> gpt2_774m_tensor_sizes() {
  const index_t H = 1280, layers = 36, vocab = 50304, positions = 1024;
  std::vector<index_t> sizes = {vocab * H, positions * H};
  for (index_t l = 0; l < layers; ++l) {
    const index_t layer[] = {H,     H,      // ln_1 weight, bias
                             H * 3 * H, 3 * H,  // qkv weight, bias
                             H * H, H,      // attention projection
                             H,     H,      // ln_2
                             H * 4 * H, 4 * H,  // fc
                             4 * H * H, H};     // fc projection
    sizes.insert(sizes.end(), std::begin(layer), std::end(layer));
  }
  sizes.push_back(H);  // ln_f weight, bias
  sizes.push_back(H);
  return sizes;
}

// AdamW with the bf16 compute copy over a whole model: today's per-tensor
// loop (adamw_step then cast: two launches per tensor, the master read
// twice) against ops::MultiTensorAdamW (one launch, the copy written in the
// same pass). Each tensor its own 256-byte-aligned piece of flat buffers, as
// separate allocations would be. Traffic counted for both: 16 bytes read
// and 12 written per element for AdamW plus 2 for the copy (the loop's
// second read of the master is not counted: it is the loop's overhead).
/// GPT-2 774M's parameters as the optimizer sees them: fp32 master, grad,
/// m, v and the bf16 compute copy in flat buffers, each tensor its own
/// 256-byte-aligned piece (as separate allocations would be).
struct AdamW774m {
  std::vector<index_t> sizes = gpt2_774m_tensor_sizes();
  index_t elements = 0;
  Tensor p, g, m, v, copy;
  std::vector<ops::AdamWTensor> tensors;
  ops::AdamWParams hp;

  AdamW774m() {
    std::vector<index_t> offsets;
    index_t total = 0;
    for (index_t n : sizes) {
      offsets.push_back(total);
      total += (n + 63) / 64 * 64;
      elements += n;
    }
    p = random_device({total}, DType::F32), g = random_device({total}, DType::F32),
    m = random_device({total}, DType::F32, -0.01, 0.01),
    v = random_device({total}, DType::F32, 0, 1e-4),
    copy = Tensor::empty({total}, DType::BF16, MemorySpace::Cuda);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto piece = [&](const Tensor& t) { return t.slice_rows(offsets[i], offsets[i] + sizes[i]); };
      tensors.push_back({piece(p), piece(g), piece(m), piece(v), piece(copy), sizes[i] > 1280 * 4});
    }
    hp.lr = 1e-4, hp.weight_decay = 0.1, hp.step = 10;
  }
};

void bench_adamw_multi_tensor(double copy_gbps) {
  AdamW774m model;
  std::vector<ops::AdamWTensor>& tensors = model.tensors;
  const ops::AdamWParams& hp = model.hp;
  const index_t elements = model.elements;
  const double per_tensor = median_ms([&] {
    for (ops::AdamWTensor& t : tensors) {
      ops::AdamWParams one = hp;
      one.weight_decay = t.decay ? hp.weight_decay : 0.0;
      ops::adamw_step(t.param, t.grad, t.m, t.v, one);
      ops::cast(t.param, t.compute_copy);
    }
  });
  ops::MultiTensorAdamW update;
  const double fused = median_ms([&] { update.step(tensors, hp); });
  const double bytes = 30.0 * double(elements);
  std::printf("\nAdamW + bf16 compute copy, GPT-2 774M shapes (%zu tensors, %.1fM elements, "
              "30 bytes each)\n",
              model.sizes.size(), double(elements) / 1e6);
  std::printf("%-40s %9s %9s %7s\n", "path", "ms", "GB/s", "/copy");
  auto row = [&](const char* what, double ms) {
    const double gbps = bytes / (ms * 1e6);
    std::printf("%-40s %9.3f %9.1f %7.2f\n", what, ms, gbps, gbps / copy_gbps);
  };
  row("per-tensor adamw_step + cast", per_tensor);
  row("adamw multi-tensor + bf16 copy", fused);
  std::printf("speed-up: %.2fx (table uploads: %ld)\n", per_tensor / fused,
              update.table_uploads());
}

// The step's AdamW (bandwidth bound) with the next step's attention-dropout
// masks (integer-ALU bound: Philox) drawn at the same time on a second
// stream: 774M's 36 layers x 8 samples x 20 heads x 1024^2 decisions. How
// much of the masks' time hides under the update, as
// training.attention_masks_ahead draws them (a high-priority stream), and
// at normal priority. `bench_cuda_ops overlap`.
ops::AttentionDropout attention_dropout(double p, index_t B, index_t S);  // below

void bench_overlap_masks_with_adamw() {
  AdamW774m model;
  ops::MultiTensorAdamW update;
  constexpr int kLayers = 36;
  constexpr index_t kB = 8 * 20, kS = 1024;
  std::vector<ops::AttentionDropout> layers;
  for (int l = 0; l < kLayers; ++l) {
    ops::AttentionDropout d = attention_dropout(0.1, kB, kS);
    d.site.stream = std::uint32_t(100 + l);
    d.keep_bits = Tensor::empty(ops::attention_keep_bits_shape(kB, kS), DType::I32,
                                MemorySpace::Cuda);
    layers.push_back(d);
  }
  const auto masks_on = [&](cudaStream_t stream) {
    for (const ops::AttentionDropout& d : layers) ops::draw_attention_mask(d, kB, kS, stream);
  };
  cudaStream_t normal, high;
  int least = 0, greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&normal, cudaStreamNonBlocking, least));
  CUDA_CHECK(cudaStreamCreateWithPriority(&high, cudaStreamNonBlocking, greatest));
  cudaEvent_t fork, join;
  CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  const cudaStream_t compute = device::compute_stream();
  // Masks on `side` while the update runs on the compute stream, joined.
  const auto together = [&](cudaStream_t side, bool masks_first) {
    CUDA_CHECK(cudaEventRecord(fork, compute));
    CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
    if (masks_first) masks_on(side);
    update.step(model.tensors, model.hp);
    if (!masks_first) masks_on(side);
    CUDA_CHECK(cudaEventRecord(join, side));
    CUDA_CHECK(cudaStreamWaitEvent(compute, join, 0));
  };
  const double adamw = median_ms([&] { update.step(model.tensors, model.hp); });
  const double masks = median_ms([&] { masks_on(compute); });
  const double serial = median_ms([&] {
    update.step(model.tensors, model.hp);
    masks_on(compute);
  });
  const double normal_first = median_ms([&] { together(normal, true); });
  const double normal_after = median_ms([&] { together(normal, false); });
  const double high_first = median_ms([&] { together(high, true); });
  const double high_after = median_ms([&] { together(high, false); });
  std::printf("\nAdamW (GPT-2 774M, %.1fM parameters) and %d layers' attention-dropout masks "
              "(%ld x %ld^2)\n", double(model.elements) / 1e6, kLayers, long(kB), long(kS));
  std::printf("%-58s %9s %9s\n", "path", "ms", "hidden");
  const auto row = [&](const char* what, double ms) {
    std::printf("%-58s %9.3f %8.0f%%\n", what, ms, 100.0 * (serial - ms) / masks);
  };
  std::printf("%-58s %9.3f\n", "adamw alone", adamw);
  std::printf("%-58s %9.3f\n", "masks alone", masks);
  row("adamw then masks, one stream", serial);
  row("together, masks on a normal-priority stream, queued first", normal_first);
  row("together, masks on a normal-priority stream, queued after", normal_after);
  row("together, masks on a high-priority stream, queued first", high_first);
  row("together, masks on a high-priority stream, queued after", high_after);
  CUDA_CHECK(cudaEventDestroy(fork));
  CUDA_CHECK(cudaEventDestroy(join));
  CUDA_CHECK(cudaStreamDestroy(normal));
  CUDA_CHECK(cudaStreamDestroy(high));
}

/// One fused-vs-unfused line: times, TFLOP/s of the GEMM's 2 M N K, speed-up,
/// and whether the fused call really ran fused (the fallback counter).
void print_fused_pair(const char* what, double flop, double fused_ms, double unfused_ms,
                      bool fell_back) {
  std::printf("%-44s fused %8.4f ms %6.1f TF/s | unfused %8.4f ms %6.1f TF/s | %.2fx%s\n", what,
              fused_ms, flop / (fused_ms * 1e9), unfused_ms, flop / (unfused_ms * 1e9),
              unfused_ms / fused_ms, fell_back ? "  (FELL BACK: not fused)" : "");
}

/// The MLP's GeLU epilogues at GPT-2 774M shapes, bf16, 8 x 1024 tokens
/// (M = 8192, h = K = 1280, ffn = N = 5120): fc forward fused
/// (gemm_bias_gelu: one cuBLASLt GEMM, GELU_AUX_BIAS writing pre_gelu and
/// gelu) against unfused (gemm_bias, then the gelu_forward kernel), and
/// proj's dgrad fused (gemm_dgelu: DGELU reading pre_gelu) against unfused
/// (gemm into d(activated), then gelu_backward); and the projection with the
/// residual add in the epilogue (M = 8192, K = 5120, N = 1280).
void bench_mlp_gelu_epilogues() {
  const index_t M = 8192, H = 1280, F = 5120;
  const DType dt = DType::BF16;
  const double flop = 2.0 * double(M) * double(F) * double(H);
  std::printf("\nMLP epilogues, bf16, GPT-2 774M shapes (M=8192, h=1280, ffn=5120)\n");
  const Tensor x = random_device({M, H}, dt), w_fc = random_device({H, F}, dt, -0.05, 0.05);
  const Tensor bias = random_device({F}, dt);
  Tensor pre = Tensor::empty({M, F}, dt, MemorySpace::Cuda), act = pre.clone();
  std::uint64_t before = cuda::gemm_gelu_fallbacks();
  const double fwd_fused = median_ms([&] { ops::gemm_bias_gelu(x, false, w_fc, false, bias, pre, act); });
  bool fell_back = cuda::gemm_gelu_fallbacks() != before;
  const double fwd_unfused = median_ms([&] {
    ops::gemm_bias(x, false, w_fc, false, bias, pre);
    ops::gelu_forward(pre, act);
  });
  print_fused_pair("fc forward: gemm_bias_gelu vs gemm_bias+gelu", flop, fwd_fused, fwd_unfused,
                   fell_back);
  const Tensor dy = random_device({M, H}, dt), w_proj = random_device({F, H}, dt, -0.05, 0.05);
  Tensor dpre = Tensor::empty({M, F}, dt, MemorySpace::Cuda), dact = dpre.clone();
  before = cuda::gemm_gelu_fallbacks();
  const double bwd_fused = median_ms([&] { ops::gemm_dgelu(dy, false, w_proj, true, pre, dpre); });
  fell_back = cuda::gemm_gelu_fallbacks() != before;
  const double bwd_unfused = median_ms([&] {
    ops::gemm(dy, false, w_proj, true, dact);
    ops::gelu_backward(dact, pre, dpre);
  });
  print_fused_pair("proj dgrad: gemm_dgelu vs gemm+gelu_backward", flop, bwd_fused, bwd_unfused,
                   fell_back);
  // fc's bias gradient: after proj's dgrad GEMM (gemm_dgelu with dbias:
  // bias_backward's column sums of dpre, what the MLP does), and the
  // alternative, in fc's weight-gradient GEMM (BGRADA) against plain.
  Tensor dbias = Tensor::zeros({F}, DType::F32, MemorySpace::Cuda);
  const double bgrad_after =
      median_ms([&] { ops::gemm_dgelu(dy, false, w_proj, true, pre, dpre, &dbias); });
  print_fused_pair("proj dgrad: gemm_dgelu vs + fc dbias colsum", flop, bwd_fused, bgrad_after,
                   false);
  // Every linear of a 774M layer (in -> out: qkv 1280 -> 3840, attention
  // proj 1280 -> 1280, fc 1280 -> 5120, mlp proj 5120 -> 1280): the
  // weight gradient alone, with the bias gradient in it (cuBLASLt's BGRADA
  // epilogue), and followed by bias_backward (what linear_weight_grads does).
  for (const auto& [in, out] : std::vector<std::pair<index_t, index_t>>{
           {H, 3 * H}, {H, H}, {H, F}, {F, H}}) {
    const Tensor xin = random_device({M, in}, dt), dout = random_device({M, out}, dt);
    Tensor dw = Tensor::zeros({in, out}, DType::F32, MemorySpace::Cuda);
    Tensor db = Tensor::zeros({out}, DType::F32, MemorySpace::Cuda);
    const double plain = median_ms([&] { ops::gemm(xin, true, dout, false, dw, 1.0, 1.0); });
    const double bgrada = median_ms([&] { ops::linear_weight_grads(xin, dout, dw, db); });
    const double colsum = median_ms([&] {
      ops::gemm(xin, true, dout, false, dw, 1.0, 1.0);
      ops::bias_backward(dout, db);
    });
    std::printf("wgrad %5ld -> %5ld: plain %8.4f ms | + BGRADA %8.4f ms (+%.4f) | + bias_backward "
                "%8.4f ms (+%.4f)\n",
                long(in), long(out), plain, bgrada, bgrada - plain, colsum, colsum - plain);
  }
  // The MLP's projection with the residual add: [8192, 5120] x [5120, 1280]
  // + bias + residual (gemm_bias_residual) against gemm_bias, then add.
  const Tensor w_out = random_device({F, H}, dt, -0.05, 0.05), b_out = random_device({H}, dt);
  const Tensor residual = random_device({M, H}, dt);
  Tensor y = Tensor::empty({M, H}, dt, MemorySpace::Cuda), out = y.clone();
  before = cuda::gemm_residual_fallbacks();
  const double res_fused = median_ms(
      [&] { ops::gemm_bias_residual(act, false, w_out, false, b_out, residual, out); });
  fell_back = cuda::gemm_residual_fallbacks() != before;
  const double res_unfused = median_ms([&] {
    ops::gemm_bias(act, false, w_out, false, b_out, y);
    ops::add(residual, y, out);
  });
  print_fused_pair("proj fwd + residual: gemm_bias_residual vs +add", flop, res_fused,
                   res_unfused, fell_back);
}

/// A GEMM row: C [M, N] = op(A) op(B) (+ C where C is fp32: beta 1).
struct GemmCase {
  const char* what;
  index_t M, N, K;
  bool ta, tb;
  DType ab, c;
  double flop() const { return 2.0 * double(M) * double(N) * double(K); }
  /// One call on random inputs the callable owns.
  std::function<void()> call() const {
    Tensor A = random_device(ta ? Shape{K, M} : Shape{M, K}, ab);
    Tensor B = random_device(tb ? Shape{N, K} : Shape{K, N}, ab);
    Tensor C = random_device({M, N}, c);
    const double beta = c == ab ? 0.0 : 1.0;
    const bool a_t = ta, b_t = tb;
    return [=]() mutable { ops::gemm(A, a_t, B, b_t, C, 1.0, beta); };
  }
};

/// The GEMMs of a GPT-2 774M layer at tp 1 (8 x 1024 tokens, bf16; weight
/// gradients into fp32 with beta = 1): the heuristic's first algorithm
/// against the fastest of its first eight (run.gemm_autotune's choice,
/// made here with set_gemm_autotune), in the same run.
void bench_gemm_autotune() {
  std::printf("\n%-44s %10s %10s %8s\n", "774M layer GEMMs (M N K, ta tb)", "heur. ms",
              "tuned ms", "ratio");
  const index_t T = 8192, H = 1280, F = 5120;
  const DType bf16 = DType::BF16, f32 = DType::F32;
  const GemmCase cases[] = {
      {"qkv forward", T, 3 * H, H, false, false, bf16, bf16},
      {"attention proj forward", T, H, H, false, false, bf16, bf16},
      {"fc forward", T, F, H, false, false, bf16, bf16},
      {"mlp proj forward", T, H, F, false, false, bf16, bf16},
      {"qkv dX", T, H, 3 * H, false, true, bf16, bf16},
      {"mlp proj dX", T, F, H, false, true, bf16, bf16},
      {"fc dX", T, H, F, false, true, bf16, bf16},
      {"qkv dW", H, 3 * H, T, true, false, bf16, f32},
      {"fc dW", H, F, T, true, false, bf16, f32},
      {"mlp proj dW", F, H, T, true, false, bf16, f32},
  };
  for (const GemmCase& c : cases) {
    const std::function<void()> gemm = c.call();  // the same inputs for both
    double ms[2];
    for (int tuned = 0; tuned < 2; ++tuned) {
      cuda::set_gemm_autotune(tuned == 1);
      ms[tuned] = median_ms(gemm);
    }
    cuda::set_gemm_autotune(false);
    char what[64];
    std::snprintf(what, sizeof(what), "%ld %ld %ld, %d %d", long(c.M), long(c.N), long(c.K),
                  int(c.ta), int(c.tb));
    std::printf("%-44s %10.4f %10.4f %8.3f\n", what, ms[0], ms[1], ms[0] / ms[1]);
  }
  std::printf("autotuned problems: %lu, of which %lu took another algorithm than the first\n",
              (unsigned long)cuda::gemm_autotuned_problems(),
              (unsigned long)cuda::gemm_autotune_changed());
}

/// The row-parallel projections' GEMMs with the bias and residual adds in
/// the epilogue (ops::gemm_bias_residual, C = residual out of place) at
/// GPT-2 774M's tp 1 and tp 2 shapes (M = 8192 tokens, N = 1280, K = the
/// local 1280 / 640 of the attention and 5120 / 2560 of the MLP), against
/// the plain GEMM (the tp ranks that do not add) and the residual copied
/// into C then a beta = 1 GEMM in place (no bias: a lower bound for that
/// route, which gains nothing end to end); heuristic and autotuned. At tp 2
/// the other ranks wait for the rank that adds at the all-reduce: in a
/// traced 774M tp 2 step the MLP's out-of-place GEMM takes 22 us more than
/// the plain one.
/// `bench_cuda_ops residual` runs this table alone.
void bench_residual_epilogues() {
  std::printf("\n%-30s %9s %9s %9s %9s %9s\n", "proj GEMM + bias + residual", "plain",
              "fused", "fused tun", "copy+beta1", "c+b1 tun");
  const index_t M = 8192, N = 1280;
  const DType dt = DType::BF16;
  for (const index_t K : {index_t(640), index_t(1280), index_t(2560), index_t(5120)}) {
    const Tensor x = random_device({M, K}, dt), w = random_device({K, N}, dt, -0.05, 0.05);
    const Tensor bias = random_device({N}, dt), residual = random_device({M, N}, dt);
    Tensor out = Tensor::empty({M, N}, dt, MemorySpace::Cuda);
    double ms[5];
    ms[0] = median_ms([&] { ops::gemm(x, false, w, false, out); });
    for (int tuned = 0; tuned < 2; ++tuned) {
      cuda::set_gemm_autotune(tuned == 1);
      ms[1 + tuned] =
          median_ms([&] { ops::gemm_bias_residual(x, false, w, false, bias, residual, out); });
      ms[3 + tuned] = median_ms([&] {
        out.copy_from(residual);
        ops::gemm(x, false, w, false, out, 1.0, 1.0);
      });
    }
    cuda::set_gemm_autotune(false);
    char what[64];
    std::snprintf(what, sizeof(what), "M N K = %ld %ld %ld", long(M), long(N), long(K));
    std::printf("%-30s %9.4f %9.4f %9.4f %9.4f %9.4f\n", what, ms[0], ms[1], ms[2], ms[3], ms[4]);
  }
}

/// A linear's bias gradient out of its weight-gradient GEMM (the measurement
/// behind training.bias_in_weight_gemm). With the input x [M, in] stored as
/// x' [M, in + 8] (column `in` ones, the rest zero), x'^T dy over in + 1 rows
/// of x'^T is dW [in, out] with db [out] as row `in` (dW and db adjacent, as
/// a flat gradient buffer could place them), one GEMM instead of GEMM +
/// bias_backward. Per 124M / 774M linear: the plain GEMM, the GEMM then
/// bias_backward (the path without the ones column), the ones-column GEMM
/// over in + 1 and over in + 8 rows (a full pack of padding), heuristic and
/// autotuned, and how far the GEMM's db and dW are from bias_backward's and
/// the plain GEMM's.
/// `bench_cuda_ops bias_in_wgrad` runs this table alone.
void bench_bias_in_weight_gradient() {
  const index_t M = 8192;
  const DType dt = DType::BF16;
  const std::size_t es = dtype_size(dt);
  std::printf("\n%-22s %9s %9s %9s %9s %9s %9s %9s %10s %10s\n", "wgrad (M = 8192) ms", "plain",
              "+bias_bw", "ones+1", "ones+8", "plain tun", "+bw tun", "ones+1 tun", "db rel", "dW rel");
  std::printf("%-22s %s\n", "", "(then: plain wgrad on x' with lda = in + 8 | forward x W: lda = in, in + 8)");
  for (const auto& [in, out] : std::vector<std::pair<index_t, index_t>>{
           {768, 2304}, {768, 768}, {768, 3072}, {3072, 768},
           {1280, 3840}, {1280, 1280}, {1280, 5120}, {5120, 1280}}) {
    const index_t ld = in + 8;
    const Tensor x = random_device({M, in}, dt), dy = random_device({M, out}, dt);
    // x' = [x | 1 0 0 0 0 0 0 0], row by row.
    Tensor xp = Tensor::zeros({M, ld}, dt, MemorySpace::Cuda);
    CUDA_CHECK(cudaMemcpy2D(xp.raw(), ld * es, x.raw(), in * es, in * es, M,
                            cudaMemcpyDeviceToDevice));
    Tensor ones_col = Tensor::zeros({M, 8}, DType::F32);
    for (index_t r = 0; r < M; ++r) ones_col.data<float>()[r * 8] = 1.f;
    const Tensor ones_dev = ones_col.to(dt).to_device();
    CUDA_CHECK(cudaMemcpy2D(static_cast<char*>(xp.raw()) + in * es, ld * es, ones_dev.raw(), 8 * es,
                            8 * es, M, cudaMemcpyDeviceToDevice));
    Tensor dw = Tensor::zeros({in, out}, DType::F32, MemorySpace::Cuda);
    Tensor db = Tensor::zeros({out}, DType::F32, MemorySpace::Cuda);
    Tensor dwp = Tensor::zeros({ld, out}, DType::F32, MemorySpace::Cuda);
    auto ones_gemm = [&](index_t rows, double beta) {
      cuda::GemmArgs g{dt,   DType::F32, xp.raw(), dy.raw(), dwp.raw(), true, false,
                       rows, out,        M,        ld,       out,       out};
      g.beta = beta;
      cuda::gemm(g);
    };
    // The same GEMMs with x' as plain operands (lda = in + 8, only in rows /
    // columns used): what the padded layout alone does to the weight
    // gradient (ones_gemm over in rows) and to the forward y = x W.
    const Tensor w = random_device({in, out}, dt, -0.05, 0.05);
    Tensor y = Tensor::empty({M, out}, dt, MemorySpace::Cuda);
    auto forward = [&](const Tensor& a, index_t lda) {
      cuda::GemmArgs g{dt, dt, a.raw(), w.raw(), y.raw(), false, false, M, out, in, lda, out, out};
      cuda::gemm(g);
    };
    const double pad_only = median_ms([&] { ones_gemm(in, 1.0); });
    const double fwd = median_ms([&] { forward(x, in); }), fwd_pad = median_ms([&] { forward(xp, ld); });
    double ms[7];
    for (int tuned = 0; tuned < 2; ++tuned) {
      cuda::set_gemm_autotune(tuned == 1);
      ms[tuned ? 4 : 0] = median_ms([&] { ops::gemm(x, true, dy, false, dw, 1.0, 1.0); });
      ms[tuned ? 5 : 1] = median_ms([&] {
        ops::gemm(x, true, dy, false, dw, 1.0, 1.0);
        ops::bias_backward(dy, db, ops::GradStore::Accumulate);
      });
      ms[tuned ? 6 : 2] = median_ms([&] { ones_gemm(in + 1, 1.0); });
      if (!tuned) ms[3] = median_ms([&] { ones_gemm(ld, 1.0); });
    }
    cuda::set_gemm_autotune(false);
    // One call each from zero: the GEMM's db against bias_backward's, its dW
    // against the plain GEMM's (max |a - b| / max |b|).
    ops::gemm(x, true, dy, false, dw, 1.0, 0.0);
    ops::bias_backward(dy, db, ops::GradStore::Overwrite);
    ones_gemm(in + 1, 0.0);
    const Tensor hw = dw.to_space(MemorySpace::Host), hb = db.to_space(MemorySpace::Host);
    const Tensor hp = dwp.to_space(MemorySpace::Host);
    auto rel = [](const float* a, const float* b, index_t n) {
      double diff = 0, scale = 0;
      for (index_t i = 0; i < n; ++i) {
        diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
        scale = std::max(scale, std::fabs(double(b[i])));
      }
      return diff / scale;
    };
    const double db_rel = rel(hp.data<float>() + in * out, hb.data<float>(), out);
    const double dw_rel = rel(hp.data<float>(), hw.data<float>(), in * out);
    char what[64];
    std::snprintf(what, sizeof(what), "%ld -> %ld", long(in), long(out));
    std::printf("%-22s %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %10.2e %10.2e | %9.4f | %9.4f %9.4f\n",
                what, ms[0], ms[1], ms[2], ms[3], ms[4], ms[5], ms[6], db_rel, dw_rel, pad_only, fwd,
                fwd_pad);
  }
}

/// The GEMM ceiling: cuBLASLt's bf16 GEMM at 8192^3 (bf16 C), TFLOP/s.
const GemmCase kGemmCeiling{"bf16 8192^3 NN, bf16 C (the ceiling)", 8192, 8192, 8192,
                            false, false, DType::BF16, DType::BF16};

const GemmCase kGemmCases[] = {
    {"bf16 4096^3 NN, bf16 C", 4096, 4096, 4096, false, false, DType::BF16, DType::BF16},
    {"bf16 4096^3 NT, bf16 C", 4096, 4096, 4096, false, true, DType::BF16, DType::BF16},
    {"bf16 4096^3 TN, fp32 C (beta=1)", 4096, 4096, 4096, true, false, DType::BF16, DType::F32},
    {"bf16 8192x2304x768 (QKV fwd)", 8192, 2304, 768, false, false, DType::BF16, DType::BF16},
    {"fp32 4096^3 NN (no TF32)", 4096, 4096, 4096, false, false, DType::F32, DType::F32},
};

double gemm_ceiling_tflops() {
  return kGemmCeiling.flop() / (median_ms(kGemmCeiling.call()) * 1e9);
}

void bench_gemm(const Baselines& baselines) {
  std::printf("\n%-40s %9s %9s %7s\n", "GEMM (row-major, cuBLASLt)", "ms", "TFLOP/s", "/gemm");
  for (const GemmCase& c : kGemmCases) {
    const double ms = median_ms(c.call()), tflops = c.flop() / (ms * 1e9);
    std::printf("%-40s %9.4f %9.1f %7.2f\n", c.what, ms, tflops, tflops / baselines.gemm_tflops);
  }
  bench_gemm_autotune();
  bench_mlp_gelu_epilogues();
  bench_residual_epilogues();
}

struct AttentionTimes {
  double fwd_ms, bwd_ms;
};

/// An attention forward and its backward (which reads the forward's
/// outputs), each owning its buffers (captured by value: they share storage).
struct AttentionCalls {
  std::function<void()> fwd, bwd;
  /// The forward's median first, so the backward reads its outputs.
  AttentionTimes time() const {
    const double f = median_ms(fwd);
    return {f, median_ms(bwd)};
  }
};

AttentionTimes time_fused_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& dout, double scale,
                                    const ops::AttentionDropout& dropout = {},
                                    const ops::FusedAttentionScores& scores = {}) {
  const index_t B = q.dim(0), S = q.dim(1);
  Tensor out = Tensor::empty(q.shape(), q.dtype(), MemorySpace::Cuda);
  Tensor lse = Tensor::empty({B, S}, DType::F32, MemorySpace::Cuda);
  Tensor dq = out.clone(), dk = out.clone(), dv = out.clone();
  const double fwd =
      median_ms([&] { ops::fused_attention_forward(q, k, v, scale, out, lse, dropout, scores); });
  const double bwd = median_ms([&] {
    ops::fused_attention_backward(dout, q, k, v, out, lse, scale, dq, dk, dv, dropout, scores);
  });
  return {fwd, bwd};
}

/// With dropout.p > 0, the probabilities are dropped as in Attention
/// (dropout_forward into a third [B, S, S] tensor; dropout_backward). With
/// `scores`, Attention's softmax of them: causal with the ALiBi slopes, or
/// masked by the key mask.
AttentionTimes time_unfused_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& dout, double scale,
                                      const ops::AttentionDropout& dropout = {},
                                      const ops::FusedAttentionScores& scores = {}) {
  using namespace ops;
  const index_t B = q.dim(0), S = q.dim(1);
  const bool drop = dropout.p > 0, masked = scores.key_mask.defined();
  Tensor logits = Tensor::empty({B, S, S}, q.dtype(), MemorySpace::Cuda), probs = logits.clone();
  Tensor kept = drop ? logits.clone() : probs;
  Tensor out = Tensor::empty(q.shape(), q.dtype(), MemorySpace::Cuda);
  Tensor dq = out.clone(), dk = out.clone(), dv = out.clone();
  const double fwd = median_ms([&] {
    gemm_batched(q, false, k, true, logits);
    if (masked)
      scaled_masked_softmax_forward(logits, scores.key_mask, scale, probs);
    else
      scaled_causal_softmax_forward(logits, scale, probs, scores.alibi_slopes);
    if (drop) dropout_forward(probs, dropout.p, dropout.site, kept);
    gemm_batched(kept, false, v, false, out);
  });
  Tensor& dprobs = logits;  // the scores are dead after the forward, as in Attention
  Tensor dscores = Tensor::empty({B, S, S}, q.dtype(), MemorySpace::Cuda);
  const double bwd = median_ms([&] {
    gemm_batched(dout, false, v, true, dprobs);
    gemm_batched(kept, true, dout, false, dv);
    if (drop) dropout_backward(dprobs, dropout.p, dropout.site, dprobs);
    if (masked)
      scaled_masked_softmax_backward(dprobs, probs, scale, dscores);
    else
      scaled_causal_softmax_backward(dprobs, probs, scale, dscores);
    gemm_batched(dscores, false, k, false, dq);
    gemm_batched(dscores, true, q, false, dk);
  });
  return {fwd, bwd};
}

/// Attention dropout p on B = 8 samples x heads of S x S, as one GPU's
/// layer sees it (the site of Attention::probs_site).
ops::AttentionDropout attention_dropout(double p, index_t B, index_t S) {
  ops::DropoutSite site;
  site.seed = 1234;
  site.step = 1;
  site.stream = 17;
  site.a = 8;
  site.b = B / 8;
  site.c = S * S;
  site.b_global = site.b;
  site.c_global = site.c;
  return {p, site};
}

/// One token-major backend's calls: `fwd` then `bwd` on fwd's outputs (fwd
/// and bwd own what they capture).
template <class Fwd, class Bwd>
AttentionCalls token_major_calls(const Tensor& qkv, const Tensor& dctx, index_t s, index_t b,
                                 index_t heads, index_t d, Fwd fwd, Bwd bwd) {
  const DType dt = qkv.dtype();
  const double scale = 1.0 / std::sqrt(double(d));
  const Tensor ctx = Tensor::empty(dctx.shape(), dt, MemorySpace::Cuda);
  const Tensor lse = Tensor::empty({b * heads, s}, DType::F32, MemorySpace::Cuda),
               delta = lse.clone();
  const Tensor dqkv = Tensor::empty(qkv.shape(), dt, MemorySpace::Cuda);
  return {[=] { fwd(dt, qkv.raw(), s, b, heads, d, scale, ctx.raw(), lse.data<float>()); },
          [=] {
            bwd(dt, dctx.raw(), qkv.raw(), ctx.raw(), lse.data<float>(), s, b, heads, d, scale,
                delta.data<float>(), dqkv.raw());
          }};
}

/// The token-major shapes the model runs (b 8).
struct TokenMajorCase {
  const char* what;
  index_t s, b, heads, d;
  double fwd_flop() const { return 4.0 * double(b * heads) * double(s) * double(s) * d / 2; }
  double bwd_flop() const { return 2.5 * fwd_flop(); }
};
const TokenMajorCase kTokenMajorCases[] = {{"b=8x12 S=1024 D=64 (GPT-2 124M)", 1024, 8, 12, 64},
                                           {"b=8x16 S=1024 D=128", 1024, 8, 16, 128},
                                           {"b=8x20 S=1024 D=64 (GPT-2 774M)", 1024, 8, 20, 64}};

/// A case's inputs: qkv [s*b, 3*heads*d] and the context's gradient.
struct TokenMajorInputs {
  Tensor qkv, dctx;
  explicit TokenMajorInputs(const TokenMajorCase& c)
      : qkv(random_device({c.s * c.b, 3 * c.heads * c.d}, DType::BF16, -2, 2)),
        dctx(random_device({c.s * c.b, c.heads * c.d}, DType::BF16)) {}
};

/// Our kernels, no dropout ("own tm").
AttentionCalls own_calls(const TokenMajorCase& c, const TokenMajorInputs& in) {
  return token_major_calls(
      in.qkv, in.dctx, c.s, c.b, c.heads, c.d,
      [](auto... args) { cuda::flash_attention_forward_token_major(args...); },
      [](auto... args) { cuda::flash_attention_backward_token_major(args...); });
}

/// cuDNN's fused attention, no dropout ("cudnn tm").
AttentionCalls cudnn_calls(const TokenMajorCase& c, const TokenMajorInputs& in) {
  return token_major_calls(
      in.qkv, in.dctx, c.s, c.b, c.heads, c.d,
      [](auto... args) { cuda::cudnn_attention_forward_token_major(args...); },
      [](auto... args) { cuda::cudnn_attention_backward_token_major(args...); });
}

/// Ours with attention dropout p as the model runs it ("own tm p.1": the op
/// table, the forward storing its keep bits for the backward).
AttentionCalls own_dropout_calls(const TokenMajorCase& c, const TokenMajorInputs& in, double p) {
  ops::AttentionDropout own = attention_dropout(p, c.b * c.heads, c.s);
  own.keep_bits = Tensor::empty(ops::attention_keep_bits_shape(c.b * c.heads, c.s), DType::I32,
                                MemorySpace::Cuda);
  const double scale = 1.0 / std::sqrt(double(c.d));
  const index_t s = c.s, b = c.b, heads = c.heads;
  const Tensor qkv = in.qkv, dctx = in.dctx;
  Tensor ctx = Tensor::empty(dctx.shape(), qkv.dtype(), MemorySpace::Cuda);
  Tensor lse = Tensor::empty({b * heads, s}, DType::F32, MemorySpace::Cuda);
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), MemorySpace::Cuda);
  return {[=]() mutable {
            ops::fused_attention_forward_token_major(qkv, s, b, heads, scale, ctx, lse, own);
          },
          [=]() mutable {
            ops::fused_attention_backward_token_major(dctx, qkv, ctx, lse, s, b, heads, scale,
                                                      dqkv, own);
          }};
}

/// cuDNN's fused attention with its own dropout generator ("cudnn tm p.1",
/// training.attention_dropout_rng = cudnn), a fixed seed and offset.
AttentionCalls cudnn_dropout_calls(const TokenMajorCase& c, const TokenMajorInputs& in,
                                   double p) {
  std::vector<std::int64_t> seed_offset_h{1234, 17};  // seed, offset
  const Tensor seed_offset =
      Tensor::view(seed_offset_h.data(), {2}, DType::I64).to_space(MemorySpace::Cuda);
  cuda::CudnnDropout dnn;
  dnn.p = p;
  dnn.seed = seed_offset.data<std::int64_t>();
  dnn.offset = seed_offset.data<std::int64_t>() + 1;
  // seed_offset rides along: dnn points into it.
  return token_major_calls(
      in.qkv, in.dctx, c.s, c.b, c.heads, c.d,
      [dnn, seed_offset](auto... args) {
        cuda::cudnn_attention_forward_token_major(args..., dnn);
      },
      [dnn, seed_offset](auto... args) {
        cuda::cudnn_attention_backward_token_major(args..., dnn);
      });
}

/// One attention row: ms and TFLOP/s of the forward, backward and both, and
/// both as a fraction of the GEMM ceiling.
void print_attention_row(const char* what, const char* path, const AttentionTimes& t,
                         double fwd_flop, double bwd_flop, const Baselines& baselines) {
  const double both = (fwd_flop + bwd_flop) / ((t.fwd_ms + t.bwd_ms) * 1e9);
  std::printf("%-34s %-15s %9.3f %9.1f %9.3f %9.1f %9.3f %9.1f %7.2f\n", what, path, t.fwd_ms,
              fwd_flop / (t.fwd_ms * 1e9), t.bwd_ms, bwd_flop / (t.bwd_ms * 1e9),
              t.fwd_ms + t.bwd_ms, both, both / baselines.gemm_tflops);
}

/// Our kernels and cuDNN's on the token-major layout (b 8), without and with
/// attention dropout 0.1.
void bench_attention_token_major(const Baselines& baselines) {
  const double p = 0.1;
  for (const TokenMajorCase& c : kTokenMajorCases) {
    const TokenMajorInputs in(c);
    auto row = [&](const char* path, const AttentionTimes& t) {
      print_attention_row(c.what, path, t, c.fwd_flop(), c.bwd_flop(), baselines);
    };
    const AttentionTimes own = own_calls(c, in).time();
    row("own tm", own);
    const cuda::CudnnAttentionSupport cudnn =
        cuda::cudnn_attention_support(DType::BF16, c.s, c.b, c.heads, c.d);
    if (!cudnn.forward || !cudnn.backward) {
      std::printf("%-34s cudnn tm: %s\n", c.what,
                  cudnn.why_not.empty() ? "not available" : cudnn.why_not.c_str());
      continue;
    }
    const AttentionTimes dnn = cudnn_calls(c, in).time();
    row("cudnn tm", dnn);
    std::printf("%-34s speed-up cudnn/own: fwd %.2fx, bwd %.2fx, fwd+bwd %.2fx (%s: %s)\n",
                c.what, own.fwd_ms / dnn.fwd_ms, own.bwd_ms / dnn.bwd_ms,
                (own.fwd_ms + own.bwd_ms) / (dnn.fwd_ms + dnn.bwd_ms), cudnn.library.c_str(),
                cudnn.plans.c_str());

    const AttentionTimes own_p = own_dropout_calls(c, in, p).time();
    row("own tm p.1", own_p);
    const cuda::CudnnAttentionSupport support =
        cuda::cudnn_attention_support(DType::BF16, c.s, c.b, c.heads, c.d, p);
    if (!support.forward || !support.backward) {
      std::printf("%-34s cudnn tm p.1: %s\n", c.what, support.why_not.c_str());
      continue;
    }
    const AttentionTimes dnn_p = cudnn_dropout_calls(c, in, p).time();
    row("cudnn tm p.1", dnn_p);
    std::printf("%-34s with dropout 0.1, speed-up cudnn/own: fwd %.2fx, bwd %.2fx, fwd+bwd %.2fx "
                "(%s)\n",
                c.what, own_p.fwd_ms / dnn_p.fwd_ms, own_p.bwd_ms / dnn_p.bwd_ms,
                (own_p.fwd_ms + own_p.bwd_ms) / (dnn_p.fwd_ms + dnn_p.bwd_ms),
                support.plans.c_str());
  }
}

/// `bench_cuda_ops gbench`: the token-major attention paths as Google
/// Benchmarks, forward and backward apart ("attention/<shape>/<path>/fwd");
/// each builds its own inputs when it runs, the backward's by a forward.
void register_attention_benchmarks(const Baselines& baselines,
                                   const std::shared_ptr<BuiltRow>& built) {
  using PathCalls = std::function<AttentionCalls(const TokenMajorCase&, const TokenMajorInputs&)>;
  const double p = 0.1;
  for (const TokenMajorCase& c : kTokenMajorCases) {
    auto add = [&](const std::string& path, const PathCalls& calls) {
      const std::string name = "attention/" + std::string(c.what) + "/" + path;
      register_benchmark(
          name + "/fwd", [c, calls] { return calls(c, TokenMajorInputs(c)).fwd; }, 1, 0,
          c.fwd_flop(), baselines, built);
      register_benchmark(
          name + "/bwd",
          [c, calls] {
            const AttentionCalls both = calls(c, TokenMajorInputs(c));
            both.fwd();  // the backward's inputs
            return both.bwd;
          },
          1, 0, c.bwd_flop(), baselines, built);
    };
    add("own", own_calls);
    add("own p.1", [p](const auto& c, const auto& in) { return own_dropout_calls(c, in, p); });
    const auto cudnn = cuda::cudnn_attention_support(DType::BF16, c.s, c.b, c.heads, c.d);
    if (cudnn.forward && cudnn.backward) add("cudnn", cudnn_calls);
    const auto cudnn_p = cuda::cudnn_attention_support(DType::BF16, c.s, c.b, c.heads, c.d, p);
    if (cudnn_p.forward && cudnn_p.backward)
      add("cudnn p.1", [p](const auto& c, const auto& in) { return cudnn_dropout_calls(c, in, p); });
  }
}

/// ALiBi (BLOOM: 8 x 16 heads, S = 1024, D = 64) and a key padding mask
/// (BERT-base: 8 x 12 heads, S = 512, D = 64, each sample's last quarter
/// padding), fused against unfused, without and with attention dropout 0.1
/// (fused: the forward stores its decisions for the backward, as the model
/// runs it). The key mask's TFLOP/s count the whole S x S.
void bench_attention_scores(const Baselines& baselines, bool fused_only) {
  struct Case {
    const char* what;
    index_t batch, heads, S, D;
    bool alibi;
  };
  const Case cases[] = {{"alibi B=8x16 S=1024 D=64 (BLOOM)", 8, 16, 1024, 64, true},
                        {"key mask B=8x12 S=512 D=64 (BERT)", 8, 12, 512, 64, false}};
  for (const Case& c : cases) {
    const index_t B = c.batch * c.heads;
    const Shape shape{B, c.S, c.D};
    const Tensor q = random_device(shape, DType::BF16, -2, 2),
                 k = random_device(shape, DType::BF16, -2, 2), v = random_device(shape, DType::BF16),
                 dout = random_device(shape, DType::BF16);
    ops::FusedAttentionScores scores;
    if (c.alibi) {
      Tensor slopes = Tensor::empty({c.heads}, DType::F32);
      const std::vector<double> all = ops::alibi_slopes(c.heads);
      for (index_t h = 0; h < c.heads; ++h) slopes.data<float>()[h] = float(all[std::size_t(h)]);
      scores.alibi_slopes = slopes.to_device();
    } else {
      Tensor mask = Tensor::zeros({c.batch, c.S}, DType::I32);
      for (index_t i = 0; i < c.batch * c.S; ++i)
        mask.data<std::int32_t>()[i] = i % c.S < 3 * c.S / 4;
      scores.key_mask = mask.to_device();
    }
    const double scale = 1.0 / std::sqrt(double(c.D));
    const double fwd_flop =
        4.0 * double(B) * double(c.S) * double(c.S) * double(c.D) / (c.alibi ? 2 : 1);
    auto row = [&](const char* path, const AttentionTimes& t) {
      print_attention_row(c.what, path, t, fwd_flop, 2.5 * fwd_flop, baselines);
    };
    const ops::AttentionDropout dropout = attention_dropout(0.1, B, c.S);
    const ops::AttentionDropout stored(
        dropout.p, dropout.site,
        Tensor::empty(ops::attention_keep_bits_shape(B, c.S), DType::I32, MemorySpace::Cuda));
    const AttentionTimes fused = time_fused_attention(q, k, v, dout, scale, {}, scores);
    row("fused", fused);
    const AttentionTimes fused_drop = time_fused_attention(q, k, v, dout, scale, stored, scores);
    row("fused p.1", fused_drop);
    if (fused_only) continue;
    const AttentionTimes unfused = time_unfused_attention(q, k, v, dout, scale, {}, scores);
    row("unfused", unfused);
    const AttentionTimes unfused_drop =
        time_unfused_attention(q, k, v, dout, scale, dropout, scores);
    row("unfused p.1", unfused_drop);
    std::printf("%-34s speed-up fused/unfused: fwd+bwd %.2fx, with dropout 0.1 %.2fx\n", c.what,
                (unfused.fwd_ms + unfused.bwd_ms) / (fused.fwd_ms + fused.bwd_ms),
                (unfused_drop.fwd_ms + unfused_drop.bwd_ms) /
                    (fused_drop.fwd_ms + fused_drop.bwd_ms));
  }
}

void bench_attention(const Baselines& baselines, bool fused_only) {
  std::printf("\n%-50s %9s %9s %9s %9s %9s %9s %7s\n", "causal attention core, bf16", "fwd ms",
              "fwd TF/s", "bwd ms", "bwd TF/s", "f+b ms", "f+b TF/s", "/gemm");
  struct Case {
    const char* what;
    index_t B, S, D;
  };
  const Case cases[] = {{"B=8x12 S=1024 D=64 (GPT-2 124M)", 96, 1024, 64},
                        {"B=8x16 S=1024 D=128", 128, 1024, 128},
                        {"B=4x12 S=2048 D=64", 48, 2048, 64}};
  for (const Case& c : cases) {
    const Shape shape{c.B, c.S, c.D};
    const Tensor q = random_device(shape, DType::BF16, -2, 2), k = random_device(shape, DType::BF16, -2, 2),
                 v = random_device(shape, DType::BF16), dout = random_device(shape, DType::BF16);
    const double scale = 1.0 / std::sqrt(double(c.D));
    const double fwd_flop = 4.0 * double(c.B) * double(c.S) * double(c.S) * double(c.D) / 2;
    const double bwd_flop = 2.5 * fwd_flop;
    auto row = [&](const char* path, const AttentionTimes& t) {
      print_attention_row(c.what, path, t, fwd_flop, bwd_flop, baselines);
    };
    const AttentionTimes fused = time_fused_attention(q, k, v, dout, scale);
    row("fused", fused);
    const ops::AttentionDropout dropout = attention_dropout(0.1, c.B, c.S);
    const AttentionTimes fused_drawn = time_fused_attention(q, k, v, dout, scale, dropout);
    row("fused p.1 drawn", fused_drawn);
    // As the model runs it: the forward stores its decisions for the backward.
    const ops::AttentionDropout stored(
        dropout.p, dropout.site,
        Tensor::empty(ops::attention_keep_bits_shape(c.B, c.S), DType::I32,
                      MemorySpace::Cuda));
    const AttentionTimes fused_drop = time_fused_attention(q, k, v, dout, scale, stored);
    row("fused p.1", fused_drop);
    std::printf("%-34s attention dropout 0.1 costs the fused kernels: fwd %.2fx, bwd %.2fx, "
                "fwd+bwd %.2fx (drawn in every pass: %.2fx)\n",
                c.what, fused_drop.fwd_ms / fused.fwd_ms, fused_drop.bwd_ms / fused.bwd_ms,
                (fused_drop.fwd_ms + fused_drop.bwd_ms) / (fused.fwd_ms + fused.bwd_ms),
                (fused_drawn.fwd_ms + fused_drawn.bwd_ms) / (fused.fwd_ms + fused.bwd_ms));
    if (fused_only) continue;
    const AttentionTimes unfused = time_unfused_attention(q, k, v, dout, scale);
    row("unfused", unfused);
    std::printf("%-34s speed-up fused/unfused: fwd %.2fx, bwd %.2fx, fwd+bwd %.2fx\n", c.what,
                unfused.fwd_ms / fused.fwd_ms, unfused.bwd_ms / fused.bwd_ms,
                (unfused.fwd_ms + unfused.bwd_ms) / (fused.fwd_ms + fused.bwd_ms));
    const AttentionTimes unfused_drop = time_unfused_attention(q, k, v, dout, scale, dropout);
    row("unfused p.1", unfused_drop);
    std::printf("%-34s with attention dropout 0.1, speed-up fused/unfused: fwd %.2fx, bwd %.2fx, "
                "fwd+bwd %.2fx\n",
                c.what, unfused_drop.fwd_ms / fused_drop.fwd_ms,
                unfused_drop.bwd_ms / fused_drop.bwd_ms,
                (unfused_drop.fwd_ms + unfused_drop.bwd_ms) /
                    (fused_drop.fwd_ms + fused_drop.bwd_ms));
  }
  bench_attention_scores(baselines, fused_only);
  bench_attention_token_major(baselines);
}

/// The most device memory the run's tensors held at once.
void print_allocator_peak(std::FILE* to) {
  const device::AllocatorStats st = device::allocator_stats();
  std::fprintf(to, "\nallocator: peak %.2f GiB, %zu cudaMalloc calls\n",
               double(st.peak_bytes) / (1 << 30), st.cuda_mallocs);
}

/// `bench_cuda_ops gbench [--benchmark_* flags]`: the memory-bound rows, the
/// GEMMs and the token-major attention as Google Benchmarks (filter, repeat,
/// --benchmark_format=json ...), each with its fraction of the run's
/// ceilings as a counter. Unless --benchmark_min_time is given, each
/// benchmark runs for 0.05 s of GPU time: a memory-bound iteration is 10
/// calls and a host round trip, so Google Benchmark's 0.5 s of per-call time
/// would take the ~90 rows over five minutes. (Set per benchmark, not as the
/// flag, whose format changed in Google Benchmark 1.8: "0.05" / "0.05s".)
int run_google_benchmarks(int argc, char** argv, Baselines baselines) {
  if (std::none_of(argv, argv + argc, [](const char* a) {
        return std::string(a).rfind("--benchmark_min_time", 0) == 0;
      }))
    baselines.benchmark_min_time_s = 0.05;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("copy_GBps", std::to_string(baselines.copy_gbps));
  benchmark::AddCustomContext("gemm_TFLOPs", std::to_string(baselines.gemm_tflops));
  const auto built = std::make_shared<BuiltRow>();
  bench_memory_bound(baselines, RowSink::GoogleBenchmark, "", built);
  auto add_gemm = [&](const GemmCase& c) {
    register_benchmark("gemm/" + std::string(c.what), [c] { return c.call(); }, 1, 0, c.flop(),
                       baselines, built);
  };
  add_gemm(kGemmCeiling);
  for (const GemmCase& c : kGemmCases) add_gemm(c);
  register_attention_benchmarks(baselines, built);
  benchmark::RunSpecifiedBenchmarks();
  *built = BuiltRow{};  // the last row's buffers, before CUDA shuts down
  print_allocator_peak(stderr);  // stdout may be Google Benchmark's JSON
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace meshtron

int main(int argc, char** argv) {
  using namespace meshtron;
  if (device::cuda_device_count() == 0) {
    std::printf("bench_cuda_ops: skipped (no CUDA device)\n");
    return 0;
  }
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool gbench = mode == "gbench";
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  // The GEMM ceiling (384 MB of inputs, 23 GEMMs) only where rows are a
  // fraction of it: not the memory table, its trace, overlap or residual.
  const bool uses_gemm_ceiling =
      mode != "memory" && mode != "trace" && mode != "overlap" && mode != "residual" &&
      mode != "adamw" && mode != "bias_in_wgrad";
  Baselines baselines;
  baselines.copy_gbps = copy_bandwidth_gbps();
  const bool memory_table = mode == "memory" || mode.empty();
  if (memory_table) baselines.copy_queued_gbps = copy_bandwidth_gbps(&stream_hold());
  if (uses_gemm_ceiling) baselines.gemm_tflops = gemm_ceiling_tflops();
  if (gbench) {  // Google Benchmark prints the ceilings in its context
    argv[1] = argv[0];  // and reads the program name from argv[0]
    return run_google_benchmarks(argc - 1, argv + 1, baselines);
  }
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("baseline: device-to-device cudaMemcpy of 1 GiB: %.1f GB/s (read + write)\n",
              baselines.copy_gbps);
  if (memory_table)
    std::printf("baseline: the same copy queued behind a held stream: %.1f GB/s\n",
                baselines.copy_queued_gbps);
  if (uses_gemm_ceiling)
    std::printf("baseline: cuBLASLt %s: %.1f TFLOP/s\n", kGemmCeiling.what,
                baselines.gemm_tflops);
  // `bench_cuda_ops attention` runs the attention section alone;
  // `bench_cuda_ops attention fused` skips its unfused rows.
  const bool attention_only = mode == "attention";
  const bool fused_only = attention_only && argc > 2 && std::string(argv[2]) == "fused";
  const std::string only = argc > 2 ? argv[2] : "";
  // `bench_cuda_ops memory [ops]` runs the memory-bound table alone.
  if (mode == "memory") {
    bench_memory_bound(baselines, RowSink::Table, only);
    return 0;
  }
  // `bench_cuda_ops trace [ops]`: the memory-bound rows' kernels as traced.
  if (mode == "trace") {
    if (!GpuTracer::available()) {
      std::printf("bench_cuda_ops trace: this build has no CUPTI\n");
      return 1;
    }
    bench_memory_bound(baselines, RowSink::Trace, only);
    return 0;
  }
  // `bench_cuda_ops adamw`: the per-tensor loop against the multi-tensor kernel alone.
  if (mode == "adamw") {
    bench_adamw_multi_tensor(baselines.copy_gbps);
    return 0;
  }
  if (mode == "overlap") {
    bench_overlap_masks_with_adamw();
    return 0;
  }
  if (mode == "residual") {
    bench_residual_epilogues();
    return 0;
  }
  if (mode == "bias_in_wgrad") {
    bench_bias_in_weight_gradient();
    return 0;
  }
  if (!attention_only) {
    bench_memory_bound(baselines);
    bench_adamw_multi_tensor(baselines.copy_gbps);
    bench_gemm(baselines);
  }
  bench_attention(baselines, fused_only);
  print_allocator_peak(stdout);
  return 0;
}

#else

int main() {
  std::printf("bench_cuda_ops: skipped (the CUDA path is not built)\n");
  return 0;
}

#endif
