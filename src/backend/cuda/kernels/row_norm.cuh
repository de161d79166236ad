// One CTA's RMSNorm of one row (optionally after the residual add): the body of norm_embed.cu's rms_norm_kernel,
// shared with the one-shot all-reduce that ends in the same add + norm (all_reduce.cu), so that both give the
// same bits. 16-byte accesses, fp32 math; kRowThreads threads per CTA.
#pragma once

#include <concepts>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {

inline constexpr int kRowThreads = 256;
// Each thread keeps its 8-element chunks in registers between the two passes (hidden <= 8 * 256 * kMaxChunks).
inline constexpr int kMaxChunks = 4;

// 8 consecutive elements of a bf16 or f32 row as floats, and back.
__device__ __forceinline__ void load8(const uint16_t* p, int64_t i, float (&v)[8]) {
  const uint4 a = reinterpret_cast<const uint4*>(p)[i];
  const uint16_t* as = reinterpret_cast<const uint16_t*>(&a);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = bf16_bits_to_f32(as[j]);
}
__device__ __forceinline__ void load8(const float* p, int64_t i, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[2 * i], b = reinterpret_cast<const float4*>(p)[2 * i + 1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(uint16_t* p, int64_t i, const float (&v)[8]) {
  uint16_t o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = f32_to_bf16_bits(v[j]);
  reinterpret_cast<uint4*>(p)[i] = *reinterpret_cast<const uint4*>(o);
}
__device__ __forceinline__ void store8(float* p, int64_t i, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[2 * i] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[2 * i + 1] = make_float4(v[4], v[5], v[6], v[7]);
}

inline __device__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += scratch[w];
  return total;
}

// The value an element of Res holds once `v` is stored (rounded to bf16 when Res is bf16 bits).
template <typename Res>
__device__ __forceinline__ float as_stored(float v) {
  if constexpr (sizeof(Res) == 2) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  return v;
}

// The norm weight's chunks of the calling thread (store_normed_row's), read ahead: before a PDL wait where
// p.weight_before_wait (the weight is a constant), so that their round trip overlaps the kernel before.
struct NormWeights {
  uint4 c[kMaxChunks];
  bool read = false;
};
__device__ __forceinline__ void read_norm_weights(const RmsNormParams& p, NormWeights& w) {
  if (!p.weight || !p.weight_before_wait) return;
  const int64_t chunks = p.hidden / 8;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i < chunks) w.c[c] = reinterpret_cast<const uint4*>(p.weight)[i];
  }
  w.read = true;
}

// The second pass of a row's norm: dst[i] = weight[i] * (v[i] * inv) as bf16 for the calling thread's chunks
// of row `row` (dst: the row's start; dst2 too where not null). `ahead`: the weight's chunks where read ahead.
__device__ __forceinline__ void store_normed_row(const RmsNormParams& p, const float (&v)[kMaxChunks][8], float inv,
                                                 uint16_t* dst, uint16_t* dst2 = nullptr,
                                                 const NormWeights* ahead = nullptr) {
  const int64_t chunks = p.hidden / 8;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i >= chunks) break;
    float w[8] = {1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f}, o[8];
    if (ahead && ahead->read) {
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(&ahead->c[c]);
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = bf16_bits_to_f32(ws[j]);
    } else if (p.weight) {
      load8(p.weight, i, w);  // null: weightless (Gemma-4's router and v norms)
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = w[j] * (v[c][j] * inv);
    store8(dst, i, o);
    if (dst2) store8(dst2, i, o);
  }
}

// Row `row` of RmsNormParams (kernels.h) by the calling CTA; scratch: kRowThreads / 32 floats of shared memory.
// Res: the residual stream's element type (float or bf16 bits). With p.residual, delta_chunk(i, d) gives the 8
// values of chunk i of the row's delta (the next overload: p.delta's).
template <typename Res, typename DeltaChunk>
  requires std::invocable<DeltaChunk&, int64_t, float (&)[8]>
__device__ __forceinline__ void rms_norm_row(const RmsNormParams& p, int64_t row, float* scratch,
                                             DeltaChunk delta_chunk, const NormWeights* ahead = nullptr) {
  const int64_t chunks = p.hidden / 8;
  float v[kMaxChunks][8];
  float sum_sq = 0;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i >= chunks) break;
    if (p.residual) {
      Res* res = static_cast<Res*>(p.residual) + row * p.hidden;
      float d[8];
      load8(res, i, v[c]);
      delta_chunk(i, d);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[c][j] += d[j];
      store8(res, i, v[c]);
      // The norm sees what the residual now holds (rounded to bf16 when the stream is bf16).
      load8(res, i, v[c]);
    } else {
      load8(static_cast<const Res*>(p.x) + row * p.hidden, i, v[c]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) sum_sq += v[c][j] * v[c][j];
  }
  const float total = block_sum(sum_sq, scratch);
  const float inv = rsqrtf(total / static_cast<float>(p.hidden) + p.eps);
  store_normed_row(p, v, inv, p.out + row * p.hidden, nullptr, ahead);
}
template <typename Res>
__device__ __forceinline__ void rms_norm_row(const RmsNormParams& p, int64_t row, float* scratch,
                                             const NormWeights* ahead = nullptr) {
  rms_norm_row<Res>(p, row, scratch, [&](int64_t i, float(&d)[8]) { load8(p.delta + row * p.hidden, i, d); }, ahead);
}

// rms_norm_row's residual add and norm without its stores to the residual (a caller whose CTAs share the row
// stores it once every CTA has read the old one, store_residual_row): v = the new residual row as stored (the
// same bits), and the norm's 1/rms returned; p.residual must be set.
template <typename Res>
__device__ __forceinline__ float add_norm_row_in_registers(const RmsNormParams& p, int64_t row, float* scratch,
                                                           float (&v)[kMaxChunks][8]) {
  const int64_t chunks = p.hidden / 8;
  const Res* res = static_cast<const Res*>(p.residual) + row * p.hidden;
  float sum_sq = 0;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i >= chunks) break;
    float d[8];
    load8(res, i, v[c]);
    load8(p.delta + row * p.hidden, i, d);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[c][j] = as_stored<Res>(v[c][j] + d[j]);
      sum_sq += v[c][j] * v[c][j];
    }
  }
  const float total = block_sum(sum_sq, scratch);
  return rsqrtf(total / static_cast<float>(p.hidden) + p.eps);
}

// The new residual row v (add_norm_row_in_registers) into p.residual.
template <typename Res>
__device__ __forceinline__ void store_residual_row(const RmsNormParams& p, int64_t row, const float (&v)[kMaxChunks][8]) {
  const int64_t chunks = p.hidden / 8;
  Res* res = static_cast<Res*>(p.residual) + row * p.hidden;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i >= chunks) break;
    store8(res, i, v[c]);
  }
}

}  // namespace mx::cuda
