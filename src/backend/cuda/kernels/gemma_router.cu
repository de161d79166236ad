// Gemma-4's router in one launch (issue 15: SGLang's five routing kernels cost 5.8% of decode).
//
// Grid (expert group, token tile). Each CTA: the weightless RMSNorm's 1/rms of its tile's tokens (a block
// reduction over the whole row), fp32 dot products of the tokens with its experts' f32 weights (the router's
// learned scale and H^-1/2 are folded into them at load), logits = dot / rms. Its warps split the experts
// and, at decode, the hidden dimension (partials summed in a fixed order). The last CTA of a token tile
// (atomic ticket, reset by that CTA so a replayed graph starts from zero) then picks each token's top-k
// with one warp: every logit becomes an order-preserving 32-bit key packed above the inverted expert id,
// so one 64-bit max per round selects the largest logit with ties to the lower id (the CPU twin's order);
// softmax over the k in fp32, times the per-expert scale.
// At decode the first weights are requested before the PDL wait: they do not depend on earlier kernels.
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"

namespace mx::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxExperts = 256;
constexpr int kMaxTopK = 16;
constexpr int kMinTileTokens = 4;  // the smallest token tile of the configs below (ticket count)

__device__ __forceinline__ float4 load_x4(const GemmaRouterParams& p, int64_t t, int64_t i) {
  if (p.x_f32) return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + t * p.hidden) + i);
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.x) + t * p.hidden) + i);
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                     __uint_as_float(v.y & 0xffff0000u));
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
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

// One warp: top-k of token t's logits (written by the tile's CTAs, read through L2), softmax, scale.
__device__ void select_topk(const GemmaRouterParams& p, int64_t t) {
  const int lane = threadIdx.x % 32, experts = static_cast<int>(p.experts), top_k = static_cast<int>(p.top_k);
  constexpr int kPerLane = kMaxExperts / 32;
  uint64_t keys[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    keys[i] = e < experts ? topk_key(__ldcg(p.logits + t * p.experts + e), e) : 0ull;
  }
  uint64_t mine = 0;  // lane j keeps the j-th pick
  for (int j = 0; j < top_k; ++j) {
    uint64_t best = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) best = keys[i] > best ? keys[i] : best;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const uint64_t other = __shfl_xor_sync(0xffffffffu, best, o);
      best = other > best ? other : best;
    }
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
  if (lane >= top_k) return;
  int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(mine));
  if (id < 0 || id >= experts) id = lane;  // only a row of NaNs gets here; keep the ids valid
  float scale = 1.f;
  if (p.expert_scale)
    scale = p.scale_f32 ? static_cast<const float*>(p.expert_scale)[id]
                        : bf16_bits_to_f32(static_cast<const uint16_t*>(p.expert_scale)[id]);
  p.topk_ids[t * p.top_k + lane] = id;
  p.topk_weights[t * p.top_k + lane] = ex / sum * scale;
}

// kWarpExperts experts per warp, kKSplit warps per expert (hidden split in equal parts), kTileTokens tokens
// per CTA. kBatch float4 weight loads per expert and lane are issued before their FMAs.
template <int kWarpExperts, int kKSplit, int kTileTokens>
__global__ void __launch_bounds__(kThreads) gemma_router_kernel(GemmaRouterParams p) {
  constexpr int kCtaExperts = kWarps / kKSplit * kWarpExperts;
  constexpr int kBatch = 12 / kWarpExperts;
  __shared__ float inv_rms[kTileTokens];
  __shared__ float sq[kWarps][kTileTokens];
  __shared__ float part[kKSplit][kCtaExperts][kTileTokens];
  __shared__ bool last;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kTileTokens;
  const int nt = static_cast<int>(p.tokens - t0 < kTileTokens ? p.tokens - t0 : kTileTokens);
  const int eg = warp / kKSplit, ks = warp % kKSplit;
  const int64_t e0 = static_cast<int64_t>(blockIdx.x) * kCtaExperts + eg * kWarpExperts;
  const int64_t n4 = p.hidden / 4, k_begin = ks * n4 / kKSplit, k_end = (ks + 1) * n4 / kKSplit;

  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 w[kBatch][kWarpExperts];
  auto load_w = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = base + lane + 32 * u;
#pragma unroll
      for (int e = 0; e < kWarpExperts; ++e)
        w[u][e] = i < k_end && e0 + e < p.experts
                      ? __ldg(reinterpret_cast<const float4*>(p.weight + (e0 + e) * p.hidden) + i)
                      : zero;
    }
  };
  load_w(k_begin);  // weights are constant: in flight before waiting for x
  pdl_wait();
  pdl_launch_dependents();

  // 1 / rms of each token of the tile over the whole row (every CTA of the tile computes the same).
  {
    float s[kTileTokens];
#pragma unroll
    for (int t = 0; t < kTileTokens; ++t) s[t] = 0.f;
    if (p.norm_eps > 0.f) {
      for (int64_t i = tid; i < n4; i += kThreads)
#pragma unroll
        for (int t = 0; t < kTileTokens; ++t)
          if (t < nt) {
            const float4 v = load_x4(p, t0 + t, i);
            s[t] = dot4(v, v, s[t]);
          }
    }
#pragma unroll
    for (int t = 0; t < kTileTokens; ++t) {
      const float v = warp_sum(s[t]);
      if (lane == 0) sq[warp][t] = v;
    }
    __syncthreads();
    if (tid < kTileTokens) {
      float total = 0.f;
      for (int i = 0; i < kWarps; ++i) total += sq[i][tid];
      inv_rms[tid] = p.norm_eps > 0.f ? rsqrtf(total / static_cast<float>(p.hidden) + p.norm_eps) : 1.f;
    }
  }

  float acc[kWarpExperts][kTileTokens];
#pragma unroll
  for (int e = 0; e < kWarpExperts; ++e)
#pragma unroll
    for (int t = 0; t < kTileTokens; ++t) acc[e][t] = 0.f;
  for (int64_t base = k_begin; base < k_end; base += 32 * kBatch) {
    if (base != k_begin) load_w(base);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = base + lane + 32 * u;
      if (i >= k_end) break;
#pragma unroll
      for (int t = 0; t < kTileTokens; ++t) {
        if (t >= nt) break;
        const float4 xv = load_x4(p, t0 + t, i);
#pragma unroll
        for (int e = 0; e < kWarpExperts; ++e) acc[e][t] = dot4(xv, w[u][e], acc[e][t]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kWarpExperts; ++e)
#pragma unroll
    for (int t = 0; t < kTileTokens; ++t) {
      const float v = warp_sum(acc[e][t]);
      if (lane == 0) part[ks][eg * kWarpExperts + e][t] = v;
    }
  __syncthreads();
  for (int idx = tid; idx < kCtaExperts * nt; idx += kThreads) {
    const int el = idx / nt, t = idx % nt;
    const int64_t e = static_cast<int64_t>(blockIdx.x) * kCtaExperts + el;
    if (e >= p.experts) continue;
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < kKSplit; ++s) sum += part[s][el][t];
    p.logits[(t0 + t) * p.experts + e] = sum * inv_rms[t];
  }

  // The last CTA of this token tile selects the top-k (threadFenceReduction).
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned ticket = atomicAdd(p.tickets + blockIdx.y, 1u);
    last = ticket == gridDim.x - 1;
    if (last) p.tickets[blockIdx.y] = 0u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int t = warp; t < nt; t += kWarps) select_topk(p, t0 + t);
}

template <int kWarpExperts, int kKSplit, int kTileTokens>
Status launch(const GemmaRouterParams& p, cudaStream_t stream) {
  constexpr int kCtaExperts = kWarps / kKSplit * kWarpExperts;
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.experts, kCtaExperts)),
                  static_cast<unsigned>(ceil_div64(p.tokens, kTileTokens)));
  return cuda_status(launch_pdl(gemma_router_kernel<kWarpExperts, kKSplit, kTileTokens>, grid, dim3(kThreads), 0,
                                stream, p),
                     "gemma_router_kernel");
}

}  // namespace

int64_t gemma_router_tickets(int64_t tokens) { return ceil_div64(tokens, kMinTileTokens); }

Status launch_gemma_router(const GemmaRouterParams& p, cudaStream_t stream) {
  if (p.experts > kMaxExperts || p.top_k < 1 || p.top_k > kMaxTopK || p.top_k > p.experts)
    return unimplemented("router: at most 256 experts and top-k in [1, 16]");
  if (p.hidden % 4 != 0) return unimplemented("router: hidden size must be a multiple of 4");
  if (p.tokens == 0) return Status::ok();
  if (ceil_div64(p.tokens, kMinTileTokens) > 65535) return unimplemented("router: too many tokens for one launch");
  // Decode: 2 experts per CTA (64 CTAs for 128 experts), 4 warps per expert, 4 tokens per tile. Prefill: 32
  // experts per CTA, whole rows per warp, 16 tokens per tile (the weights come from L2 many times less).
  if (p.tokens <= 32) return launch<1, 4, 4>(p, stream);
  return launch<4, 1, 16>(p, stream);
}

}  // namespace mx::cuda
