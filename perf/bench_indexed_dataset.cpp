// Read throughput of the indexed dataset and GPT samples under random
// access, the access pattern of training (shuffled samples).
//
//   build/perf/bench_indexed_dataset [--benchmark_min_time=1]
//   MESHTRON_BENCH_DIR=/scratch/me build/perf/bench_indexed_dataset
//
// 1. A synthetic uint16 dataset (20k documents, ~20M tokens, ~40 MB) is
//    written once into $MESHTRON_BENCH_DIR (default /tmp), so it is in the
//    page cache: this measures the reader, not the disk.
// 2. The baseline copies the same number of int32 tokens per item from a
//    contiguous in-memory array (the best any reader can do); every other
//    benchmark is printed as a ratio of its tokens/s to the baseline's.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>

#include "data/gpt_dataset.hpp"
#include "data/indexed_dataset.hpp"

namespace {

using namespace meshtron::data;

constexpr int kDocuments = 20000;
constexpr int kMaxDocLength = 2000;

std::string bench_prefix() {
  const char* dir = std::getenv("MESHTRON_BENCH_DIR");
  return (std::filesystem::path(dir ? dir : "/tmp") / "meshtron_bench_indexed").string();
}

/// The dataset, written on first use.
std::shared_ptr<const IndexedDataset> dataset() {
  static std::shared_ptr<const IndexedDataset> data = [] {
    std::mt19937 rng(1);
    IndexedDatasetWriter writer(bench_prefix(), TokenDType::U16);
    std::vector<std::int32_t> doc;
    for (int d = 0; d < kDocuments; ++d) {
      doc.resize(1 + rng() % kMaxDocLength);
      for (auto& t : doc) t = std::int32_t(rng() % 50257);
      writer.add_document(doc);
    }
    writer.finalize();
    return std::make_shared<const IndexedDataset>(bench_prefix());
  }();
  return data;
}

/// Train samples of `seq_length`; indices cached beside the data.
const GptDataset& gpt(std::int64_t seq_length) {
  static std::map<std::int64_t, std::unique_ptr<GptDataset>> cache;
  auto& slot = cache[seq_length];
  if (!slot) {
    GptDatasetConfig config;
    config.seq_length = seq_length;
    slot = std::make_unique<GptDataset>(dataset(), Split::Train, 0, kDocuments,
                                        200'000, config);
  }
  return *slot;
}

std::vector<std::int64_t> random_indices(std::int64_t n, std::int64_t count) {
  std::mt19937_64 rng(7);
  std::vector<std::int64_t> out(static_cast<std::size_t>(count));
  for (auto& i : out) i = std::int64_t(rng() % std::uint64_t(n));
  return out;
}

void set_tokens(benchmark::State& state, std::int64_t tokens) {
  state.counters["tokens/s"] =
      benchmark::Counter(double(tokens), benchmark::Counter::kIsRate);
}

// Baseline: copy seq+1 int32 tokens from random places of a contiguous array.
void BM_Baseline_MemcpyInt32(benchmark::State& state) {
  const std::int64_t s = state.range(0) + 1;
  std::vector<std::int32_t> all(std::size_t(dataset()->num_tokens()));
  for (std::size_t k = 0; k < all.size(); ++k) all[k] = std::int32_t(k);
  const auto starts = random_indices(std::int64_t(all.size()) - s, 4096);
  std::vector<std::int32_t> out(static_cast<std::size_t>(s));
  std::int64_t tokens = 0;
  std::size_t k = 0;
  for (auto _ : state) {
    std::memcpy(out.data(), all.data() + starts[k++ % starts.size()], std::size_t(s) * 4);
    benchmark::DoNotOptimize(out.data());
    tokens += s;
  }
  set_tokens(state, tokens);
}

// One GPT sample (seq_length + 1 tokens, uint16 -> int32, across documents).
void BM_GptSampleRandom(benchmark::State& state) {
  const GptDataset& ds = gpt(state.range(0));
  const auto picks = random_indices(ds.size(), 4096);
  std::vector<std::int32_t> out(std::size_t(ds.seq_length() + 1));
  std::int64_t tokens = 0;
  std::size_t k = 0;
  for (auto _ : state) {
    ds.sample(picks[k++ % picks.size()], out.data());
    benchmark::DoNotOptimize(out.data());
    tokens += ds.seq_length() + 1;
  }
  set_tokens(state, tokens);
}

// A micro-batch of 8 samples into freshly allocated input/label tensors.
void BM_GptMicroBatch8(benchmark::State& state) {
  const GptDataset& ds = gpt(state.range(0));
  const auto picks = random_indices(ds.size(), 8 * 512);
  std::int64_t tokens = 0;
  std::size_t k = 0;
  for (auto _ : state) {
    const std::span<const std::int64_t> rows(picks.data() + 8 * (k++ % 512), 8);
    auto batch = ds.micro_batch(rows);
    benchmark::DoNotOptimize(batch.tokens.raw());
    tokens += 8 * (ds.seq_length() + 1);
  }
  set_tokens(state, tokens);
}

// Whole documents by random index through the converting reader.
void BM_SequenceReadRandom(benchmark::State& state) {
  const auto data = dataset();
  const auto picks = random_indices(data->num_sequences(), 4096);
  std::vector<std::int32_t> out(kMaxDocLength + 1);
  std::int64_t tokens = 0;
  std::size_t k = 0;
  for (auto _ : state) {
    tokens += data->read(picks[k++ % picks.size()], 0, -1, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  set_tokens(state, tokens);
}

// Building the index arrays (no cache) for 200k samples of 1024 tokens.
void BM_BuildGptIndices(benchmark::State& state) {
  GptDatasetConfig config;
  config.seq_length = 1024;
  config.use_cache = false;
  for (auto _ : state) {
    GptDataset ds(dataset(), Split::Train, 0, kDocuments, 200'000, config);
    benchmark::DoNotOptimize(ds.shuffle_idx().data());
  }
}

BENCHMARK(BM_Baseline_MemcpyInt32)->Arg(1024)->Arg(2048);
BENCHMARK(BM_GptSampleRandom)->Arg(1024)->Arg(2048);
BENCHMARK(BM_GptMicroBatch8)->Arg(1024)->Arg(2048);
BENCHMARK(BM_SequenceReadRandom);
BENCHMARK(BM_BuildGptIndices)->Unit(benchmark::kMillisecond);

/// Console output plus, at the end, each run's tokens/s relative to the
/// baseline with the same argument.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      const auto it = run.counters.find("tokens/s");
      if (it != run.counters.end()) rates_.emplace_back(run.benchmark_name(), double(it->second));
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::map<std::string, double> baseline;
    for (const auto& [name, rate] : rates_)
      if (name.rfind("BM_Baseline_MemcpyInt32/", 0) == 0)
        baseline[name.substr(name.find('/'))] = rate;
    std::cout << "\ntokens/s relative to BM_Baseline_MemcpyInt32 (same argument):\n";
    for (const auto& [name, rate] : rates_) {
      const auto slash = name.find('/');
      const auto base = baseline.find(slash == std::string::npos ? "" : name.substr(slash));
      std::cout << "  " << name << ": " << rate / 1e6 << " M tokens/s";
      if (base != baseline.end()) std::cout << "  (x" << rate / base->second << ")";
      std::cout << "\n";
    }
  }

 private:
  std::vector<std::pair<std::string, double>> rates_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
