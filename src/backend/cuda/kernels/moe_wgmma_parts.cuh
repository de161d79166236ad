// Device pieces shared by the two MXFP4 wgmma grouped GEMMs (moe_wgmma.cu: every warp loads and multiplies;
// moe_wgmma_ws.cu: a producer warpgroup loads, two warpgroups multiply): the k permutation of their
// activations, 32-bit shared-memory loads and copies, the work items and the epilogue. One definition keeps
// the kernels bitwise in step (the GPU tests compare them with the CPU twin and with each other's bits).
#pragma once

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {

// Position in the logical k order of physical k `p` (moe_wgmma.cu's header comment): within a 64-k tile,
// physical 16q + 4kk + j goes to 16kk + 2q + (j & 1) + 8 (j >> 1).
__device__ __forceinline__ int64_t logical_k(int64_t p) {
  const int w = static_cast<int>(p & 63), q = w >> 4, kk = (w >> 2) & 3, j = w & 3;
  return (p & ~int64_t{63}) + 16 * kk + 2 * q + (j & 1) + 8 * (j >> 1);
}

// Shared-memory loads at 32-bit shared addresses (no generic pointer kept live: registers are tight).
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t lds8(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u8 %0, [%1];\n" : "=h"(v) : "r"(addr) : "memory");
  return v;
}
// 16-byte global -> shared copy at a shared-memory address with a source size of 16 or 0 (zero fill).
__device__ __forceinline__ void cp_async_16_to(uint32_t dst, const void* src, int src_size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size));
}

#if MX_SM90A
// wgmma m64n16k16 (wgmma.cuh's other widths' form): the narrowest MMA of the 96-token kernel's two-strip loop,
// for tiles of at most 16 tokens (gpt-oss-120b's batched decode: ~8 tokens per expert at 256 sequences). Here
// rather than in wgmma.cuh, which every attention kernel includes (a change there rebuilds them all).
template <>
__device__ __forceinline__ void wgmma_bf16_rs<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7"
      "}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// One k tile of a warp's 16-row strip, once the ring stage at `stage` (B tile first) holds it: lane (r, q)'s
// 16 fp4 bytes at `weights` and the strip's scales at `scales` (rows r and r + 8 of this lane's half) decoded
// into the A registers `at`, the warpgroup's four k16 wgmma against the stage's B tile issued as one group,
// then a wait until the previous tile's group is done (its A registers and ring slot are free again).
// kShifts: the fp4 decode's form (swap_ab_decode_word).
template <int kCols, bool kShifts = false>
__device__ __forceinline__ void moe_wgmma_k_tile(float (&d)[kCols / 2], uint32_t (&at)[4][4], uint32_t stage,
                                                 uint32_t weights, uint32_t scales, int r) {
  const uint4 wq = lds128(weights);
  const uint32_t sc0 = mxfp4_scale_x2(lds8(scales + r)), sc8 = mxfp4_scale_x2(lds8(scales + r + 8));
  const uint32_t w4[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) mxfp4_dequant_step<kShifts>(w4[kk], sc0, sc8, at[kk]);
  // A k16 step adds 32 bytes (2 in the descriptor's address field).
  const uint64_t desc = wgmma_desc_k128(stage);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_bf16_rs<kCols>(d, at[kk], desc + 2 * kk);
  wgmma_commit();
  wgmma_wait<1>();
}

// The k loop around it: `step(at)` for each of n_k k tiles with two sets of A registers alternating (tile t's
// decode overlaps tile t - 1's MMAs; unrolled by 2 to keep the set indices static), between the fences that
// keep the accumulators `acc` in place around the asynchronous MMAs, and the last group drained.
template <int R, typename Step>
__device__ __forceinline__ void moe_wgmma_k_loop(float (&acc)[R], int n_k, Step&& step) {
  uint32_t a[2][4][4];
  wgmma_fence_regs(acc);
  int t = 0;
  for (; t + 1 < n_k; t += 2) {
    step(a[0]);
    step(a[1]);
  }
  if (t < n_k) step(a[0]);
  wgmma_wait<0>();
  wgmma_fence_regs(acc);
}
#endif

// One unit of work: weight rows [strip0 * 16, strip0 * 16 + 16 x strips per CTA) of expert e against the n
// tokens of routing tile `tile`, which starts at sorted position `start`.
struct WorkItem {
  int e, start, n, strip0, tile;
};
// Items are numbered tile * n_cols + column block (tile-major, weight rows fastest, so that concurrent CTAs
// share token tiles in L2).
__device__ __forceinline__ WorkItem moe_work_item(const MoeGemmParams& p, int item, int n_cols, int strips_per_cta) {
  const int tile = item / n_cols;
  return WorkItem{p.r.tile_expert[tile], p.r.tile_start[tile], p.r.tile_rows[tile], (item - tile * n_cols) * strips_per_cta,
                  tile};
}

// Token groups of 8 whose routing weights the second GEMM's epilogue loads at once: the largest divisor of the
// tile's groups up to 8 (6 for 96-token tiles), so that every batch indexes accumulators of the tile.
constexpr int moe_store_batch(int groups) {
  int b = groups < 8 ? groups : 8;
  while (groups % b != 0) --b;
  return b;
}

// gpt-oss's clamped SwiGLU of the biased gate and up sums (swiglu_clamped's order of operations) on the fast
// exp and divide (ex2.approx and rcp.approx, a few ulp of fp32 where the IEEE forms cost ~40 instructions with
// branches): the wgmma kernels' first-GEMM epilogue, which ncu measured at 18% of that GEMM's warp time with
// 256-token tiles. h is rounded to bf16 right after, which hides the difference but for rare rounding ties;
// the GPU tests compare with the CPU twin at bf16 tolerance. Where 1 + exp(-alpha gate) overflows the divide
// gives 0 (gate times a flushed reciprocal), as the exact form's gate / inf does.
__device__ __forceinline__ float swiglu_clamped_fast(float gate_sum, float up_sum, float limit, float alpha) {
  const float gate = fminf(gate_sum, limit);
  const float up = fminf(fmaxf(up_sum, -limit), limit);
  return __fdividef(gate, 1.0f + __expf(-alpha * gate)) * (up + 1.0f);
}

// The two bias values a lane's epilogue adds for strip `strip` (inside the matrix): the first GEMM's gate and up of
// channel strip * 8 + r, the second's rows r and r + 8 (load_strip_bias). Loaded before a k loop, their wait is
// hidden behind it (moe_wgmma_store's kBiasGiven).
__device__ __forceinline__ StripBias moe_wgmma_strip_bias(const MoeGemmParams& p, int e, int64_t strip, int r) {
  if (!p.gated) return load_strip_bias(p, e, strip, r);
  const int64_t channel = strip * 8 + r;
  return {bf16_bits_to_f32(p.bias[e * p.rows + 2 * channel]), bf16_bits_to_f32(p.bias[e * p.rows + 2 * channel + 1])};
}

// Epilogue of one warp's 16-row strip `strip` (inside the matrix) for the item's n tokens: acc[4j + c] is strip
// row r (c 0, 1) or r + 8 (c 2, 3) for tile tokens 8j + 2q + (c & 1), as wgmma leaves it. First GEMM: bias +
// clamped SwiGLU into h, in the second GEMM's logical k order (kTiledOut: h tiled as moe_wgmma_ws.cu reads it,
// padded row w.tile x tile_tokens + token, else h by sorted position); second GEMM: (acc + bias) x routing weight
// into the tile's sorted rows of y. kBiasGiven: the bias is `given` (moe_wgmma_strip_bias), else loaded here.
template <int kN, bool kTiledOut = false, bool kBiasGiven = false>
__device__ __forceinline__ void moe_wgmma_store(const MoeGemmParams& p, const float (&acc)[kN / 2], const WorkItem& w,
                                                int64_t strip, int r, int q, int tile_tokens = 0,
                                                StripBias given = {}) {
  const int e = w.e, start = w.start, n = w.n;
  if (p.gated) {
    // Gate and up of channel strip * 8 + r.
    const int64_t channel = strip * 8 + r, half = p.rows / 2, col = logical_k(channel);
    // Tiled h (max_tiles x tile_tokens padded rows): column col of padded row P at k tile col / 64, 16-byte
    // chunk ((col % 64) / 8) ^ (P % 8).
    const int64_t tiled_plane = (col >> 6) * p.max_tiles * tile_tokens, tiled_row0 = static_cast<int64_t>(w.tile) * tile_tokens;
    const int tiled_chunk = static_cast<int>((col & 63) >> 3), tiled_elem = static_cast<int>(col & 7);
    const float gate_b = kBiasGiven ? given.b0 : bf16_bits_to_f32(p.bias[e * p.rows + 2 * channel]);
    const float up_b = kBiasGiven ? given.b8 : bf16_bits_to_f32(p.bias[e * p.rows + 2 * channel + 1]);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int tok = 8 * j + 2 * q + c;
        if (tok >= n) continue;
        const float h = swiglu_clamped_fast(acc[4 * j + c] + gate_b, acc[4 * j + 2 + c] + up_b, p.swiglu_limit, p.swiglu_alpha);
        if constexpr (kTiledOut) {
          const int64_t P = tiled_row0 + tok;
          p.out[(tiled_plane + P) * 64 + ((tiled_chunk ^ (tok & 7)) << 3) + tiled_elem] = f32_to_bf16_bits(h);
        } else {
          p.out[(start + tok) * half + col] = f32_to_bf16_bits(h);
        }
      }
  } else {
    const StripBias bias = kBiasGiven ? given : load_strip_bias(p, e, strip, r);
    // The routing weights of this lane's tokens, kBatch token groups at a time, every load of a batch issued
    // before its stores: the compiler may not move a load above a store to y (they could alias for all it
    // knows), so weights looked up inside the store loop cost two dependent global round trips per group,
    // which ncu measured at ~45% of the second GEMM's warp time with 256-token tiles (docs/PERF.md).
    constexpr int kBatch = moe_store_batch(kN / 8);
#pragma unroll
    for (int j0 = 0; j0 < kN / 8; j0 += kBatch) {
      if (8 * j0 >= n) break;
      int slot[kBatch][2];
      float weight[kBatch][2];
#pragma unroll
      for (int jj = 0; jj < kBatch; ++jj)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int tok = 8 * (j0 + jj) + 2 * q + c;
          slot[jj][c] = tok < n ? p.r.sorted_slots[start + tok] : -1;
        }
#pragma unroll
      for (int jj = 0; jj < kBatch; ++jj)
#pragma unroll
        for (int c = 0; c < 2; ++c) weight[jj][c] = slot[jj][c] >= 0 ? p.topk_weights[slot[jj][c]] : 0.f;
#pragma unroll
      for (int jj = 0; jj < kBatch; ++jj) {
        const int j = j0 + jj;
        if (8 * j >= n) break;
        const float part[4] = {acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]};
        swap_ab_weighted_epilogue(p, part, bias, start + 8 * j, n - 8 * j, strip, r, q,
                                  [&](int c) { return weight[jj][c]; });
      }
    }
  }
}

}  // namespace mx::cuda
