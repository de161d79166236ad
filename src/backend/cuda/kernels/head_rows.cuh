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

// One rotated pair (x0, x1) = (x[i], x[i + half]) of a q or k head (NeoX halves), bf16 bits in and out: every
// RoPE form (qkv_rope's two, the attention's Q load) rounds this one expression.
__device__ __forceinline__ void rope_rotate_pair(uint16_t x0, uint16_t x1, float c, float s, uint16_t& y0,
                                                 uint16_t& y1) {
  const float a = bf16_bits_to_f32(x0), b = bf16_bits_to_f32(x1);
  y0 = f32_to_bf16_bits(a * c - b * s);
  y1 = f32_to_bf16_bits(b * c + a * s);
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
