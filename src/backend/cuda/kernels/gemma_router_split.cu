// Gemma-4's router for batches of tokens (GemmaRouterParams::split_ctas): one CTA cluster per tile of up to
// 32 tokens, its C CTAs splitting the hidden dimension (C = 16 on Hopper: each CTA every expert over a
// sixteenth of the row, 45 KB of 26B-A4B's weight), so 64 tokens run as 8 clusters = 128 CTAs and each
// cluster reads the weight once. (The 16-token ticket tiles it replaces ran 16 CTAs at 64 tokens: 157 us
// per layer on an H100, ~13% of a batch-64 decode step.)
// The dot products run on bf16 tensor cores (mma.sync m16n8k16, experts as M, tokens as N): the weight is
// bf16 already and x * x_scale (fp32) is split into three bf16 terms hi + lo + lo2 that sum to it exactly
// (8 + 8 + 8 bits of the 24-bit significand); a bf16 x bf16 product is exact in the fp32 accumulators, so
// the logits are fp32 dot products as the CPU twin's (summed in another order).
// Each CTA sends its partial logits and partial sums of x^2 (the weightless norm's) for every token through
// distributed shared memory to the token's owner (tile token n: rank n % C); one cluster barrier later the
// owner sums the C partials in rank order, scales by 1/rms and picks the top-k with one warp. A token's
// sums depend on C alone, not on the tokens beside it or on the tile size.
// The CTA's weights are requested before the PDL wait (they do not depend on earlier kernels).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/gemma_router_parts.cuh"

namespace mx::cuda {
namespace {

using namespace router_parts;

constexpr int kChunkK = 32;         // hidden dims per chunk: a lane's 16-byte load covers 8, four lanes a row
constexpr int kMaxTileTokens = 32;  // four 8-token n tiles
constexpr int kRegChunks = 6;       // chunks of a warp's weights held in registers at once (26B-A4B: all)
constexpr int kPlanes = 3;          // x * x_scale = hi + lo + lo2
constexpr int64_t kMaxSplitSmem = 96 * 1024;  // under sm_120a's 99 KB opt-in

// The launch's shape and its dynamic shared memory carve-up (byte offsets).
struct SplitArgs {
  GemmaRouterParams p;
  int tile_tokens = 0;   // a multiple of 8, <= kMaxTileTokens
  int max_chunks = 0;    // the most kChunkK chunks one CTA of the cluster owns
  int64_t recv_off = 0;  // float [slot][source rank][expert]: partial logits of the tokens this CTA owns
  int64_t sq_off = 0;    // float [slot][source rank]: partial sums of x^2
  int64_t row_off = 0;   // float [slot][expert]: the owned tokens' logits
  int64_t scales_off = 0;  // float [expert]
  int64_t bytes = 0;
};

// The three bf16 terms of v, as three bf16x2 planes' halves (v = hi + lo + lo2 up to v's last bit).
__device__ __forceinline__ void split3(float a, float b, uint32_t (&out)[kPlanes]) {
  float ra = a, rb = b;
#pragma unroll
  for (int s = 0; s < kPlanes; ++s) {
    const uint16_t ha = f32_to_bf16_bits(ra), hb = f32_to_bf16_bits(rb);
    out[s] = static_cast<uint32_t>(ha) | (static_cast<uint32_t>(hb) << 16);
    ra -= bf16_bits_to_f32(ha);
    rb -= bf16_bits_to_f32(hb);
  }
}

// Rows 16 m + lane / 4 and + 8 of the weight, hidden dims 32 c + 8 (lane % 4) .. + 7 for the chunks c0 ..
// c0 + kRegChunks - 1 below c_end: the A fragments of two m16n8k16 steps per chunk, k permuted within the
// chunk (a lane's 8 consecutive dims serve as k 2q, 2q + 1, 2q + 8, 2q + 9 of step 0 and of step 1; the
// x planes are laid out the same way, and a dot product does not depend on the order of its terms).
__device__ __forceinline__ void load_weights(const GemmaRouterParams& p, int m, int64_t c0, int64_t c_end,
                                             uint4 (&w)[kRegChunks][2]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kRegChunks; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t e = 16 * m + lane / 4 + 8 * h, k = kChunkK * (c0 + i) + 8 * (lane % 4);
      w[i][h] = c0 + i < c_end && e < p.experts && k < p.hidden ? ldg_stream(p.weight + e * p.hidden + k)
                                                                 : make_uint4(0u, 0u, 0u, 0u);
    }
}

// Eight values of token t's row of x from hidden dim k (k + 8 <= hidden), as f32.
__device__ __forceinline__ void load_x8(const GemmaRouterParams& p, int64_t t, int64_t k, float (&v)[8]) {
  float4 a, b;
  if (p.x_f32) {
    const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + t * p.hidden + k);
    a = __ldg(src);
    b = __ldg(src + 1);
  } else {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.x) + t * p.hidden + k));
    a = bf16x4_to_float4(make_uint2(raw.x, raw.y));
    b = bf16x4_to_float4(make_uint2(raw.z, raw.w));
  }
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__global__ void __launch_bounds__(kThreads, 2) gemma_router_split_kernel(SplitArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const GemmaRouterParams& p = a.p;
  extern __shared__ __align__(16) unsigned char smem[];
  // x planes in fragment order: [chunk][n tile][plane][lane] of uint4 (lane n * 4 + q: token n of the tile,
  // dims 8 q .. 8 q + 7 of the chunk).
  uint4* planes = reinterpret_cast<uint4*>(smem);
  float* recv = reinterpret_cast<float*>(smem + a.recv_off);
  float* recv_sq = reinterpret_cast<float*>(smem + a.sq_off);
  float* row = reinterpret_cast<float*>(smem + a.row_off);
  float* scales = reinterpret_cast<float*>(smem + a.scales_off);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int C = static_cast<int>(gridDim.x), rank = static_cast<int>(blockIdx.x);
  const int experts = static_cast<int>(p.experts), n_tiles_max = a.tile_tokens / 8;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * a.tile_tokens;
  const int nt = static_cast<int>(p.tokens - t0 < a.tile_tokens ? p.tokens - t0 : a.tile_tokens);
  const int n_tiles = (nt + 7) / 8, slots = (a.tile_tokens + C - 1) / C, m_tiles = (experts + 15) / 16;
  const int64_t chunks = (p.hidden + kChunkK - 1) / kChunkK;
  const int64_t c_begin = rank * chunks / C, c_end = (rank + 1) * chunks / C;
  // Phase 0 of the cluster barrier: once it completes, every CTA runs and takes remote stores.
  cluster_arrive_relaxed();

  uint4 w[kRegChunks][2];
  if (warp < m_tiles) load_weights(p, warp, c_begin, c_end, w);
  const bool owner = rank < nt;  // owns tile token `rank` at least
  if (owner && p.expert_scale != nullptr)
    for (int e = tid; e < experts; e += kThreads) scales[e] = expert_scale_at(p, e);
  pdl_wait();
  pdl_launch_dependents();

  // x * x_scale of the tile's tokens over this CTA's chunks into the planes (zeros past the tokens and past
  // hidden), and each token's partial sum of x^2: warp w takes tokens w, w + 8, ... (a fixed order).
  const int octets = static_cast<int>(c_end - c_begin) * (kChunkK / 8);
  constexpr int kWarpTokens = kMaxTileTokens / kWarps;
  float sq[kWarpTokens];
  // Every load of a lane's octet (its x_scale once, x of each of the warp's tokens) is issued before any is
  // used: one round trip per octet instead of one per token and octet.
#pragma unroll
  for (int j = 0; j < kWarpTokens; ++j) sq[j] = 0.f;
  for (int o = lane; o < octets; o += 32) {
    const int64_t k = kChunkK * c_begin + 8 * o;
    const bool k_ok = k < p.hidden;
    float z[kWarpTokens][8];
#pragma unroll
    for (int j = 0; j < kWarpTokens; ++j) {
      const int n = warp + kWarps * j;
      if (n < nt && k_ok) {
        load_x8(p, t0 + n, k, z[j]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) z[j][i] = 0.f;
      }
    }
    const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 s0 = k_ok ? __ldg(reinterpret_cast<const float4*>(p.x_scale + k)) : zero4;
    const float4 s1 = k_ok ? __ldg(reinterpret_cast<const float4*>(p.x_scale + k) + 1) : zero4;
    const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
#pragma unroll
    for (int j = 0; j < kWarpTokens; ++j) {
      const int n = warp + kWarps * j;
      if (n >= 8 * n_tiles) break;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        sq[j] = fmaf(z[j][i], z[j][i], sq[j]);
        z[j][i] *= s[i];
      }
      uint32_t parts[4][kPlanes];
#pragma unroll
      for (int i = 0; i < 4; ++i) split3(z[j][2 * i], z[j][2 * i + 1], parts[i]);
      uint4* dst = planes + ((static_cast<int64_t>(o / 4) * n_tiles_max + n / 8) * kPlanes) * 32 + (n % 8) * 4 + o % 4;
#pragma unroll
      for (int t = 0; t < kPlanes; ++t) dst[t * 32] = make_uint4(parts[0][t], parts[1][t], parts[2][t], parts[3][t]);
    }
  }
#pragma unroll
  for (int j = 0; j < kWarpTokens; ++j) sq[j] = warp_sum(sq[j]);
  __syncthreads();
  cluster_wait_acquire();  // phase 0
#pragma unroll
  for (int j = 0; j < kMaxTileTokens / kWarps; ++j) {
    const int n = warp + kWarps * j;
    if (lane == 0 && n < nt) store_to_cluster_rank(recv_sq + (n / C) * C + rank, n % C, sq[j]);
  }

  // Warp w: experts 16 m .. 16 m + 15 for m = w, w + 8, ...; every token n tile; two mma steps per chunk
  // and plane. The partial logits go to the tokens' owners.
  for (int m = warp; m < m_tiles; m += kWarps) {
    // Two accumulator chains (a chunk's two mma steps): half as long a chain of dependent mmas.
    float acc[kMaxTileTokens / 8][4], acc2[kMaxTileTokens / 8][4];
#pragma unroll
    for (int i = 0; i < kMaxTileTokens / 8; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][r] = acc2[i][r] = 0.f;
    for (int64_t c0 = c_begin; c0 < c_end; c0 += kRegChunks) {
      if (m != warp || c0 != c_begin) load_weights(p, m, c0, c_end, w);
#pragma unroll
      for (int i = 0; i < kRegChunks; ++i) {
        if (c0 + i >= c_end) break;
        const uint32_t a0[4] = {w[i][0].x, w[i][1].x, w[i][0].y, w[i][1].y};
        const uint32_t a1[4] = {w[i][0].z, w[i][1].z, w[i][0].w, w[i][1].w};
#pragma unroll
        for (int j = 0; j < kMaxTileTokens / 8; ++j) {
          if (j >= n_tiles) break;
          const uint4* b = planes + ((c0 + i - c_begin) * n_tiles_max + j) * kPlanes * 32 + lane;
#pragma unroll
          for (int s = 0; s < kPlanes; ++s) {
            const uint4 bv = b[s * 32];
            mma_bf16_16816(acc[j], a0, bv.x, bv.y);
            mma_bf16_16816(acc2[j], a1, bv.z, bv.w);
          }
        }
      }
    }
    // acc[j]: experts 16 m + lane / 4 (+ 8 for 2, 3) x tokens 8 j + 2 (lane % 4) (+ 1 for 1, 3).
#pragma unroll
    for (int j = 0; j < kMaxTileTokens / 8; ++j) {
      if (j >= n_tiles) break;
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[j][r] += acc2[j][r];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int e = 16 * m + lane / 4 + 8 * (r / 2), n = 8 * j + 2 * (lane % 4) + r % 2;
        if (e < experts && n < nt) store_to_cluster_rank(recv + ((n / C) * C + rank) * experts + e, n % C, acc[j][r]);
      }
    }
  }
  cluster_arrive_release();  // phase 1: every partial is in its owner's shared memory
  cluster_wait_acquire();

  // The owned tokens (slot i: tile token i C + rank): sums in rank order, 1/rms, then a warp's top-k.
  for (int idx = tid; idx < slots * experts; idx += kThreads) {
    const int i = idx / experts, e = idx % experts, n = i * C + rank;
    if (n >= nt) continue;
    float sum = 0.f, total_sq = 0.f;
    for (int src = 0; src < C; ++src) {
      sum += recv[(i * C + src) * experts + e];
      total_sq += recv_sq[i * C + src];
    }
    const float inv_rms = p.norm_eps > 0.f ? rsqrtf(total_sq / static_cast<float>(p.hidden) + p.norm_eps) : 1.f;
    const float logit = sum * inv_rms;
    p.logits[(t0 + n) * p.experts + e] = logit;
    row[i * experts + e] = logit;
  }
  __syncthreads();
  if (owner && warp < slots && warp * C + rank < nt)
    select_topk(p, t0 + warp * C + rank, row + warp * experts, p.expert_scale != nullptr ? scales : nullptr);
#endif
}

// Tokens per cluster: enough clusters to give each SM about one CTA (132 SMs: 8 clusters of 16), at most
// kMaxTileTokens, a multiple of 8.
int split_tile_tokens(int64_t tokens, int ctas) {
  const int64_t clusters = std::max<int64_t>(1, 128 / ctas);
  const int64_t per = (ceil_div64(tokens, clusters) + 7) / 8 * 8;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(per, 8), kMaxTileTokens));
}

SplitArgs split_args(const GemmaRouterParams& p, int tile_tokens) {
  SplitArgs a;
  a.p = p;
  a.tile_tokens = tile_tokens;
  const int64_t C = p.split_ctas, slots = ceil_div64(tile_tokens, C);
  a.max_chunks = static_cast<int>(ceil_div64(ceil_div64(p.hidden, kChunkK), C));
  const int64_t plane_bytes = int64_t{a.max_chunks} * (tile_tokens / 8) * kPlanes * 32 * 16;
  a.recv_off = plane_bytes;
  a.sq_off = a.recv_off + slots * C * p.experts * 4;
  a.row_off = a.sq_off + slots * C * 4;
  a.scales_off = a.row_off + slots * p.experts * 4;
  a.bytes = a.scales_off + p.experts * 4;
  return a;
}

}  // namespace

int gemma_router_split_ctas() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9) {
    cudaGetLastError();
    return 0;
  }
  // Clusters of 16 are non-portable: opt in (per device) before the query and the launches, as to the
  // largest shared memory a launch may ask for.
  if (cudaFuncSetAttribute(gemma_router_split_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
    cudaGetLastError();
  if (cudaFuncSetAttribute(gemma_router_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kMaxSplitSmem)) != cudaSuccess)
    cudaGetLastError();
  for (const int ctas : {16, 8}) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(ctas));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = static_cast<size_t>(kMaxSplitSmem);
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(ctas);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, gemma_router_split_kernel, &cfg) == cudaSuccess && clusters > 0)
      return ctas;
    cudaGetLastError();
  }
  return 0;
}

bool gemma_router_split_fits(const GemmaRouterParams& p) {
  // 16-byte loads of x, x_scale and weight rows: hidden % 8 == 0.
  if (p.split_ctas <= 0 || p.hidden % 8 != 0) return false;
  return split_args(p, split_tile_tokens(p.tokens, p.split_ctas)).bytes <= kMaxSplitSmem;
}

Status launch_gemma_router_split(const GemmaRouterParams& p, cudaStream_t stream) {
  if (p.split_ctas != 8 && p.split_ctas != 16) return invalid_argument("router: split clusters of 8 or 16 CTAs");
  if (!gemma_router_split_fits(p))
    return unimplemented("router: the split kernel needs hidden % 8 == 0 and its tile in shared memory");
  const int tile = split_tile_tokens(p.tokens, p.split_ctas);
  const SplitArgs a = split_args(p, tile);
  if (ceil_div64(p.tokens, tile) > 65535) return unimplemented("router: too many tokens for one split launch");
  const unsigned ctas = static_cast<unsigned>(p.split_ctas);
  const dim3 grid(ctas, static_cast<unsigned>(ceil_div64(p.tokens, tile)));
  return cuda_status(launch_pdl_clusters(gemma_router_split_kernel, grid, dim3(kThreads), dim3(ctas),
                                         static_cast<size_t>(a.bytes), stream, a),
                     "gemma_router_split_kernel");
}

}  // namespace mx::cuda
