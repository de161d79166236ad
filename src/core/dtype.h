// Element types of tensors in checkpoints, caches and activations, with exact scalar conversions.
// Conversions here are the reference: CUDA kernels decode the same bit patterns and are tested against them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mx {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kF8E4M3,  // fp8, 4 exponent bits, 3 mantissa bits, no infinities (0x7f/0xff are NaN)
  kE8M0,    // unsigned power-of-two scale, bias 127, 0xff is NaN (MX block scales)
  kFP4E2M1, // 4-bit float, two per byte; only as packed MXFP4 blocks (U8 in checkpoints)
  kU8,
  kI8,
  kI32,
  kI64,
  kBool,  // one byte per element (safetensors BOOL: e.g. EAGLE-3's t2d mask)
};

// Bits per element (4 for FP4, which is stored packed two per byte).
int dtype_bits(DType dt);
// Bytes for `count` elements; FP4 rounds up to whole bytes.
int64_t dtype_bytes(DType dt, int64_t count);
const char* dtype_name(DType dt);
// Safetensors dtype strings: "F32", "BF16", "F16", "F8_E4M3", "F8_E8M0", "U8", "I8", "I32", "I64", "BOOL".
bool dtype_from_safetensors(std::string_view name, DType* out);
const char* dtype_to_safetensors(DType dt);

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 is the top half of an f32: widening is exact.
inline float bf16_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }
// Round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// fp8 e4m3fn (OCP): bias 7, max finite 448, no infinities, S.1111.111 is NaN.
float fp8e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating to +-448; NaN maps to 0x7f.
uint8_t f32_to_fp8e4m3(float f);

// e8m0: 2^(v - 127) for v in 0..254; 255 is NaN.
float e8m0_to_f32(uint8_t v);

// fp4 e2m1 code (low 4 bits): sign bit 3, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
inline constexpr float kFp4E2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline float fp4e2m1_to_f32(uint8_t code) { return kFp4E2M1Values[code & 0xf]; }
// Round to nearest representable, ties to the even code; saturates at +-6; NaN maps to +0.
uint8_t f32_to_fp4e2m1(float f);

}  // namespace mx
