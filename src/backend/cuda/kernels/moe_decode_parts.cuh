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
// `bias` and `weight_of(c)` (tile row 2q + c's routing weight) as swap_ab_weighted_epilogue takes them.
template <typename WeightOf>
__device__ __forceinline__ void weighted_epilogue_and_combine(const MoeFusedParams& p, const float (&acc)[4],
                                                              const TileRoute& rt, StripBias bias, WeightOf weight_of,
                                                              int64_t strip, int r, int q) {
  const MoeGemmParams& g = p.g;
  swap_ab_weighted_epilogue(g, acc, bias, rt.start, rt.rows, strip, r, q, weight_of);
  if (p.tickets != nullptr && last_tile_of_strip(p.tickets, static_cast<int>(strip), rt.tiles))
    combine_strip(g.out, p.combined, g.rows, static_cast<int>(p.slots), static_cast<int>(g.top_k), rt.pos, strip);
}

// The epilogue's inputs that do not depend on the sums, copied into shared memory by the epilogue's warp
// before its k loop (cp.async: no registers held across the loop, and their latency is off the path from
// the last k tile to the stores): the strip's 16 biases (bf16; gate and up of channel strip * 8 + i at 2i
// and 2i + 1 in the first GEMM) and, for the second GEMM, the routing weights of the tile's 8 rows.
struct StagedEpilogue {
  uint16_t bias[16];
  float weight[8];
};
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
// One warp: lanes 0-7 copy a bias pair each (4-byte aligned: rows % 16 == 0 and bf16 tensors are at least
// 4-byte aligned), lanes below the tile's rows its routing weights.
__device__ __forceinline__ void stage_epilogue_inputs(StagedEpilogue* s, const MoeGemmParams& g, const TileRoute& rt,
                                                      int64_t strip, bool weights) {
  const int lane = threadIdx.x % 32;
  const int row_slot = __shfl_sync(0xffffffffu, rt.row_slot, 4 * (lane % 8));  // tile row lane % 8
  if (lane < 8) cp_async_4(&s->bias[2 * lane], g.bias + rt.expert * g.rows + strip * 16 + 2 * lane);
  if (weights && lane < rt.rows && lane < 8) cp_async_4(&s->weight[lane], g.topk_weights + row_slot);
  cp_async_commit();
}
// The staged inputs, once visible to the whole warp.
__device__ __forceinline__ void staged_epilogue_ready() {
  cp_async_wait<0>();
  __syncwarp();
}

// The first GEMM's epilogue (swap_ab_swiglu_epilogue's indexing and swiglu_clamped, mxfp4_swap_ab.cuh) on the
// staged biases: gate and up of channel strip * 8 + r are the strip's biases 2r and 2r + 1.
__device__ __forceinline__ void staged_swiglu_epilogue(const MoeGemmParams& g, const float (&acc)[4],
                                                       const StagedEpilogue& s, int start, int rows, int64_t strip,
                                                       int r, int q) {
  const int64_t channel = strip * 8 + r, half = g.rows / 2;
  const float gate_b = bf16_bits_to_f32(s.bias[2 * r]), up_b = bf16_bits_to_f32(s.bias[2 * r + 1]);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int tok = 2 * q + c;
    if (tok >= rows) continue;
    const float h = swiglu_clamped(acc[c] + gate_b, acc[2 + c] + up_b, g.swiglu_limit, g.swiglu_alpha);
    g.out[(start + tok) * half + channel] = f32_to_bf16_bits(h);
  }
}

}  // namespace mx::cuda
