// A tiny T5 and one fixed micro-batch for the T5Model tests: s_enc = 6,
// s_dec = 4 (both even: sequence parallelism on tp 2), b = 2; encoder
// sample 1's last two tokens padding, decoder sample 1's last token
// padding (and unlabelled), some labels -100. Four heads of d_kv = 3
// (inner 12 != d_model 16); 8 buckets over a max distance of 5, so the
// encoder's bias has both exact and logarithmic buckets.
#pragma once

#include <cstdint>
#include <vector>

#include "model/t5_model.hpp"

namespace meshtron::t5_test {

constexpr index_t kEncSeq = 6, kDecSeq = 4, kBatch = 2;
constexpr int kVocab = 30;

/// v1.0 (ReLU, tied head) or v1.1 (gated gelu_new, untied head).
inline ModelSpec tiny_spec(bool v11, int tp = 1) {
  ModelSpec s = t5_spec(/*encoder_layers=*/2, /*decoder_layers=*/2, /*d_model=*/16, /*heads=*/4,
                        /*d_kv=*/3, /*d_ff=*/20, v11 ? Activation::GegluTanh : Activation::Relu,
                        /*tie_word_embeddings=*/!v11, kVocab, int(kEncSeq), int(kDecSeq),
                        /*buckets=*/8, /*max_distance=*/5);
  s.padded_vocab_size = padded_vocab_size(kVocab, 4, tp);  // 32: rows past the vocabulary
  return s;
}

/// Values given per sample [b][s] become int32 [s*b] rows in [s, b] order.
inline Tensor sb_rows(const std::vector<std::vector<std::int32_t>>& per_sample) {
  const index_t b = index_t(per_sample.size()), s = index_t(per_sample[0].size());
  Tensor t = Tensor::empty({s * b}, DType::I32);
  for (index_t i = 0; i < b; ++i)
    for (index_t j = 0; j < s; ++j)
      t.data<std::int32_t>()[j * b + i] = per_sample[std::size_t(i)][std::size_t(j)];
  return t;
}

inline Tensor ints(const Shape& shape, const std::vector<std::int32_t>& v) {
  Tensor t = Tensor::empty(shape, DType::I32);
  for (std::size_t i = 0; i < v.size(); ++i) t.data<std::int32_t>()[i] = v[i];
  return t;
}

inline T5Batch tiny_batch() {
  T5Batch b;
  b.encoder_ids = sb_rows({{5, 7, 11, 3, 19, 1}, {8, 5, 3, 1, 0, 0}});
  b.encoder_mask = ints({kBatch, kEncSeq}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
  b.decoder_ids = sb_rows({{0, 9, 4, 29}, {0, 17, 6, 0}});
  b.decoder_mask = ints({kBatch, kDecSeq}, {1, 1, 1, 1, 1, 1, 1, 0});
  b.labels = sb_rows({{9, 4, 29, 1}, {17, -100, 6, -100}});
  return b;
}

inline LayerContext context(TensorParallelGroup& tp) {
  LayerContext ctx{tp};
  ctx.micro_batch = kBatch;
  ctx.global_batch = kBatch;
  ctx.seed = 11;
  return ctx;
}

inline void zero_grads(T5Model& m) {
  for (Parameter* p : m.parameters()) p->grad.fill(0.0);
}

/// Loss of one forward, after which the gradients are those of one backward.
inline double loss_and_grads(T5Model& m, const T5Batch& batch, LayerContext& ctx,
                             T5Model::Cache* kept = nullptr) {
  zero_grads(m);
  T5Model::Cache local;
  T5Model::Cache& cache = kept ? *kept : local;
  const double loss = m.forward(batch, ctx, cache);
  m.backward(ctx, cache);
  return loss;
}

}  // namespace meshtron::t5_test
