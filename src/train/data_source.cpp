#include "train/data_source.hpp"

#include <type_traits>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "config/run_config.hpp"
#include "data/bert_samples.hpp"
#include "data/gpt_dataset.hpp"
#include "data/pretraining_sampler.hpp"
#include "data/t5_samples.hpp"

namespace meshtron {

MicroBatch to_seq_major(const Tensor& tokens, index_t sample_offset) {
  const index_t b = tokens.dim(0), s = tokens.dim(1) - 1;
  MicroBatch mb;
  mb.ids = Tensor::empty({s * b}, DType::I32);
  mb.targets = Tensor::empty({s * b}, DType::I32);
  mb.sample_offset = sample_offset;
  const auto* t = tokens.data<std::int32_t>();
  auto* ids = mb.ids.data<std::int32_t>();
  auto* targets = mb.targets.data<std::int32_t>();
  for (index_t j = 0; j < b; ++j)
    for (index_t i = 0; i < s; ++i) {
      ids[i * b + j] = t[j * (s + 1) + i];
      targets[i * b + j] = t[j * (s + 1) + i + 1];
    }
  return mb;
}

MicroBatch bert_micro_batch(const std::vector<data::BertSample>& samples, index_t sample_offset) {
  const auto b = index_t(samples.size()), s = index_t(samples.front().tokens.size());
  MicroBatch mb;
  mb.sample_offset = sample_offset;
  mb.ids = Tensor::empty({s * b}, DType::I32);
  mb.targets = Tensor::empty({s * b}, DType::I32);
  mb.token_types = Tensor::empty({s * b}, DType::I32);
  mb.padding_mask = Tensor::empty({b, s}, DType::I32);
  mb.next_sentence = Tensor::empty({b}, DType::I32);
  for (index_t j = 0; j < b; ++j) {
    const data::BertSample& x = samples[std::size_t(j)];
    for (index_t i = 0; i < s; ++i) {
      const auto k = std::size_t(i);
      mb.ids.data<std::int32_t>()[i * b + j] = x.tokens[k];
      mb.targets.data<std::int32_t>()[i * b + j] = x.labels[k];
      mb.token_types.data<std::int32_t>()[i * b + j] = x.token_types[k];
      mb.padding_mask.data<std::int32_t>()[j * s + i] = x.padding_mask[k];
    }
    mb.next_sentence.data<std::int32_t>()[j] = x.is_random;
  }
  return mb;
}

MicroBatch t5_micro_batch(const std::vector<data::T5Sample>& samples, index_t sample_offset) {
  const auto b = index_t(samples.size());
  const auto se = index_t(samples.front().enc_tokens.size());
  const auto sd = index_t(samples.front().dec_in.size());
  MicroBatch mb;
  mb.sample_offset = sample_offset;
  mb.ids = Tensor::empty({se * b}, DType::I32);
  mb.padding_mask = Tensor::empty({b, se}, DType::I32);
  mb.decoder_ids = Tensor::empty({sd * b}, DType::I32);
  mb.decoder_padding_mask = Tensor::empty({b, sd}, DType::I32);
  mb.targets = Tensor::empty({sd * b}, DType::I32);
  for (index_t j = 0; j < b; ++j) {
    const data::T5Sample& x = samples[std::size_t(j)];
    for (index_t i = 0; i < se; ++i) {
      mb.ids.data<std::int32_t>()[i * b + j] = x.enc_tokens[std::size_t(i)];
      mb.padding_mask.data<std::int32_t>()[j * se + i] = x.enc_mask[std::size_t(i)];
    }
    for (index_t i = 0; i < sd; ++i) {
      mb.decoder_ids.data<std::int32_t>()[i * b + j] = x.dec_in[std::size_t(i)];
      mb.decoder_padding_mask.data<std::int32_t>()[j * sd + i] = x.dec_mask[std::size_t(i)];
      mb.targets.data<std::int32_t>()[i * b + j] = x.labels[std::size_t(i)];
    }
  }
  return mb;
}

namespace {

MicroBatch micro_batch_of(const std::vector<data::BertSample>& samples, index_t offset) {
  return bert_micro_batch(samples, offset);
}
MicroBatch micro_batch_of(const std::vector<data::T5Sample>& samples, index_t offset) {
  return t5_micro_batch(samples, offset);
}

/// This dp rank's micro-batches of the batch from `first` of a sentence
/// sample builder (BertSamples, T5Samples), through Megatron's sampler.
template <class Samples>
std::vector<MicroBatch> sampled_batch(const Samples& set, const DataLayout& l, std::int64_t first) {
  data::PretrainingSampler sampler(set.size(), 0, l.global_batch, l.micro_batch, l.dp_rank,
                                   l.dp_size);
  std::vector<MicroBatch> out;
  for (index_t m = 0; m < l.micro_batches(); ++m) {
    std::vector<decltype(set.sample(0))> samples;
    for (std::int64_t i : sampler.micro_batch(first, m)) samples.push_back(set.sample(i));
    out.push_back(micro_batch_of(samples, l.sample_offset(m)));
  }
  return out;
}

/// The documents [first, end) of split k (0 train, 1 valid) of `split`.
std::pair<std::int64_t, std::int64_t> split_documents(const std::string& split, std::int64_t n,
                                                      int k) {
  const auto bounds = data::split_boundaries(split, n);
  return {bounds[std::size_t(k)], bounds[std::size_t(k) + 1]};
}

/// The key of sample `sample` (its index in the global batch) of synthetic
/// batch `stream` (train step s: 2s, eval batch k: 2k + 1): no rank in it,
/// so the data do not depend on the decomposition.
std::uint64_t synthetic_key(const DataLayout& l, long stream, index_t sample) {
  return splitmix64(l.seed ^ splitmix64(std::uint64_t(stream) * l.global_batch + std::uint64_t(sample)));
}

/// This dp rank's micro-batches of synthetic sentence batch `stream` (BERT,
/// T5), each sample `make_sample(its synthetic_key)`.
template <class MakeSample>
std::vector<MicroBatch> synthetic_batch(const DataLayout& l, long stream,
                                        const MakeSample& make_sample) {
  std::vector<MicroBatch> out;
  for (index_t m = 0; m < l.micro_batches(); ++m) {
    const index_t first = l.sample_offset(m);
    std::vector<decltype(make_sample(std::uint64_t{}))> samples;
    for (index_t j = 0; j < l.micro_batch; ++j)
      samples.push_back(make_sample(synthetic_key(l, stream, first + j)));
    out.push_back(micro_batch_of(samples, first));
  }
  return out;
}

/// The synthetic sources' common part: train step s is batch stream 2s,
/// evaluation batch k stream 2k + 1 (synthetic_key's convention), each
/// stream's batch made by the family's batch().
class SyntheticSource : public DataSource {
 public:
  SyntheticSource(const DataLayout& l, int vocab) : l_(l), vocab_(vocab) {}
  std::vector<MicroBatch> train_step(long step) final { return batch(2 * step); }
  std::vector<MicroBatch> eval_batch(long k) final { return batch(2 * k + 1); }
  int vocab_size() const final { return vocab_; }

 protected:
  virtual std::vector<MicroBatch> batch(long stream) const = 0;
  DataLayout l_;
  int vocab_;
};

class SyntheticBertData final : public SyntheticSource {
 public:
  using SyntheticSource::SyntheticSource;

 private:
  std::vector<MicroBatch> batch(long stream) const override {
    return synthetic_batch(l_, stream, [this](std::uint64_t key) { return sample(key); });
  }
  /// Real tokens up to a length in [s/2, s], segment B from the middle, a
  /// label on token 1 and on about 15 % of the others.
  data::BertSample sample(std::uint64_t key) const {
    const auto s = std::size_t(l_.seq_length);
    const std::size_t real = s - std::size_t(splitmix64(key) % (s / 2 + 1));
    data::BertSample x;
    x.is_random = std::int32_t(splitmix64(key + 1) % 2);
    for (std::size_t i = 0; i < s; ++i) {
      const std::uint64_t h = splitmix64(key + 2 + i);
      const bool live = i < real;
      x.tokens.push_back(live ? std::int32_t(h % std::uint64_t(vocab_)) : 0);
      x.token_types.push_back(live && i >= real / 2 ? 1 : 0);
      x.padding_mask.push_back(live ? 1 : 0);
      const bool labelled = live && (i == 1 || (h >> 32) % 100 < 15);  // never none
      x.labels.push_back(labelled ? std::int32_t((h >> 16) % std::uint64_t(vocab_)) : -100);
    }
    return x;
  }
};

/// The training and validation splits of a sentence sample builder
/// (BertSamples, T5Samples): `make_split(split, num_samples)` gives split
/// `split`'s samples or null.
template <class Samples>
class IndexedSentenceData final : public DataSource {
 public:
  template <class MakeSplit>
  IndexedSentenceData(const RunConfig& run, const DataLayout& l, int vocab, MakeSplit make_split)
      : l_(l), vocab_(vocab), path_(run.data.path) {
    sets_[0] = make_split(0, std::int64_t(l.train_iters) * l.global_batch);
    sets_[1] = make_split(1, std::int64_t(std::max<long>(l.eval_batches, 1)) * l.global_batch);
    MESH_REQUIRE(sets_[0] != nullptr, "data.split '" << run.data.split
                                                     << "' leaves no training documents");
  }
  std::vector<MicroBatch> train_step(long step) override {
    return checked(sampled_batch(*sets_[0], l_, (step - 1) * l_.global_batch));
  }
  std::vector<MicroBatch> eval_batch(long k) override {
    MESH_REQUIRE(sets_[1] != nullptr, "evaluation needs a validation split (data.split)");
    return checked(
        sampled_batch(*sets_[1], l_, (k % std::max<long>(l_.eval_batches, 1)) * l_.global_batch));
  }
  int vocab_size() const override { return vocab_; }

 private:
  /// T5: every encoder and decoder id a real one of the model's vocabulary
  /// (a dataset of another tokenizer would index past the embedding; the
  /// device kernels do not check), as IndexedData checks GPT's tokens.
  std::vector<MicroBatch> checked(std::vector<MicroBatch> batch) const {
    if constexpr (std::is_same_v<Samples, data::T5Samples>)
      for (const MicroBatch& mb : batch)
        for (const Tensor* ids : {&mb.ids, &mb.decoder_ids})
          for (index_t i = 0; i < ids->numel(); ++i) {
            const std::int32_t id = ids->data<std::int32_t>()[i];
            MESH_VERIFY(id >= 0 && id < vocab_,
                        "data.path " << path_ << ": a T5 sample holds token id " << id
                                     << ", outside the model's vocabulary [0, " << vocab_ << ")");
          }
    return batch;
  }
  DataLayout l_;
  int vocab_;
  std::string path_;
  std::array<std::unique_ptr<Samples>, 2> sets_;
};

/// Random T5 micro-batches: encoder tokens up to a length in [s/2, s]
/// (padded with 0), a decoder of 2 to s_dec real tokens starting from 0 (the
/// pad id, T5's decoder start), a label on each real decoder position.
class SyntheticT5Data final : public SyntheticSource {
 public:
  SyntheticT5Data(const DataLayout& l, int vocab) : SyntheticSource(l, vocab) {
    MESH_REQUIRE(l.decoder_seq_length > 1, "synthetic T5 data: decoder length "
                                               << l.decoder_seq_length << " is below 2");
  }

 private:
  std::vector<MicroBatch> batch(long stream) const override {
    return synthetic_batch(l_, stream, [this](std::uint64_t key) { return sample(key); });
  }
  std::int32_t token(std::uint64_t h) const { return std::int32_t(h % std::uint64_t(vocab_)); }
  data::T5Sample sample(std::uint64_t key) const {
    const auto se = std::size_t(l_.seq_length), sd = std::size_t(l_.decoder_seq_length);
    const std::size_t enc_real = se - std::size_t(splitmix64(key) % (se / 2 + 1));
    const std::size_t dec_real = 2 + std::size_t(splitmix64(key + 1) % (sd - 1));
    data::T5Sample x;
    for (std::size_t i = 0; i < se; ++i) {
      const bool live = i < enc_real;
      x.enc_tokens.push_back(live ? token(splitmix64(key + 2 + i)) : 0);
      x.enc_mask.push_back(live ? 1 : 0);
    }
    for (std::size_t i = 0; i < sd; ++i) {
      const bool live = i < dec_real;
      const std::uint64_t h = splitmix64(key + 2 + se + i);
      x.dec_in.push_back(live && i > 0 ? token(h) : 0);
      x.dec_mask.push_back(live ? 1 : 0);
      x.labels.push_back(live ? token(h >> 16) : -100);
    }
    return x;
  }
};

class SyntheticData final : public SyntheticSource {
 public:
  using SyntheticSource::SyntheticSource;

 private:
  std::vector<MicroBatch> batch(long stream) const override {
    std::vector<MicroBatch> out;
    const index_t s1 = l_.seq_length + 1;
    for (index_t m = 0; m < l_.micro_batches(); ++m) {
      const index_t first = l_.sample_offset(m);
      Tensor tokens = Tensor::empty({l_.micro_batch, s1}, DType::I32);
      for (index_t j = 0; j < l_.micro_batch; ++j) {
        const std::uint64_t key = synthetic_key(l_, stream, first + j);
        for (index_t i = 0; i < s1; ++i)
          tokens.data<std::int32_t>()[j * s1 + i] = std::int32_t(splitmix64(key + i) % vocab_);
      }
      out.push_back(to_seq_major(tokens, first));
    }
    return out;
  }
};

class IndexedData final : public DataSource {
 public:
  IndexedData(const RunConfig& run, const DataLayout& l, int vocab)
      : l_(l), vocab_(vocab), path_(run.data.path) {
    auto indexed = std::make_shared<data::IndexedDataset>(run.data.path);
    data::GptDatasetConfig cfg;
    cfg.seq_length = l.seq_length;
    cfg.seed = std::uint32_t(l.seed);
    cfg.split = run.data.split;
    const std::array<std::int64_t, 3> samples = {
        std::int64_t(l.train_iters) * l.global_batch,
        std::int64_t(std::max<long>(l.eval_batches, 1)) * l.global_batch, 0};
    auto sets = data::build_gpt_datasets(indexed, samples, cfg);
    train_ = std::move(sets[0]);
    valid_ = std::move(sets[1]);
    MESH_REQUIRE(train_ != nullptr, "data.split '" << run.data.split
                                                   << "' leaves no training documents");
  }
  std::vector<MicroBatch> train_step(long step) override {
    return batch(*train_, (step - 1) * l_.global_batch);
  }
  std::vector<MicroBatch> eval_batch(long k) override {
    MESH_REQUIRE(valid_ != nullptr, "evaluation needs a validation split (data.split)");
    return batch(*valid_, (k % std::max<long>(l_.eval_batches, 1)) * l_.global_batch);
  }
  int vocab_size() const override { return vocab_; }

 private:
  std::vector<MicroBatch> batch(const data::GptDataset& set, std::int64_t step_start) {
    data::PretrainingSampler sampler(set.size(), 0, l_.global_batch, l_.micro_batch,
                                     l_.dp_rank, l_.dp_size);
    std::vector<MicroBatch> out;
    for (index_t m = 0; m < l_.micro_batches(); ++m) {
      const auto indices = sampler.micro_batch(step_start, m);
      Tensor tokens = Tensor::empty({l_.micro_batch, l_.seq_length + 1}, DType::I32);
      for (std::size_t j = 0; j < indices.size(); ++j) {
        std::int32_t* sample = tokens.data<std::int32_t>() + j * (l_.seq_length + 1);
        set.sample(indices[j], sample);
        check_tokens(sample, l_.seq_length + 1, indices[j]);
      }
      out.push_back(to_seq_major(tokens, l_.sample_offset(m)));
    }
    return out;
  }
  /// Every token a real one of the model's vocabulary: the ids index the
  /// embedding and the targets the logits (the device kernels do not check).
  void check_tokens(const std::int32_t* sample, index_t n, std::int64_t index) const {
    for (index_t i = 0; i < n; ++i)
      MESH_VERIFY(sample[i] >= 0 && sample[i] < vocab_,
                  "data.path " << path_ << ": sample " << index << " holds token id "
                               << sample[i] << ", outside the model's vocabulary [0, "
                               << vocab_ << ")");
  }
  DataLayout l_;
  int vocab_;
  std::string path_;
  std::unique_ptr<data::GptDataset> train_, valid_;
};

}  // namespace

std::unique_ptr<DataSource> make_synthetic_data(const DataLayout& layout, int vocab_size) {
  return std::make_unique<SyntheticData>(layout, vocab_size);
}

std::unique_ptr<DataSource> make_indexed_data(const RunConfig& run, const DataLayout& layout,
                                              int vocab_size) {
  return std::make_unique<IndexedData>(run, layout, vocab_size);
}

std::unique_ptr<DataSource> make_synthetic_bert_data(const DataLayout& layout, int vocab_size) {
  return std::make_unique<SyntheticBertData>(layout, vocab_size);
}

std::unique_ptr<DataSource> make_indexed_bert_data(const RunConfig& run, const DataLayout& layout,
                                                   const data::SpecialTokens& special) {
  return std::make_unique<IndexedSentenceData<data::BertSamples>>(
      run, layout, int(special.vocab_size), [&](int split, std::int64_t n) {
        return bert_split_samples(run, split, n, special);
      });
}

std::unique_ptr<DataSource> make_synthetic_t5_data(const DataLayout& layout, int vocab_size) {
  return std::make_unique<SyntheticT5Data>(layout, vocab_size);
}

std::unique_ptr<DataSource> make_indexed_t5_data(const RunConfig& run, const DataLayout& layout,
                                                 const data::SpecialTokens& special) {
  return std::make_unique<IndexedSentenceData<data::T5Samples>>(
      run, layout, int(special.vocab_size), [&](int split, std::int64_t n) {
        return t5_split_samples(run, split, n, special);
      });
}

namespace {

/// A sentence sample builder over split `split` of run.data.path, or null
/// for a split without documents.
template <class Samples, class Config>
std::unique_ptr<Samples> split_samples(const RunConfig& run, int split, std::int64_t num_samples,
                                       const Config& cfg, const data::SpecialTokens& special) {
  auto indexed = std::make_shared<data::IndexedDataset>(run.data.path);
  const auto [first, end] = split_documents(run.data.split, indexed->num_documents(), split);
  if (end <= first) return nullptr;
  return std::make_unique<Samples>(indexed, first, end, num_samples, cfg, special);
}

}  // namespace

std::unique_ptr<data::BertSamples> bert_split_samples(const RunConfig& run, int split,
                                                      std::int64_t num_samples,
                                                      const data::SpecialTokens& special) {
  data::BertSamplesConfig cfg;
  cfg.seq_length = run.model.seq_length;
  cfg.seed = std::uint32_t(run.run.seed);
  return split_samples<data::BertSamples>(run, split, num_samples, cfg, special);
}

std::unique_ptr<data::T5Samples> t5_split_samples(const RunConfig& run, int split,
                                                  std::int64_t num_samples,
                                                  const data::SpecialTokens& special) {
  data::T5SamplesConfig cfg;
  cfg.encoder_seq_length = run.model.seq_length;
  cfg.decoder_seq_length = run.model.decoder_seq_length;
  cfg.seed = std::uint32_t(run.run.seed);
  return split_samples<data::T5Samples>(run, split, num_samples, cfg, special);
}

std::vector<MicroBatch> bert_batch(const data::BertSamples& set, const DataLayout& l,
                                   std::int64_t first) {
  return sampled_batch(set, l, first);
}

std::vector<MicroBatch> t5_batch(const data::T5Samples& set, const DataLayout& l,
                                 std::int64_t first) {
  return sampled_batch(set, l, first);
}

}  // namespace meshtron
