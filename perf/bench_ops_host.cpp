// Host op-table microbenchmarks at GPT-2 small sizes (fp32).
//
//   ./build/perf/bench_ops_host                       (all)
//   ./build/perf/bench_ops_host --benchmark_filter=gemm
//
// GEMM reports FLOP/s (2 M N K per call); the memory-bound kernels report
// bytes/s counting each tensor they must read or write once (the minimum
// traffic), so the number is comparable with the machine's stream bandwidth.
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <random>

#include "ops/ops.hpp"

namespace {

using meshtron::DType;
using meshtron::index_t;
using meshtron::Tensor;
namespace ops = meshtron::ops;

Tensor random_tensor(meshtron::Shape shape, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(std::move(shape), DType::F32);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist{float(lo), float(hi)};
  float* p = t.data<float>();
  for (index_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  return t;
}

void set_bytes(benchmark::State& state, double bytes_per_call) {
  state.SetBytesProcessed(std::int64_t(bytes_per_call * double(state.iterations())));
}

// C [M, N] = A [M, K] B [K, N]: the MLP up-projection of 768 tokens.
void BM_gemm(benchmark::State& state) {
  const index_t M = 768, K = 768, N = 3072;
  Tensor A = random_tensor({M, K}), B = random_tensor({K, N}), C = Tensor::zeros({M, N});
  for (auto _ : state) {
    ops::gemm(A, false, B, false, C);
    benchmark::DoNotOptimize(C.raw());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * M * N * K * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_gemm)->Name("gemm/M768_K768_N3072")->Unit(benchmark::kMillisecond);

void BM_layernorm_forward(benchmark::State& state) {
  const index_t N = 4096, H = 768;
  Tensor x = random_tensor({N, H}), gamma = random_tensor({H}), beta = random_tensor({H});
  Tensor y = Tensor::empty({N, H}), mean = Tensor::empty({N}), rstd = Tensor::empty({N});
  for (auto _ : state) ops::layernorm_forward(x, gamma, beta, 1e-5, y, mean, rstd);
  set_bytes(state, 2.0 * N * H * sizeof(float));  // read x, write y
}
BENCHMARK(BM_layernorm_forward)->Name("layernorm_forward/4096x768")->Unit(benchmark::kMillisecond);

void BM_layernorm_backward(benchmark::State& state) {
  const index_t N = 4096, H = 768;
  Tensor x = random_tensor({N, H}), gamma = random_tensor({H}), beta = random_tensor({H});
  Tensor y = Tensor::empty({N, H}), mean = Tensor::empty({N}), rstd = Tensor::empty({N});
  ops::layernorm_forward(x, gamma, beta, 1e-5, y, mean, rstd);
  Tensor dy = random_tensor({N, H}), dx = Tensor::empty({N, H});
  Tensor dgamma = Tensor::zeros({H}), dbeta = Tensor::zeros({H});
  for (auto _ : state) ops::layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  set_bytes(state, 3.0 * N * H * sizeof(float));  // read dy, x; write dx
}
BENCHMARK(BM_layernorm_backward)
    ->Name("layernorm_backward/4096x768")
    ->Unit(benchmark::kMillisecond);

// Attention probabilities of 4 sequences x 12 heads at S = 256.
void BM_softmax_forward(benchmark::State& state) {
  const index_t B = 12 * 4, S = 256;
  Tensor scores = random_tensor({B, S, S}, -4, 4), probs = Tensor::empty({B, S, S});
  for (auto _ : state) ops::scaled_causal_softmax_forward(scores, 0.125, probs);
  set_bytes(state, 2.0 * B * S * S * sizeof(float));  // read scores, write probs
}
BENCHMARK(BM_softmax_forward)->Name("softmax_forward/48x256x256")->Unit(benchmark::kMillisecond);

void BM_softmax_backward(benchmark::State& state) {
  const index_t B = 12 * 4, S = 256;
  Tensor scores = random_tensor({B, S, S}, -4, 4), probs = Tensor::empty({B, S, S});
  ops::scaled_causal_softmax_forward(scores, 0.125, probs);
  Tensor dprobs = random_tensor({B, S, S}), dscores = Tensor::empty({B, S, S});
  for (auto _ : state) ops::scaled_causal_softmax_backward(dprobs, probs, 0.125, dscores);
  set_bytes(state, 3.0 * B * S * S * sizeof(float));  // read dprobs, probs; write dscores
}
BENCHMARK(BM_softmax_backward)->Name("softmax_backward/48x256x256")->Unit(benchmark::kMillisecond);

void BM_gelu_forward(benchmark::State& state) {
  const index_t N = 4096, H = 3072;
  Tensor x = random_tensor({N, H}, -4, 4), y = Tensor::empty({N, H});
  for (auto _ : state) ops::gelu_forward(x, y);
  set_bytes(state, 2.0 * N * H * sizeof(float));  // read x, write y
}
BENCHMARK(BM_gelu_forward)->Name("gelu_forward/4096x3072")->Unit(benchmark::kMillisecond);

void BM_gelu_backward(benchmark::State& state) {
  const index_t N = 4096, H = 3072;
  Tensor x = random_tensor({N, H}, -4, 4), dy = random_tensor({N, H}), dx = Tensor::empty({N, H});
  for (auto _ : state) ops::gelu_backward(dy, x, dx);
  set_bytes(state, 3.0 * N * H * sizeof(float));  // read dy, x; write dx
}
BENCHMARK(BM_gelu_backward)->Name("gelu_backward/4096x3072")->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
