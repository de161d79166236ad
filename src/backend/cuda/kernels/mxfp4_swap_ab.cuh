// Device pieces of the MXFP4 expert GEMMs over the swap-AB layout (expert_repack.h), shared by the decode
// kernels (moe.cu, moe_decode.cu: weights as the mma A operand straight from registers) and the prefill
// grouped GEMM (moe_grouped.cu: the same fragments dequantized into shared memory as the B operand).
// One definition of the fp4 decode and of the epilogue arithmetic keeps the three paths bitwise in step
// with each other and with the CPU twin; everything is force-inlined, so each kernel compiles as before.
#pragma once

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/mxfp4_word.h"

namespace mx::cuda {

// A strip row's scale byte (e8m0 + 126, see expert_repack.h) as the same bf16 in both halves of a bf16x2:
// (s << 7) is the bf16 of 2^126 * 2^(s - 127), which cancels the 2^-126 of the decoded fp4 magnitudes. One
// multiply: s < 256, so s * (2^7 + 2^23) = (s << 7) | (s << 23).
__device__ __forceinline__ uint32_t mxfp4_scale_x2(uint32_t s) { return s * 0x00800080u; }

// The four A registers (bf16x2) of one k-step from lane (r, q)'s packed 32-bit word of that step: the codes'
// sign and magnitude bits go straight into bf16s (a rotation and a mask per register, mxfp4_word.h; a 2^-126
// factor), then one bf16x2 multiply by the row's scale: registers 0 and 2 hold strip row r (scale sc0), 1
// and 3 row r + 8. kShifts: swap_ab_decode_word's.
template <bool kShifts = false>
__device__ __forceinline__ void mxfp4_dequant_step(uint32_t v, uint32_t sc0, uint32_t sc8, uint32_t (&a)[4]) {
  swap_ab_decode_word<kShifts>(v, a);
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j] = bf16x2_mul(a[j], (j & 1) ? sc8 : sc0);
}

// One 64-wide k tile of a 16-row strip times 8 token columns: the lane's 16 weight bytes `wq` (4 k-steps)
// against its 32 activation bytes xa, xb (the layout's k permutation makes them contiguous), 4 mma steps
// accumulated in order into acc. kShifts: swap_ab_decode_word's (the same bits).
template <bool kShifts = false>
__device__ __forceinline__ void mxfp4_strip_mma(float (&acc)[4], const uint4& wq, uint32_t sc0, uint32_t sc8,
                                                const uint4& xa, const uint4& xb) {
  const uint32_t w4[4] = {wq.x, wq.y, wq.z, wq.w};
  const uint32_t bx[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    mxfp4_dequant_step<kShifts>(w4[kk], sc0, sc8, a);
    mma_bf16_16816(acc, a, bx[2 * kk], bx[2 * kk + 1]);
  }
}

// gpt-oss's clamped SwiGLU of the biased gate and up sums, in the CPU twin's order of operations.
__device__ __forceinline__ float swiglu_clamped(float gate_sum, float up_sum, float limit, float alpha) {
  const float gate = fminf(gate_sum, limit);
  const float up = fminf(fmaxf(up_sum, -limit), limit);
  return gate / (1.0f + expf(-alpha * gate)) * (up + 1.0f);
}

// Fixed-order reduction of a CTA's k split through shared memory `red` ([k_split - 1][4][32] floats):
// warp 0 adds warps 1, 2, ... in turn, so the sums do not depend on timing. True in warp 0 only, which
// then holds the strip's sums; the other warps are done.
__device__ __forceinline__ bool reduce_k_split(float (&acc)[4], float* red, int warp, int lane, int k_split) {
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) red[((warp - 1) * 4 + i) * 32 + lane] = acc[i];
  }
  __syncthreads();
  if (warp != 0) return false;
  for (int w = 1; w < k_split; ++w)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += red[((w - 1) * 4 + i) * 32 + lane];
  return true;
}

// Epilogues of the swap-AB GEMMs for the tile of `rows` routed tokens of expert e at sorted position
// `start`, by lane (r, q): acc[0], acc[1] are strip row r for tile rows 2q and 2q + 1; acc[2], acc[3] strip
// row r + 8 for the same tile rows.
// First GEMM: bias + clamped SwiGLU; gate and up of channel strip * 8 + r sit in strip rows r and r + 8.
__device__ __forceinline__ void swap_ab_swiglu_epilogue(const MoeGemmParams& g, const float (&acc)[4], int e,
                                                        int start, int rows, int64_t strip, int r, int q) {
  const int64_t channel = strip * 8 + r, half = g.rows / 2;
  const float gate_b = bf16_bits_to_f32(g.bias[e * g.rows + 2 * channel]);
  const float up_b = bf16_bits_to_f32(g.bias[e * g.rows + 2 * channel + 1]);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int tok = 2 * q + c;
    if (tok >= rows) continue;
    const float h = swiglu_clamped(acc[c] + gate_b, acc[2 + c] + up_b, g.swiglu_limit, g.swiglu_alpha);
    g.out[(start + tok) * half + channel] = f32_to_bf16_bits(h);
  }
}

// Second GEMM: (acc + bias) * routing weight, into the tile's sorted rows of y. The bias of strip rows r
// and r + 8 is loaded first (load_strip_bias) so that its latency overlaps whatever the caller does to find
// the routing weights; `weight_of(c)` gives the routing weight of tile row 2q + c and is only called for
// rows inside the tile.
struct StripBias {
  float b0, b8;
};
__device__ __forceinline__ StripBias load_strip_bias(const MoeGemmParams& g, int e, int64_t strip, int r) {
  const int64_t row0 = strip * 16 + r;
  return {bf16_bits_to_f32(g.bias[e * g.rows + row0]), bf16_bits_to_f32(g.bias[e * g.rows + row0 + 8])};
}
template <typename WeightOf>
__device__ __forceinline__ void swap_ab_weighted_epilogue(const MoeGemmParams& g, const float (&acc)[4],
                                                          StripBias bias, int start, int rows, int64_t strip, int r,
                                                          int q, WeightOf weight_of) {
  const int64_t row0 = strip * 16 + r;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int tok = 2 * q + c;
    if (tok >= rows) continue;
    const float w = weight_of(c);
    uint16_t* out = g.out + (start + tok) * g.rows;
    out[row0] = f32_to_bf16_bits((acc[c] + bias.b0) * w);
    out[row0 + 8] = f32_to_bf16_bits((acc[2 + c] + bias.b8) * w);
  }
}

}  // namespace mx::cuda
