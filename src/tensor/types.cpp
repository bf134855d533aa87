#include "tensor/types.hpp"

#include "common/error.hpp"

namespace meshtron {

std::uint16_t fp16::from_float(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u)  // Inf or NaN
    return std::uint16_t(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u));
  if (mag >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // overflow
  if (mag < 0x38800000u) {  // subnormal half or zero: round by float addition
    float abs_f;
    std::memcpy(&abs_f, &mag, 4);
    abs_f += 0.5f;  // 2^-1 aligns the half subnormal ulp (2^-24) to bit 0
    std::uint32_t r;
    std::memcpy(&r, &abs_f, 4);
    return std::uint16_t(sign | (r - 0x3f000000u));
  }
  // Normal: rebias exponent (127 -> 15) and round to nearest even.
  mag += 0xc8000fffu + ((mag >> 13) & 1u);
  return std::uint16_t(sign | (mag >> 13));
}

float fp16::to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  std::uint32_t out;
  if (exp == 0) {
    float f = float(man) * 5.9604644775390625e-8f;  // 2^-24
    std::memcpy(&out, &f, 4);
    out |= sign;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U16: return "uint16";
    case DType::U8: return "uint8";
  }
  return "?";
}

DType parse_dtype(std::string_view n) {
  if (n == "fp32" || n == "F32" || n == "float32") return DType::F32;
  if (n == "fp64" || n == "F64" || n == "float64") return DType::F64;
  if (n == "bf16" || n == "BF16" || n == "bfloat16") return DType::BF16;
  if (n == "fp16" || n == "F16" || n == "float16") return DType::F16;
  if (n == "int32" || n == "I32") return DType::I32;
  if (n == "int64" || n == "I64") return DType::I64;
  if (n == "uint16" || n == "U16") return DType::U16;
  if (n == "uint8" || n == "U8") return DType::U8;
  throw UserError(MESH_MSG("unknown dtype '" << n
                           << "' (expected fp32, bf16, fp16 or fp64)"));
}

}  // namespace meshtron
