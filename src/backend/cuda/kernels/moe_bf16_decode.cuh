// The parts both bf16 GeGLU expert decode kernels share (moe_bf16.cu: weights by 16-byte loads into
// registers; moe_bf16_bulk.cu: weights by bulk copies into shared memory): the 64-wide k chunk's mma steps,
// the activation loads, a tile's routing, the epilogue and the fused combine. Both kernels order k the same
// way inside a chunk and sum a strip's partials in a fixed order, so a token's result does not depend on
// the batch.
//
// Fragment layout (swap AB, m16n8k16): the CTA's 16 weight rows are the A operand, the tile's 8 tokens the
// B operand. For a 64-wide k chunk, lane (r = lane / 4, q = lane % 4) holds k [16q, 16q + 16) of weight
// rows r (lo) and r + 8 (hi) and of token r's input row, both in the same order of k inside the chunk (a
// permutation the dot product does not see). The first GEMM's rows lo / hi are the gate and up rows of
// channel 8 strip + r, so gate and up of a (token, channel) land in one lane and the GeGLU runs in
// registers.
#pragma once

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gated_mul.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/moe_route_tile.cuh"
#include "backend/cuda/kernels/tma.cuh"

namespace mx::cuda::moe_bf16 {

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Activations: x (first GEMM) is shared by many CTAs, through L1; h (second GEMM) may have been written
// while this kernel already ran (PDL), so from L2 only.
template <bool kGated>
__device__ __forceinline__ uint4 load16_act(const uint16_t* p, bool ok) {
  if (!ok) return make_uint4(0, 0, 0, 0);
  if constexpr (kGated) return __ldg(reinterpret_cast<const uint4*>(p));
  return __ldcg(reinterpret_cast<const uint4*>(p));
}

// One 64-wide k chunk: 4 mma steps; a = rows r (lo) and r + 8 (hi), 16 k each; x = the n-tile's token row.
__device__ __forceinline__ void chunk_mma(float (&acc)[4], const uint4 (&a)[4], uint4 x0, uint4 x1) {
  const uint32_t lo[8] = {a[0].x, a[0].y, a[0].z, a[0].w, a[1].x, a[1].y, a[1].z, a[1].w};
  const uint32_t hi[8] = {a[2].x, a[2].y, a[2].z, a[2].w, a[3].x, a[3].y, a[3].z, a[3].w};
  const uint32_t xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t frag[4] = {lo[2 * kk], hi[2 * kk], lo[2 * kk + 1], hi[2 * kk + 1]};
    mma_bf16_16816(acc, frag, xs[2 * kk], xs[2 * kk + 1]);
  }
}

// Tensor boxes (MoeBf16GemmParams::bulk_tensor_boxes; moe_bf16_bulk.cu and moe_bf16_stream.cu): a ring stage is
// one TMA copy of the strip's 16 rows (gated: 8 gate rows, then the same channels' 8 up rows) for each 64-wide k
// chunk of the stage, chunk-major lines of 128 bytes (line 16 c + row) with the 128-byte swizzle (16-byte unit u
// of line n at u ^ n % 8); a slot starts on a 1024-byte boundary (the swizzle's period). The weights are seen as a
// rank-5 tensor (64 k, rows of a half, gate|up half, expert, k / 64 chunks): a box of (64, 8 gated or 16, 2 or 1,
// 1, 4 blocks); rows and chunks past the tensor read as zero. Needs k % 64 == 0 (moe_bf16_bulk_boxes_fit).
constexpr int64_t kBoxLineBytes = 128;
__host__ __device__ constexpr int64_t box_stage_bytes(int blocks) { return 16 * 2 * 256 * blocks; }
Status encode_box_map(const MoeBf16GemmParams& p, int blocks, CUtensorMap* map);
// Lane (r, q)'s A fragment of a box's chunk (`chunk`: its first line): lines r (lo) and r + 8 (hi), units 2q and
// 2q + 1 swizzled by r, so that a quarter warp's reads fall in 8 bank groups; zero where the k is past the matrix.
__device__ __forceinline__ void box_fragment(const uint8_t* chunk, int r, int q, bool in0, bool in1, uint4 (&a)[4]) {
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const uint8_t* line = chunk + r * kBoxLineBytes;
  const int u0 = (2 * q) ^ r, u1 = (2 * q + 1) ^ r;
  a[0] = in0 ? *reinterpret_cast<const uint4*>(line + 16 * u0) : zero;
  a[1] = in1 ? *reinterpret_cast<const uint4*>(line + 16 * u1) : zero;
  a[2] = in0 ? *reinterpret_cast<const uint4*>(line + 8 * kBoxLineBytes + 16 * u0) : zero;
  a[3] = in1 ? *reinterpret_cast<const uint4*>(line + 8 * kBoxLineBytes + 16 * u1) : zero;
}

// The tile's routing: from the ids (self-routed decode) or from launch_moe_routing's metadata.
__device__ __forceinline__ TileRoute tile_route(const MoeBf16GemmParams& p, int tile) {
  if (p.topk_ids) return route_tile(p.topk_ids, static_cast<int>(p.slots), static_cast<int>(p.experts), tile);
  TileRoute t;
  t.tiles = *p.r.num_tiles;
  if (tile >= t.tiles) return t;
  t.expert = p.r.tile_expert[tile];
  t.start = p.r.tile_start[tile];
  t.rows = p.r.tile_rows[tile];
  return t;
}

// A CTA's start: its tile's routing. The first GEMM waits for its inputs first, and lets the second one
// launch only after that wait, since the second reads the ids before its own wait (the ids precede the
// first GEMM). rt.tiles <= tile: no work for this CTA.
template <bool kGated>
__device__ __forceinline__ TileRoute begin_tile(const MoeBf16GemmParams& p, int tile) {
  if constexpr (kGated) {
    pdl_wait();
    pdl_launch_dependents();
  }
  return tile_route(p, tile);
}

// This lane's two weight rows in a strip: gate and up of channel 8 strip + r, or rows r and r + 8.
struct StripRows {
  int64_t lo = 0, hi = 0;
  bool lo_ok = false, hi_ok = false;
};
template <bool kGated>
__device__ __forceinline__ StripRows strip_rows(const MoeBf16GemmParams& p, int64_t strip, int r) {
  StripRows s;
  s.lo = kGated ? 8 * strip + r : 16 * strip + r;
  s.hi = kGated ? p.out_rows + s.lo : s.lo + 8;
  s.lo_ok = s.lo < p.out_rows;
  s.hi_ok = kGated ? s.lo_ok : s.hi < p.out_rows;
  return s;
}

// This lane's B column: token r of the tile (its input row: x by token, or h by sorted position), offset
// to k 16q; `ok` false past the tile's tokens.
template <bool kGated>
__device__ __forceinline__ const uint16_t* token_row(const MoeBf16GemmParams& p, const TileRoute& rt, int r, int q,
                                                     bool& ok) {
  ok = r < rt.rows;
  int64_t src = 0;
  if (ok) {
    const int64_t slot = p.topk_ids ? rt.row_slot : kGated ? p.r.sorted_slots[rt.start + r] : 0;
    src = kGated ? slot / p.top_k : rt.start + r;
  }
  return p.in + src * p.k + 16 * q;
}

// One warp with the strip's summed accumulators (c 0, 1 = row lo, tokens 2q + {0, 1}; c 2, 3 = row hi,
// same tokens): h = gelu_tanh(gate) * up, or y times the slot's routing weight; then, self-routed with a
// combine buffer, the strip's last tile sums the tokens' rows.
template <bool kGated>
__device__ __forceinline__ void store_strip(const MoeBf16GemmParams& p, const TileRoute& rt, const StripRows& s,
                                            int64_t strip, const float (&acc)[4]) {
  const int q = threadIdx.x % 32 % 4;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int tok = 2 * q + c;
    // Self-routed: tile row tok's slot is lane 4 tok's row_slot (every lane takes part in the shuffle).
    const int self_slot = __shfl_sync(0xffffffffu, rt.row_slot, 4 * tok);
    if (tok >= rt.rows) continue;
    const int64_t pos = rt.start + tok;
    if constexpr (kGated) {
      if (s.lo_ok) p.out[pos * p.out_rows + s.lo] = f32_to_bf16_bits(gelu_tanh(acc[c]) * acc[2 + c]);
    } else {
      const float wt = p.topk_weights[p.topk_ids ? self_slot : p.r.sorted_slots[pos]];
      if (s.lo_ok) p.out[pos * p.out_rows + s.lo] = f32_to_bf16_bits(acc[c] * wt);
      if (s.hi_ok) p.out[pos * p.out_rows + s.hi] = f32_to_bf16_bits(acc[2 + c] * wt);
    }
  }
  if constexpr (!kGated) {
    if (p.combined == nullptr) return;
    if (last_tile_of_strip(p.tickets, strip, rt.tiles))
      combine_strip(p.out, p.combined, p.out_rows, static_cast<int>(p.slots), static_cast<int>(p.top_k), rt.pos, strip);
  }
}

}  // namespace mx::cuda::moe_bf16
