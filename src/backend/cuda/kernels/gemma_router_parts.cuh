// Device parts both router files share (gemma_router.cu, gemma_router_split.cu): bf16 loads, the top-k of one
// token's logits with one warp (the cluster steps are in cluster.cuh).
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/cluster.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"

namespace mx::cuda::router_parts {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxExperts = 256;
constexpr int kMaxTopK = 16;

__device__ __forceinline__ float4 bf16x4_to_float4(uint2 v) {
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                     __uint_as_float(v.y & 0xffff0000u));
}

__device__ __forceinline__ float4 load_x4(const GemmaRouterParams& p, int64_t t, int64_t i) {
  if (p.x_f32) return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + t * p.hidden) + i);
  return bf16x4_to_float4(__ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.x) + t * p.hidden) + i));
}

// Weights 4i .. 4i + 3 of expert e's row, from global memory.
__device__ __forceinline__ float4 load_w4(const GemmaRouterParams& p, int64_t e, int64_t i) {
  return bf16x4_to_float4(__ldg(reinterpret_cast<const uint2*>(p.weight + e * p.hidden) + i));
}

// Float4 i of p.x_scale: x's factor per dimension before the dot products (the norm's sum of squares is of
// x itself).
__device__ __forceinline__ float4 load_x_scale4(const GemmaRouterParams& p, int64_t i) {
  return __ldg(reinterpret_cast<const float4*>(p.x_scale) + i);
}
__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
  return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// The warp sums of 8 values at once in 9 shuffles (8 warp_sums take 40): each round of halving trades the half
// of its values a lane does not keep for its partner's copy of the half it keeps. Lane l returns the sum of
// v[(l >> 2) & 7] over the warp (the lanes 4g hold value g).
__device__ __forceinline__ float warp_sum8(const float (&v)[8]) {
  const int lane = threadIdx.x % 32;
  float a[4], b[2];
  const bool up4 = lane & 16, up2 = lane & 8, up1 = lane & 4;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    a[i] = (up4 ? v[4 + i] : v[i]) + __shfl_xor_sync(0xffffffffu, up4 ? v[i] : v[4 + i], 16);
#pragma unroll
  for (int i = 0; i < 2; ++i)
    b[i] = (up2 ? a[2 + i] : a[i]) + __shfl_xor_sync(0xffffffffu, up2 ? a[i] : a[2 + i], 8);
  float c = (up1 ? b[1] : b[0]) + __shfl_xor_sync(0xffffffffu, up1 ? b[0] : b[1], 4);
  c += __shfl_xor_sync(0xffffffffu, c, 2);
  return c + __shfl_xor_sync(0xffffffffu, c, 1);
}

// Expert e's scale (p.expert_scale non-null), as f32.
__device__ __forceinline__ float expert_scale_at(const GemmaRouterParams& p, int e) {
  return p.scale_f32 ? static_cast<const float*>(p.expert_scale)[e]
                     : bf16_bits_to_f32(static_cast<const uint16_t*>(p.expert_scale)[e]);
}

// Larger logit -> larger key; the low word is ~id, so equal logits rank the lower id first.
__device__ __forceinline__ uint64_t topk_key(float logit, int id) {
  const uint32_t u = __float_as_uint(logit);
  const uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(k) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ float key_logit(uint64_t key) {
  const uint32_t k = static_cast<uint32_t>(key >> 32);
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Stores pick `lane` (lane < top_k) of token t: its expert `id`, softmax weight `ex / sum` times its scale.
__device__ __forceinline__ void store_pick(const GemmaRouterParams& p, int64_t t, int id, float ex, float sum,
                                           const float* scales) {
  const int lane = threadIdx.x % 32;
  if (id < 0 || id >= p.experts) id = lane;  // only a row of NaNs gets here; keep the ids valid
  float scale = 1.f;
  if (scales)
    scale = scales[id];
  else if (p.expert_scale)
    scale = expert_scale_at(p, id);
  p.topk_ids[t * p.top_k + lane] = id;
  p.topk_weights[t * p.top_k + lane] = ex / sum * scale;
}

// select_topk's picks at up to 128 experts with one reduction a round: each lane sorts its 4 keys, and a round
// takes the largest logit key among the lanes' heads (one redux.sync) and pops it from the lane that holds it.
// Which lane that was, and so the expert id, is found beside the next round's reduction. Two lanes holding the
// same largest logit (a tie between experts, resolved by id) would both pop: the function then returns false
// (every lane; nothing was stored) and the caller takes the general path. Every lane knows every pick's logit,
// so each sums the k exponentials itself, in pick order.
__device__ inline bool select_topk_128(const GemmaRouterParams& p, int64_t t, const float* row, const float* scales) {
  const int lane = threadIdx.x % 32, experts = static_cast<int>(p.experts), top_k = static_cast<int>(p.top_k);
  uint64_t k[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int e = lane + 32 * i;
    k[i] = e < experts ? topk_key(row ? row[e] : __ldcg(p.logits + t * p.experts + e), e) : 0ull;
  }
  auto order = [](uint64_t& a, uint64_t& b) {  // a = the larger
    const uint64_t hi = a > b ? a : b, lo = a > b ? b : a;
    a = hi;
    b = lo;
  };
  order(k[0], k[1]);
  order(k[2], k[3]);
  order(k[0], k[2]);
  order(k[1], k[3]);
  order(k[1], k[2]);
  unsigned ties = 0;
  int my_id = 0;
  float top = 0.f, sum = 0.f, my_ex = 0.f;
  for (int j = 0; j < top_k; ++j) {
    const uint32_t head = static_cast<uint32_t>(k[0] >> 32);
    const uint32_t best = __reduce_max_sync(0xffffffffu, head);
    const bool mine = head == best;
    const unsigned holders = __ballot_sync(0xffffffffu, mine);
    const uint32_t id_word = __shfl_sync(0xffffffffu, static_cast<uint32_t>(k[0]), __ffs(holders) - 1);
    if (mine) {
      k[0] = k[1];
      k[1] = k[2];
      k[2] = k[3];
      k[3] = 0ull;
    }
    ties |= holders & (holders - 1);
    const float logit = key_logit(static_cast<uint64_t>(best) << 32);
    if (j == 0) top = logit;
    const float ex = expf(logit - top);
    sum += ex;
    if (lane == j) {
      my_id = static_cast<int>(0xffffffffu - id_word);
      my_ex = ex;
    }
  }
  if (ties != 0) return false;
  if (lane < top_k) store_pick(p, t, my_id, my_ex, sum, scales);
  return true;
}

// One warp: top-k of token t's logits, softmax, scale. `row`: the token's logits in shared memory (this
// CTA computed them), or null: from p.logits through L2 (the tile's other CTAs wrote them). `scales`: the
// per-expert scales as f32 in shared memory (loaded early), or null: from p.expert_scale. Up to 128 experts
// select_topk_128 (one reduction a round); this general path where it meets a tie, and above 128 experts:
// every logit an order-preserving 32-bit key packed above the inverted expert id, the largest 64-bit key per
// round by two 32-bit reductions (the logit key, then the id word among the lanes holding it).
__device__ inline void select_topk(const GemmaRouterParams& p, int64_t t, const float* row = nullptr,
                                   const float* scales = nullptr) {
  if (p.experts <= 128 && select_topk_128(p, t, row, scales)) return;
  const int lane = threadIdx.x % 32, experts = static_cast<int>(p.experts), top_k = static_cast<int>(p.top_k);
  constexpr int kPerLane = kMaxExperts / 32;
  uint64_t keys[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    keys[i] = e < experts ? topk_key(row ? row[e] : __ldcg(p.logits + t * p.experts + e), e) : 0ull;
  }
  uint64_t mine = 0;  // lane j keeps the j-th pick
  for (int j = 0; j < top_k; ++j) {
    uint64_t local = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) local = keys[i] > local ? keys[i] : local;
    // The warp max of the 64-bit keys as two single-instruction 32-bit reductions: the logit key, then
    // the id word among the lanes holding that key.
    const uint32_t hi = __reduce_max_sync(0xffffffffu, static_cast<uint32_t>(local >> 32));
    const uint32_t lo = __reduce_max_sync(
        0xffffffffu, static_cast<uint32_t>(local >> 32) == hi ? static_cast<uint32_t>(local) : 0u);
    const uint64_t best = (static_cast<uint64_t>(hi) << 32) | lo;
    const int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best));
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i == id) keys[i] = 0ull;
    if (lane == j) mine = best;
  }
  // Softmax over the k picks (the first is the largest), in fp32, then the expert's scale.
  const float top = __shfl_sync(0xffffffffu, key_logit(mine), 0);
  const float ex = lane < top_k ? expf(key_logit(mine) - top) : 0.f;
  const float sum = warp_sum(ex);
  if (lane < top_k) store_pick(p, t, static_cast<int>(0xffffffffu - static_cast<uint32_t>(mine)), ex, sum, scales);
}

}  // namespace mx::cuda::router_parts
