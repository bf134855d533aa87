// Scalar types and aliases used across meshtron (one place, as ExaMiniMD's
// types.h). bf16 and fp16 are storage types: arithmetic happens in float.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace meshtron {

using index_t = std::int64_t;  ///< element counts and offsets
using token_t = std::int32_t;  ///< token ids in memory

/// bfloat16: the top 16 bits of an IEEE float, rounded to nearest even.
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const {
    std::uint32_t u = std::uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static std::uint16_t from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))  // NaN stays NaN
      return std::uint16_t((u >> 16) | 0x0040u);
    const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return std::uint16_t((u + rounding) >> 16);
  }
};

/// IEEE binary16, converted in software (the host path never computes in it).
struct fp16 {
  std::uint16_t bits = 0;
  fp16() = default;
  explicit fp16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }
  static std::uint16_t from_float(float f);
  static float to_float(std::uint16_t h);
};

enum class DType : std::uint8_t { F32, F64, BF16, F16, I32, I64, U16, U8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: case DType::U16: return 2;
    case DType::U8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t);
/// Parse "fp32", "bf16", "fp16", "fp64" (and the safetensors spellings
/// "F32", "BF16", "F16", "F64", "I32", "I64"); throws UserError otherwise.
DType parse_dtype(std::string_view name);

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<fp16> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<std::uint16_t> { static constexpr DType value = DType::U16; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::U8; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

/// Where a tensor's memory lives.
enum class MemorySpace : std::uint8_t { Host, Cuda };

}  // namespace meshtron
