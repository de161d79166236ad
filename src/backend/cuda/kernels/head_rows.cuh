// Per-token, per-head pieces that the RoPE kernels (rope.cu; gemma_rope.cu with Gemma-4's per-head norms)
// and the per-head norms (gemma_ops.cu) share, so that each computes the same bits: the token's RoPE
// cos/sin table, its slot in the paged KV cache, and a head row loaded into registers with its sum of
// squares.
#pragma once

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {

// cos / sin of pos * inv_freq[i] for i < half, times `scale`: the fp32 angle and the precise sincosf, as
// the CPU twin computes them. The CTA's threads split i; the caller's barrier publishes the table.
__device__ __forceinline__ void rope_cos_sin(int32_t pos, float inv_freq, float scale, float& c, float& s) {
  sincosf(static_cast<float>(pos) * inv_freq, &s, &c);
  c *= scale;
  s *= scale;
}
__device__ __forceinline__ void rope_table(float* cos_t, float* sin_t, int half, int32_t pos, const float* inv_freq,
                                           float scale) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) rope_cos_sin(pos, inv_freq[i], scale, cos_t[i], sin_t[i]);
}

// The rotation of one pair (a, b) = (x[i], x[i + half]) of a q or k head (NeoX halves) in fp32, its multiplies and
// adds spelled out (no contraction left to the compiler): every RoPE form (qkv_rope's two, the attention's Q load)
// computes these bits and rounds them once to bf16.
__device__ __forceinline__ float rope_first(float a, float b, float c, float s) {
  return __fmaf_rn(a, c, -__fmul_rn(b, s));
}
__device__ __forceinline__ float rope_second(float a, float b, float c, float s) {
  return __fmaf_rn(b, c, __fmul_rn(a, s));
}

// One rotated pair (x0, x1) = (x[i], x[i + half]), bf16 bits in and out.
__device__ __forceinline__ void rope_rotate_pair(uint16_t x0, uint16_t x1, float c, float s, uint16_t& y0,
                                                 uint16_t& y1) {
  const float a = bf16_bits_to_f32(x0), b = bf16_bits_to_f32(x1);
  y0 = f32_to_bf16_bits(rope_first(a, b, c, s));
  y1 = f32_to_bf16_bits(rope_second(a, b, c, s));
}

// Two neighbouring pairs at once, as bf16x2 words: x holds dims i, i + 1 of the first half, y their partners
// i + half, i + half + 1 (cos/sin c0, s0 of dim i, c1, s1 of i + 1). rope_rotate_pair's bits, but two results to a
// cvt.rn.bf16x2 (one conversion instruction instead of two: the attention's Q load rotates 32 pairs a thread a
// block, and single conversions share the pipe of the softmax's exp2s).
__device__ __forceinline__ void rope_rotate_pair2(uint32_t x, uint32_t y, float c0, float s0, float c1, float s1,
                                                  uint32_t& x_out, uint32_t& y_out) {
  const float a0 = __uint_as_float(x << 16), a1 = __uint_as_float(x & 0xffff0000u);
  const float b0 = __uint_as_float(y << 16), b1 = __uint_as_float(y & 0xffff0000u);
  const float x0 = rope_first(a0, b0, c0, s0), x1 = rope_first(a1, b1, c1, s1);
  const float y0 = rope_second(a0, b0, c0, s0), y1 = rope_second(a1, b1, c1, s1);
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(x_out) : "f"(x1), "f"(x0));  // the first operand: the high half
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(y_out) : "f"(y1), "f"(y0));
}

// Row of token t's first KV head in the paged cache (rows of head_dim; n_kv per token), or -1 where its
// position has no page (the host validates the tables; such a token's K and V are not written).
__device__ __forceinline__ int64_t kv_row(const PagedKv& kv, int64_t t, int32_t pos, int64_t n_kv) {
  const int32_t seq = kv.token_seq[t];
  const int64_t logical = pos / kv.page_size;
  int64_t page = -1;
  if (pos >= 0 && logical < kv.max_pages) page = kv.page_table[seq * kv.max_pages + logical];
  if (page < 0 || page >= kv.num_pages) return -1;
  return (page * kv.page_size + pos % kv.page_size) * n_kv;
}

// One warp: a bf16 head row of `chunks` 16-byte chunks (lane + 32 c) into v as fp32; returns the row's
// sum of squares (every lane). chunks <= 32 kChunks.
template <int kChunks>
__device__ __forceinline__ float load_head_row(const uint16_t* row, int chunks, float (&v)[kChunks][8]) {
  const int lane = threadIdx.x % 32;
  float sum_sq = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = lane + 32 * c;
    if (i >= chunks) break;
    const uint4 a = reinterpret_cast<const uint4*>(row)[i];
    const uint16_t* as = reinterpret_cast<const uint16_t*>(&a);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[c][j] = bf16_bits_to_f32(as[j]);
      sum_sq += v[c][j] * v[c][j];
    }
  }
  return warp_sum(sum_sq);
}

}  // namespace mx::cuda
