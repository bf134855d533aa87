#include "data/gpt_dataset.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "common/error.hpp"
#include "data/npy_file.hpp"
#include "data/numpy_random.hpp"

namespace meshtron::data {

namespace {

// ---------------------------------------------------------------- epochs ---

/// Megatron's _num_epochs: the fewest epochs whose tokens give num_samples
/// windows of seq_length + 1 tokens overlapping by one.
std::int64_t num_epochs_for(std::int64_t tokens_per_epoch, std::int64_t seq_length,
                            std::int64_t num_samples) {
  std::int64_t epochs = 0, tokens = 0;
  do {
    ++epochs;
    tokens += tokens_per_epoch;
  } while ((tokens - 1) / seq_length < num_samples);
  return epochs;
}

/// Megatron separates the last epoch (shuffles it on its own, after the
/// others) when fewer than 80% of its samples are needed, so that the
/// samples used come from the earlier epochs' full permutation.
bool separate_last_epoch(std::int64_t num_epochs, std::int64_t tokens_per_epoch,
                         std::int64_t seq_length, std::int64_t num_samples) {
  if (num_epochs == 1) return false;
  const std::int64_t samples_before_last =
      ((num_epochs - 1) * tokens_per_epoch - 1) / seq_length;
  const std::int64_t last_epoch_samples = num_samples - samples_before_last;
  const std::int64_t samples_per_epoch = (tokens_per_epoch - 1) / seq_length;
  return last_epoch_samples < std::int64_t(0.80 * double(samples_per_epoch));
}

/// Megatron's _build_doc_idx for one block of epochs shuffled together.
void append_shuffled_epochs(std::vector<std::int32_t>& doc_idx, std::int64_t first,
                            std::int64_t end, std::int64_t epochs,
                            NumpyLegacyRandom& rng) {
  const std::size_t start = doc_idx.size();
  for (std::int64_t e = 0; e < epochs; ++e)
    for (std::int64_t d = first; d < end; ++d) doc_idx.push_back(std::int32_t(d));
  rng.shuffle(doc_idx.data() + start, doc_idx.size() - start);
}

/// Megatron's build_sample_idx (its C++ helper): walk the token stream of
/// doc_idx in windows of seq_length + 1 tokens, a window starting on the
/// last token of the previous one.
std::vector<std::int32_t> build_sample_idx(const std::vector<std::int32_t>& sizes,
                                           const std::vector<std::int32_t>& doc_idx,
                                           std::int64_t seq_length,
                                           std::int64_t total_tokens) {
  const std::int64_t num_samples = total_tokens > 0 ? (total_tokens - 1) / seq_length : 0;
  std::vector<std::int32_t> sample_idx(2 * std::size_t(num_samples + 1));
  std::int64_t doc_pos = 0, doc_offset = 0;
  sample_idx[0] = 0;
  sample_idx[1] = 0;
  for (std::int64_t s = 1; s <= num_samples; ++s) {
    std::int64_t remaining = seq_length + 1;
    while (remaining != 0) {
      const std::int64_t doc_length = sizes[std::size_t(doc_idx[std::size_t(doc_pos)])] - doc_offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        doc_offset += remaining + doc_length - 1;  // the window's last token
        remaining = 0;
      } else {
        ++doc_pos;
        doc_offset = 0;
      }
    }
    sample_idx[2 * std::size_t(s)] = std::int32_t(doc_pos);
    sample_idx[2 * std::size_t(s) + 1] = std::int32_t(doc_offset);
  }
  return sample_idx;
}

/// Megatron's _build_shuffle_idx: [0, num_samples) shuffled, then
/// [num_samples, total) shuffled on its own.
std::vector<std::uint32_t> build_shuffle_idx(std::int64_t num_samples, std::int64_t total,
                                             NumpyLegacyRandom& rng) {
  std::vector<std::uint32_t> shuffle(static_cast<std::size_t>(total));
  for (std::int64_t k = 0; k < total; ++k) shuffle[std::size_t(k)] = std::uint32_t(k);
  rng.shuffle(shuffle.data(), std::size_t(num_samples));
  rng.shuffle(shuffle.data() + num_samples, std::size_t(total - num_samples));
  return shuffle;
}

// ----------------------------------------------------------------- split ---

std::string trim(const std::string& s) {
  const std::size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::vector<double> parse_split_weights(const std::string& split) {
  const char sep = split.find(',') != std::string::npos ? ',' : '/';
  std::vector<double> weights;
  std::istringstream in(split);
  std::string piece;
  while (std::getline(in, piece, sep)) {
    const std::string item = trim(piece);
    std::size_t used = 0;
    double w = -1;
    try {
      w = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MESH_REQUIRE(!item.empty() && used == item.size() && std::isfinite(w) && w >= 0,
                 "data split '" << split << "': '" << item
                 << "' is not a non-negative number");
    weights.push_back(w);
  }
  MESH_REQUIRE(!weights.empty() && weights.size() <= 3, "data split '" << split
               << "' must have 1 to 3 weights (train, valid, test)");
  weights.resize(3, 0.0);
  const double sum = weights[0] + weights[1] + weights[2];
  MESH_REQUIRE(sum > 0, "data split '" << split << "': the weights sum to 0");
  for (double& w : weights) w /= sum;
  return weights;
}

// ----------------------------------------------------------------- cache ---

/// FNV-1a, 64-bit: a stable hash for file names and fingerprints.
std::uint64_t fnv1a(const void* bytes, std::size_t n,
                    std::uint64_t hash = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (std::size_t k = 0; k < n; ++k) hash = (hash ^ p[k]) * 0x100000001b3ull;
  return hash;
}

std::string hex64(std::uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text_file_atomically(const std::string& path, const std::string& text) {
  std::random_device entropy;
  const std::string tmp = path + ".tmp." + std::to_string(entropy());
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    MESH_REQUIRE(out.good(), "cannot write '" << tmp << "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  MESH_REQUIRE(!ec, "cannot write '" << path << "'");
}

std::string cache_base(const std::string& prefix, const std::string& cache_dir) {
  if (cache_dir.empty()) return prefix;
  return (std::filesystem::path(cache_dir) / std::filesystem::path(prefix).filename()).string();
}

}  // namespace

// -------------------------------------------------------------- public ---

const char* split_name(Split split) {
  switch (split) {
    case Split::Train: return "train";
    case Split::Valid: return "valid";
    case Split::Test: return "test";
  }
  return "unknown";
}

std::vector<double> split_weights(const std::string& split) { return parse_split_weights(split); }

std::array<std::int64_t, 4> split_boundaries(const std::string& split,
                                             std::int64_t num_documents) {
  const std::vector<double> weights = parse_split_weights(split);
  std::array<std::int64_t, 4> bounds{0, 0, 0, 0};
  for (int k = 0; k < 3; ++k)
    bounds[k + 1] = bounds[k] + std::int64_t(std::nearbyint(weights[k] * double(num_documents)));
  const std::int64_t diff = bounds[3] - num_documents;
  for (int k = 1; k < 4; ++k) bounds[k] -= diff;
  return bounds;
}

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, Split split,
                       std::int64_t first_document, std::int64_t end_document,
                       std::int64_t num_samples, const GptDatasetConfig& config)
    : data_(std::move(data)),
      split_(split),
      first_document_(first_document),
      end_document_(end_document),
      num_samples_(num_samples),
      seq_length_(config.seq_length),
      seed_(config.seed) {
  MESH_REQUIRE(seq_length_ > 0, "GPT dataset: seq_length must be positive, got "
               << seq_length_);
  MESH_REQUIRE(num_samples_ >= 0, "GPT dataset: num_samples must be >= 0, got "
               << num_samples_);
  MESH_REQUIRE(0 <= first_document_ && first_document_ <= end_document_ &&
               end_document_ <= data_->num_sequences(),
               "GPT dataset: documents [" << first_document_ << ", " << end_document_
               << ") outside the " << data_->num_sequences() << " of '"
               << data_->prefix() << "'");
  if (!config.use_cache) {
    build_indices();
    return;
  }
  const std::string text = description();
  cache_stem_ = cache_base(data_->prefix(), config.cache_dir) + "_gpt_" +
                split_name(split_) + "_" + hex64(fnv1a(text.data(), text.size()));
  if (load_cache(text)) return;
  build_indices();
  save_cache(text);
}

/// Everything the index arrays depend on; its hash names the cache files and
/// the text itself is compared on load, so a collision cannot go unnoticed.
std::string GptDataset::description() const {
  std::uint64_t fingerprint = 0xcbf29ce484222325ull;
  for (std::int64_t d = first_document_; d < end_document_; ++d) {
    const std::int32_t length = data_->sequence_length(d);
    fingerprint = fnv1a(&length, sizeof length, fingerprint);
  }
  std::ostringstream s;
  s << "meshtron GptDataset index v1\n"
    << "split: " << split_name(split_) << "\n"
    << "documents: [" << first_document_ << ", " << end_document_ << ") of "
    << data_->num_sequences() << "\n"
    << "document_lengths_fnv1a: " << hex64(fingerprint) << "\n"
    << "seq_length: " << seq_length_ << "\n"
    << "num_samples: " << num_samples_ << "\n"
    << "seed: " << seed_ << "\n";
  return s.str();
}

void GptDataset::build_indices() {
  const std::vector<std::int32_t> sizes = data_->sequence_lengths();
  std::int64_t tokens_per_epoch = 0;
  for (std::int64_t d = first_document_; d < end_document_; ++d)
    tokens_per_epoch += sizes[std::size_t(d)];
  if (tokens_per_epoch == 0) {
    MESH_REQUIRE(num_samples_ == 0, "GPT dataset: the " << split_name(split_)
                 << " split of '" << data_->prefix() << "' has no tokens but "
                 << num_samples_ << " samples were requested");
    doc_idx_.clear();
    sample_idx_ = {0, 0};
    shuffle_idx_.clear();
    return;
  }
  const std::int64_t epochs = num_epochs_for(tokens_per_epoch, seq_length_, num_samples_);
  const bool separate = separate_last_epoch(epochs, tokens_per_epoch, seq_length_, num_samples_);
  const std::int64_t documents = end_document_ - first_document_;
  MESH_REQUIRE(epochs * documents < std::numeric_limits<std::int32_t>::max(),
               "GPT dataset: " << epochs << " epochs of " << documents
               << " documents overflow the int32 doc_idx");

  NumpyLegacyRandom rng(seed_);
  doc_idx_.clear();
  doc_idx_.reserve(std::size_t(epochs * documents));
  if (separate) {
    append_shuffled_epochs(doc_idx_, first_document_, end_document_, epochs - 1, rng);
    append_shuffled_epochs(doc_idx_, first_document_, end_document_, 1, rng);
  } else {
    append_shuffled_epochs(doc_idx_, first_document_, end_document_, epochs, rng);
  }
  sample_idx_ = build_sample_idx(sizes, doc_idx_, seq_length_, epochs * tokens_per_epoch);
  const std::int64_t total = std::int64_t(sample_idx_.size() / 2) - 1;
  MESH_REQUIRE(total < std::int64_t(std::numeric_limits<std::uint32_t>::max()),
               "GPT dataset: " << total << " samples overflow the uint32 shuffle_idx");
  const std::int64_t first_block =
      separate ? ((epochs - 1) * tokens_per_epoch - 1) / seq_length_ : total;
  shuffle_idx_ = build_shuffle_idx(first_block, total, rng);
}

bool GptDataset::load_cache(const std::string& description) {
  if (read_text_file(cache_stem_ + "_description.txt") != description) return false;
  auto doc = read_npy<std::int32_t>(cache_stem_ + "_doc_idx.npy");
  auto sample = read_npy<std::int32_t>(cache_stem_ + "_sample_idx.npy");
  auto shuffle = read_npy<std::uint32_t>(cache_stem_ + "_shuffle_idx.npy");
  if (!doc || !sample || !shuffle) return false;
  if (doc->shape.size() != 1 || shuffle->shape.size() != 1 || sample->shape.size() != 2 ||
      sample->shape[1] != 2)
    return false;
  doc_idx_ = std::move(doc->values);
  sample_idx_ = std::move(sample->values);
  shuffle_idx_ = std::move(shuffle->values);
  loaded_from_cache_ = indices_consistent();
  return loaded_from_cache_;
}

/// Cheap checks that cached arrays can be indexed safely: every entry points
/// inside the arrays and the data, and the sample count is what was asked.
bool GptDataset::indices_consistent() const {
  const std::int64_t total = std::int64_t(sample_idx_.size() / 2) - 1;
  if (total < 0 || std::int64_t(shuffle_idx_.size()) != total || total < num_samples_)
    return false;
  for (std::int32_t d : doc_idx_)
    if (d < first_document_ || d >= end_document_) return false;
  for (std::size_t k = 0; total > 0 && k < sample_idx_.size(); k += 2) {
    const std::int32_t pos = sample_idx_[k], offset = sample_idx_[k + 1];
    if (pos < 0 || std::size_t(pos) >= doc_idx_.size() || offset < 0 ||
        offset >= std::max(1, data_->sequence_length(doc_idx_[std::size_t(pos)])))
      return false;
  }
  for (std::uint32_t s : shuffle_idx_)
    if (std::int64_t(s) >= total) return false;
  return true;
}

void GptDataset::save_cache(const std::string& description) {
  // A data folder may be read-only: then the indices stay in memory only.
  try {
    write_npy(cache_stem_ + "_doc_idx.npy", doc_idx_, {std::int64_t(doc_idx_.size())});
    write_npy(cache_stem_ + "_sample_idx.npy", sample_idx_,
              {std::int64_t(sample_idx_.size() / 2), 2});
    write_npy(cache_stem_ + "_shuffle_idx.npy", shuffle_idx_,
              {std::int64_t(shuffle_idx_.size())});
    // Last: a description on disk means the arrays beside it are complete.
    write_text_file_atomically(cache_stem_ + "_description.txt", description);
    wrote_cache_ = true;
  } catch (const UserError&) {
    wrote_cache_ = false;
  }
}

void GptDataset::sample(std::int64_t i, std::int32_t* out) const {
  MESH_VERIFY(i >= 0 && i < size(), "GPT sample " << i << " out of range [0, "
              << size() << ") of the " << split_name(split_) << " split");
  const std::size_t j = shuffle_idx_[std::size_t(i)];
  const std::int64_t first_pos = sample_idx_[2 * j], first_offset = sample_idx_[2 * j + 1];
  const std::int64_t last_pos = sample_idx_[2 * j + 2], last_offset = sample_idx_[2 * j + 3];
  auto doc = [&](std::int64_t pos) { return std::int64_t(doc_idx_[std::size_t(pos)]); };
  if (first_pos == last_pos) {
    data_->read(doc(first_pos), first_offset, last_offset - first_offset + 1, out);
    return;
  }
  std::int64_t n = data_->read(doc(first_pos), first_offset, -1, out);
  for (std::int64_t pos = first_pos + 1; pos < last_pos; ++pos)
    n += data_->read(doc(pos), 0, -1, out + n);
  n += data_->read(doc(last_pos), 0, last_offset + 1, out + n);
  MESH_ASSERT(n == seq_length_ + 1);
}

std::vector<std::int32_t> GptDataset::sample(std::int64_t i) const {
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(seq_length_ + 1));
  sample(i, tokens.data());
  return tokens;
}

GptMicroBatch GptDataset::micro_batch(std::span<const std::int64_t> sample_indices) const {
  const auto rows = index_t(sample_indices.size());
  GptMicroBatch batch{Tensor::empty({rows, seq_length_}, DType::I32),
                      Tensor::empty({rows, seq_length_}, DType::I32)};
  std::vector<std::int32_t> window(static_cast<std::size_t>(seq_length_ + 1));
  std::int32_t* tokens = batch.tokens.data<std::int32_t>();
  std::int32_t* labels = batch.labels.data<std::int32_t>();
  for (index_t r = 0; r < rows; ++r) {
    sample(sample_indices[std::size_t(r)], window.data());
    std::memcpy(tokens + r * seq_length_, window.data(), std::size_t(seq_length_) * 4);
    std::memcpy(labels + r * seq_length_, window.data() + 1, std::size_t(seq_length_) * 4);
  }
  return batch;
}

std::array<std::unique_ptr<GptDataset>, 3> build_gpt_datasets(
    std::shared_ptr<const IndexedDataset> data,
    const std::array<std::int64_t, 3>& num_samples, const GptDatasetConfig& config) {
  const auto bounds = split_boundaries(config.split, data->num_sequences());
  std::array<std::unique_ptr<GptDataset>, 3> datasets;
  for (int k = 0; k < 3; ++k) {
    if (bounds[k + 1] <= bounds[k]) continue;  // empty split: no dataset
    datasets[k] = std::make_unique<GptDataset>(data, Split(k), bounds[k], bounds[k + 1],
                                               num_samples[k], config);
  }
  return datasets;
}

}  // namespace meshtron::data
