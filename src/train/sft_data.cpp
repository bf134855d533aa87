#include "train/sft_data.hpp"

#include <algorithm>
#include <numeric>

#include "common/error.hpp"
#include "data/numpy_random.hpp"

namespace meshtron {

namespace {

/// Cuts a decoder row to `limit` tokens: the context from the left, then
/// the target from the right. Returns whether it cut anything.
bool fit_decoder_row(SftExample& x, std::size_t limit) {
  std::size_t excess = x.context.size() + x.target.size();
  if (excess <= limit) return false;
  excess -= limit;
  const std::size_t from_context = std::min(excess, x.context.size());
  x.context.erase(x.context.begin(), x.context.begin() + std::ptrdiff_t(from_context));
  x.target.resize(x.target.size() - (excess - from_context));
  return true;
}

/// Cuts a T5 row's encoder input and labels from the right.
bool fit_t5_row(SftExample& x, std::size_t encoder_limit, std::size_t decoder_limit) {
  const bool cut = x.context.size() > encoder_limit || x.target.size() > decoder_limit;
  x.context.resize(std::min(x.context.size(), encoder_limit));
  x.target.resize(std::min(x.target.size(), decoder_limit));
  return cut;
}

/// Whether token k of a decoder row (context ++ target) is a scored target:
/// a target token, and not the row's first token (nothing predicts it).
bool scored(const SftExample& x, std::size_t k) {
  return k >= 1 && k >= x.context.size() && k < x.context.size() + x.target.size();
}

std::int32_t token_at(const SftExample& x, std::size_t k) {
  return k < x.context.size() ? x.context[k] : x.target[k - x.context.size()];
}

/// A T5 slot without a row: one real encoder and decoder token (a row of
/// padding only would leave attention no key), no label.
data::T5Sample empty_t5_sample(std::size_t se, std::size_t sd) {
  data::T5Sample x;
  x.enc_tokens.assign(se, 0);
  x.enc_mask.assign(se, 0);
  x.enc_mask[0] = 1;
  x.dec_in.assign(sd, 0);
  x.dec_mask.assign(sd, 0);
  x.dec_mask[0] = 1;
  x.labels.assign(sd, -100);
  return x;
}

}  // namespace

SftSamples::SftSamples(std::vector<SftExample> rows, index_t seq_length,
                       index_t decoder_seq_length, const std::string& where)
    : rows_(std::move(rows)), seq_length_(seq_length), decoder_seq_length_(decoder_seq_length) {
  for (SftExample& x : rows_) {
    const bool cut = t5() ? fit_t5_row(x, std::size_t(seq_length), std::size_t(decoder_seq_length))
                          : fit_decoder_row(x, std::size_t(seq_length) + 1);
    truncated_ += cut ? 1 : 0;
    if (t5()) {
      MESH_REQUIRE(!x.context.empty() && !x.target.empty(),
                   where << ":" << x.line << ": a T5 row needs an input and a target token");
      continue;
    }
    const std::size_t n = x.context.size() + x.target.size();
    MESH_REQUIRE(n >= 2 && scored(x, n - 1),
                 where << ":" << x.line << ": no completion token left to score (a row needs "
                       "one after its first token, within model.seq_length + 1 = "
                       << seq_length + 1 << " tokens)");
  }
}

data::T5Sample SftSamples::t5_sample(std::int64_t i) const {
  const auto se = std::size_t(seq_length_), sd = std::size_t(decoder_seq_length_);
  if (i < 0) return empty_t5_sample(se, sd);
  const SftExample& x = rows_[std::size_t(i)];
  data::T5Sample s;
  s.enc_tokens = x.context;
  s.enc_tokens.resize(se, 0);
  s.enc_mask.assign(se, 0);
  std::fill_n(s.enc_mask.begin(), x.context.size(), 1);
  s.labels = x.target;
  s.labels.resize(sd, -100);
  s.dec_mask.assign(sd, 0);
  std::fill_n(s.dec_mask.begin(), x.target.size(), 1);
  s.dec_in.assign(sd, 0);  // the decoder start and the padding: T5's pad id 0
  std::copy(x.target.begin(), x.target.end() - 1, s.dec_in.begin() + 1);
  return s;
}

MicroBatch SftSamples::micro_batch(const std::vector<std::int64_t>& rows,
                                   index_t sample_offset) const {
  if (t5()) {
    std::vector<data::T5Sample> samples;
    for (std::int64_t i : rows) samples.push_back(t5_sample(i));
    return t5_micro_batch(samples, sample_offset);
  }
  const index_t b = index_t(rows.size()), s = seq_length_;
  MicroBatch mb;
  mb.sample_offset = sample_offset;
  mb.unlabelled_targets = true;
  mb.ids = Tensor::zeros({s * b}, DType::I32);
  mb.targets = Tensor::empty({s * b}, DType::I32);
  auto* ids = mb.ids.data<std::int32_t>();
  auto* targets = mb.targets.data<std::int32_t>();
  std::fill_n(targets, s * b, -100);
  for (index_t j = 0; j < b; ++j) {
    if (rows[std::size_t(j)] < 0) continue;
    const SftExample& x = rows_[std::size_t(rows[std::size_t(j)])];
    const auto n = index_t(x.context.size() + x.target.size());
    for (index_t t = 0; t < std::min(n, s); ++t) ids[t * b + j] = token_at(x, std::size_t(t));
    for (index_t t = 0; t + 1 < n; ++t)
      if (scored(x, std::size_t(t + 1))) targets[t * b + j] = token_at(x, std::size_t(t + 1));
  }
  return mb;
}

MicroBatch with_loss_mask(MicroBatch mb) {
  const index_t n = mb.targets.numel();
  mb.loss_mask = Tensor::zeros({n}, DType::F32);
  auto* targets = mb.targets.data<std::int32_t>();
  for (index_t i = 0; i < n; ++i) {
    mb.loss_mask.data<float>()[i] = targets[i] == -100 ? 0.0f : 1.0f;
    if (targets[i] == -100) targets[i] = 0;
  }
  mb.unlabelled_targets = false;
  return mb;
}

std::vector<MicroBatch> sft_eval_batch(const SftSamples& samples, const DataLayout& l,
                                       std::int64_t first) {
  std::vector<MicroBatch> out;
  for (index_t m = 0; m < l.micro_batches(); ++m) {
    std::vector<std::int64_t> rows;
    for (index_t j = 0; j < l.micro_batch; ++j) {
      const std::int64_t i = first + l.sample_offset(m) + j;
      rows.push_back(i < samples.size() ? i : -1);
    }
    out.push_back(samples.micro_batch(rows, l.sample_offset(m)));
  }
  return out;
}

namespace {

class SftData final : public DataSource {
 public:
  SftData(const DataLayout& l, int vocab, std::shared_ptr<const SftSamples> train,
          std::shared_ptr<const SftSamples> valid)
      : l_(l), vocab_(vocab), train_(std::move(train)), valid_(std::move(valid)) {}

  std::vector<MicroBatch> train_step(long step) override {
    const std::int64_t first = std::int64_t(step - 1) * l_.global_batch;
    return batch(*train_, [&](std::int64_t i) { return training_row(first + i); });
  }
  std::vector<MicroBatch> eval_batch(long k) override {
    MESH_REQUIRE(valid_ != nullptr, "evaluation on data.source = jsonl needs data.valid_path");
    const std::int64_t first = std::int64_t(k) * l_.global_batch;
    return batch(*valid_, [&](std::int64_t i) { return (first + i) % valid_->size(); });
  }
  int vocab_size() const override { return vocab_; }

 private:
  /// This dp rank's micro-batches, slot i of the global batch holding row
  /// row_of(i).
  template <class RowOf>
  std::vector<MicroBatch> batch(const SftSamples& samples, const RowOf& row_of) const {
    std::vector<MicroBatch> out;
    for (index_t m = 0; m < l_.micro_batches(); ++m) {
      std::vector<std::int64_t> rows;
      for (index_t j = 0; j < l_.micro_batch; ++j) rows.push_back(row_of(l_.sample_offset(m) + j));
      out.push_back(samples.micro_batch(rows, l_.sample_offset(m)));
    }
    return out;
  }
  /// The training row of sample i of the run (the file comment's order).
  std::int64_t training_row(std::int64_t i) {
    const std::int64_t n = train_->size(), epoch = i / n;
    if (epoch != epoch_) {
      order_.resize(std::size_t(n));
      std::iota(order_.begin(), order_.end(), std::int64_t{0});
      data::NumpyLegacyRandom(std::uint32_t(l_.seed + std::uint64_t(epoch)))
          .shuffle(order_.data(), order_.size());
      epoch_ = epoch;
    }
    return order_[std::size_t(i % n)];
  }

  DataLayout l_;
  int vocab_;
  std::shared_ptr<const SftSamples> train_, valid_;
  std::int64_t epoch_ = -1;            ///< the epoch `order_` shuffles
  std::vector<std::int64_t> order_;
};

}  // namespace

std::unique_ptr<DataSource> make_sft_data(const DataLayout& layout, int vocab_size,
                                          std::shared_ptr<const SftSamples> train,
                                          std::shared_ptr<const SftSamples> valid) {
  return std::make_unique<SftData>(layout, vocab_size, std::move(train), std::move(valid));
}

}  // namespace meshtron
