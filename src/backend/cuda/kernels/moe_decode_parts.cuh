// Pieces of the MXFP4 decode kernels (moe_decode.cu): the tile's routing from the routing kernel's metadata,
// and the second GEMM's epilogue with the fused combine (moe_route_tile.cuh) of a strip that its last tile
// runs, kept apart from the GEMM loop so that another decode GEMM can share the exact epilogue arithmetic.
#pragma once

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/moe_route_tile.cuh"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"

namespace mx::cuda {

// A CTA's (or warp's) tile from the routing kernel's metadata (more than kMoeFusedMaxSlots routed slots).
__device__ __forceinline__ TileRoute route_from_metadata(const MoeRouting& r, int tile) {
  TileRoute t;
  t.tiles = *r.num_tiles;
  if (tile >= t.tiles) return t;
  t.expert = r.tile_expert[tile];
  t.start = r.tile_start[tile];
  t.rows = r.tile_rows[tile];
  const int row = static_cast<int>(threadIdx.x % 32) / 4;
  t.row_slot = row < t.rows ? r.sorted_slots[t.start + row] : 0;
  return t;
}

// The second GEMM's epilogue of one tile of a strip (bias + routing weight into the tile's sorted rows of y,
// acc as swap_ab_weighted_epilogue takes it), then, self-routed with tickets, the strip's combine when this
// tile is its last to finish. One warp; `rt` has the step's routing (pos of every slot when self-routed).
__device__ __forceinline__ void weighted_epilogue_and_combine(const MoeFusedParams& p, const float (&acc)[4],
                                                              const TileRoute& rt, int64_t strip, int r, int q) {
  const MoeGemmParams& g = p.g;
  const StripBias bias = load_strip_bias(g, rt.expert, strip, r);
  // Tile row 2q + c is the route of lane 8q + 4c (tile row = lane / 4).
  const int slot_of[2] = {__shfl_sync(0xffffffffu, rt.row_slot, 8 * q),
                          __shfl_sync(0xffffffffu, rt.row_slot, 8 * q + 4)};
  swap_ab_weighted_epilogue(g, acc, bias, rt.start, rt.rows, strip, r, q,
                            [&](int c) { return g.topk_weights[slot_of[c]]; });
  if (p.tickets != nullptr && last_tile_of_strip(p.tickets, static_cast<int>(strip), rt.tiles))
    combine_strip(g.out, p.combined, g.rows, static_cast<int>(p.slots), static_cast<int>(g.top_k), rt.pos, strip);
}

}  // namespace mx::cuda
