// Generation on the GPU (src/generate/ over kernels/cuda/cached_attention.cu
// and logit_candidates.cu), against the host path:
//  * ops::cached_attention on the device (fp32 tight, bf16 and fp16 loose)
//    equals the host op in fp64: the context and both caches, for head dims
//    64 and 128, grouped kv heads, a long cache (2100 positions; one decode
//    row, so the cache is split over blocks) and a prefill of many rows;
//  * ops::logit_candidates on the device equals the host's (ties, padding
//    columns, more candidates than real columns);
//  * greedy, top-k sampled and beam-search ids of the tiny GPT-2 and
//    Llama-style (rope, GQA, RMSNorm, SwiGLU) models on one GPU in fp32
//    equal the host's; with mpirun -np 2 and two GPUs, tp 2 equals the
//    1-rank host run (skips otherwise).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <map>
#include <random>

#include "common/mpi_test_util.hpp"
#include "tests/generate/generate_test_util.hpp"
#include "gpu_test_util.hpp"
#include "ops/ops.hpp"

namespace meshtron {
namespace {

using generate_test::Replica;
using generate_test::some_ids;
using testing_util::world_size;

struct AttentionCase {
  index_t heads, groups, d, slots, capacity;
  std::vector<index_t> slot, position;  // one entry per row
};

Tensor int32_rows(const std::vector<index_t>& v, MemorySpace space) {
  Tensor t = Tensor::empty({index_t(v.size())}, DType::I32);
  for (std::size_t i = 0; i < v.size(); ++i) t.data<std::int32_t>()[i] = std::int32_t(v[i]);
  return space == MemorySpace::Host ? t : t.to_device();
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(b[i])) return INFINITY;
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  return worst;
}

void check_cached_attention(const AttentionCase& c, DType dt, double tol) {
  const index_t rows = index_t(c.slot.size());
  const Tensor qkv = gpu_test::random_rounded({rows, (c.heads + 2 * c.groups) * c.d}, dt, 11, -1, 1);
  // Earlier steps' keys and values fill the whole cache.
  const Shape cache_shape{c.slots, c.groups, c.capacity, c.d};
  Tensor k_host = gpu_test::random_rounded(cache_shape, dt, 12, -1, 1);
  Tensor v_host = gpu_test::random_rounded(cache_shape, dt, 13, -1, 1);
  Tensor k_dev = k_host.to(dt).to_device(), v_dev = v_host.to(dt).to_device();
  Tensor context_host = Tensor::empty({rows, c.heads * c.d}, DType::F64);
  Tensor context_dev = gpu_test::poisoned({rows, c.heads * c.d}, dt);
  const double scale = 1.0 / std::sqrt(double(c.d));
  ops::cached_attention(qkv, c.heads, c.groups, int32_rows(c.slot, MemorySpace::Host),
                        int32_rows(c.position, MemorySpace::Host), scale, k_host, v_host,
                        context_host);
  ops::cached_attention(qkv.to(dt).to_device(), c.heads, c.groups,
                        int32_rows(c.slot, MemorySpace::Cuda), int32_rows(c.position, MemorySpace::Cuda),
                        scale, k_dev, v_dev, context_dev);
  const std::string what = std::string(dtype_name(dt)) + " d " + std::to_string(c.d) + " rows " +
                           std::to_string(rows) + " capacity " + std::to_string(c.capacity);
  // The stored k and v are copies: exact in every dtype.
  EXPECT_EQ(max_abs_diff(k_host.to_doubles(), k_dev.to_doubles()), 0.0) << what;
  EXPECT_EQ(max_abs_diff(v_host.to_doubles(), v_dev.to_doubles()), 0.0) << what;
  EXPECT_LE(max_abs_diff(context_host.to_doubles(), context_dev.to_doubles()), tol) << what;
}

/// One decode row per slot at scattered positions, the last near the end of
/// a 2100-position cache.
AttentionCase decode_case(index_t d, index_t rows) {
  AttentionCase c{8, 2, d, rows, 2100, {}, {}};
  for (index_t r = 0; r < rows; ++r) {
    c.slot.push_back(r);
    c.position.push_back(r == 0 ? 2099 : (r * 397) % 2100);
  }
  return c;
}

/// Two prompts of 40 and 25 rows in one call, then a decode row of a third
/// slot: as the generator's prefill of prompts of different lengths.
AttentionCase prefill_case(index_t d) {
  AttentionCase c{8, 2, d, 3, 128, {}, {}};
  for (index_t t = 0; t < 40; ++t) c.slot.push_back(0), c.position.push_back(t);
  for (index_t t = 0; t < 25; ++t) c.slot.push_back(1), c.position.push_back(t);
  c.slot.push_back(2);
  c.position.push_back(77);
  return c;
}

TEST(GpuGenerate, CachedAttentionMatchesHost) {
  REQUIRE_GPU();
  for (index_t d : {64, 128}) {
    for (index_t rows : {1, 3, 64}) {  // 1 and 3 split the cache; 64 rows x 8 heads do not
      check_cached_attention(decode_case(d, rows), DType::F32, 1e-5);
      check_cached_attention(decode_case(d, rows), DType::BF16, 2e-2);
    }
    check_cached_attention(prefill_case(d), DType::F32, 1e-5);
    check_cached_attention(prefill_case(d), DType::BF16, 2e-2);
    check_cached_attention(prefill_case(d), DType::F16, 5e-3);
  }
  // Multi-query and a head dim that is not a multiple of 32.
  AttentionCase mqa{4, 1, 40, 2, 300, {0, 1, 1}, {299, 0, 150}};
  check_cached_attention(mqa, DType::F32, 1e-5);
}

void check_candidates(const Tensor& logits_f64, index_t real, int n) {
  const Tensor host = ops::logit_candidates(logits_f64, real, n);
  const Tensor dev = ops::logit_candidates(logits_f64.to(DType::F32).to_device(), real, n);
  ASSERT_EQ(dev.shape(), host.shape());
  ASSERT_TRUE(dev.is_host());
  const index_t width = 2 + 2 * index_t(n);
  for (index_t r = 0; r < host.dim(0); ++r)
    for (index_t i = 0; i < width; ++i) {
      const double h = host.data<double>()[r * width + i], g = dev.data<double>()[r * width + i];
      if (i == 1)  // the sum of exponentials: fp32 on the device
        EXPECT_NEAR(g, h, 1e-5 * h) << "row " << r << " sum";
      else
        EXPECT_EQ(g, h) << "row " << r << " entry " << i << " (n " << n << ", real " << real << ")";
    }
}

TEST(GpuGenerate, LogitCandidatesMatchHost) {
  REQUIRE_GPU();
  // Integer logits in [-20, 20): many ties, which the lower column wins.
  const index_t rows = 5, cols = 3000;
  Tensor logits = Tensor::empty({rows, cols}, DType::F64);
  std::mt19937 rng(7);
  for (index_t i = 0; i < logits.numel(); ++i)
    logits.data<double>()[i] = double(int(rng() % 40) - 20);
  for (int n : {1, 7, 64}) check_candidates(logits, 2900, n);
  check_candidates(logits, cols, 50);
  // Fewer real columns than candidates: the rest are (-inf, -1).
  check_candidates(logits, 5, 12);
}

/// Greedy; top-k sampling (its candidates from the device); beam search
/// (the cache's slots reordered on the device).
std::map<std::string, generate::GenerateParams> decodings() {
  std::map<std::string, generate::GenerateParams> out;
  generate::GenerateParams p;
  p.max_new_tokens = 12;
  out["greedy"] = p;
  p.decoding = generate::Decoding::Sample;
  p.temperature = 1.3;
  p.top_k = 5;
  out["sample_top_k"] = p;
  p = {};
  p.max_new_tokens = 12;
  p.decoding = generate::Decoding::Beam;
  p.num_beams = 3;
  p.length_penalty = 0.7;
  out["beam"] = p;
  return out;
}

void expect_same_ids(Replica& gpu, Replica& host, const std::string& what) {
  const std::vector<generate::Request> batch = {{0, some_ids(4, 3)}, {1, some_ids(9, 4)},
                                                {2, some_ids(1, 5)}};
  for (const auto& [name, p] : decodings()) {
    const auto on_gpu = gpu.generator->generate(batch, p);
    const auto on_host = host.generator->generate(batch, p);
    ASSERT_EQ(on_gpu.size(), on_host.size());
    for (std::size_t i = 0; i < on_gpu.size(); ++i) {
      EXPECT_EQ(on_gpu[i].ids, on_host[i].ids) << what << " " << name << " prompt " << i;
      ASSERT_EQ(on_gpu[i].logprobs.size(), on_host[i].logprobs.size());
      for (std::size_t t = 0; t < on_gpu[i].logprobs.size(); ++t)
        EXPECT_NEAR(on_gpu[i].logprobs[t], on_host[i].logprobs[t], 1e-4)
            << what << " " << name << " prompt " << i;
    }
  }
}

TEST(GpuGenerate, IdsEqualHostOnOneGpu) {
  REQUIRE_GPU();
  if (world_size() != 1) GTEST_SKIP() << "one-rank test";
  for (const std::string family : {"gpt2", "llama"}) {
    Replica host(MPI_COMM_SELF, family, 1, 1, DType::F32);
    Replica gpu(MPI_COMM_SELF, family, 1, 1, DType::F32, {}, MemorySpace::Cuda);
    expect_same_ids(gpu, host, family);
  }
}

// tp 2, and pp 2 (greedy and sampled: two micro-batches in flight, hidden
// states over NCCL, the chosen tokens over MPI).
TEST(GpuGenerate, IdsEqualHostOnTwoGpusTp2AndPp2) {
  if (world_size() != 2) GTEST_SKIP() << "needs mpirun -np 2";
  if (device::cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  for (const std::string family : {"gpt2", "llama"}) {
    Replica host(MPI_COMM_SELF, family, 1, 1, DType::F32);
    Replica tp2(MPI_COMM_WORLD, family, 2, 1, DType::F32, {}, MemorySpace::Cuda);
    expect_same_ids(tp2, host, family + " tp 2");
    Replica pp2(MPI_COMM_WORLD, family, 1, 2, DType::F32, {}, MemorySpace::Cuda);
    expect_same_ids(pp2, host, family + " pp 2");
  }
}

}  // namespace
}  // namespace meshtron
