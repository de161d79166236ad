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
// with one warp (select_topk, gemma_router_parts.cuh): the largest logit per round, ties to the lower id (the
// CPU twin's order); softmax over the k in fp32, times the per-expert scale.
// At decode (GemmaRouterParams::cluster_ctas) the CTAs of one token form a cluster instead, and CTA 0 picks
// the top-k from logits the others store into its shared memory (gemma_router_cluster_kernel).
// At decode the first weights are requested before the PDL wait: they do not depend on earlier kernels.
// Batches (more than a few tokens) take the split kernel where the device runs clusters
// (gemma_router_split.cu, GemmaRouterParams::split_ctas).
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/gemma_router_parts.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"

namespace mx::cuda {
namespace {

using namespace router_parts;

constexpr int kMinTileTokens = 4;  // the ticket kernel's token tile (one ticket each)

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
// 3 groups of 4 weights per lane each, every weight of the CTA). A warp sums its 8 experts' partials at once
// (warp_sum8: 9 shuffles, not 8 x 5); the CTA sums its warps' through shared memory and stores each logit to
// p.logits and, by st.async counted on CTA 0's mbarrier, into CTA 0's row, and is done: only CTA 0 waits,
// on its barrier, then picks the top-k (select_topk: one reduction a round). That replaces the ticket
// kernel's fence, atomic and second read of the logits through L2, and the cluster barrier after the logits
// (H200, one token, weights from HBM, session 16 W1: 3.87 us with the barrier and a warp_sum per expert,
// 3.62 with st.async alone, 3.15 with the fewer reductions alone, 2.88 with both; without the top-k 2.03).
// kBulkWeights: the CTA's weight rows (all of them) come into shared memory by cp.async.bulk, one copy per
// row completing on one mbarrier, instead of 8-byte loads into registers: the copy engine's rate into one
// SM, where clusters of 8 (twice the bytes per SM) measured ~2 us slower than clusters of 16 on loads.
constexpr int kGroup = 8;           // experts whose weights a warp holds at once
constexpr int kChunk = 3;           // groups of 4 per lane and expert: hidden up to 3072 in one pass
constexpr int kMaxCtaExperts = 32;  // 256 experts over a cluster of 8
constexpr int64_t kMaxBulkWeightBytes = 200 * 1024;  // a CTA's weight rows in shared memory (H100: 227 KB)

template <bool kBulkWeights>
__global__ void __launch_bounds__(kThreads) gemma_router_cluster_kernel(GemmaRouterParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) uint16_t weight_rows[];  // kBulkWeights: [E_c][hidden]
  __shared__ __align__(8) uint64_t weights_landed;      // kBulkWeights: the rows' mbarrier
  __shared__ __align__(8) uint64_t logits_landed;       // CTA 0's: the other CTAs' logits landed
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
  if (blockIdx.x == 0 && tid == 0) {  // armed for the bytes of the other CTAs' logits
    mbarrier_init(smem_addr(&logits_landed), 1);
    mbarrier_init_fence();
    mbarrier_arrive_expect_tx(smem_addr(&logits_landed), static_cast<uint32_t>((p.experts - (e_end - e_begin)) * 4));
  }
  // Phase 0 of the cluster barrier: once it completes, every CTA runs and CTA 0's row (and its barrier) may be
  // written.
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
    const float v = warp_sum8(acc);  // lanes 4e hold expert e0 + e's
    if ((lane & 3) == 0 && e0 + lane / 4 < e_end) part[warp][e0 - e_begin + lane / 4] = v;
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
    if (blockIdx.x == 0)
      row[e_begin + tid] = logit;  // warp 0's lanes: CTA 0 has at most 32 experts
    else
      store_async_to_cluster_rank(row + e_begin + tid, 0, logit, &logits_landed);
  }
  // Only CTA 0 waits, for the bytes on its barrier; the others are done.
  if (blockIdx.x != 0 || warp != 0) return;
  __syncwarp();
  mbarrier_wait(smem_addr(&logits_landed), 0);
  select_topk(p, t, row, smem_scales ? scales : nullptr);
#endif
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
  const unsigned ctas = static_cast<unsigned>(p.cluster_ctas);
  const dim3 grid(ctas, static_cast<unsigned>(p.tokens));
  auto* kernel = p.bulk_weights ? gemma_router_cluster_kernel<true> : gemma_router_cluster_kernel<false>;
  return cuda_status(
      launch_pdl_clusters(kernel, grid, dim3(kThreads), dim3(ctas), static_cast<size_t>(smem), stream, p),
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
  if (p.split_ctas > 0) return launch_gemma_router_split(p, stream);
  if (p.cluster_ctas > 0) return launch_cluster(p, stream);
  if (ceil_div64(p.tokens, kMinTileTokens) > 65535) return unimplemented("router: too many tokens for one launch");
  // 2 experts per CTA (64 CTAs for 128 experts), 4 warps per expert, 4 tokens per tile: the kernel without
  // clusters at every size (batches take the split kernel where the device runs clusters: 14x faster at 64
  // tokens on an H200).
  return launch<1, 4, 4>(p, stream);
}

}  // namespace mx::cuda
