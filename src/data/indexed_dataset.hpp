// Indexed datasets, byte-compatible with Megatron-LM's MMapIndexedDataset
// (megatron.core.datasets.indexed_dataset): token sequences stored back to
// back in PREFIX.bin and described by PREFIX.idx. Files written here are read
// by Megatron-LM and the other way round.
//
// PREFIX.idx, little-endian, no padding:
//   9 bytes     magic "MMIDIDX\0\0"
//   uint64      version, 1
//   uint8       dtype code of the tokens (TokenDType below; Megatron's codes)
//   uint64      S, the number of sequences
//   uint64      D+1, the number of document-index entries
//   int32[S]    sequence lengths, in tokens
//   int64[S]    byte offset of each sequence in PREFIX.bin
//   int64[D+1]  document indices: document d is sequences [doc[d], doc[d+1]),
//               doc[0] = 0 and doc[D] = S
//   (int8[S]    sequence modes, only in Megatron's multimodal files; ignored)
// PREFIX.bin: the tokens of every sequence in order, in the dtype above.
//
// A "sequence" is what Megatron calls an item (one add_item call: a whole
// document, or one sentence when preprocessing splits sentences); documents
// group consecutive sequences.
//
// Errors: a missing, truncated or inconsistent file throws meshtron::UserError
// with one line naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace meshtron::data {

/// On-disk token types, with Megatron-LM's dtype codes.
enum class TokenDType : std::uint8_t {
  U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, F64 = 6, F32 = 7, U16 = 8
};

std::size_t token_dtype_size(TokenDType t);
const char* token_dtype_name(TokenDType t);
/// True for the eight codes above.
bool is_valid_token_dtype_code(std::uint8_t code);
/// Megatron's DType.optimal_dtype: uint16 for vocabularies below 65500
/// tokens, int32 otherwise.
TokenDType optimal_token_dtype(std::int64_t vocab_size);

template <class T> struct token_dtype_of;
template <> struct token_dtype_of<std::uint8_t> { static constexpr TokenDType value = TokenDType::U8; };
template <> struct token_dtype_of<std::int8_t> { static constexpr TokenDType value = TokenDType::I8; };
template <> struct token_dtype_of<std::int16_t> { static constexpr TokenDType value = TokenDType::I16; };
template <> struct token_dtype_of<std::int32_t> { static constexpr TokenDType value = TokenDType::I32; };
template <> struct token_dtype_of<std::int64_t> { static constexpr TokenDType value = TokenDType::I64; };
template <> struct token_dtype_of<double> { static constexpr TokenDType value = TokenDType::F64; };
template <> struct token_dtype_of<float> { static constexpr TokenDType value = TokenDType::F32; };
template <> struct token_dtype_of<std::uint16_t> { static constexpr TokenDType value = TokenDType::U16; };

std::string idx_file_path(const std::string& prefix);  ///< PREFIX.idx
std::string bin_file_path(const std::string& prefix);  ///< PREFIX.bin

/// A whole file mapped read-only. Move-only; unmaps on destruction.
class MappedFile {
 public:
  MappedFile() = default;
  /// Throws UserError naming `path` if it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  const std::byte* data_ = nullptr;  ///< Owned mapping (null when empty).
  std::size_t size_ = 0;
};

/// Read-only view of PREFIX.bin/.idx through mmap. The index is validated
/// once on open (sizes agree with the counts, offsets are contiguous,
/// document indices increase); afterwards every access is a bounds check and
/// a load. Thread-safe for concurrent reads.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  std::int64_t num_sequences() const { return num_sequences_; }
  std::int64_t num_documents() const { return num_doc_entries_ - 1; }
  std::int64_t num_tokens() const { return num_tokens_; }

  std::int32_t sequence_length(std::int64_t i) const;
  /// Byte offset of sequence i in PREFIX.bin.
  std::int64_t sequence_pointer(std::int64_t i) const;
  /// Entry d of the document index, d in [0, num_documents()].
  std::int64_t document_index(std::int64_t d) const;
  /// Sequences [first, end) of document d.
  std::pair<std::int64_t, std::int64_t> document_sequences(std::int64_t d) const;
  /// All sequence lengths (a copy; the mapped array need not be aligned).
  std::vector<std::int32_t> sequence_lengths() const;

  /// Tokens of sequence i in their stored type; T must match dtype().
  template <class T>
  std::span<const T> get(std::int64_t i) const {
    check_type(token_dtype_of<T>::value);
    return {reinterpret_cast<const T*>(sequence_bytes(i)),
            std::size_t(sequence_length(i))};
  }
  /// Tokens [offset, offset+length) of sequence i converted to int32 into
  /// `out` (length < 0: to the end of the sequence). Returns the count.
  std::int64_t read(std::int64_t i, std::int64_t offset, std::int64_t length,
                    std::int32_t* out) const;
  /// Whole sequence i converted to int32.
  std::vector<std::int32_t> get_int32(std::int64_t i) const;
  /// The whole of PREFIX.bin.
  std::span<const std::byte> bin_bytes() const { return {bin_.data(), bin_.size()}; }

 private:
  void parse_header();
  void validate_index() const;
  void validate_bin_size();
  void check_type(TokenDType wanted) const;
  const std::byte* sequence_bytes(std::int64_t i) const;

  std::string prefix_;
  MappedFile idx_;
  MappedFile bin_;
  TokenDType dtype_ = TokenDType::U16;
  std::int64_t num_sequences_ = 0;
  std::int64_t num_doc_entries_ = 1;
  std::int64_t num_tokens_ = 0;
  std::size_t lengths_offset_ = 0;   ///< Byte offsets of the arrays in .idx.
  std::size_t pointers_offset_ = 0;
  std::size_t documents_offset_ = 0;
};

/// Writes PREFIX.bin/.idx exactly as Megatron-LM's IndexedDatasetBuilder
/// does. Tokens stream to disk; lengths and document indices stay in memory
/// until finalize(). Output goes to temporary names and is renamed into
/// place by finalize(), so an interrupted run never leaves a valid-looking
/// half dataset; a writer destroyed unfinalized removes its temporaries.
///
///   IndexedDatasetWriter w(prefix, optimal_token_dtype(vocab));
///   for (doc : docs) w.add_document(tokenize(doc));   // one sequence each
///   w.finalize();
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, TokenDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  /// Appends one sequence (Megatron's add_item). Throws UserError if a token
  /// does not fit the dtype.
  void add_sequence(std::span<const std::int32_t> tokens);
  /// Closes the current document (Megatron's end_document).
  void end_document();
  /// One sequence, then end_document.
  void add_document(std::span<const std::int32_t> tokens);
  /// A document made of several sequences (sentences): `tokens` cut into
  /// consecutive pieces of `sequence_lengths` (Megatron's add_document).
  void add_document(std::span<const std::int32_t> tokens,
                    std::span<const std::int64_t> sequence_lengths);
  /// Appends every document of the finalized dataset at `prefix` (same
  /// dtype), copying its tokens byte for byte (Megatron's add_index).
  void append_dataset(const std::string& prefix);
  /// Writes PREFIX.idx and moves both files into place. A trailing document
  /// left open is closed first.
  void finalize();

  std::int64_t num_sequences() const { return std::int64_t(lengths_.size()); }
  std::int64_t num_documents() const { return std::int64_t(documents_.size()) - 1; }
  TokenDType dtype() const { return dtype_; }

 private:
  void write_bin(const void* bytes, std::size_t count);
  void write_index(const std::string& path) const;
  void remove_temporaries();

  std::string prefix_;
  TokenDType dtype_;
  std::string bin_tmp_, idx_tmp_;
  std::FILE* bin_ = nullptr;  ///< Owned.
  std::vector<std::int32_t> lengths_;
  std::vector<std::int64_t> documents_{0};
  std::vector<std::byte> scratch_;  ///< Conversion buffer for one sequence.
  bool finalized_ = false;
};

/// Concatenates the datasets at `shard_prefixes` (e.g. written in parallel by
/// several preprocessing ranks) into `output_prefix`, in order. All shards
/// must have the same dtype. The result is byte-identical to writing every
/// document of every shard into one writer.
void merge_indexed_datasets(const std::vector<std::string>& shard_prefixes,
                            const std::string& output_prefix);

}  // namespace meshtron::data
