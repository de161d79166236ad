#include "core/dtype.h"

#include <cmath>
#include <limits>

namespace mx {

int dtype_bits(DType dt) {
  switch (dt) {
    case DType::kF32: return 32;
    case DType::kBF16: return 16;
    case DType::kF16: return 16;
    case DType::kF8E4M3: return 8;
    case DType::kE8M0: return 8;
    case DType::kFP4E2M1: return 4;
    case DType::kU8: return 8;
    case DType::kI8: return 8;
    case DType::kI32: return 32;
    case DType::kI64: return 64;
    case DType::kBool: return 8;
  }
  return 0;
}

int64_t dtype_bytes(DType dt, int64_t count) { return (count * dtype_bits(dt) + 7) / 8; }

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF8E4M3: return "fp8e4m3";
    case DType::kE8M0: return "e8m0";
    case DType::kFP4E2M1: return "fp4e2m1";
    case DType::kU8: return "u8";
    case DType::kI8: return "i8";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kBool: return "bool";
  }
  return "?";
}

namespace {
struct SafetensorsName {
  const char* name;
  DType dtype;
};
// FP4 has no safetensors spelling: checkpoints store packed MXFP4 as U8.
constexpr SafetensorsName kSafetensorsNames[] = {
    {"F32", DType::kF32},  {"BF16", DType::kBF16}, {"F16", DType::kF16}, {"F8_E4M3", DType::kF8E4M3},
    {"F8_E8M0", DType::kE8M0}, {"U8", DType::kU8}, {"I8", DType::kI8},   {"I32", DType::kI32},
    {"I64", DType::kI64},  {"BOOL", DType::kBool},
};
}  // namespace

bool dtype_from_safetensors(std::string_view name, DType* out) {
  for (const auto& entry : kSafetensorsNames) {
    if (name == entry.name) {
      *out = entry.dtype;
      return true;
    }
  }
  return false;
}

const char* dtype_to_safetensors(DType dt) {
  for (const auto& entry : kSafetensorsNames) {
    if (entry.dtype == dt) return entry.name;
  }
  return nullptr;
}

float f16_to_f32(uint16_t h) {
  const bool negative = (h & 0x8000u) != 0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    magnitude = std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);
  }
  return negative ? -magnitude : magnitude;
}

uint16_t f32_to_f16(float f) {
  const uint16_t sign = (f32_bits(f) >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // past the halfway point above 65504: infinity
  if (a < std::ldexp(1.0f, -14)) {           // subnormal: quantum 2^-24
    const auto q = static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
    return sign | q;  // q == 1024 lands exactly on the smallest normal's code
  }
  int e2;
  std::frexp(a, &e2);
  int exponent = e2 - 1;  // a in [2^exponent, 2^(exponent+1))
  int q = static_cast<int>(std::nearbyint(std::ldexp(a, 10 - exponent)));  // in [1024, 2048]
  if (q == 2048) {
    q = 1024;
    ++exponent;
  }
  if (exponent + 15 >= 31) return sign | 0x7c00u;
  return static_cast<uint16_t>(sign | ((exponent + 15) << 10) | (q - 1024));
}

float fp8e4m3_to_f32(uint8_t v) {
  const bool negative = (v & 0x80u) != 0;
  const int exponent = (v >> 3) & 0xf;
  const int mantissa = v & 0x7;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  }
  return negative ? -magnitude : magnitude;
}

// On the bits: the dense FP8 conversion runs it over every weight at load (1.5G for gpt-oss-120b), where frexp,
// ldexp and nearbyint per value cost ~10x this.
uint8_t f32_to_fp8e4m3(float f) {
  const uint32_t bits = f32_bits(f);
  const uint8_t sign = (bits >> 31) ? 0x80 : 0x00;
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;  // NaN
  constexpr uint8_t kMaxFinite = 0x7e;  // 448
  if (abs >= 0x43e00000u) return sign | kMaxFinite;  // >= 448 (and infinity)
  if (abs < 0x3c800000u) {  // below 2^-6, e4m3's subnormals: quantum 2^-9
    const auto q = static_cast<uint8_t>(std::nearbyint(std::ldexp(f32_from_bits(abs), 9)));
    return sign | q;  // q == 8 is exactly the smallest normal's code
  }
  // A normal f32 to 3 mantissa bits, nearest even: the 20 bits below them rounded into the exponent and mantissa
  // together (a carry out of the mantissa bumps the exponent), then rebiased from 127 to 7.
  const uint32_t rounded = (abs + 0x7ffffu + ((abs >> 20) & 1u)) >> 20;
  const uint32_t code = rounded - ((127 - 7) << 3);
  return static_cast<uint8_t>(sign | (code > kMaxFinite ? kMaxFinite : code));
}

float e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

uint8_t f32_to_fp4e2m1(float f) {
  if (std::isnan(f)) return 0;
  const uint8_t sign = std::signbit(f) ? 0x8 : 0x0;
  const float a = std::fabs(f);
  for (uint8_t code = 0; code < 7; ++code) {
    const float mid = 0.5f * (kFp4E2M1Values[code] + kFp4E2M1Values[code + 1]);
    if (a < mid) return sign | code;
    if (a == mid) return sign | ((code % 2 == 0) ? code : code + 1);
  }
  return sign | 7;
}

}  // namespace mx
