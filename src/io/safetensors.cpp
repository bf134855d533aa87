#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace meshtron::io {

// Tensor bytes are copied as they lie in the file, which is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using nlohmann::json;

constexpr std::uint64_t kHeaderLengthBytes = 8;
// The reference implementation refuses headers above 100 MB; so do we, so a
// garbage length cannot make us allocate gigabytes before failing.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeSpelling {
  const char* name;
  DType dtype;
};
constexpr DTypeSpelling kDTypes[] = {
    {"F32", DType::F32}, {"F64", DType::F64}, {"BF16", DType::BF16},
    {"F16", DType::F16}, {"I32", DType::I32}, {"I64", DType::I64},
    {"U16", DType::U16}, {"U8", DType::U8}};

std::string where(const std::string& path, const std::string& tensor) {
  return MESH_MSG("safetensors file '" << path << "', tensor '" << tensor << "'");
}

DType dtype_from_safetensors(const std::string& s, const std::string& path,
                             const std::string& tensor) {
  for (const auto& d : kDTypes)
    if (s == d.name) return d.dtype;
  throw UserError(MESH_MSG(where(path, tensor) << ": unsupported dtype '" << s
                           << "' (meshtron reads F32, F64, BF16, F16, I32, I64, "
                              "U16, U8)"));
}

/// pread exactly `n` bytes at `offset`, retrying short reads and EINTR.
void pread_all(int fd, void* dst, std::uint64_t n, std::uint64_t offset,
               const std::string& path) {
  auto* out = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    MESH_REQUIRE(got > 0, "safetensors file '" << path << "': read of " << n
                          << " bytes at offset " << offset << " failed ("
                          << (got < 0 ? std::strerror(errno) : "unexpected end of file")
                          << ")");
    out += got;
    n -= std::uint64_t(got);
    offset += std::uint64_t(got);
  }
}

std::uint64_t decode_u64_le(const unsigned char* b) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

std::uint64_t shape_bytes(const Shape& shape, DType dtype) {
  std::uint64_t n = dtype_size(dtype);
  for (index_t d : shape)
    if (__builtin_mul_overflow(n, std::uint64_t(d), &n)) return UINT64_MAX;
  return n;
}

Shape parse_shape(const json& j, const std::string& ctx) {
  MESH_REQUIRE(j.is_array(), ctx << ": 'shape' is not an array");
  Shape shape;
  for (const auto& d : j) {
    MESH_REQUIRE(d.is_number_unsigned(),
                 ctx << ": 'shape' holds " << d.dump() << ", not a size");
    shape.push_back(index_t(d.get<std::uint64_t>()));
  }
  return shape;
}

SafetensorsEntry parse_entry(const std::string& name, const json& j,
                             std::uint64_t data_size, const std::string& path) {
  const std::string ctx = where(path, name);
  MESH_REQUIRE(j.is_object(), ctx << ": header entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    MESH_REQUIRE(j.contains(key), ctx << ": header entry lacks '" << key << "'");
  MESH_REQUIRE(j["dtype"].is_string(), ctx << ": 'dtype' is not a string");

  SafetensorsEntry e;
  e.name = name;
  e.dtype = dtype_from_safetensors(j["dtype"].get<std::string>(), path, name);
  e.shape = parse_shape(j["shape"], ctx);

  const json& off = j["data_offsets"];
  MESH_REQUIRE(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                   off[1].is_number_unsigned(),
               ctx << ": 'data_offsets' is not a pair of offsets: " << off.dump());
  e.begin = off[0].get<std::uint64_t>();
  e.end = off[1].get<std::uint64_t>();
  MESH_REQUIRE(e.begin <= e.end && e.end <= data_size,
               ctx << ": data_offsets [" << e.begin << ", " << e.end
                   << "] lie outside the data section of " << data_size
                   << " bytes (file truncated or corrupt?)");
  const std::uint64_t expected = shape_bytes(e.shape, e.dtype);
  MESH_REQUIRE(e.end - e.begin == expected,
               ctx << ": data_offsets span " << (e.end - e.begin) << " bytes but "
                   << safetensors_dtype_name(e.dtype) << " " << shape_string(e.shape)
                   << " needs " << expected);
  return e;
}

SafetensorsMetadata parse_metadata(const json& j, const std::string& path) {
  MESH_REQUIRE(j.is_object(),
               "safetensors file '" << path << "': __metadata__ is not an object");
  SafetensorsMetadata m;
  for (const auto& [key, value] : j.items()) {
    MESH_REQUIRE(value.is_string(), "safetensors file '" << path
                                    << "': __metadata__ value of '" << key
                                    << "' is not a string");
    m[key] = value.get<std::string>();
  }
  return m;
}

json parse_header_json(const std::string& text, const std::string& path) {
  try {
    json j = json::parse(text);
    MESH_REQUIRE(j.is_object(),
                 "safetensors file '" << path << "': header is not a JSON object");
    return j;
  } catch (const json::parse_error& err) {
    throw UserError(MESH_MSG("safetensors file '" << path
                             << "': header is not valid JSON (error at byte "
                             << std::min<std::size_t>(err.byte, text.size()) << " of "
                             << text.size() << ")"));
  }
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

// ------------------------------------------------------------------ reading

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  MESH_REQUIRE(fd_ >= 0, "cannot open safetensors file '" << path_
                         << "': " << std::strerror(errno));
  try {
    struct stat st {};
    MESH_REQUIRE(::fstat(fd_, &st) == 0, "cannot stat safetensors file '"
                                         << path_ << "': " << std::strerror(errno));
    const auto file_size = std::uint64_t(st.st_size);
    MESH_REQUIRE(file_size >= kHeaderLengthBytes,
                 "safetensors file '" << path_ << "' is " << file_size
                 << " bytes, too short for the 8-byte header length");

    unsigned char len_bytes[kHeaderLengthBytes];
    pread_all(fd_, len_bytes, kHeaderLengthBytes, 0, path_);
    const std::uint64_t header_len = decode_u64_le(len_bytes);
    MESH_REQUIRE(header_len <= file_size - kHeaderLengthBytes && header_len <= kMaxHeaderBytes,
                 "safetensors file '" << path_ << "': header length " << header_len
                 << " exceeds the file size " << file_size
                 << " (not a safetensors file, or truncated)");

    std::string text(header_len, '\0');
    pread_all(fd_, text.data(), header_len, kHeaderLengthBytes, path_);
    data_start_ = kHeaderLengthBytes + header_len;
    const std::uint64_t data_size = file_size - data_start_;

    const json header = parse_header_json(text, path_);  // outlives the loop
    for (const auto& [key, value] : header.items()) {
      if (key == "__metadata__")
        metadata_ = parse_metadata(value, path_);
      else
        entries_.push_back(parse_entry(key, value, data_size, path_));
    }
    std::sort(entries_.begin(), entries_.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

bool SafetensorsFile::contains(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const auto& e, const std::string& n) { return e.name < n; });
  return it != entries_.end() && it->name == name;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const auto& e, const std::string& n) { return e.name < n; });
  MESH_REQUIRE(it != entries_.end() && it->name == name,
               where(path_, name) << ": no such tensor in the file ("
                                  << entries_.size() << " tensors)");
  return *it;
}

void SafetensorsFile::read_bytes(const SafetensorsEntry& e, void* dst) const {
  pread_all(fd_, dst, e.end - e.begin, data_start_ + e.begin, path_);
}

Tensor SafetensorsFile::load(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, e.dtype);
  read_bytes(e, t.raw());
  return t;
}

Tensor SafetensorsFile::load(const std::string& name, DType dtype) const {
  Tensor t = load(name);
  return t.dtype() == dtype ? t : t.to(dtype);
}

void SafetensorsFile::load_into(const std::string& name, Tensor& dst) const {
  const SafetensorsEntry& e = entry(name);
  MESH_REQUIRE(dst.shape() == e.shape,
               where(path_, name) << ": shape " << shape_string(e.shape)
                                  << " in the file, " << shape_string(dst.shape())
                                  << " expected");
  MESH_VERIFY(dst.is_host(), "load_into a device tensor: load to host, then copy");
  if (dst.dtype() == e.dtype)
    read_bytes(e, dst.raw());
  else
    dst.copy_from(load(name));
}

std::vector<SafetensorsEntry> list_safetensors(const std::string& path) {
  return SafetensorsFile(path).entries();
}

// ------------------------------------------------------------------ writing

namespace {

using NamedTensor = std::pair<std::string, Tensor>;

void check_names(const std::vector<NamedTensor>& tensors, const std::string& path) {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) {
    MESH_REQUIRE(!name.empty() && name != "__metadata__",
                 where(path, name) << ": invalid tensor name");
    MESH_VERIFY(t.defined() && t.is_host(),
                where(path, name) << ": only defined host tensors can be written");
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  const auto dup = std::adjacent_find(names.begin(), names.end());
  MESH_REQUIRE(dup == names.end(), where(path, *dup) << ": tensor name given twice");
}

/// Data layout order: widest element first, then by name (as the reference
/// implementation does), so that every tensor starts aligned to its element
/// size and zero-copy readers (numpy, torch.frombuffer) accept it.
std::vector<const NamedTensor*> layout_order(const std::vector<NamedTensor>& tensors) {
  std::vector<const NamedTensor*> order;
  for (const auto& nt : tensors) order.push_back(&nt);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const auto sa = dtype_size(a->second.dtype()), sb = dtype_size(b->second.dtype());
    return sa != sb ? sa > sb : a->first < b->first;
  });
  return order;
}

/// Header JSON padded with spaces so that 8 + its length is a multiple of 8.
std::string build_header(const std::vector<const NamedTensor*>& order,
                         const SafetensorsMetadata& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto* nt : order) {
    const Tensor& t = nt->second;
    header[nt->first] = {{"dtype", std::string(safetensors_dtype_name(t.dtype()))},
                         {"shape", t.shape()},
                         {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata) {
  check_names(tensors, path);
  const auto order = layout_order(tensors);
  const std::string header = build_header(order, metadata);
  const std::string tmp = MESH_MSG(path << ".tmp." << ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MESH_REQUIRE(out, "cannot create safetensors file '" << tmp << "': "
                      << std::strerror(errno));
    unsigned char len_bytes[kHeaderLengthBytes];
    for (std::size_t i = 0; i < kHeaderLengthBytes; ++i)
      len_bytes[i] = static_cast<unsigned char>(std::uint64_t(header.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len_bytes), kHeaderLengthBytes);
    out.write(header.data(), std::streamsize(header.size()));
    for (const auto* nt : order)
      out.write(static_cast<const char*>(nt->second.raw()),
                std::streamsize(nt->second.bytes()));
    out.close();
    MESH_REQUIRE(out, "writing safetensors file '" << tmp << "' failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  MESH_REQUIRE(!ec, "cannot rename '" << tmp << "' to '" << path << "': " << ec.message());
}

}  // namespace meshtron::io
