// Gemma-4's router in one launch (issue 15: SGLang's five routing kernels cost 5.8% of decode).
//
// Grid (expert group, token tile). Each CTA: the weightless RMSNorm's 1/rms of its tile's tokens (a block
// reduction over the whole row), fp32 dot products of the tokens with its experts' weights, logits = dot /
// rms. The router's learned scale and H^-1/2 ride on x (x_scale; the token tiles scale the weights they
// share instead) beside the checkpoint's bf16 weight: half the bytes of the weight with them folded in
// (f32), and a decode step's router is bound by its weight stream (H100, ncu with cold caches: 10.30 ->
// 9.41 us at one token). Its warps split the experts
// and, at decode, the hidden dimension (partials summed in a fixed order). The last CTA of a token tile
// (atomic ticket, reset by that CTA so a replayed graph starts from zero) then picks each token's top-k
// with one warp: every logit becomes an order-preserving 32-bit key packed above the inverted expert id,
// so one 64-bit max per round selects the largest logit with ties to the lower id (the CPU twin's order);
// softmax over the k in fp32, times the per-expert scale.
// At decode (GemmaRouterParams::cluster_ctas) the CTAs of one token form a cluster instead, and CTA 0 picks
// the top-k from logits the others store into its shared memory (gemma_router_cluster_kernel).
// At decode the first weights are requested before the PDL wait: they do not depend on earlier kernels.
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/mbarrier.cuh"

namespace mx::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxExperts = 256;
constexpr int kMaxTopK = 16;
constexpr int kMinTileTokens = 4;  // the smallest token tile of the configs below (ticket count)

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

// One warp: top-k of token t's logits, softmax, scale. `row`: the token's logits in shared memory (this
// CTA computed them), or null: from p.logits through L2 (the tile's other CTAs wrote them). `scales`: the
// per-expert scales as f32 in shared memory (loaded early), or null: from p.expert_scale.
__device__ void select_topk(const GemmaRouterParams& p, int64_t t, const float* row = nullptr,
                            const float* scales = nullptr) {
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
  if (lane >= top_k) return;
  int id = static_cast<int>(0xffffffffu - static_cast<uint32_t>(mine));
  if (id < 0 || id >= experts) id = lane;  // only a row of NaNs gets here; keep the ids valid
  float scale = 1.f;
  if (scales)
    scale = scales[id];
  else if (p.expert_scale)
    scale = expert_scale_at(p, id);
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
  __shared__ float sq[kKSplit][kTileTokens];
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
      // x_scale rides on the weights here: a tile's tokens share them.
      const float4 xs = i < k_end ? load_x_scale4(p, i) : zero;
#pragma unroll
      for (int e = 0; e < kWarpExperts; ++e)
        w[u][e] = i < k_end && e0 + e < p.experts ? mul4(load_w4(p, e0 + e, i), xs) : zero;
    }
  };
  load_w(k_begin);  // weights are constant: in flight before waiting for x
  pdl_wait();
  pdl_launch_dependents();

  // Dot products, and the sums of squares of x on the same loads: the warps of expert group 0 cover the
  // whole row between them, so their partials give each token's 1 / rms.
  float acc[kWarpExperts][kTileTokens], s[kTileTokens];
#pragma unroll
  for (int t = 0; t < kTileTokens; ++t) {
    s[t] = 0.f;
#pragma unroll
    for (int e = 0; e < kWarpExperts; ++e) acc[e][t] = 0.f;
  }
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
        s[t] = dot4(xv, xv, s[t]);
#pragma unroll
        for (int e = 0; e < kWarpExperts; ++e) acc[e][t] = dot4(xv, w[u][e], acc[e][t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTileTokens; ++t) {
#pragma unroll
    for (int e = 0; e < kWarpExperts; ++e) {
      const float v = warp_sum(acc[e][t]);
      if (lane == 0) part[ks][eg * kWarpExperts + e][t] = v;
    }
    const float v = warp_sum(s[t]);
    if (lane == 0 && eg == 0) sq[ks][t] = v;
  }
  __syncthreads();
  if (tid < kTileTokens) {
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kKSplit; ++i) total += sq[i][tid];
    inv_rms[tid] = p.norm_eps > 0.f ? rsqrtf(total / static_cast<float>(p.hidden) + p.norm_eps) : 1.f;
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

// Decode (a few tokens): one cluster of C CTAs (gridDim.x) per token (blockIdx.y), CTA r owning experts
// [r E_c, (r + 1) E_c), E_c = ceil(E / C). Each warp takes an eighth of the hidden row for all of its CTA's
// experts (kGroup at a time), so the row of x is read once per CTA and the warps' partial sums of x^2
// give 1 / rms; the first group's weights are in flight before the PDL wait (26B-A4B at C = 16: 8 experts,
// 3 groups of 4 weights per lane each, every weight of the CTA). The CTA sums its warps' partials through
// shared memory and stores each logit to p.logits and, through distributed shared memory, into CTA 0's
// row; one cluster barrier later CTA 0 picks the top-k from there. That replaces the ticket kernel's
// fence, atomic and second read of the logits through L2.
// kBulkWeights: the CTA's weight rows (all of them) come into shared memory by cp.async.bulk, one copy per
// row completing on one mbarrier, instead of 8-byte loads into registers: the copy engine's rate into one
// SM, where clusters of 8 (twice the bytes per SM) measured ~2 us slower than clusters of 16 on loads.
constexpr int kGroup = 8;           // experts whose weights a warp holds at once
constexpr int kChunk = 3;           // groups of 4 per lane and expert: hidden up to 3072 in one pass
constexpr int kMaxCtaExperts = 32;  // 256 experts over a cluster of 8
constexpr int64_t kMaxBulkWeightBytes = 200 * 1024;  // a CTA's weight rows in shared memory (H100: 227 KB)

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The float at `local`'s offset in the shared memory of the cluster's CTA `rank` = v.
__device__ __forceinline__ void store_to_cluster_rank(const float* local, unsigned rank, float v) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(local)), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(v) : "memory");
}

template <bool kBulkWeights>
__global__ void __launch_bounds__(kThreads) gemma_router_cluster_kernel(GemmaRouterParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) uint16_t weight_rows[];  // kBulkWeights: [E_c][hidden]
  __shared__ __align__(8) uint64_t weights_landed;      // kBulkWeights: the rows' mbarrier
  __shared__ float row[kMaxExperts];  // CTA 0's: the token's logits from every CTA of the cluster
  __shared__ float scales[kMaxExperts];  // CTA 0's: the per-expert scales (with p.expert_scale)
  __shared__ float part[kWarps][kMaxCtaExperts];
  __shared__ float sq_part[kWarps];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t t = blockIdx.y, n4 = p.hidden / 4;
  const int64_t cta_experts = (p.experts + gridDim.x - 1) / gridDim.x;
  const int64_t e_begin = blockIdx.x * cta_experts;
  const int64_t e_end = e_begin + cta_experts < p.experts ? e_begin + cta_experts : p.experts;
  const int64_t k_begin = warp * n4 / kWarps, k_end = (warp + 1) * n4 / kWarps;
  const uint32_t bar = smem_addr(&weights_landed);
  // Phase 0 of the cluster barrier: once it completes, every CTA runs and CTA 0's row may be written.
  cluster_arrive_relaxed();

  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 w[kGroup][kChunk];
  auto load_w = [&](int64_t e0, int64_t base) {
#pragma unroll
    for (int e = 0; e < kGroup; ++e)
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const int64_t i = base + lane + 32 * u;
        if (e0 + e >= e_end || i >= k_end) {
          w[e][u] = zero;
        } else if constexpr (kBulkWeights) {
          w[e][u] = bf16x4_to_float4(reinterpret_cast<const uint2*>(weight_rows + (e0 - e_begin + e) * p.hidden)[i]);
        } else {
          w[e][u] = load_w4(p, e0 + e, i);
        }
      }
  };
  // Weights are constant: in flight before waiting for x.
  if constexpr (kBulkWeights) {
    if (tid == 0) {
      const auto bytes = static_cast<uint32_t>(p.hidden * 2);
      mbarrier_init(bar, 1);
      mbarrier_init_fence();
      mbarrier_arrive_expect_tx(bar, e_end > e_begin ? bytes * static_cast<uint32_t>(e_end - e_begin) : 0u);
      for (int64_t e = e_begin; e < e_end; ++e)
        bulk_copy(smem_addr(weight_rows + (e - e_begin) * p.hidden), p.weight + e * p.hidden, bytes, bar);
    }
    __syncthreads();  // the barrier is initialized before anyone waits on it
  } else {
    load_w(e_begin, k_begin);
  }
  // CTA 0's per-expert scales are constant too: read now, they are not a round trip to memory at the very end
  // of the critical path (after the top-k). The CTA barrier below the dot products publishes them.
  const bool smem_scales = blockIdx.x == 0 && p.expert_scale != nullptr;
  if (smem_scales)
    for (int e = tid; e < p.experts; e += kThreads) scales[e] = expert_scale_at(p, e);
  pdl_wait();
  pdl_launch_dependents();

  float sq = 0.f;
  for (int64_t e0 = e_begin; e0 < e_end; e0 += kGroup) {
    float acc[kGroup];
#pragma unroll
    for (int e = 0; e < kGroup; ++e) acc[e] = 0.f;
    for (int64_t base = k_begin; base < k_end; base += 32 * kChunk) {
      const bool first = e0 == e_begin && base == k_begin;
      if (!kBulkWeights && !first) load_w(e0, base);
      float4 xv[kChunk], xs[kChunk];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        const int64_t i = base + lane + 32 * u;
        xv[u] = i < k_end ? load_x4(p, t, i) : zero;
        xs[u] = i < k_end ? load_x_scale4(p, i) : zero;
      }
      if constexpr (kBulkWeights) {  // x is in flight
        if (first) mbarrier_wait(bar, 0);
        load_w(e0, base);
      }
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        if (e0 == e_begin) sq = dot4(xv[u], xv[u], sq);
        const float4 xz = mul4(xv[u], xs[u]);
#pragma unroll
        for (int e = 0; e < kGroup; ++e) acc[e] = dot4(xz, w[e][u], acc[e]);
      }
    }
#pragma unroll
    for (int e = 0; e < kGroup; ++e) {
      const float v = warp_sum(acc[e]);
      if (lane == 0 && e0 + e < e_end) part[warp][e0 - e_begin + e] = v;
    }
  }
  sq = warp_sum(sq);  // (a CTA without experts, past the last, uses none of it)
  if (lane == 0) sq_part[warp] = sq;
  __syncthreads();
  cluster_wait_acquire();  // phase 0
  if (tid < e_end - e_begin) {
    float total_sq = 0.f, sum = 0.f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) {
      total_sq += sq_part[i];
      sum += part[i][tid];
    }
    const float inv_rms = p.norm_eps > 0.f ? rsqrtf(total_sq / static_cast<float>(p.hidden) + p.norm_eps) : 1.f;
    const float logit = sum * inv_rms;
    p.logits[t * p.experts + e_begin + tid] = logit;
    store_to_cluster_rank(row + e_begin + tid, 0, logit);
  }
  cluster_arrive_release();  // phase 1: the logits are in CTA 0's row
  cluster_wait_acquire();
  if (blockIdx.x == 0 && warp == 0) select_topk(p, t, row, smem_scales ? scales : nullptr);
#endif
}

// Prefill, up to 128 experts: a CTA computes all the experts of 64 tokens as a register-blocked fp32 GEMM
// (k in chunks of 32 through shared memory, 4 tokens x 8 experts per thread), so it picks its tokens' top-k
// itself from shared memory (no ticket). The thread that loads a token's x also sums its squares.
constexpr int kTileM = 64, kTileE = 128, kTileK = 32;
constexpr int kLogitPitch = kTileE + 1;
constexpr int64_t kTileGemmMinTokens = 2048;

__global__ void __launch_bounds__(kThreads) gemma_router_tile_kernel(GemmaRouterParams p) {
  constexpr int kXPitch = kTileM + 4, kWPitch = kTileE + 4;
  static_assert(kTileK * (kXPitch + kWPitch) <= kTileM * kLogitPitch, "the logits reuse the operand buffer");
  __shared__ __align__(16) float buf[kTileM * kLogitPitch];
  __shared__ float inv_rms[kTileM];
  float* xs = buf;                    // [k][token]
  float* ws = buf + kTileK * kXPitch;  // [k][expert]
  pdl_wait();
  pdl_launch_dependents();
  const int tid = threadIdx.x, warp = tid / 32;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTileM;
  const int nt = static_cast<int>(p.tokens - t0 < kTileM ? p.tokens - t0 : kTileM);
  const int ty = tid / 16, tx = tid % 16;  // tokens 4 ty .. + 4; experts 4 tx .. + 4 and 64 + 4 tx .. + 4
  float acc[4][8];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;
  float sq[2] = {0.f, 0.f};  // tokens tid / 8 and 32 + tid / 8
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t k0 = 0; k0 < p.hidden; k0 += kTileK) {
    // x: 64 tokens x 8 float4; W: 128 experts x 8 float4; stored transposed (k-major).
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int tok = tid / 8 + 32 * j, k4 = tid % 8;
      const int64_t kk = k0 + 4 * k4;
      const float4 raw = tok < nt && kk < p.hidden ? load_x4(p, t0 + tok, kk / 4) : zero;
      sq[j] = dot4(raw, raw, sq[j]);
      const float4 v = kk < p.hidden ? mul4(raw, load_x_scale4(p, kk / 4)) : zero;
      xs[(4 * k4 + 0) * kXPitch + tok] = v.x;
      xs[(4 * k4 + 1) * kXPitch + tok] = v.y;
      xs[(4 * k4 + 2) * kXPitch + tok] = v.z;
      xs[(4 * k4 + 3) * kXPitch + tok] = v.w;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int e = tid / 8 + 32 * j, k4 = tid % 8;
      const int64_t kk = k0 + 4 * k4;
      const float4 v = e < p.experts && kk < p.hidden ? load_w4(p, e, kk / 4) : zero;
      ws[(4 * k4 + 0) * kWPitch + e] = v.x;
      ws[(4 * k4 + 1) * kWPitch + e] = v.y;
      ws[(4 * k4 + 2) * kWPitch + e] = v.z;
      ws[(4 * k4 + 3) * kWPitch + e] = v.w;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < kTileK; ++k) {
      const float4 xv = *reinterpret_cast<const float4*>(xs + k * kXPitch + 4 * ty);
      const float4 w0 = *reinterpret_cast<const float4*>(ws + k * kWPitch + 4 * tx);
      const float4 w1 = *reinterpret_cast<const float4*>(ws + k * kWPitch + 64 + 4 * tx);
      const float xa[4] = {xv.x, xv.y, xv.z, xv.w};
      const float wa[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(xa[i], wa[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {  // the 8 lanes that loaded a token's x hold its partial sums
    float v = sq[j];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    if (tid % 8 == 0)
      inv_rms[tid / 8 + 32 * j] = p.norm_eps > 0.f ? rsqrtf(v / static_cast<float>(p.hidden) + p.norm_eps) : 1.f;
  }
  __syncthreads();
  float* lg = buf;  // [token][expert], after the last chunk's barrier
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int tok = 4 * ty + i;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int e = j < 4 ? 4 * tx + j : 64 + 4 * tx + j - 4;
      const float v = acc[i][j] * inv_rms[tok];
      lg[tok * kLogitPitch + e] = v;
      if (tok < nt && e < p.experts) p.logits[(t0 + tok) * p.experts + e] = v;
    }
  }
  __syncthreads();
  for (int t = warp; t < nt; t += kWarps) select_topk(p, t0 + t, lg + t * kLogitPitch);
}

// A CTA's weight rows in bytes at `ctas` CTAs per cluster.
int64_t cluster_weight_bytes(const GemmaRouterParams& p, int ctas) { return ceil_div64(p.experts, ctas) * p.hidden * 2; }

Status launch_cluster(const GemmaRouterParams& p, cudaStream_t stream) {
  if (p.cluster_ctas != 8 && p.cluster_ctas != 16) return invalid_argument("router: clusters of 8 or 16 CTAs");
  if (ceil_div64(p.experts, p.cluster_ctas) > kMaxCtaExperts) return unimplemented("router: too many experts per CTA");
  if (p.tokens > 65535) return unimplemented("router: too many tokens for one cluster launch");
  const int64_t smem = p.bulk_weights ? cluster_weight_bytes(p, p.cluster_ctas) : 0;
  if (p.bulk_weights && !gemma_router_bulk_weights_fit(p))
    return unimplemented("router: the CTA's weight rows do not fit shared memory or 16-byte copies");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(p.cluster_ctas), static_cast<unsigned>(p.tokens));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = static_cast<unsigned>(p.cluster_ctas);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  return cuda_status(p.bulk_weights ? cudaLaunchKernelEx(&cfg, gemma_router_cluster_kernel<true>, p)
                                    : cudaLaunchKernelEx(&cfg, gemma_router_cluster_kernel<false>, p),
                     "gemma_router_cluster_kernel");
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

int gemma_router_cluster_ctas() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9) {
    cudaGetLastError();
    return 0;
  }
  // Clusters of 16 are non-portable: both forms opt in before the query and their launches (per device), the
  // bulk-copy form also to its largest shared-memory use.
  for (auto kernel : {gemma_router_cluster_kernel<false>, gemma_router_cluster_kernel<true>})
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
      cudaGetLastError();
  if (cudaFuncSetAttribute(gemma_router_cluster_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kMaxBulkWeightBytes)) != cudaSuccess)
    cudaGetLastError();
  for (const int ctas : {16, 8}) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(ctas));
    cfg.blockDim = dim3(kThreads);
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(ctas);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, gemma_router_cluster_kernel<false>, &cfg) == cudaSuccess &&
        clusters > 0)
      return ctas;
    cudaGetLastError();
  }
  return 0;
}

bool gemma_router_bulk_weights_fit(const GemmaRouterParams& p) {
  // Bulk copies move multiples of 16 bytes between 16-byte-aligned addresses: rows of hidden % 8 == 0.
  return p.cluster_ctas > 0 && cluster_weight_bytes(p, p.cluster_ctas) <= kMaxBulkWeightBytes && p.hidden % 8 == 0;
}

Status launch_gemma_router(const GemmaRouterParams& p, cudaStream_t stream) {
  if (p.experts > kMaxExperts || p.top_k < 1 || p.top_k > kMaxTopK || p.top_k > p.experts)
    return unimplemented("router: at most 256 experts and top-k in [1, 16]");
  if (p.hidden % 4 != 0) return unimplemented("router: hidden size must be a multiple of 4");
  if (p.weight == nullptr || p.x_scale == nullptr) return invalid_argument("router: a bf16 weight and its x_scale");
  if (p.tokens == 0) return Status::ok();
  if (p.cluster_ctas > 0) return launch_cluster(p, stream);
  if (ceil_div64(p.tokens, kMinTileTokens) > 65535) return unimplemented("router: too many tokens for one launch");
  // Decode: 2 experts per CTA (64 CTAs for 128 experts), 4 warps per expert, 4 tokens per tile. Prefill: the
  // 64-token GEMM tiles up to 128 experts from 2048 tokens, else 32 experts per CTA, whole rows per warp, 16
  // tokens per tile.
  if (p.tokens <= 32) return launch<1, 4, 4>(p, stream);
  // The GEMM tiles beat the 16-token tiles once there are enough of them to fill the GPU (H100: 304 vs
  // 1183 us at 8192 tokens, 279 vs 72 us at 512 with 8 CTAs).
  if (p.experts <= kTileE && p.tokens >= kTileGemmMinTokens)
    return cuda_status(launch_pdl(gemma_router_tile_kernel, dim3(static_cast<unsigned>(ceil_div64(p.tokens, kTileM))),
                                  dim3(kThreads), 0, stream, p),
                       "gemma_router_tile_kernel");
  return launch<4, 1, 16>(p, stream);
}

}  // namespace mx::cuda
