// A tiny BERT (either layout) and one fixed micro-batch for the BertModel tests: s = 6,
// b = 2, sample 1's last two tokens padding, both token types, some labels
// -100, both next-sentence classes.
#pragma once

#include <cstdint>
#include <vector>

#include "model/bert_model.hpp"

namespace meshtron::bert_test {

constexpr index_t kSeq = 6, kBatch = 2;
constexpr int kVocab = 30;

/// MegatronBert's layout, or with `google` Google BERT's (post-norm blocks,
/// the embedding norm, no final norm).
inline ModelSpec tiny_spec(int tp = 1, bool google = false) {
  ModelSpec s = (google ? google_bert_spec : bert_spec)(/*layers=*/2, /*hidden=*/16, /*heads=*/2,
                                                        /*ffn=*/32, kVocab, int(kSeq),
                                                        /*max_positions=*/8,
                                                        /*num_token_types=*/2);
  s.padded_vocab_size = padded_vocab_size(kVocab, 4, tp);  // 32: rows past the vocabulary
  s.init_std = 0.3;  // large enough that every part moves the loss
  return s;
}

/// Values given per sample [b][s] become int32 [s*b] rows in [s, b] order.
inline Tensor sb_rows(const std::vector<std::vector<std::int32_t>>& per_sample) {
  Tensor t = Tensor::empty({kSeq * kBatch}, DType::I32);
  for (index_t i = 0; i < kBatch; ++i)
    for (index_t j = 0; j < kSeq; ++j)
      t.data<std::int32_t>()[j * kBatch + i] = per_sample[std::size_t(i)][std::size_t(j)];
  return t;
}

inline Tensor ints(const Shape& shape, const std::vector<std::int32_t>& v) {
  Tensor t = Tensor::empty(shape, DType::I32);
  for (std::size_t i = 0; i < v.size(); ++i) t.data<std::int32_t>()[i] = v[i];
  return t;
}

inline BertBatch tiny_batch() {
  BertBatch b;
  b.tokens = sb_rows({{2, 7, 11, 3, 19, 3}, {2, 5, 3, 23, 0, 0}});
  b.token_types = sb_rows({{0, 0, 0, 0, 1, 1}, {0, 0, 0, 1, 0, 0}});
  b.padding_mask = ints({kBatch, kSeq}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
  b.labels = sb_rows({{-100, 9, -100, -100, 29, -100}, {-100, 4, -100, 17, -100, -100}});
  b.next_sentence = ints({kBatch}, {1, 0});
  return b;
}

inline LayerContext context(TensorParallelGroup& tp) {
  LayerContext ctx{tp};
  ctx.seq_length = kSeq;
  ctx.micro_batch = kBatch;
  ctx.global_batch = kBatch;
  return ctx;
}

inline void zero_grads(BertModel& m) {
  for (Parameter* p : m.parameters()) p->grad.fill(0.0);
}

/// Loss of one forward, after which the gradients are those of one backward.
inline double loss_and_grads(BertModel& m, const BertBatch& batch, LayerContext& ctx) {
  zero_grads(m);
  BertModel::Cache cache;
  const double loss = m.forward(batch, ctx, cache);
  m.backward(ctx, cache);
  return loss;
}

}  // namespace meshtron::bert_test
