// DType conversions, checked exhaustively over every bit pattern of the narrow formats.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace mx {
namespace {

TEST(DType, Bf16WideningIsExactAndRoundTripsEveryPattern) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    EXPECT_EQ(f32_bits(f), b << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      ASSERT_EQ(f32_to_bf16(f), b) << "pattern " << b;
    }
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the largest bf16
}

TEST(DType, F16EveryPatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << "pattern " << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
}

TEST(DType, F16MidpointsRoundToEven) {
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const float lo = f16_to_f32(static_cast<uint16_t>(h));
    const float hi = f16_to_f32(static_cast<uint16_t>(h + 1));
    const float mid = 0.5f * (lo + hi);  // exact in f32
    ASSERT_EQ(f32_to_f16(mid), (h % 2 == 0) ? h : h + 1) << "between patterns " << h << " and " << h + 1;
  }
}

TEST(DType, Fp8E4M3EveryPattern) {
  int nan_count = 0;
  for (uint32_t v = 0; v <= 0xff; ++v) {
    const float f = fp8e4m3_to_f32(static_cast<uint8_t>(v));
    if (std::isnan(f)) {
      ++nan_count;
      continue;
    }
    ASSERT_EQ(f32_to_fp8e4m3(f), v) << "pattern " << v;
  }
  EXPECT_EQ(nan_count, 2);  // 0x7f and 0xff
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f32_to_fp8e4m3(1e6f), 0x7e);     // saturates
  EXPECT_EQ(f32_to_fp8e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(std::nanf("")), 0x7f);
}

TEST(DType, Fp8E4M3MidpointsRoundToEven) {
  for (uint32_t v = 0; v < 0x7e; ++v) {
    const float lo = fp8e4m3_to_f32(static_cast<uint8_t>(v));
    const float hi = fp8e4m3_to_f32(static_cast<uint8_t>(v + 1));
    const float mid = 0.5f * (lo + hi);
    ASSERT_EQ(f32_to_fp8e4m3(mid), (v % 2 == 0) ? v : v + 1) << "between " << v << " and " << v + 1;
    ASSERT_EQ(f32_to_fp8e4m3(-mid), ((v % 2 == 0) ? v : v + 1) | 0x80);
  }
}

// f32_to_fp8e4m3 works on the bits; this is its arithmetic form (frexp, ldexp, nearest even), which it replaced
// as the dense FP8 conversion's per-weight step. Every 4099th f32 pattern (NaNs, infinities, subnormals, both
// signs) and every 7th f32 from 2^-10 to 2^-5 (around e4m3's subnormal/normal boundary) give the same code.
TEST(DType, Fp8E4M3EqualsTheArithmeticForm) {
  auto reference = [](float f) -> uint8_t {
    if (std::isnan(f)) return 0x7f;
    const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    const float a = std::fabs(f);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < std::ldexp(1.0f, -6)) return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
    int e2;
    std::frexp(a, &e2);
    int exponent = e2 - 1, q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exponent)));
    if (q == 16) q = 8, ++exponent;
    const int code = ((exponent + 7) << 3) | (q - 8);
    return static_cast<uint8_t>(sign | (code > 0x7e ? 0x7e : code));
  };
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    const float f = f32_from_bits(static_cast<uint32_t>(bits));
    ASSERT_EQ(f32_to_fp8e4m3(f), reference(f)) << "pattern " << bits;
  }
  for (uint32_t bits = f32_bits(std::ldexp(1.0f, -10)); bits < f32_bits(std::ldexp(1.0f, -5)); bits += 7) {
    const float f = f32_from_bits(bits);
    ASSERT_EQ(f32_to_fp8e4m3(f), reference(f)) << f;
    ASSERT_EQ(f32_to_fp8e4m3(-f), reference(-f)) << -f;
  }
}

TEST(DType, E8M0EveryPattern) {
  for (uint32_t v = 0; v < 0xff; ++v) {
    const float f = e8m0_to_f32(static_cast<uint8_t>(v));
    ASSERT_EQ(f, std::ldexp(1.0f, static_cast<int>(v) - 127)) << v;
    // The bf16 shortcut used by kernels: for 1 <= v <= 254 the bf16 pattern of 2^(v-127) is v << 7.
    if (v >= 1) {
      ASSERT_EQ(f32_to_bf16(f), static_cast<uint16_t>(v << 7)) << v;
    }
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
}

TEST(DType, Fp4E2M1EveryCode) {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t code = 0; code < 16; ++code) {
    const float f = fp4e2m1_to_f32(code);
    EXPECT_EQ(std::fabs(f), magnitudes[code & 7]);
    EXPECT_EQ(std::signbit(f), (code & 8) != 0);
    EXPECT_EQ(f32_to_fp4e2m1(f), code);
  }
  // Every byte decodes as two codes, low nibble first (the MXFP4 element order).
  for (uint32_t byte = 0; byte <= 0xff; ++byte) {
    EXPECT_EQ(fp4e2m1_to_f32(byte & 0xf), kFp4E2M1Values[byte & 0xf]);
    EXPECT_EQ(fp4e2m1_to_f32(byte >> 4), kFp4E2M1Values[byte >> 4]);
  }
}

TEST(DType, Fp4E2M1RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(f32_to_fp4e2m1(0.25f), 0);   // tie between 0 and 0.5 -> even code 0
  EXPECT_EQ(f32_to_fp4e2m1(0.75f), 2);   // tie between 0.5 (1) and 1.0 (2)
  EXPECT_EQ(f32_to_fp4e2m1(1.25f), 2);   // tie between 1.0 (2) and 1.5 (3)
  EXPECT_EQ(f32_to_fp4e2m1(2.5f), 4);    // tie between 2 (4) and 3 (5)
  EXPECT_EQ(f32_to_fp4e2m1(5.0f), 6);    // tie between 4 (6) and 6 (7)
  EXPECT_EQ(f32_to_fp4e2m1(5.1f), 7);
  EXPECT_EQ(f32_to_fp4e2m1(100.0f), 7);
  EXPECT_EQ(f32_to_fp4e2m1(-100.0f), 15);
}

TEST(DType, SafetensorsNames) {
  DType dt;
  ASSERT_TRUE(dtype_from_safetensors("BF16", &dt));
  EXPECT_EQ(dt, DType::kBF16);
  ASSERT_TRUE(dtype_from_safetensors("U8", &dt));
  EXPECT_EQ(dt, DType::kU8);
  EXPECT_FALSE(dtype_from_safetensors("bf16", &dt));
  EXPECT_FALSE(dtype_from_safetensors("F4", &dt));
  EXPECT_STREQ(dtype_to_safetensors(DType::kF32), "F32");
  EXPECT_EQ(dtype_bytes(DType::kFP4E2M1, 3), 2);
}

}  // namespace
}  // namespace mx
