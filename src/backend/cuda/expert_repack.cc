#include "backend/cuda/expert_repack.h"

#include <cmath>
#include <cstring>
#include <string>

#include "backend/cuda/mxfp4_word.h"
#include "core/dtype.h"

namespace mx::cuda {

Status check_swap_ab(int64_t rows, int64_t k, const uint8_t* scales) {
  if (rows % 16 != 0 || k % 64 != 0)
    return unimplemented("MXFP4 experts of " + std::to_string(rows) + " x " + std::to_string(k) +
                         ": the CUDA kernels need rows % 16 == 0 and k % 64 == 0");
  for (int64_t i = 0; i < rows * (k / 32); ++i)
    if (scales[i] > kSwapAbMaxScale)
      return unimplemented("MXFP4 block scale 2^" + std::to_string(int{scales[i]} - 127) +
                           " is above 2^1, which the CUDA expert kernels do not support");
  return Status::ok();
}

int64_t swap_ab_source_row(int64_t strip, int rr, bool gate_up_pairs) {
  if (!gate_up_pairs) return strip * 16 + rr;
  const int64_t channel = strip * 8 + (rr & 7);
  return 2 * channel + (rr >= 8 ? 1 : 0);
}

namespace {

// scatter[reg][byte]: the byte's two codes (low nibble half 0, high nibble half 1) at their places in a word of
// register reg (mxfp4_word.h), so that a word is four lookups of whole checkpoint bytes.
struct ByteScatter {
  uint32_t bits[4][256];
  ByteScatter() {
    for (int reg = 0; reg < 4; ++reg)
      for (uint32_t byte = 0; byte < 256; ++byte) {
        uint32_t w = 0;
        for (int half = 0; half < 2; ++half)
          for (int bit = 0; bit < 4; ++bit) w |= ((byte >> (4 * half + bit)) & 1u) << swap_ab_stored_bit(reg, half, bit);
        bits[reg][byte] = w;
      }
  }
};

}  // namespace

// Word kk of lane (r, q) in tile t holds k b.. b + 3, b = 64 t + 16 q + 4 kk, of rows lo = src[r] (registers 0 and 2:
// k b, b + 1 and b + 2, b + 3) and hi = src[r + 8] (registers 1 and 3): the checkpoint bytes b / 2 and b / 2 + 1 of
// each row, a code's half its nibble (k b + half). This runs over every expert byte at load (57 GB for
// gpt-oss-120b): whole bytes through one table, not codes one at a time.
void repack_mxfp4_swap_ab(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t k, bool gate_up_pairs,
                          uint8_t* out_blocks, uint8_t* out_scales) {
  static const ByteScatter scatter;
  const auto& T = scatter.bits;
  const int64_t tiles = k / 64, row_bytes = k / 2, row_scales = k / 32;
  for (int64_t s = 0; s < rows / 16; ++s) {
    int64_t src[16];
    const uint8_t* row[16];
    for (int rr = 0; rr < 16; ++rr) {
      src[rr] = swap_ab_source_row(s, rr, gate_up_pairs);
      row[rr] = blocks + src[rr] * row_bytes;
    }
    for (int64_t t = 0; t < tiles; ++t) {
      uint8_t* out = out_blocks + (s * tiles + t) * 32 * 16;
      for (int lane = 0; lane < 32; ++lane) {
        const int r = lane / 4, q = lane % 4;
        const uint8_t* lo = row[r] + 32 * t + 8 * q;
        const uint8_t* hi = row[r + 8] + 32 * t + 8 * q;
        uint32_t words[4];
        for (int kk = 0; kk < 4; ++kk)
          words[kk] = T[0][lo[2 * kk]] | T[1][hi[2 * kk]] | T[2][lo[2 * kk + 1]] | T[3][hi[2 * kk + 1]];
        std::memcpy(out + lane * 16, words, 16);
      }
      for (int blk = 0; blk < 2; ++blk)
        for (int rr = 0; rr < 16; ++rr)
          out_scales[((s * tiles + t) * 2 + blk) * 16 + rr] =
              static_cast<uint8_t>(scales[src[rr] * row_scales + 2 * t + blk] + 126);
    }
  }
}

float swap_ab_weight(const uint8_t* out_blocks, const uint8_t* out_scales, int64_t rows, int64_t k, int64_t packed_row,
                     int64_t col) {
  (void)rows;
  const int64_t tiles = k / 64, s = packed_row / 16, t = col / 64;
  const int rr = static_cast<int>(packed_row % 16), r = rr & 7;
  const int64_t within = col % 64;
  const int q = static_cast<int>(within / 16), kk = static_cast<int>((within % 16) / 4), j = static_cast<int>(within % 4);
  const int lane = r * 4 + q;
  uint32_t word;
  std::memcpy(&word, out_blocks + (((s * tiles + t) * 32 + lane) * 16 + kk * 4), 4);
  // The kernel's decode: register p = 0 row r slots 0/1, p = 1 row r+8 slots 0/1, p = 2 row r slots 2/3,
  // p = 3 row r+8 slots 2/3; slot j in half j % 2.
  const int p = (j < 2 ? 0 : 2) + (rr >= 8 ? 1 : 0);
  uint32_t a[4];
  swap_ab_decode_word(word, a);
  const uint32_t half = (a[p] >> (16 * (j % 2))) & 0xffffu;
  const uint8_t code = static_cast<uint8_t>(((half >> 15) << 3) | ((half >> 6) & 7u));
  const int blk = q / 2;
  const int sc = out_scales[((s * tiles + t) * 2 + blk) * 16 + rr] - 126;
  return fp4e2m1_to_f32(code) * std::ldexp(1.0f, sc - 127);
}

}  // namespace mx::cuda
