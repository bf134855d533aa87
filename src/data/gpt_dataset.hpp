// GPT training samples, built as Megatron-LM's GPTDataset builds them
// (megatron/data/gpt_dataset.py with its C++ helper build_sample_idx; the
// same arithmetic lives on in megatron.core.datasets.gpt_dataset).
//
// 1. Split. The sequences of the indexed dataset are cut into contiguous
//    train / valid / test ranges by a "969,30,1" string (split_boundaries).
//    As in Megatron, each *sequence* of the indexed dataset is one GPT
//    "document"; preprocessing without sentence splitting writes one
//    sequence per document, so the two coincide.
// 2. doc_idx. Enough epochs over the split's documents to give the requested
//    number of samples, each epoch a shuffled copy of the document list
//    (the last epoch shuffled separately when it is used for less than 80%).
// 3. sample_idx. Concatenating the documents in doc_idx order gives one token
//    stream; sample j is the window stream[j*s, j*s + s + 1) (s = seq_length),
//    so consecutive samples share one token and windows cross document
//    boundaries. sample_idx[j] = (position in doc_idx, offset in document)
//    of the window's first token.
// 4. shuffle_idx. A permutation of the samples (the samples of a separated
//    last epoch shuffled among themselves, after the others).
//
// Randomness: std::mt19937 seeded with `seed` and the bounded draw of
// numpy's legacy RandomState.shuffle, so doc_idx and shuffle_idx equal
// Megatron-LM's `np.random.RandomState(seed)` shuffles bit for bit, on
// every platform (the engine's output is fixed by the C++ standard; no
// std::shuffle or std::uniform_int_distribution).
//
// Cache. The three arrays are saved as .npy next to the data prefix (or in
// cache_dir) under a name holding a hash of every parameter that determines
// them (split range, seq_length, num_samples, seed and a fingerprint of the
// sequence lengths) and reused when present and consistent; new parameters
// give a new name, a corrupt or mismatching cache is rebuilt. Files are
// written atomically, so ranks that build the same cache at once are safe.
// Nothing here depends on the number of ranks.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/indexed_dataset.hpp"
#include "tensor/tensor.hpp"

namespace meshtron::data {

enum class Split : int { Train = 0, Valid = 1, Test = 2 };
const char* split_name(Split split);

struct GptDatasetConfig {
  std::int64_t seq_length = 1024;
  std::uint32_t seed = 1234;       ///< numpy RandomState seeds are 32-bit
  std::string split = "969,30,1";  ///< weights, ',' or '/' separated
  std::string cache_dir;           ///< empty: next to the data prefix
  bool use_cache = true;
};

/// Megatron's get_train_valid_test_split_: document boundaries
/// {0, end_train, end_valid, num_documents} for weights like "969,30,1"
/// (1 to 3 non-negative numbers, missing ones 0). Each range is
/// round(weight / sum * n) (round half to even, as Python's round), then all
/// boundaries shift so that the last one is n. Throws UserError on a bad
/// string.
std::array<std::int64_t, 4> split_boundaries(const std::string& split,
                                             std::int64_t num_documents);

/// The (train, valid, test) weights of a split string like "969,30,1",
/// normalised to sum 1. Throws UserError on a bad string.
std::vector<double> split_weights(const std::string& split);

/// One micro-batch for the model: inputs and next-token labels.
struct GptMicroBatch {
  Tensor tokens;  ///< [micro_batch, seq_length] int32: sample tokens [0, s)
  Tensor labels;  ///< [micro_batch, seq_length] int32: sample tokens [1, s+1)
};

class GptDataset {
 public:
  /// Samples over documents (= sequences) [first_document, end_document) of
  /// `data`; at least `num_samples` of them (more when the last epoch is not
  /// separated, as in Megatron). Throws UserError when samples are asked of
  /// a split without tokens.
  GptDataset(std::shared_ptr<const IndexedDataset> data, Split split,
             std::int64_t first_document, std::int64_t end_document,
             std::int64_t num_samples, const GptDatasetConfig& config);

  /// Number of samples available (Megatron's len(dataset)).
  std::int64_t size() const { return std::int64_t(shuffle_idx_.size()); }
  std::int64_t seq_length() const { return seq_length_; }
  Split split() const { return split_; }

  /// Sample i (after shuffling): seq_length + 1 tokens into `out`.
  void sample(std::int64_t i, std::int32_t* out) const;
  std::vector<std::int32_t> sample(std::int64_t i) const;
  /// Stacks the samples `sample_indices` into inputs and labels.
  GptMicroBatch micro_batch(std::span<const std::int64_t> sample_indices) const;

  // The index arrays, for inspection and tests.
  const std::vector<std::int32_t>& doc_idx() const { return doc_idx_; }
  /// (size()+1) x 2, row-major: (position in doc_idx, token offset).
  const std::vector<std::int32_t>& sample_idx() const { return sample_idx_; }
  const std::vector<std::uint32_t>& shuffle_idx() const { return shuffle_idx_; }

  /// True when the index arrays came from the cache files.
  bool loaded_from_cache() const { return loaded_from_cache_; }
  /// True when the cache files were written by this object.
  bool wrote_cache() const { return wrote_cache_; }
  /// Common start of the cache file names ("" when caching is off).
  const std::string& cache_stem() const { return cache_stem_; }

 private:
  std::string description() const;
  bool load_cache(const std::string& description);
  void save_cache(const std::string& description);
  bool indices_consistent() const;
  void build_indices();

  std::shared_ptr<const IndexedDataset> data_;
  Split split_;
  std::int64_t first_document_, end_document_;
  std::int64_t num_samples_;
  std::int64_t seq_length_;
  std::uint32_t seed_;

  std::vector<std::int32_t> doc_idx_;
  std::vector<std::int32_t> sample_idx_;
  std::vector<std::uint32_t> shuffle_idx_;
  std::string cache_stem_;
  bool loaded_from_cache_ = false;
  bool wrote_cache_ = false;
};

/// Train, valid and test datasets of `data` split by config.split, with
/// num_samples[k] samples each; an empty split gives nullptr (as Megatron's
/// None).
std::array<std::unique_ptr<GptDataset>, 3> build_gpt_datasets(
    std::shared_ptr<const IndexedDataset> data,
    const std::array<std::int64_t, 3>& num_samples, const GptDatasetConfig& config);

}  // namespace meshtron::data
