// MXFP4 experts on the GPU: routing metadata, the expert GEMMs and the combine.
//
// Routing (one CTA): per-expert counts, their scan, tiles of at most 8 routed tokens per expert (64 or 128
// for the grouped GEMM of moe_grouped.cu, used at prefill), and a
// stable expert sort of the (token, k) slots (ranks from warp match + per-warp counts, so the order inside
// an expert is by slot index and the whole thing is deterministic). The grid of the GEMMs is sized for the
// worst case (moe_max_tiles); tiles past the device-side count exit, so captured graphs stay valid.
// GEMMs ("swap AB", ref-kernels.md 2.6): the weights are the mma A operand (16 rows x 16 k), loaded
// straight from global memory in the kExpertLayout::kMxfp4SwapAb fragment order, dequantized in registers
// (two ALU ops per bf16 pair and a bf16x2 multiply by the pre-biased scale); the tile's tokens are the
// 8-wide B side. A CTA's warps split K and reduce through shared memory in a fixed order.
// First GEMM epilogue: bias + clamped SwiGLU (gate and up of a channel sit in rows r and r + 8 of a strip).
// Second GEMM epilogue: (acc + bias) * routing weight. The combine sums a token's k rows in router order.
// The fp4 decode, the k-split reduction and both epilogues are in mxfp4_swap_ab.cuh, shared with
// moe_decode.cu (and the decode with moe_grouped.cu), so that the paths cannot drift apart.
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/moe_route_tile.cuh"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"

namespace mx::cuda {
namespace {

constexpr int kRoutingThreads = 1024;
constexpr int kMaxExperts = 256;
constexpr int kTileTokens = 8;

__global__ void __launch_bounds__(kRoutingThreads) moe_routing_kernel(MoeRoutingParams p) {
  __shared__ int counts[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  __shared__ int tile_base[kMaxExperts];
  __shared__ int warp_counts[kRoutingThreads / 32][kMaxExperts];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int experts = static_cast<int>(p.experts);
  const int bm = static_cast<int>(p.tile_tokens);
  for (int e = tid; e < experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  auto expert_of = [&](int64_t i) {
    const int e = p.topk_ids[i];
    return e < 0 || e >= experts ? 0 : e;  // ids come from our router; never index out of bounds
  };
  for (int64_t i = tid; i < p.slots; i += blockDim.x) atomicAdd(&counts[expert_of(i)], 1);
  __syncthreads();
  // Exclusive scans of the counts and of the tiles over the experts, by warp 0 (expert_run_scan).
  if (warp == 0) {
    const ExpertRun run = expert_run_scan(counts, experts, bm);
    int off = run.offset, tiles = run.tile;
    for (int e = run.e0; e < run.e1; ++e) {
      p.r.offsets[e] = off;
      cursor[e] = off;
      tile_base[e] = tiles;
      off += counts[e];
      tiles += (counts[e] + bm - 1) / bm;
    }
    if (lane == 31) {
      p.r.offsets[experts] = run.slots_through;
      *p.r.num_tiles = run.tiles_through;
    }
  }
  __syncthreads();
  for (int e = tid; e < experts; e += blockDim.x) {
    const int n = counts[e], base = tile_base[e], off = cursor[e];
    for (int j = 0; j * bm < n; ++j) {
      p.r.tile_expert[base + j] = e;
      p.r.tile_start[base + j] = off + j * bm;
      p.r.tile_rows[base + j] = min(bm, n - j * bm);
    }
  }
  // Stable scatter, 1024 slots at a time.
  for (int64_t chunk = 0; chunk < p.slots; chunk += blockDim.x) {
    const int64_t i = chunk + tid;
    const bool valid = i < p.slots;
    const int e = valid ? expert_of(i) : -1;
    for (int idx = tid; idx < (kRoutingThreads / 32) * experts; idx += blockDim.x)
      warp_counts[idx / experts][idx % experts] = 0;
    __syncthreads();
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (valid && rank == 0) warp_counts[warp][e] = __popc(peers);
    __syncthreads();
    int total = 0;
    if (tid < experts) {
      for (int w = 0; w < kRoutingThreads / 32; ++w) {
        const int c = warp_counts[w][tid];
        warp_counts[w][tid] = total;
        total += c;
      }
    }
    __syncthreads();
    if (valid) {
      const int dst = cursor[e] + warp_counts[warp][e] + rank;
      p.r.sorted_slots[dst] = static_cast<int32_t>(i);
      p.r.slot_pos[i] = dst;
    }
    __syncthreads();
    if (tid < experts) cursor[tid] += total;
    __syncthreads();
  }
}

template <bool kGated>
__global__ void moe_gemm_kernel(MoeGemmParams p) {
  extern __shared__ float red[];  // [k_split - 1][4][32]
  const int tile = blockIdx.y;
  if (tile >= *p.r.num_tiles) return;
  const int e = p.r.tile_expert[tile];
  const int start = p.r.tile_start[tile];
  const int n = p.r.tile_rows[tile];
  const int64_t strip = blockIdx.x, strips = p.rows / 16, n_k = p.k / 64;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, k_split = blockDim.x / 32;
  const int r = lane / 4, q = lane % 4;

  const int64_t per = (n_k + k_split - 1) / k_split;
  const int64_t t_begin = warp * per, t_end = min(n_k, t_begin + per);
  const uint8_t* wp = p.blocks + ((e * strips + strip) * n_k) * 512 + lane * 16;
  const uint8_t* sp = p.scales + ((e * strips + strip) * n_k) * 32 + (q >> 1) * 16 + r;
  const bool has_token = r < n;
  const uint16_t* in_row = p.in;
  if (has_token) {
    const int64_t src = kGated ? p.r.sorted_slots[start + r] / p.top_k : start + r;
    in_row = p.in + src * p.k;
  }
  const uint4* xr = reinterpret_cast<const uint4*>(in_row) + 2 * q;

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  uint4 xa = make_uint4(0, 0, 0, 0), xb = xa;  // lanes without a token keep zeros: set once, not per tile
#pragma unroll 4
  for (int64_t t = t_begin; t < t_end; ++t) {
    const uint4 wq = ldg_stream(wp + t * 512);
    const uint32_t sc0 = mxfp4_scale_x2(sp[t * 32]), sc8 = mxfp4_scale_x2(sp[t * 32 + 8]);
    if (has_token) {
      xa = __ldg(xr + t * 8);
      xb = __ldg(xr + t * 8 + 1);
    }
    mxfp4_strip_mma(acc, wq, sc0, sc8, xa, xb);
  }

  if (!reduce_k_split(acc, red, warp, lane, k_split)) return;
  if constexpr (kGated) {
    swap_ab_swiglu_epilogue(p, acc, e, start, n, strip, r, q);
  } else {
    swap_ab_weighted_epilogue(p, acc, load_strip_bias(p, e, strip, r), start, n, strip, r, q,
                              [&](int c) { return p.topk_weights[p.r.sorted_slots[start + 2 * q + c]]; });
  }
}

// One CTA per token, a thread per 8 channels (one pass at gpt-oss's and Gemma-4's widths, 360 and 352 chunks):
// the token's k row positions are read once, and all k rows' 16 bytes are requested before any is summed. The
// first form read a position and then its row, k dependent round trips a pass, in three passes of 128 threads:
// 7.4 us for 256 tokens x 4 on an H200, 1.9 warps per scheduler (ncu, session 14). Sums in router order.
template <int kMaxTopK>
__global__ void moe_combine_kernel(MoeCombineParams p) {
  pdl_wait();  // launched as a programmatic dependent: y comes from the second GEMM
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const int64_t t = blockIdx.x;
  const int k = static_cast<int>(p.top_k);
  int64_t pos[kMaxTopK];
#pragma unroll
  for (int j = 0; j < kMaxTopK; ++j) pos[j] = j < k ? p.slot_pos[t * k + j] : 0;
  for (int64_t i = threadIdx.x; i < p.hidden / 8; i += blockDim.x) {
    uint4 v[kMaxTopK];
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j)
      if (j < k) v[j] = reinterpret_cast<const uint4*>(p.y + pos[j] * p.hidden)[i];
    float sum[8] = {};
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) {
      if (j >= k) break;
      const uint16_t* vs = reinterpret_cast<const uint16_t*>(&v[j]);
#pragma unroll
      for (int c = 0; c < 8; ++c) sum[c] += bf16_bits_to_f32(vs[c]);
    }
    uint16_t o[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) o[c] = f32_to_bf16_bits(sum[c]);
    reinterpret_cast<uint4*>(p.out + t * p.hidden)[i] = *reinterpret_cast<const uint4*>(o);
  }
}

}  // namespace

Status launch_moe_routing(const MoeRoutingParams& p, cudaStream_t stream) {
  if (p.experts > kMaxExperts) return unimplemented("MoE: at most 256 experts");
  // 8-token tiles for the swap-AB kernels (16 and 32 for the streamed bf16 experts), 64 or 128 for the grouped
  // GEMMs, also 16, 32 (narrow), 96 and 256 for the wgmma one.
  if (p.tile_tokens != kTileTokens && p.tile_tokens != 16 && p.tile_tokens != 32 && p.tile_tokens != 64 &&
      p.tile_tokens != 96 && p.tile_tokens != 128 && p.tile_tokens != 256)
    return internal_error("MoE routing: tiles of 8, 16, 32, 64, 96, 128 or 256 tokens expected");
  if (p.slots == 0) return Status::ok();
  moe_routing_kernel<<<1, kRoutingThreads, 0, stream>>>(p);
  return launch_status("moe_routing_kernel");
}

Status launch_moe_gemm(const MoeGemmParams& p, const MoeConfig& c, cudaStream_t stream) {
  if (p.rows % 16 != 0 || p.k % 64 != 0) return internal_error("MoE GEMM: rows % 16 and k % 64 must be 0");
  if (c.tile_tokens != kTileTokens || c.k_split < 1 || c.k_split > 32) return internal_error("MoE GEMM: bad config");
  if (p.max_tiles == 0) return Status::ok();
  const dim3 grid(static_cast<unsigned>(p.rows / 16), static_cast<unsigned>(p.max_tiles));
  if (p.gated) {
    moe_gemm_kernel<true><<<grid, c.threads, c.smem_bytes, stream>>>(p);
  } else {
    moe_gemm_kernel<false><<<grid, c.threads, c.smem_bytes, stream>>>(p);
  }
  return launch_status("moe_gemm_kernel");
}

Status launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream) {
  if (p.hidden % 8 != 0) return unimplemented("MoE combine: hidden size must be a multiple of 8");
  if (p.top_k < 1 || p.top_k > 8) return unimplemented("MoE combine: top-k from 1 to 8");
  if (p.tokens == 0) return Status::ok();
  // A thread per 16-byte chunk of a row, whole warps, at most 512 (wider rows loop).
  const unsigned threads = static_cast<unsigned>(std::clamp<int64_t>((p.hidden / 8 + 31) / 32 * 32, 32, 512));
  // A programmatic dependent: its CTAs take the SMs as the GEMM's last ones leave, and wait there for its end.
  return cuda_status(launch_pdl(p.top_k <= 4 ? moe_combine_kernel<4> : moe_combine_kernel<8>,
                                dim3(static_cast<unsigned>(p.tokens)), dim3(threads), 0, stream, p),
                     "moe_combine_kernel");
}

}  // namespace mx::cuda
