// MXFP4 experts at decode on a persistent grid that streams the weights through shared memory by the copy
// engine (kernel_configs.h, MoeStreamConfig; sm_90a). Why: the ring kernels (moe_decode.cu) and v1 (moe.cu)
// reach 31-57% of HBM at 1-8 tokens, their time tracking the number of CTAs rather than the bytes (a fixed
// per-CTA cost paid a dozen times per SM slot), and deeper register rings measured slower (every weight,
// scale and activation load goes through the load/store units and L1TEX). Here:
//  * one CTA per SM; its warps each own whole (tile, 16-row strip) units dealt round-robin over the grid,
//    so every SM streams about the same share of the step's bytes even when only 4 experts are busy, and a
//    unit's fixed cost (routing in registers, epilogue) is one warp's while the other warps stream;
//  * each warp's weights, scales and activation rows arrive in its ring of shared-memory slots by
//    cp.async.bulk, one mbarrier per slot counting the bytes; the warp refills a slot as soon as it has
//    multiplied it, so the next unit's weights are in flight during this unit's last chunks and epilogue;
//  * no cross-warp reduction: a warp sums all of a unit's k in an order fixed by the shape (even and odd k
//    tiles in two accumulator sets, added at the end: two mma chains of half the length), so a token's sums
//    are the same in any batch;
//  * self-routing up to 32 routed tokens, the fused combine and PDL between the GEMMs as in moe_decode.cu;
//    the second GEMM issues its first chunks' weights before griddepcontrol.wait and their h rows after.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_decode_parts.cuh"
#include "backend/cuda/kernels/moe_route_tile.cuh"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"
#include "backend/cuda/kernels/wgmma.cuh"  // MX_SM90A

namespace mx::cuda {
namespace {


// A warp's place in its sequence of units (unit ordinals blockIdx.x + gridDim.x * (warp + warps * i), tile
// major: unit = tile * strips + strip; fewer than 2^31, checked at launch) and of each unit's chunks of
// kMoeStreamChunkTiles k tiles. 32-bit counters throughout: a 64-bit division per chunk would cost a good
// part of the chunk's own instructions.
struct Cursor {
  int unit = 0;
  int strip = 0;
  int chunk = 0;
  TileRoute rt;
};

template <bool kGated>
__global__ void __launch_bounds__(32 * kMoeStreamMaxWarps, 1)
    moe_stream_gemm_kernel(MoeFusedParams p, int stages, int slot_bytes) {
#if MX_SM90A
  constexpr int kChunk = kMoeStreamChunkTiles;
  constexpr int kScalesAt = kChunk * 512;  // in a slot: weights, then scales, then activation rows
  constexpr int kActsAt = kChunk * (512 + 32);
  constexpr int kActPitch = static_cast<int>(moe_stream_act_pitch());
  extern __shared__ __align__(16) uint8_t smem[];  // [warps][stages] slots, then [warps][stages] mbarriers
  const MoeGemmParams& g = p.g;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int r = lane / 4, q = lane % 4;
  const uint8_t* ring = smem + warp * stages * slot_bytes;
  const uint32_t ring_at = smem_addr(ring);
  const uint32_t bar0 = smem_addr(smem + warps * stages * slot_bytes) + 8u * warp * stages;
  if (lane == 0) {
    for (int s = 0; s < stages; ++s) mbarrier_init(bar0 + 8 * s, 1);
    mbarrier_init_fence();
  }
  __syncwarp();
  if constexpr (kGated) {
    pdl_wait();  // launched as a programmatic dependent: the top-k ids come from the router
    pdl_launch_dependents();  // only after the wait: the second GEMM reads the ids before its own wait
  }

  const int strips = static_cast<int>(g.rows / 16), n_k = static_cast<int>(g.k / 64);
  const int n_chunks = (n_k + kChunk - 1) / kChunk;
  const int step = static_cast<int>(gridDim.x) * warps;
  int units = INT_MAX;  // known once the first routing is in
  auto enter = [&](Cursor& c, int unit) {  // by every lane: the routing takes shuffles
    c.unit = unit;
    c.chunk = 0;
    if (unit >= units) return;
    const int tile = unit / strips;
    c.strip = unit - tile * strips;
    c.rt = p.topk_ids ? route_tile(p.topk_ids, static_cast<int>(p.slots), static_cast<int>(p.experts), tile)
                      : route_from_metadata(g.r, tile);
  };
  Cursor first;
  enter(first, blockIdx.x + static_cast<int>(gridDim.x) * warp);
  units = first.rt.tiles * strips;
  if (first.unit >= units) return;  // the whole warp: nothing below waits on other warps
  auto advance = [&](Cursor& c) {
    if (++c.chunk == n_chunks) enter(c, c.unit + step);
  };

  // The warp's chunks go to its slots in turn. Lane 0 arms the slot's barrier with all of the chunk's bytes
  // and copies its weights and scales; lane 4r then copies tile row r's activations.
  const uint64_t evict_first = l2_evict_first_policy();
  auto issue = [&](const Cursor& c, int slot, bool weights, bool acts) {
    const uint32_t dst = ring_at + static_cast<uint32_t>(slot * slot_bytes), bar = bar0 + 8 * slot;
    const int kt0 = c.chunk * kChunk, nkt = min(kChunk, n_k - kt0);
    if (weights && lane == 0) {
      mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(nkt * (512 + 32) + c.rt.rows * nkt * 128));
      const int64_t base = (static_cast<int64_t>(c.rt.expert) * strips + c.strip) * n_k + kt0;
      bulk_copy_with_policy(dst, g.blocks + base * 512, nkt * 512, bar, evict_first);
      bulk_copy_with_policy(dst + kScalesAt, g.scales + base * 32, nkt * 32, bar, evict_first);
    }
    if (!acts) return;
    __syncwarp();  // the phase is armed before any activation bytes land on it
    if (q == 0 && r < c.rt.rows) {
      const int64_t in_row = kGated ? c.rt.row_slot / g.top_k : c.rt.start + r;
      bulk_copy(dst + kActsAt + r * kActPitch, g.in + in_row * g.k + kt0 * 64, nkt * 128, bar);
    }
  };
  Cursor prod = first;
  int filled = 0;  // the first chunks, one per slot
  for (; filled < stages && prod.unit < units; ++filled) {
    issue(prod, filled, true, kGated);
    advance(prod);
  }
  if constexpr (!kGated) {
    pdl_wait();  // h comes from the first GEMM
    Cursor c = first;
    for (int slot = 0; slot < filled; ++slot) {
      issue(c, slot, false, true);
      advance(c);
    }
  }

  int slot = 0;  // the next chunk's: consumed in the order issued, slot after slot
  uint32_t parity = 0;
  for (Cursor cons = first; cons.unit < units;) {
    const TileRoute& rt = cons.rt;
    const bool has_token = r < rt.rows;
    float acc[2][4] = {};
    for (int c = 0; c < n_chunks; ++c) {
      mbarrier_wait(bar0 + 8 * slot, parity);
      const uint8_t* s = ring + slot * slot_bytes;
      const int nkt = min(kChunk, n_k - c * kChunk);
#pragma unroll
      for (int kt = 0; kt < kChunk; ++kt) {
        if (kt >= nkt) break;
        const uint4 wq = *reinterpret_cast<const uint4*>(s + kt * 512 + lane * 16);
        const uint8_t* sc = s + kScalesAt + kt * 32 + (q >> 1) * 16 + r;
        uint4 xa = make_uint4(0, 0, 0, 0), xb = xa;
        if (has_token) {
          const uint4* x = reinterpret_cast<const uint4*>(s + kActsAt + r * kActPitch + kt * 128 + q * 32);
          xa = x[0];
          xb = x[1];
        }
        // kChunk is even, so kt's parity is the k tile's.
        mxfp4_strip_mma(acc[kt & 1], wq, mxfp4_scale_x2(sc[0]), mxfp4_scale_x2(sc[8]), xa, xb);
      }
      __syncwarp();  // every lane has read the slot: refill it with the chunk `stages` ahead
      if (prod.unit < units) {
        issue(prod, slot, true, true);
        advance(prod);
      }
      if (++slot == stages) {
        slot = 0;
        parity ^= 1u;
      }
    }

    float sum[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) sum[i] = acc[0][i] + acc[1][i];
    if constexpr (kGated) {
      swap_ab_swiglu_epilogue(g, sum, rt.expert, rt.start, rt.rows, cons.strip, r, q);
    } else {
      weighted_epilogue_and_combine(p, sum, rt, cons.strip, r, q);
    }
    enter(cons, cons.unit + step);
  }
#endif
}

template <bool kGated>
Status launch(const MoeFusedParams& p, const MoeStreamConfig& c, int64_t max_units, cudaStream_t stream) {
  auto* kernel = moe_stream_gemm_kernel<kGated>;
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem_bytes)),
      "cudaFuncSetAttribute(moe stream smem)"));
  // One CTA per SM, fewer only when the routing cannot have a unit for each: units are dealt across the CTAs
  // first (unit u to CTA u % grid), so a GEMM of fewer units than warps still streams from every SM.
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(c.sms, max_units))), block(32 * c.warps);
  const size_t smem = static_cast<size_t>(c.smem_bytes);
  const int slot_bytes = static_cast<int>(c.slot_bytes);
  if (c.pdl)
    return cuda_status(launch_pdl(kernel, grid, block, smem, stream, p, c.stages, slot_bytes), "moe_stream_gemm_kernel");
  kernel<<<grid, block, smem, stream>>>(p, c.stages, slot_bytes);
  return launch_status("moe_stream_gemm_kernel");
}

}  // namespace

Status launch_moe_stream_gemm(const MoeFusedParams& p, const MoeStreamConfig& c, cudaStream_t stream) {
  const MoeGemmParams& g = p.g;
  if (g.rows % 16 != 0 || g.k % 64 != 0) return internal_error("MoE GEMM: rows % 16 and k % 64 must be 0");
  if (!c.enabled || c.warps < 1 || c.warps > kMoeStreamMaxWarps || c.stages < 2 || c.stages > kMoeStreamMaxStages ||
      c.slot_bytes != moe_stream_slot_bytes(c.act_rows) || c.smem_bytes != c.warps * c.stages * (c.slot_bytes + 8) ||
      c.sms < 1)
    return internal_error("MoE stream GEMM: config does not fit this GPU");
  // A slot holds a tile's activation rows: at most 8, and never more than the routed slots.
  if (c.act_rows < std::min<int64_t>(kMoeFusedTileTokens, p.slots))
    return internal_error("MoE stream GEMM: config made for fewer routed slots");
  if (p.topk_ids != nullptr && !use_fused_moe_routing(p.slots))
    return internal_error("MoE stream GEMM: self-routing takes at most 32 routed tokens");
  if (p.tickets != nullptr && (p.topk_ids == nullptr || g.gated || p.combined == nullptr))
    return internal_error("MoE stream GEMM: the combine is fused into the self-routed second GEMM only");
  // The copy engine reads 16-byte aligned ranges: rows of k bf16 (k % 64 == 0) from 16-byte aligned bases.
  const auto misaligned = [](const void* base) { return reinterpret_cast<uintptr_t>(base) % 16 != 0; };
  if (misaligned(g.blocks) || misaligned(g.scales) || misaligned(g.in))
    return internal_error("MoE stream GEMM: weights and activations must be 16-byte aligned");
  if (p.slots == 0) return Status::ok();
  const int64_t max_tiles = p.topk_ids ? moe_fused_max_tiles(p.slots, p.experts)
                                       : moe_max_tiles(p.slots, p.experts, kMoeFusedTileTokens);
  if (max_tiles * (g.rows / 16) > INT32_MAX) return unimplemented("MoE stream GEMM: too many units for one launch");
  const int64_t max_units = max_tiles * (g.rows / 16);
  return g.gated ? launch<true>(p, c, max_units, stream) : launch<false>(p, c, max_units, stream);
}

}  // namespace mx::cuda
