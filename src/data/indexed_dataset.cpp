#include "data/indexed_dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.hpp"

namespace meshtron::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr std::uint64_t kVersion = 1;
// magic, version, dtype code, sequence count, document-index count.
constexpr std::size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <class T>
T load(const std::byte* base, std::size_t offset) {
  T value;  // memcpy: the arrays in .idx are not aligned (header is 34 bytes)
  std::memcpy(&value, base + offset, sizeof(T));
  return value;
}

template <class T>
void append_bytes(std::vector<std::byte>& out, const T* values, std::size_t n) {
  const auto* bytes = reinterpret_cast<const std::byte*>(values);
  out.insert(out.end(), bytes, bytes + n * sizeof(T));
}

template <class T>
void append_value(std::vector<std::byte>& out, T value) {
  append_bytes(out, &value, 1);
}

/// Converts stored tokens of type T to int32.
template <class T>
void convert_to_int32(const std::byte* src, std::int64_t n, std::int32_t* out) {
  const T* tokens = reinterpret_cast<const T*>(src);  // .bin offsets are aligned
  for (std::int64_t k = 0; k < n; ++k) out[k] = static_cast<std::int32_t>(tokens[k]);
}

/// Converts int32 tokens to T, refusing values that T cannot hold exactly.
template <class T>
void convert_from_int32(std::span<const std::int32_t> tokens, std::byte* dst,
                        const std::string& prefix) {
  T* out = reinterpret_cast<T*>(dst);
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    const std::int32_t v = tokens[k];
    out[k] = static_cast<T>(v);
    MESH_REQUIRE(static_cast<std::int64_t>(out[k]) == v,
                 "indexed dataset '" << prefix << "': token " << v
                 << " does not fit the dtype "
                 << token_dtype_name(token_dtype_of<T>::value));
  }
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

// ------------------------------------------------------------- dtypes ---

std::size_t token_dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::U8: case TokenDType::I8: return 1;
    case TokenDType::I16: case TokenDType::U16: return 2;
    case TokenDType::I32: case TokenDType::F32: return 4;
    case TokenDType::I64: case TokenDType::F64: return 8;
  }
  return 0;
}

const char* token_dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::U8: return "uint8";
    case TokenDType::I8: return "int8";
    case TokenDType::I16: return "int16";
    case TokenDType::I32: return "int32";
    case TokenDType::I64: return "int64";
    case TokenDType::F64: return "float64";
    case TokenDType::F32: return "float32";
    case TokenDType::U16: return "uint16";
  }
  return "unknown";
}

bool is_valid_token_dtype_code(std::uint8_t code) { return code >= 1 && code <= 8; }

TokenDType optimal_token_dtype(std::int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::U16 : TokenDType::I32;
}

std::string idx_file_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_file_path(const std::string& prefix) { return prefix + ".bin"; }

// --------------------------------------------------------- MappedFile ---

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MESH_REQUIRE(fd >= 0, "cannot open '" << path << "': " << errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    MESH_REQUIRE(false, "cannot stat '" << path << "': " << why);
  }
  size_ = std::size_t(st.st_size);
  if (size_ > 0) {  // mmap of zero bytes fails; an empty file maps to nothing
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = errno_text();
      ::close(fd);
      MESH_REQUIRE(false, "cannot mmap '" << path << "': " << why);
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    this->~MappedFile();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ----------------------------------------------------- IndexedDataset ---

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix),
      idx_(idx_file_path(prefix)),
      bin_(bin_file_path(prefix)) {
  parse_header();
  validate_index();
  validate_bin_size();
}

void IndexedDataset::parse_header() {
  const std::string path = idx_file_path(prefix_);
  MESH_REQUIRE(idx_.size() >= kHeaderBytes,
               "indexed dataset '" << path << "' is truncated: " << idx_.size()
               << " bytes, less than the " << kHeaderBytes << "-byte header");
  MESH_REQUIRE(std::memcmp(idx_.data(), kMagic, sizeof kMagic) == 0,
               "indexed dataset '" << path
               << "' has a bad magic number (not a Megatron MMIDIDX index)");
  const auto version = load<std::uint64_t>(idx_.data(), 9);
  MESH_REQUIRE(version == kVersion, "indexed dataset '" << path
               << "' has version " << version << ", expected " << kVersion);
  const auto code = load<std::uint8_t>(idx_.data(), 17);
  MESH_REQUIRE(is_valid_token_dtype_code(code), "indexed dataset '" << path
               << "' has unknown dtype code " << int(code));
  dtype_ = TokenDType(code);
  const auto sequences = load<std::uint64_t>(idx_.data(), 18);
  const auto doc_entries = load<std::uint64_t>(idx_.data(), 26);

  // Sizes implied by the counts; compared in 128 bits against garbage counts.
  const unsigned __int128 arrays = (unsigned __int128)sequences * 12 +
                                   (unsigned __int128)doc_entries * 8;
  const unsigned __int128 need = kHeaderBytes + arrays;
  const bool plain = idx_.size() == need;
  const bool with_modes = idx_.size() == need + sequences;  // multimodal files
  MESH_REQUIRE(plain || with_modes,
               "indexed dataset '" << path << "' is " << idx_.size()
               << " bytes but its counts (" << sequences << " sequences, "
               << doc_entries << " document-index entries) need "
               << (unsigned long long)std::min<unsigned __int128>(need, ~0ull)
               << " bytes (truncated or corrupt)");
  MESH_REQUIRE(doc_entries >= 1, "indexed dataset '" << path
               << "' has no document-index entries (need at least the leading 0)");
  num_sequences_ = std::int64_t(sequences);
  num_doc_entries_ = std::int64_t(doc_entries);
  lengths_offset_ = kHeaderBytes;
  pointers_offset_ = lengths_offset_ + 4 * std::size_t(sequences);
  documents_offset_ = pointers_offset_ + 8 * std::size_t(sequences);
}

void IndexedDataset::validate_index() const {
  const std::string path = idx_file_path(prefix_);
  const std::size_t itemsize = token_dtype_size(dtype_);
  std::int64_t expected_pointer = 0;
  for (std::int64_t i = 0; i < num_sequences_; ++i) {
    // Raw loads: this loop runs over every sequence at open.
    const auto length = load<std::int32_t>(idx_.data(), lengths_offset_ + 4 * std::size_t(i));
    MESH_REQUIRE(length >= 0, "indexed dataset '" << path << "': sequence " << i
                 << " has negative length " << length);
    const auto pointer = load<std::int64_t>(idx_.data(), pointers_offset_ + 8 * std::size_t(i));
    MESH_REQUIRE(pointer == expected_pointer, "indexed dataset '" << path
                 << "': sequence " << i << " starts at byte " << pointer
                 << ", expected " << expected_pointer
                 << " (sequences must be contiguous)");
    expected_pointer += std::int64_t(length) * std::int64_t(itemsize);
  }
  MESH_REQUIRE(document_index(0) == 0, "indexed dataset '" << path
               << "': document index starts at " << document_index(0)
               << ", expected 0");
  for (std::int64_t d = 1; d < num_doc_entries_; ++d) {
    MESH_REQUIRE(document_index(d) >= document_index(d - 1),
                 "indexed dataset '" << path << "': document index decreases at "
                 << "entry " << d << " (" << document_index(d) << " after "
                 << document_index(d - 1) << ")");
  }
  const std::int64_t last = document_index(num_doc_entries_ - 1);
  MESH_REQUIRE(last == num_sequences_, "indexed dataset '" << path
               << "': documents end at sequence " << last << " but there are "
               << num_sequences_ << " sequences");
}

void IndexedDataset::validate_bin_size() {
  std::int64_t tokens = 0;
  for (std::int32_t length : sequence_lengths()) tokens += length;
  const std::uint64_t bytes = std::uint64_t(tokens) * token_dtype_size(dtype_);
  MESH_REQUIRE(bin_.size() == bytes,
               "indexed dataset '" << bin_file_path(prefix_) << "' is "
               << bin_.size() << " bytes but '" << idx_file_path(prefix_)
               << "' describes " << tokens << " " << token_dtype_name(dtype_)
               << " tokens (" << bytes << " bytes)");
  num_tokens_ = tokens;
}

std::int32_t IndexedDataset::sequence_length(std::int64_t i) const {
  MESH_VERIFY(i >= 0 && i < num_sequences_, "sequence " << i << " out of range [0, "
              << num_sequences_ << ") in '" << prefix_ << "'");
  return load<std::int32_t>(idx_.data(), lengths_offset_ + 4 * std::size_t(i));
}

std::int64_t IndexedDataset::sequence_pointer(std::int64_t i) const {
  MESH_VERIFY(i >= 0 && i < num_sequences_, "sequence " << i << " out of range [0, "
              << num_sequences_ << ") in '" << prefix_ << "'");
  return load<std::int64_t>(idx_.data(), pointers_offset_ + 8 * std::size_t(i));
}

std::int64_t IndexedDataset::document_index(std::int64_t d) const {
  MESH_VERIFY(d >= 0 && d < num_doc_entries_, "document-index entry " << d
              << " out of range [0, " << num_doc_entries_ << ") in '" << prefix_ << "'");
  return load<std::int64_t>(idx_.data(), documents_offset_ + 8 * std::size_t(d));
}

std::pair<std::int64_t, std::int64_t> IndexedDataset::document_sequences(
    std::int64_t d) const {
  return {document_index(d), document_index(d + 1)};
}

std::vector<std::int32_t> IndexedDataset::sequence_lengths() const {
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(num_sequences_));
  if (!lengths.empty())
    std::memcpy(lengths.data(), idx_.data() + lengths_offset_, 4 * lengths.size());
  return lengths;
}

void IndexedDataset::check_type(TokenDType wanted) const {
  MESH_VERIFY(wanted == dtype_, "indexed dataset '" << prefix_ << "' holds "
              << token_dtype_name(dtype_) << " tokens, read as "
              << token_dtype_name(wanted));
}

const std::byte* IndexedDataset::sequence_bytes(std::int64_t i) const {
  return bin_.data() + sequence_pointer(i);
}

std::int64_t IndexedDataset::read(std::int64_t i, std::int64_t offset,
                                  std::int64_t length, std::int32_t* out) const {
  const std::int64_t total = sequence_length(i);
  if (length < 0) length = total - offset;
  MESH_VERIFY(offset >= 0 && offset + length <= total,
              "tokens [" << offset << ", " << offset + length << ") out of range of "
              << "sequence " << i << " (" << total << " tokens) in '" << prefix_ << "'");
  if (length == 0) return 0;  // an empty .bin maps to no memory at all
  const std::byte* src = sequence_bytes(i) + offset * std::int64_t(token_dtype_size(dtype_));
  switch (dtype_) {
    case TokenDType::U8: convert_to_int32<std::uint8_t>(src, length, out); break;
    case TokenDType::I8: convert_to_int32<std::int8_t>(src, length, out); break;
    case TokenDType::I16: convert_to_int32<std::int16_t>(src, length, out); break;
    case TokenDType::U16: convert_to_int32<std::uint16_t>(src, length, out); break;
    case TokenDType::I32: std::memcpy(out, src, std::size_t(length) * 4); break;
    case TokenDType::I64: convert_to_int32<std::int64_t>(src, length, out); break;
    case TokenDType::F32: convert_to_int32<float>(src, length, out); break;
    case TokenDType::F64: convert_to_int32<double>(src, length, out); break;
  }
  return length;
}

std::vector<std::int32_t> IndexedDataset::get_int32(std::int64_t i) const {
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(sequence_length(i)));
  read(i, 0, -1, tokens.data());
  return tokens;
}

// ----------------------------------------------- IndexedDatasetWriter ---

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  MESH_REQUIRE(token_dtype_size(dtype_) > 0, "indexed dataset writer '" << prefix_
               << "': invalid dtype code " << int(dtype_));
  // Temporary names carry the pid so that two writers never share a file.
  const std::string tag = ".partial." + std::to_string(::getpid());
  bin_tmp_ = bin_file_path(prefix_) + tag;
  idx_tmp_ = idx_file_path(prefix_) + tag;
  bin_ = std::fopen(bin_tmp_.c_str(), "wb");
  MESH_REQUIRE(bin_ != nullptr, "cannot create '" << bin_tmp_ << "': " << errno_text());
  std::setvbuf(bin_, nullptr, _IOFBF, std::size_t(1) << 22);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finalized_) remove_temporaries();
}

void IndexedDatasetWriter::remove_temporaries() {
  if (bin_) std::fclose(bin_);
  bin_ = nullptr;
  std::remove(bin_tmp_.c_str());
  std::remove(idx_tmp_.c_str());
}

void IndexedDatasetWriter::write_bin(const void* bytes, std::size_t count) {
  MESH_REQUIRE(!finalized_, "indexed dataset writer '" << prefix_
               << "': written to after finalize()");
  if (count == 0) return;
  MESH_REQUIRE(std::fwrite(bytes, 1, count, bin_) == count,
               "cannot write '" << bin_tmp_ << "': " << errno_text());
}

void IndexedDatasetWriter::add_sequence(std::span<const std::int32_t> tokens) {
  MESH_REQUIRE(tokens.size() <= std::size_t(std::numeric_limits<std::int32_t>::max()),
               "indexed dataset writer '" << prefix_ << "': a sequence of "
               << tokens.size() << " tokens exceeds the int32 length field");
  scratch_.resize(tokens.size() * token_dtype_size(dtype_));
  std::byte* dst = scratch_.data();
  switch (dtype_) {
    case TokenDType::U8: convert_from_int32<std::uint8_t>(tokens, dst, prefix_); break;
    case TokenDType::I8: convert_from_int32<std::int8_t>(tokens, dst, prefix_); break;
    case TokenDType::I16: convert_from_int32<std::int16_t>(tokens, dst, prefix_); break;
    case TokenDType::U16: convert_from_int32<std::uint16_t>(tokens, dst, prefix_); break;
    case TokenDType::I32: convert_from_int32<std::int32_t>(tokens, dst, prefix_); break;
    case TokenDType::I64: convert_from_int32<std::int64_t>(tokens, dst, prefix_); break;
    case TokenDType::F32: convert_from_int32<float>(tokens, dst, prefix_); break;
    case TokenDType::F64: convert_from_int32<double>(tokens, dst, prefix_); break;
  }
  write_bin(scratch_.data(), scratch_.size());
  lengths_.push_back(std::int32_t(tokens.size()));
}

void IndexedDatasetWriter::end_document() {
  documents_.push_back(std::int64_t(lengths_.size()));
}

void IndexedDatasetWriter::add_document(std::span<const std::int32_t> tokens) {
  add_sequence(tokens);
  end_document();
}

void IndexedDatasetWriter::add_document(std::span<const std::int32_t> tokens,
                                        std::span<const std::int64_t> sequence_lengths) {
  std::size_t begin = 0;
  for (std::int64_t length : sequence_lengths) {
    MESH_REQUIRE(length >= 0 && begin + std::size_t(length) <= tokens.size(),
                 "indexed dataset writer '" << prefix_ << "': sequence lengths sum "
                 << "past the " << tokens.size() << " tokens of the document");
    add_sequence(tokens.subspan(begin, std::size_t(length)));
    begin += std::size_t(length);
  }
  MESH_REQUIRE(begin == tokens.size(), "indexed dataset writer '" << prefix_
               << "': sequence lengths sum to " << begin << " but the document has "
               << tokens.size() << " tokens");
  end_document();
}

void IndexedDatasetWriter::append_dataset(const std::string& prefix) {
  const IndexedDataset shard(prefix);
  MESH_REQUIRE(shard.dtype() == dtype_, "cannot append '" << prefix << "' ("
               << token_dtype_name(shard.dtype()) << ") to '" << prefix_ << "' ("
               << token_dtype_name(dtype_) << "): dtypes differ");
  if (documents_.back() != num_sequences()) end_document();
  const std::int64_t offset = num_sequences();
  const std::vector<std::int32_t> lengths = shard.sequence_lengths();
  lengths_.insert(lengths_.end(), lengths.begin(), lengths.end());
  for (std::int64_t d = 1; d <= shard.num_documents(); ++d)
    documents_.push_back(offset + shard.document_index(d));
  write_bin(shard.bin_bytes().data(), shard.bin_bytes().size());
}

void IndexedDatasetWriter::write_index(const std::string& path) const {
  std::vector<std::byte> out;
  out.reserve(kHeaderBytes + lengths_.size() * 12 + documents_.size() * 8);
  append_bytes(out, kMagic, sizeof kMagic);
  append_value<std::uint64_t>(out, kVersion);
  append_value<std::uint8_t>(out, std::uint8_t(dtype_));
  append_value<std::uint64_t>(out, lengths_.size());
  append_value<std::uint64_t>(out, documents_.size());
  append_bytes(out, lengths_.data(), lengths_.size());
  std::int64_t pointer = 0;
  for (std::int32_t length : lengths_) {
    append_value<std::int64_t>(out, pointer);
    pointer += std::int64_t(length) * std::int64_t(token_dtype_size(dtype_));
  }
  append_bytes(out, documents_.data(), documents_.size());

  std::FILE* f = std::fopen(path.c_str(), "wb");
  MESH_REQUIRE(f != nullptr, "cannot create '" << path << "': " << errno_text());
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  const bool closed = std::fclose(f) == 0;
  MESH_REQUIRE(ok && closed, "cannot write '" << path << "': " << errno_text());
}

void IndexedDatasetWriter::finalize() {
  MESH_REQUIRE(!finalized_, "indexed dataset writer '" << prefix_
               << "': finalize() called twice");
  if (documents_.back() != num_sequences()) end_document();
  const bool closed = std::fclose(bin_) == 0;
  bin_ = nullptr;
  MESH_REQUIRE(closed, "cannot write '" << bin_tmp_ << "': " << errno_text());
  write_index(idx_tmp_);
  MESH_REQUIRE(std::rename(bin_tmp_.c_str(), bin_file_path(prefix_).c_str()) == 0,
               "cannot rename '" << bin_tmp_ << "': " << errno_text());
  MESH_REQUIRE(std::rename(idx_tmp_.c_str(), idx_file_path(prefix_).c_str()) == 0,
               "cannot rename '" << idx_tmp_ << "': " << errno_text());
  finalized_ = true;
}

void merge_indexed_datasets(const std::vector<std::string>& shard_prefixes,
                            const std::string& output_prefix) {
  MESH_REQUIRE(!shard_prefixes.empty(), "merge into '" << output_prefix
               << "': no shards given");
  const TokenDType dtype = IndexedDataset(shard_prefixes.front()).dtype();
  IndexedDatasetWriter writer(output_prefix, dtype);
  for (const std::string& shard : shard_prefixes) writer.append_dataset(shard);
  writer.finalize();
}

}  // namespace meshtron::data
