// GPT-2 tokenizer throughput on the Brown corpus (tools/fetch-corpus.sh).
//
//   build/perf/bench_tokenizer                  # data from <repo>/data
//   MESHTRON_DATA_DIR=/scratch/d build/perf/bench_tokenizer
//
// Cases, each encoding the whole corpus (data/brown.txt, ~6 MB) per
// iteration, throughput in bytes of input text per second:
//   Pretokenize   the PCRE2 regex split alone (the floor under encoding)
//   EncodeWarm    word cache already filled by a previous pass
//   EncodeCold    word cache emptied before every pass (first pass over new text)
//   EncodeNoCache cache disabled: BPE runs on every word
// Without the data it prints how to fetch it and exits 0.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "data/gpt2_tokenizer.hpp"

namespace fs = std::filesystem;
using meshtron::data::Gpt2Pretokenizer;
using meshtron::data::Gpt2Tokenizer;

namespace {

fs::path data_dir() {
  const char* env = std::getenv("MESHTRON_DATA_DIR");
  return env && *env ? fs::path(env) : fs::path(MESHTRON_SOURCE_DIR) / "data";
}

std::string g_text;            // the corpus, read once
Gpt2Tokenizer* g_tokenizer;    // Not owned (lives in main).

void report(benchmark::State& state, std::size_t tokens_per_pass) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_text.size()));
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * tokens_per_pass), benchmark::Counter::kIsRate);
  state.counters["bytes/token"] =
      static_cast<double>(g_text.size()) / static_cast<double>(tokens_per_pass);
}

void BM_Pretokenize(benchmark::State& state) {
  Gpt2Pretokenizer pre;
  std::size_t words = 0;
  for (auto _ : state) {
    words = 0;
    pre.for_each_word(g_text, [&](std::string_view) { ++words; });
    benchmark::DoNotOptimize(words);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_text.size()));
  state.counters["words"] = static_cast<double>(words);
  state.counters["jit"] = pre.jit_compiled() ? 1 : 0;
}

void BM_EncodeWarm(benchmark::State& state) {
  g_tokenizer->set_cache_limit(std::size_t{1} << 20);
  std::vector<int32_t> ids = g_tokenizer->encode(g_text);  // fills the cache
  for (auto _ : state) {
    ids.clear();
    g_tokenizer->encode_append(g_text, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  report(state, ids.size());
  state.counters["cached_words"] = static_cast<double>(g_tokenizer->cache_size());
}

void BM_EncodeCold(benchmark::State& state) {
  g_tokenizer->set_cache_limit(std::size_t{1} << 20);
  std::vector<int32_t> ids;
  for (auto _ : state) {
    state.PauseTiming();
    g_tokenizer->clear_cache();
    ids.clear();
    state.ResumeTiming();
    g_tokenizer->encode_append(g_text, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  report(state, ids.size());
}

void BM_EncodeNoCache(benchmark::State& state) {
  g_tokenizer->set_cache_limit(0);
  std::vector<int32_t> ids;
  for (auto _ : state) {
    ids.clear();
    g_tokenizer->encode_append(g_text, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  report(state, ids.size());
  g_tokenizer->set_cache_limit(std::size_t{1} << 20);
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = data_dir();
  for (const char* name : {"brown.txt", "encoder.json", "vocab.bpe"}) {
    if (!fs::exists(dir / name)) {
      std::cout << "bench_tokenizer: skipped, no " << (dir / name)
                << " (run tools/fetch-corpus.sh)\n";
      return 0;
    }
  }
  std::ifstream in(dir / "brown.txt", std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  g_text = std::move(contents).str();
  Gpt2Tokenizer tokenizer = Gpt2Tokenizer::from_openai((dir / "encoder.json").string(),
                                                       (dir / "vocab.bpe").string());
  g_tokenizer = &tokenizer;
  std::cout << "corpus: " << (dir / "brown.txt") << ", " << g_text.size() << " bytes\n";

  benchmark::RegisterBenchmark("Pretokenize", BM_Pretokenize)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("EncodeWarm", BM_EncodeWarm)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("EncodeCold", BM_EncodeCold)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("EncodeNoCache", BM_EncodeNoCache)->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
