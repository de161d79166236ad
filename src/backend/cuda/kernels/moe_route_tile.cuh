// The MoE kernels' routing tiles. Decode (moe_decode.cu for MXFP4, moe_bf16.cu for bf16 experts) routes
// itself: with at most 32 routed slots every CTA derives its routing tile from the top-k ids in registers, in
// the same order as launch_moe_routing's metadata, so no routing kernel runs before the GEMMs. The grouped
// prefill GEMMs (moe_grouped.cu, moe_bf16_grouped.cu, moe_bf16_wgmma.cu) read that metadata: grouped_tile.
#pragma once

#include <climits>
#include <cstdint>

#include "backend/cuda/kernel_configs.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {

// One CTA's view of the step's routing, in moe_routing_kernel's order: experts ascending, slots ascending
// inside an expert, tiles of 8 per expert.
struct TileRoute {
  int tiles = 0;     // busy tiles in the step
  int expert = 0;    // of this CTA's tile
  int start = 0;     // sorted position of the tile's first row
  int rows = 0;      // routed tokens in the tile
  int row_slot = 0;  // slot (token * top_k + j) of tile row lane / 4, when lane / 4 < rows
  int pos = 0;       // sorted position of slot `lane` (self-routed only)
};

// Every warp computes the routing itself from <= 32 ids (a slot per lane; registers and shuffles only).
__device__ __forceinline__ TileRoute route_tile(const int32_t* ids, int slots, int experts, int tile) {
  const int lane = threadIdx.x % 32;
  const bool valid = lane < slots;
  int e = INT_MAX;
  if (valid) {
    e = ids[lane];
    if (e < 0 || e >= experts) e = 0;  // ids come from our router; never index out of bounds
  }
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const int rank = __popc(peers & ((1u << lane) - 1u));  // among the slots of the same expert
  const int lead_tiles = valid && rank == 0 ? (__popc(peers) + kMoeFusedTileTokens - 1) / kMoeFusedTileTokens : 0;
  int below = 0, tiles_below = 0, tiles = 0;
  for (int j = 0; j < slots; ++j) {
    const int ej = __shfl_sync(0xffffffffu, e, j);
    const int tj = __shfl_sync(0xffffffffu, lead_tiles, j);
    below += ej < e;
    tiles_below += ej < e ? tj : 0;
    tiles += tj;
  }
  TileRoute t;
  t.tiles = tiles;
  t.pos = below + rank;
  const unsigned members = __ballot_sync(0xffffffffu, valid && tiles_below + rank / kMoeFusedTileTokens == tile);
  t.rows = __popc(members);
  const int first = members ? __ffs(members) - 1 : 0;
  t.expert = __shfl_sync(0xffffffffu, e, first);
  t.start = __shfl_sync(0xffffffffu, t.pos, first);
  unsigned m = members;  // tile row i is the i-th member
  for (int i = 0; i < lane / 4 && m; ++i) m &= m - 1u;
  t.row_slot = m ? __ffs(m) - 1 : 0;
  return t;
}

// Called by one warp after its tile wrote its share of the strip: true in every lane when this tile is the
// strip's last to finish (threadFenceReduction: publish, take a ticket; the last one resets the ticket for
// the next launch or graph replay and then sees every other tile's writes), so it combines the strip.
__device__ __forceinline__ bool last_tile_of_strip(uint32_t* tickets, int strip, int tiles) {
  __threadfence();
  __syncwarp();
  unsigned last = 0;
  if (threadIdx.x % 32 == 0) {
    last = atomicAdd(tickets + strip, 1u) == static_cast<unsigned>(tiles - 1);
    if (last) tickets[strip] = 0u;
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return false;
  __threadfence();
  return true;
}

// Run by one warp of a strip's last tile (after last_tile_of_strip): combined[t, row] = the sum over j in
// router order of y[pos(t, j), row] for the strip's 16 rows below `rows`, where lane s holds the sorted
// position `pos` of slot s (TileRoute::pos). The combine kernel's arithmetic: bf16 y, fp32 sum, bf16 out.
__device__ __forceinline__ void combine_strip(const uint16_t* y, uint16_t* combined, int64_t rows, int slots, int top_k,
                                              int pos, int64_t strip) {
  const int lane = threadIdx.x % 32, tokens = slots / top_k;
  for (int b = 0; b < tokens * 16; b += 32) {
    const int idx = b + lane, t = min(idx / 16, tokens - 1);
    const int64_t row = strip * 16 + idx % 16;
    float sum = 0.f;
    for (int j = 0; j < top_k; ++j) {
      const int at = __shfl_sync(0xffffffffu, pos, t * top_k + j);
      if (row < rows) sum += bf16_bits_to_f32(__ldcg(y + at * rows + row));
    }
    if (idx < tokens * 16 && row < rows) combined[t * rows + row] = f32_to_bf16_bits(sum);
  }
}

// The routing kernels' exclusive scans of the per-expert slot counts and of their tiles of `bm` tokens, by one
// warp (moe.cu's moe_routing_kernel, moe_wgmma_ws.cu's routing launches): lane l takes the run of experts
// [e0, e1), ceil(experts / 32) of them, and the runs' sums are scanned across the lanes by shuffles (one thread
// walking all 128 of gpt-oss-120b's experts was a serial chain of shared loads and global stores). The caller
// walks its run from `offset` and `tile`; lane 31's inclusive sums are the step's slots and busy tiles.
struct ExpertRun {
  int e0, e1;                        // this lane's experts
  int offset, tile;                  // slots and tiles of the experts before e0
  int slots_through, tiles_through;  // the same through e1 - 1
};
__device__ __forceinline__ ExpertRun expert_run_scan(const int* counts, int experts, int bm) {
  const int lane = threadIdx.x % 32;
  const int per = (experts + 31) / 32, e0 = min(experts, lane * per), e1 = min(experts, e0 + per);
  int run_slots = 0, run_tiles = 0;
  for (int e = e0; e < e1; ++e) {
    run_slots += counts[e];
    run_tiles += (counts[e] + bm - 1) / bm;
  }
  int slots_through = run_slots, tiles_through = run_tiles;
  for (int d = 1; d < 32; d <<= 1) {
    const int s = __shfl_up_sync(0xffffffffu, slots_through, d), t = __shfl_up_sync(0xffffffffu, tiles_through, d);
    if (lane >= d) {
      slots_through += s;
      tiles_through += t;
    }
  }
  return ExpertRun{e0, e1, slots_through - run_slots, tiles_through - run_tiles, slots_through, tiles_through};
}

// A grouped GEMM's routing tile `tile` (launch_moe_routing's metadata): its expert, first sorted position and
// routed tokens, and src_row[i] for its kRows rows, the input row of tile row i (-1 past its tokens): the
// slot's token for the first GEMM (`gated`: x has a row per token), the sorted position for the second (h has
// a row per slot). The kThreads threads of the CTA share src_row; the caller synchronizes before reading it.
struct GroupedTile {
  int expert, start, rows;
};
template <int kRows, int kThreads>
__device__ __forceinline__ GroupedTile grouped_tile(const MoeRouting& r, int tile, bool gated, int64_t top_k,
                                                    int* src_row) {
  const GroupedTile t{r.tile_expert[tile], r.tile_start[tile], r.tile_rows[tile]};
  for (int i = threadIdx.x; i < kRows; i += kThreads)
    src_row[i] = i >= t.rows ? -1 : gated ? r.sorted_slots[t.start + i] / static_cast<int>(top_k) : t.start + i;
  return t;
}

}  // namespace mx::cuda
