// The bf16 wgmma prefill kernel's tile shape, shared-memory wgmma and epilogues (moe_bf16_wgmma.cu), apart
// from its k loop so that another loading scheme can reuse them with the same bits. (A producer warp issuing
// TMA loads, per-row boxes for the gathered tokens, measured 15-65% slower on an H200 in session 15 W1c:
// branch gemmab-copy-engine.)
#pragma once

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/moe_bf16_decode.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {

// A CTA's weight rows (wgmma's N; the first GEMM's are 64 channels' gate rows, then their up rows) and k tile
// (64 bf16: one 128-byte swizzled row); each warpgroup multiplies 64 tokens of the routing tile (M).
constexpr int kMoeBf16WgmmaRows = 128, kMoeBf16WgmmaK = 64, kMoeBf16WgmmaWarpgroupTokens = 64;

#if MX_SM90A
// D(64 x 128, fp32) += A(64 x 16) * B(16 x 128), both bf16 K-major in shared memory (descriptors of
// wgmma_desc_k128). Here rather than in wgmma.cuh, which every attention kernel includes.
__device__ __forceinline__ void wgmma_bf16_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}
#endif

// Epilogue of warp `warp`'s 16 tokens (tile rows 16 warp ..): acc[4j + 2 half + c] is token 16 warp + r +
// 8 half, column col0-relative 8j + 2q + c. First GEMM: columns j < 8 are gate and j + 8 up of channel
// col0 + 8j + 2q + c, h = gelu_tanh(gate) * up; second GEMM: y = acc x the slot's routing weight. bf16 pairs.
template <bool kGated>
__device__ __forceinline__ void moe_bf16_wgmma_store(const MoeBf16GemmParams& p, const float (&acc)[64], int start,
                                                     int n, int64_t col0, int warp, int r, int q) {
  constexpr int kBN = kMoeBf16WgmmaRows;
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
        const int g = 4 * j + 2 * half, u = g + 4 * (kBN / 16);  // column 64 + 8j + 2q: up of the same channel
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
