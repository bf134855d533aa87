// Helpers shared by the data tests: scratch folders, the golden documents,
// synthetic datasets.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/indexed_dataset.hpp"

namespace meshtron::data::testing {

/// validation/megatron-indexed in the source tree.
inline std::filesystem::path golden_dir() {
  return std::filesystem::path(MESHTRON_SOURCE_DIR) / "validation" / "megatron-indexed";
}

/// An empty folder unique to this process and `name`, removed on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("meshtron_data_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& file) const { return (path_ / file).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// documents[d][s] = token ids of sequence s of document d.
using Documents = std::vector<std::vector<std::vector<std::int32_t>>>;

inline Documents load_golden_documents() {
  std::ifstream in(golden_dir() / "documents.json");
  return nlohmann::json::parse(in).get<Documents>();
}

inline std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

/// Writes `docs` through the writer, sequence by sequence, as Megatron's
/// builder was driven for the golden files (add_item per sequence,
/// end_document per document).
inline void write_documents(const std::string& prefix, TokenDType dtype, const Documents& docs) {
  IndexedDatasetWriter writer(prefix, dtype);
  for (const auto& doc : docs) {
    for (const auto& seq : doc) writer.add_sequence(seq);
    writer.end_document();
  }
  writer.finalize();
}

/// Random documents of one sequence each, lengths in [min_len, max_len].
inline Documents random_documents(int count, int min_len, int max_len, int vocab,
                                  std::uint32_t seed) {
  std::mt19937 rng(seed);
  Documents docs(static_cast<std::size_t>(count));
  for (auto& doc : docs) {
    const int length = min_len + int(rng() % std::uint32_t(max_len - min_len + 1));
    std::vector<std::int32_t> seq(static_cast<std::size_t>(length));
    for (auto& t : seq) t = std::int32_t(rng() % std::uint32_t(vocab));
    doc.push_back(std::move(seq));
  }
  return docs;
}

/// Random documents of `min_sentences`..`max_sentences` sentences of
/// `min_len`..`max_len` tokens each, ids in [first_id, end_id).
inline Documents random_sentence_documents(int count, int min_sentences, int max_sentences,
                                           int min_len, int max_len, int first_id, int end_id,
                                           std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto between = [&](int lo, int hi) { return lo + int(rng() % std::uint32_t(hi - lo + 1)); };
  Documents docs(static_cast<std::size_t>(count));
  for (auto& doc : docs) {
    doc.resize(static_cast<std::size_t>(between(min_sentences, max_sentences)));
    for (auto& sentence : doc) {
      sentence.resize(static_cast<std::size_t>(between(min_len, max_len)));
      for (auto& t : sentence) t = std::int32_t(between(first_id, end_id - 1));
    }
  }
  return docs;
}

}  // namespace meshtron::data::testing
