// The bf16 wgmma prefill kernel's tile shape and epilogues (moe_bf16_wgmma.cu; its shared-memory wgmma is
// wgmma.cuh's wgmma_bf16_ss), apart from its k loop so that another loading scheme can reuse them with the same
// bits. (A producer warp issuing TMA loads, per-row boxes for the gathered tokens, measured 15-65% slower on an
// H200 in session 15 W1c: branch gemmab-copy-engine.)
#pragma once

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/moe_bf16_decode.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {

// A CTA's weight rows by default (wgmma's N; the first GEMM's are 64 channels' gate rows, then their up rows;
// 128-token tiles also take 176 or 256, MoeBf16GemmParams::wgmma_rows) and k tile (64 bf16: one 128-byte swizzled
// row); each warpgroup multiplies 64 tokens of the routing tile (M).
constexpr int kMoeBf16WgmmaRows = 128, kMoeBf16WgmmaK = 64, kMoeBf16WgmmaWarpgroupTokens = 64;

// Epilogue of warp `warp`'s 16 tokens (tile rows 16 warp ..) of a kBN-row weight tile: acc[4j + 2 half + c] is
// token 16 warp + r + 8 half, column col0-relative 8j + 2q + c. First GEMM: columns j < kBN / 16 are gate and
// j + kBN / 16 up of channel col0 + 8j + 2q + c, h = gelu_tanh(gate) * up; second GEMM: y = acc x the slot's
// routing weight. bf16 pairs.
template <bool kGated, int kBN = kMoeBf16WgmmaRows>
__device__ __forceinline__ void moe_bf16_wgmma_store(const MoeBf16GemmParams& p, const float (&acc)[kBN / 2],
                                                     int start, int n, int64_t col0, int warp, int r, int q) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int tok = warp * 16 + r + 8 * half;  // warp 4 wg + i: the warpgroup's 64 tokens
    if (tok >= n) continue;
    const int64_t pos = start + tok;
    if constexpr (kGated) {
#pragma unroll
      for (int j = 0; j < kBN / 16; ++j) {
        const int64_t ch = col0 + 8 * j + 2 * q;
        if (ch >= p.out_rows) continue;
        const int g = 4 * j + 2 * half, u = g + 4 * (kBN / 16);  // column kBN / 2 + 8j + 2q: up of the channel
        const float h0 = gelu_tanh(acc[g]) * acc[u];
        const float h1 = gelu_tanh(acc[g + 1]) * acc[u + 1];
        *reinterpret_cast<uint32_t*>(p.out + pos * p.out_rows + ch) = pack_bf16x2(h0, h1);
      }
    } else {
      const float wt = p.topk_weights[p.r.sorted_slots[pos]];
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        const int64_t row = col0 + 8 * j + 2 * q;
        if (row >= p.out_rows) continue;
        *reinterpret_cast<uint32_t*>(p.out + pos * p.out_rows + row) =
            pack_bf16x2(acc[4 * j + 2 * half] * wt, acc[4 * j + 2 * half + 1] * wt);
      }
    }
  }
}

}  // namespace mx::cuda
