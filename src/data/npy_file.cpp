#include "data/npy_file.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "common/error.hpp"

namespace meshtron::data {

namespace {

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kPreambleBytes = 10;  // magic, version 1.0, uint16 length
constexpr std::size_t kAlignment = 64;      // numpy pads headers to 64 bytes

template <class T> const char* descr();
template <> const char* descr<std::int32_t>() { return "<i4"; }
template <> const char* descr<std::uint32_t>() { return "<u4"; }
template <> const char* descr<std::int64_t>() { return "<i8"; }

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::ostringstream s;
  s << "(";
  for (std::size_t k = 0; k < shape.size(); ++k) s << (k ? ", " : "") << shape[k];
  if (shape.size() == 1) s << ",";
  s << ")";
  return s.str();
}

/// The header dictionary exactly as numpy.save writes it, padded with spaces
/// and ended with '\n' so that preamble + header is a multiple of 64 bytes.
template <class T>
std::string header_text(const std::vector<std::int64_t>& shape) {
  std::string dict = std::string("{'descr': '") + descr<T>() +
                     "', 'fortran_order': False, 'shape': " + shape_text(shape) + ", }";
  const std::size_t unpadded = kPreambleBytes + dict.size() + 1;
  const std::size_t padded = (unpadded + kAlignment - 1) / kAlignment * kAlignment;
  dict.append(padded - unpadded, ' ');
  dict.push_back('\n');
  return dict;
}

/// Shape parsed from "'shape': (a, b), " or nullopt.
std::optional<std::vector<std::int64_t>> parse_shape(const std::string& header) {
  const std::string key = "'shape': (";
  const std::size_t at = header.find(key);
  if (at == std::string::npos) return std::nullopt;
  const std::size_t close = header.find(')', at);
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::int64_t> shape;
  std::istringstream in(header.substr(at + key.size(), close - at - key.size()));
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    try {
      shape.push_back(std::stoll(item));
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (shape.back() < 0) return std::nullopt;
  }
  return shape;
}

}  // namespace

template <class T>
void write_npy(const std::string& path, const std::vector<T>& values,
               const std::vector<std::int64_t>& shape) {
  std::int64_t count = 1;
  for (std::int64_t n : shape) count *= n;
  MESH_VERIFY(count == std::int64_t(values.size()), "write_npy '" << path << "': shape "
              << shape_text(shape) << " does not match " << values.size() << " values");
  const std::string header = header_text<T>(shape);
  const auto header_len = std::uint16_t(header.size());

  // Unique temporary name: several ranks may write the same cache at once.
  std::random_device entropy;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(entropy());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  MESH_REQUIRE(f != nullptr, "cannot create '" << tmp << "': " << std::strerror(errno));
  bool ok = std::fwrite(kMagic, 1, 6, f) == 6;
  const unsigned char version[2] = {1, 0};
  const unsigned char length[2] = {std::uint8_t(header_len & 0xff), std::uint8_t(header_len >> 8)};
  ok = ok && std::fwrite(version, 1, 2, f) == 2 && std::fwrite(length, 1, 2, f) == 2;
  ok = ok && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  ok = ok && std::fwrite(values.data(), sizeof(T), values.size(), f) == values.size();
  ok = (std::fclose(f) == 0) && ok;
  if (ok) ok = std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) std::remove(tmp.c_str());
  MESH_REQUIRE(ok, "cannot write '" << path << "': " << std::strerror(errno));
}

template <class T>
std::optional<NpyArray<T>> read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  char preamble[kPreambleBytes];
  if (!in.read(preamble, kPreambleBytes)) return std::nullopt;
  if (std::memcmp(preamble, kMagic, 6) != 0 || preamble[6] != 1) return std::nullopt;
  const std::size_t header_len = std::uint8_t(preamble[8]) | (std::uint8_t(preamble[9]) << 8);
  std::string header(header_len, '\0');
  if (!in.read(header.data(), std::streamsize(header_len))) return std::nullopt;
  if (header.find(std::string("'descr': '") + descr<T>() + "'") == std::string::npos ||
      header.find("'fortran_order': False") == std::string::npos)
    return std::nullopt;
  auto shape = parse_shape(header);
  if (!shape) return std::nullopt;
  NpyArray<T> array;
  array.shape = *shape;
  // The data must fill the rest of the file exactly: checked before
  // allocating, so a corrupt shape cannot ask for absurd memory.
  const std::streamoff data_begin = in.tellg();
  in.seekg(0, std::ios::end);
  const std::streamoff data_bytes = in.tellg() - data_begin;
  in.seekg(data_begin);
  std::int64_t count = 1;
  for (std::int64_t n : array.shape) {
    if (n > 0 && count > data_bytes / n) return std::nullopt;
    count *= n;
  }
  if (count * std::int64_t(sizeof(T)) != data_bytes) return std::nullopt;
  array.values.resize(std::size_t(count));
  if (!in.read(reinterpret_cast<char*>(array.values.data()), data_bytes)) return std::nullopt;
  return array;
}

template void write_npy<std::int32_t>(const std::string&, const std::vector<std::int32_t>&,
                                      const std::vector<std::int64_t>&);
template void write_npy<std::uint32_t>(const std::string&, const std::vector<std::uint32_t>&,
                                       const std::vector<std::int64_t>&);
template void write_npy<std::int64_t>(const std::string&, const std::vector<std::int64_t>&,
                                      const std::vector<std::int64_t>&);
template std::optional<NpyArray<std::int32_t>> read_npy<std::int32_t>(const std::string&);
template std::optional<NpyArray<std::uint32_t>> read_npy<std::uint32_t>(const std::string&);
template std::optional<NpyArray<std::int64_t>> read_npy<std::int64_t>(const std::string&);

}  // namespace meshtron::data
