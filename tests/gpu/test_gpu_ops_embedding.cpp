// The embedding ops on the device against the host (src/ops/ops_embedding.cpp).
//
// Inputs, tolerances and the NaN poisoning: gpu_ops_test_util.hpp.
// Run: ctest -R gpu_ops --output-on-failure   (skips, exit 0, without a GPU)
#include "gpu_ops_test_util.hpp"

namespace meshtron::ops {
namespace {

using namespace gpu_ops_test;

// ============================================================ Embedding ==

TEST_F(GpuOps, EmbeddingsForwardAndBackwardMatchHost) {
  for (DType dt : kDtypes)
    for (index_t N : kRows)
      for (index_t H : kCols)
        for (DType gdt : {DType::F32, dt}) {
          const std::string what = name(dt) + " N=" + std::to_string(N) + " H=" +
                                   std::to_string(H) + " grads " + name(gdt);
          const index_t V = 37, vocab_begin = 10;
          const Tensor ids_host = random_ids(N, 0, 60);  // some outside the shard
          const Tensor ids_dev = ids_host.to_device();
          const Pair table = input({V, H}, dt);
          Pair out = output({N, H}, dt);
          embedding_forward(ids_host, table.host, vocab_begin, out.host);
          embedding_forward(ids_dev, table.dev, vocab_begin, out.dev);
          expect_close(out, dt, "embedding_forward " + what);
          const Pair dout = input({N, H}, dt);
          Pair dtable = input({V, H}, gdt);
          embedding_backward(ids_host, dout.host, vocab_begin, dtable.host);
          embedding_backward(ids_dev, dout.dev, vocab_begin, dtable.dev);
          expect_close(dtable, gdt == DType::F32 ? dt : gdt, "embedding_backward " + what);

          for (index_t S : {index_t(1), index_t(3), index_t(17)}) {
            const index_t rows = 3 * S;
            const Pair pos = input({S + 2, H}, dt);
            Pair acc = input({rows, H}, dt);
            position_embedding_forward(pos.host, S, acc.host);
            position_embedding_forward(pos.dev, S, acc.dev);
            expect_close(acc, dt, "position_embedding_forward S=" + std::to_string(S) + what);
            const Pair dpos_out = input({rows, H}, dt);
            Pair dpos = input({S + 2, H}, gdt);
            position_embedding_backward(dpos_out.host, S, dpos.host);
            position_embedding_backward(dpos_out.dev, S, dpos.dev);
            expect_close(dpos, gdt == DType::F32 ? dt : gdt,
                         "position_embedding_backward S=" + std::to_string(S) + what);
          }
        }
}

// Calls back to back, as the position and word tables' backward run: the
// second call's sort reads its ids while the first call's accumulation may
// still run (programmatic launch), and its runs and tokens scratch may be
// the memory the first call's accumulation reads; the writes must wait.
// 8192 tokens over 4096 rows take the range sort on several blocks.
TEST_F(GpuOps, EmbeddingBackwardCallsBackToBackMatchHost) {
  const index_t N = 8192, H = 256, V = 4096;
  for (DType dt : {DType::BF16, DType::F32}) {
    const std::string what = "embedding_backward back to back " + name(dt);
    Pair dtable = input({V, H}, DType::F32);
    std::vector<Tensor> ids_host, ids_dev;
    std::vector<Pair> douts;
    for (int call = 0; call < 4; ++call) {  // every input uploaded before the first call
      ids_host.push_back(random_ids(N, 0, call % 2 ? V : 64));  // long runs, then short
      ids_dev.push_back(ids_host.back().to_device());
      douts.push_back(input({N, H}, dt));
    }
    for (int call = 0; call < 4; ++call) {
      embedding_backward(ids_host[call], douts[call].host, 0, dtable.host);
      embedding_backward(ids_dev[call], douts[call].dev, 0, dtable.dev);
    }
    expect_close(dtable, dt, what);
  }
}

// The backward sums repeated ids in token order (kernels/cuda/embedding.cu):
// into an fp32 table it is the host's result bit for bit (same order, same
// roundings; bf16/fp16 dout are exact fp32 numbers),
// and every call gives the same bits (atomics would not). 8192 tokens (the
// one-block sort) and 12000 (the device-wide sort) over 64 ids give
// ~128-190 repeats per row; some ids fall outside the shard; the position
// table's ids (token / micro-batch) are the model's other use.
TEST_F(GpuOps, EmbeddingBackwardIsDeterministicAndExactInFp32) {
  const index_t H = 96, V = 50, vocab_begin = 7, micro_batch = 4;
  for (const index_t N : {index_t(8192), index_t(12000)}) {
    Tensor positions = Tensor::empty({N}, DType::I32);
    for (index_t t = 0; t < N; ++t)
      positions.data<std::int32_t>()[t] = std::int32_t(t / micro_batch);
    const std::pair<std::string, Tensor> cases[] = {{"word ids", random_ids(N, 0, 64)},
                                                    {"position ids", positions}};
    for (const auto& [ids_name, ids_host] : cases) {
      const std::string what = ids_name + " N=" + std::to_string(N);
      const index_t rows = ids_name == "word ids" ? V : N / micro_batch;
      const index_t begin = ids_name == "word ids" ? vocab_begin : 0;
      const Tensor ids_dev = ids_host.to_device();
      for (DType dt : kDtypes) {
        const Pair dout = input({N, H}, dt);
        const Pair start = input({rows, H}, DType::F32);  // fp32 main_grad
        Tensor host = start.host.clone();
        embedding_backward(ids_host, dout.host, begin, host);
        Tensor first = start.dev.clone(), second = start.dev.clone();
        embedding_backward(ids_dev, dout.dev, begin, first);
        embedding_backward(ids_dev, dout.dev, begin, second);
        const auto a = first.to_doubles(), b = second.to_doubles();
        EXPECT_TRUE(a == b) << what << " " << name(dt) << ": two calls differ";
        // bf16/fp16 dout are exact in fp32, so the fp32 sums match too.
        EXPECT_TRUE(a == host.to_doubles()) << what << " " << name(dt) << ": differs from the host";
      }
    }
  }
}

// The range sort of kernels/cuda/embedding.cu (up to 8192 tokens): a hot
// row (real text's "the": here 3/4 of the tokens, so one block lists 6000
// of them), every token the same row, a shard of 300000 rows (more keys
// than 256 per block), and token counts that are not a multiple of 32,
// ids outside the shard among them. Exact against the host in fp32.
TEST_F(GpuOps, EmbeddingBackwardSortHandlesHotRowsAndLargeShards) {
  struct Case {
    std::string name;
    index_t N, V;
    double hot;  // fraction of tokens on row 17
  };
  const Case cases[] = {{"hot row", 8192, 50304, 0.75},
                        {"one row", 8192, 50304, 1.0},
                        {"large shard", 8192, 300000, 0.1},
                        {"odd count", 4001, 50304, 0.3},
                        {"one token", 1, 50304, 0.0}};
  const index_t H = 16, vocab_begin = 3;
  for (const Case& c : cases) {
    Tensor ids = random_ids(c.N, 0, int(c.V + 2 * vocab_begin));  // some outside [begin, begin + V)
    std::bernoulli_distribution is_hot(c.hot);
    for (index_t n = 0; n < c.N; ++n)
      if (is_hot(rng())) ids.data<std::int32_t>()[n] = std::int32_t(vocab_begin + 17);
    const Tensor ids_dev = ids.to_device();
    const Pair dout = input({c.N, H}, DType::F32), start = input({c.V, H}, DType::F32);
    Tensor host = start.host.clone(), dev = start.dev.clone();
    embedding_backward(ids, dout.host, vocab_begin, host);
    embedding_backward(ids_dev, dout.dev, vocab_begin, dev);
    EXPECT_TRUE(dev.to_doubles() == host.to_doubles()) << c.name << ": differs from the host";
  }
}

#ifdef MESHTRON_HAVE_CUDA
// Row loops past one pass of the grid: see gpu_ops_test_util.hpp (misaligned_copy).

TEST_F(GpuOps, EmbeddingForwardPacksMatchHostExactlyAndFallBack) {
  const index_t V = 1000, vocab_begin = 100;
  for (DType dt : kDtypes)
    for (index_t N : {index_t(1), index_t(37), index_t(8197)})
      for (index_t H : {index_t(768), index_t(1280), index_t(130)}) {
        const std::string what = "embedding_forward " + name(dt) + " N=" + std::to_string(N) +
                                 " H=" + std::to_string(H);
        const Tensor ids_host = random_ids(N, 0, 1200);  // some outside [100, 1100)
        const Tensor ids_dev = ids_host.to_device();
        const Pair table = input({V, H}, dt);
        Pair out = output({N, H}, dt);
        embedding_forward(ids_host, table.host, vocab_begin, out.host);
        embedding_forward(ids_dev, table.dev, vocab_begin, out.dev);
        expect_close(out, DType::F32, what);  // a copy: exact, any dtype
        EXPECT_TRUE(out.dev.to_doubles() == out.host.to_doubles()) << what << ": not exact";
        OffsetView out_off = offset_by_one({N, H}, dt);
        embedding_forward(ids_dev, table.dev, vocab_begin, out_off.view);
        EXPECT_TRUE(out_off.view.to_doubles() == out.host.to_doubles())
            << what << ": misaligned output (scalar kernel) differs";
      }
}

// Packed runs (H % V == 0, aligned) and the scalar kernel (odd H, or dout
// one element off a 16-byte boundary): in an fp32 table the host's bits,
// every call. 8192 tokens over 40 rows give runs of ~200, over 8192 rows
// runs of one to a few; 66000 tokens of
// 520-wide fp32 rows use more sorted positions than grid rows (65535);
// 2600-wide fp32 rows (650 packs) are split over two x blocks of 352
// threads, the last with idle threads.
TEST_F(GpuOps, EmbeddingBackwardPacksAreExactAndDeterministicAtModelShapes) {
  struct Case {
    DType dt;
    index_t N, H, V;
    int id_hi;
  };
  std::vector<Case> cases;
  for (DType dt : kDtypes)
    for (index_t H : {index_t(768), index_t(1280), index_t(130)})
      for (int id_hi : {50, 9000}) cases.push_back({dt, 8192, H, id_hi == 50 ? 40 : 8192, id_hi});
  cases.push_back({DType::F32, 66000, 520, 64, 70});
  cases.push_back({DType::F32, 4096, 2600, 40, 50});
  for (const Case& c : cases) {
    const std::string what = "embedding_backward " + name(c.dt) + " N=" + std::to_string(c.N) +
                             " H=" + std::to_string(c.H) + " V=" + std::to_string(c.V);
    const index_t vocab_begin = 5;
    const Tensor ids_host = random_ids(c.N, 0, c.id_hi), ids_dev = ids_host.to_device();
    const Pair dout = input({c.N, c.H}, c.dt), start = input({c.V, c.H}, DType::F32);
    Tensor host = start.host.clone();
    embedding_backward(ids_host, dout.host, vocab_begin, host);
    Tensor first = start.dev.clone(), second = start.dev.clone();
    embedding_backward(ids_dev, dout.dev, vocab_begin, first);
    embedding_backward(ids_dev, dout.dev, vocab_begin, second);
    const auto a = first.to_doubles();
    EXPECT_TRUE(a == second.to_doubles()) << what << ": two calls differ";
    EXPECT_TRUE(a == host.to_doubles()) << what << ": differs from the host";
    if (c.N == 8192 && c.H != 130) {
      OffsetView dout_off = misaligned_copy(dout.dev);
      Tensor scalar = start.dev.clone();
      embedding_backward(ids_dev, dout_off.view, vocab_begin, scalar);
      EXPECT_TRUE(scalar.to_doubles() == a) << what << ": scalar kernel differs";
      // Gradients in the storage dtype (rounded once per run, at the store).
      const Pair start_dt = input({c.V, c.H}, c.dt);
      Pair table_dt{start_dt.host.clone(), start_dt.dev.clone()};
      embedding_backward(ids_host, dout.host, vocab_begin, table_dt.host);
      embedding_backward(ids_dev, dout.dev, vocab_begin, table_dt.dev);
      expect_close(table_dt, c.dt, what + " into " + name(c.dt));
    }
  }
}
#endif

}  // namespace
}  // namespace meshtron::ops
