// Device parts of Gemma-4's one-CTA-per-row norm kernels (gemma_norms.cu) and of the attention end fused with
// the router (gemma_attention_end_route.cu), so that both compute the same bits: the row's 8-value chunks
// (row_norm.cuh's 16-byte accesses, kRowThreads threads per CTA), block sums, weighted norms.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/row_norm.cuh"

namespace mx::cuda::gemma_rows {

// Sums a and b over the CTA (two sums for the price of one pair of barriers). The trailing barrier lets the
// next call reuse `scratch`.
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* scratch) {
  a = warp_sum(a), b = warp_sum(b);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) scratch[warp] = make_float2(a, b);
  __syncthreads();
  float2 total = make_float2(0.f, 0.f);
#pragma unroll
  for (int w = 0; w < kRowThreads / 32; ++w) total.x += scratch[w].x, total.y += scratch[w].y;
  __syncthreads();
  return total;
}

__device__ __forceinline__ float sum_sq(const float (&v)[8]) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += v[j] * v[j];
  return s;
}

// Chunk i of a bf16 vector (8 values), kept as loaded until used: 4 registers instead of 8.
__device__ __forceinline__ uint4 load_raw8(const uint16_t* p, int64_t i) { return reinterpret_cast<const uint4*>(p)[i]; }
__device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = bf16_bits_to_f32(h[j]);
}

// A weighted RMSNorm's output chunk: out[i] = weight * (v * inv_rms), each of the 8 values rounded once.
__device__ __forceinline__ void store_weighted_norm(const uint4& weight, uint16_t* out, int64_t i,
                                                    const float (&v)[8], float inv_rms) {
  float w[8], o[8];
  unpack8(weight, w);
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = w[j] * (v[j] * inv_rms);
  store8(out, i, o);
}

// The chunk index of this thread's c-th chunk, or -1 past the row's end.
__device__ __forceinline__ int64_t chunk_index(int c, int64_t chunks) {
  const int64_t i = threadIdx.x + static_cast<int64_t>(c) * kRowThreads;
  return i < chunks ? i : -1;
}

}  // namespace mx::cuda::gemma_rows
