// Where a step's micro-batches come from: a Megatron-style indexed dataset
// (sample builder + pretraining sampler) or deterministic synthetic tokens.
// Either way, sample i of the run is the same on every decomposition, and a
// dp rank reads only its own micro-batches.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/stage_model.hpp"
#include "tensor/tensor.hpp"

namespace meshtron {

struct RunConfig;
namespace data {
class GptDataset;
struct BertSample;
class BertSamples;
struct T5Sample;
class T5Samples;
struct SpecialTokens;
}

/// tokens [b, s+1] (sample-major, as read) -> ids / targets in [s, b] order.
MicroBatch to_seq_major(const Tensor& tokens, index_t sample_offset);
/// BERT samples (each [s]) -> a micro-batch in [s, b] order: ids = tokens,
/// targets = labels, token types, padding mask [b, s], next_sentence =
/// is_random.
MicroBatch bert_micro_batch(const std::vector<data::BertSample>& samples, index_t sample_offset);
/// T5 samples -> a micro-batch in [s, b] order: ids = encoder tokens
/// [s_enc * b], padding_mask = the encoder's [b, s_enc], decoder_ids
/// [s_dec * b], decoder_padding_mask [b, s_dec], targets = labels (-100 on
/// the decoder's padding).
MicroBatch t5_micro_batch(const std::vector<data::T5Sample>& samples, index_t sample_offset);

class DataSource {
 public:
  virtual ~DataSource() = default;
  /// This dp rank's micro-batches of training step `step` (1-based).
  virtual std::vector<MicroBatch> train_step(long step) = 0;
  /// This dp rank's micro-batches of evaluation batch `k` (valid split).
  virtual std::vector<MicroBatch> eval_batch(long k) = 0;
  /// Vocabulary size of the tokens.
  virtual int vocab_size() const = 0;
};

struct DataLayout {
  index_t seq_length, micro_batch, global_batch;
  int dp_rank, dp_size;
  long train_iters, eval_batches;
  std::uint64_t seed;
  index_t decoder_seq_length = 0;  ///< T5 only (seq_length is the encoder's)
  /// Micro-batch m of this dp rank starts at sample m * mbs * dp + rank * mbs
  /// of the step (Megatron's MegatronPretrainingSampler).
  index_t sample_offset(index_t m) const {
    return m * micro_batch * dp_size + dp_rank * micro_batch;
  }
  index_t micro_batches() const { return global_batch / (micro_batch * dp_size); }
};

/// Tokens hash(seed, sample, position) % vocab: for tests and smoke runs.
std::unique_ptr<DataSource> make_synthetic_data(const DataLayout& layout, int vocab_size);
/// The indexed dataset at run.data.path, split by run.data.split.
std::unique_ptr<DataSource> make_indexed_data(const RunConfig& run, const DataLayout& layout,
                                              int vocab_size);
/// model.arch = bert: random BERT batches (tokens, a two-segment split,
/// padding, 15 % labels, binary labels) hashed from (seed, sample): for tests.
std::unique_ptr<DataSource> make_synthetic_bert_data(const DataLayout& layout, int vocab_size);
/// model.arch = bert: Megatron's BERT samples (data::BertSamples, its
/// defaults) over the documents of run.data.path (a --split-sentences
/// dataset) split by run.data.split, the special ids `special`.
std::unique_ptr<DataSource> make_indexed_bert_data(const RunConfig& run, const DataLayout& layout,
                                                   const data::SpecialTokens& special);
/// Megatron's BERT samples over split `split` (0 train, 1 valid, 2 test)
/// of run.data.split of run.data.path: at least num_samples (<= 0: one
/// epoch); null for a split without documents.
std::unique_ptr<data::BertSamples> bert_split_samples(const RunConfig& run, int split,
                                                      std::int64_t num_samples,
                                                      const data::SpecialTokens& special);
/// This dp rank's micro-batches of the batch of `layout.global_batch`
/// samples from `first` (Megatron's sampler).
std::vector<MicroBatch> bert_batch(const data::BertSamples& samples, const DataLayout& layout,
                                   std::int64_t first);

/// model.arch = t5: random T5 batches (encoder tokens and padding, decoder
/// inputs from the pad id, labels, decoder padding) hashed from (seed,
/// sample), of layout.seq_length / layout.decoder_seq_length: for tests.
std::unique_ptr<DataSource> make_synthetic_t5_data(const DataLayout& layout, int vocab_size);
/// model.arch = t5: Megatron's T5 span-corruption samples (data::T5Samples,
/// its defaults; encoder and decoder lengths from the layout) over the
/// documents of run.data.path (a --split-sentences dataset) split by
/// run.data.split, the special ids `special` (data::t5_special_tokens).
std::unique_ptr<DataSource> make_indexed_t5_data(const RunConfig& run, const DataLayout& layout,
                                                 const data::SpecialTokens& special);
/// Megatron's T5 samples over split `split`, as bert_split_samples.
std::unique_ptr<data::T5Samples> t5_split_samples(const RunConfig& run, int split,
                                                  std::int64_t num_samples,
                                                  const data::SpecialTokens& special);
/// This dp rank's micro-batches of the batch from `first`, as bert_batch.
std::vector<MicroBatch> t5_batch(const data::T5Samples& samples, const DataLayout& layout,
                                 std::int64_t first);

}  // namespace meshtron
