// The MoE decode kernels' self-routing (moe_decode.cu for MXFP4, moe_bf16.cu for bf16 experts): with at
// most 32 routed slots every CTA derives its routing tile from the top-k ids in registers, in the same
// order as launch_moe_routing's metadata, so no routing kernel runs before the GEMMs.
#pragma once

#include <climits>
#include <cstdint>

#include "backend/cuda/kernel_configs.h"

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

}  // namespace mx::cuda
