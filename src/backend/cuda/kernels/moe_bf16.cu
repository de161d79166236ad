// bf16 GeGLU experts (Gemma-4): the two expert GEMMs over launch_moe_routing's tiles, swap AB on mma.sync.
//
// A warp owns a strip of 16 weight rows of the tile's expert (the m16n8k16 A operand) and the tile's routed
// tokens as n-tiles of 8 (the B operand). The first GEMM's strip is 8 gate rows and the same 8 channels' up
// rows (rows r and r + 8 of the fragment), so gate and up of a (token, channel) land in one lane and the
// GeGLU runs in registers. Operands are read straight from global memory, 16 bytes per lane: for a 64-wide
// k chunk, lane (r, q) reads k [16q, 16q + 16) of its rows and of its token's row, and both operands use the
// same order of k inside the chunk (a permutation the dot product does not see).
// Decode (tiles of 8 tokens): one strip per CTA, its warps split k (partials summed through shared memory in
// a fixed order); kDepth chunks of weights are requested before their mma. Prefill (tiles of 64 tokens): one
// strip per warp, 4 strips per CTA, so the tile's activations are read from L1 by the 4 warps.
// Rows or channels past the matrix and k past its end are zero-filled; the routing's tiles past the
// device-side count exit, so the grid can be sized for the worst case (graph capture).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"

namespace mx::cuda {
namespace {

constexpr int kPrefillWarps = 4;

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ uint4 load16(const uint16_t* p, bool ok) { return ok ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0); }
__device__ __forceinline__ uint4 load16_stream(const uint16_t* p, bool ok) { return ok ? ldg_stream(p) : make_uint4(0, 0, 0, 0); }

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

template <bool kGated, int kNTiles, int kDepth>
__global__ void moe_bf16_kernel(MoeBf16GemmParams p) {
  extern __shared__ float red[];  // decode k split: [k_split - 1][4][32]
  const int tile = blockIdx.y;
  if (tile >= *p.r.num_tiles) return;
  const int e = p.r.tile_expert[tile], start = p.r.tile_start[tile], n = p.r.tile_rows[tile];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, q = lane % 4;
  const int k_split = p.k_split, ks = warp % k_split;
  const int64_t strip = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32 / k_split) + warp / k_split;
  const int64_t rows_total = kGated ? 2 * p.out_rows : p.out_rows;
  const int64_t strips = kGated ? cdiv(p.out_rows, 8) : cdiv(p.out_rows, 16);
  if (strip >= strips) return;  // only prefill CTAs (k_split 1) have warps past the last strip

  // This lane's two weight rows: gate and up of channel 8 strip + r, or rows r and r + 8 of the strip.
  const int64_t row_lo = kGated ? 8 * strip + r : 16 * strip + r;
  const int64_t row_hi = kGated ? p.out_rows + row_lo : row_lo + 8;
  const bool lo_ok = kGated ? row_lo < p.out_rows : row_lo < p.out_rows;
  const bool hi_ok = kGated ? lo_ok : row_hi < p.out_rows;
  const uint16_t* w_lo = p.w + (e * rows_total + (lo_ok ? row_lo : 0)) * p.k + 16 * q;
  const uint16_t* w_hi = p.w + (e * rows_total + (hi_ok ? row_hi : 0)) * p.k + 16 * q;
  const uint16_t* x_row[kNTiles];
  bool x_ok[kNTiles];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const int tok = 8 * j + r;
    x_ok[j] = tok < n;
    const int64_t src = !x_ok[j] ? 0 : kGated ? p.r.sorted_slots[start + tok] / p.top_k : start + tok;
    x_row[j] = p.in + src * p.k + 16 * q;
  }

  const int64_t n_chunks = cdiv(p.k, 64);
  const int64_t c_begin = ks * n_chunks / k_split, c_end = (ks + 1) * n_chunks / k_split;
  float acc[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int64_t c0 = c_begin; c0 < c_end; c0 += kDepth) {
    uint4 a[kDepth][4];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t k0 = (c0 + d) * 64 + 16 * q;
      const bool in0 = c0 + d < c_end && k0 < p.k, in1 = c0 + d < c_end && k0 + 8 < p.k;
      const int64_t off = (c0 + d) * 64;
      a[d][0] = load16_stream(w_lo + off, in0 && lo_ok);
      a[d][1] = load16_stream(w_lo + off + 8, in1 && lo_ok);
      a[d][2] = load16_stream(w_hi + off, in0 && hi_ok);
      a[d][3] = load16_stream(w_hi + off + 8, in1 && hi_ok);
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (c0 + d >= c_end) break;
      const int64_t k0 = (c0 + d) * 64 + 16 * q, off = (c0 + d) * 64;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const uint4 x0 = load16(x_row[j] + off, x_ok[j] && k0 < p.k);
        const uint4 x1 = load16(x_row[j] + off + 8, x_ok[j] && k0 + 8 < p.k);
        chunk_mma(acc[j], a[d], x0, x1);
      }
    }
  }

  if (k_split > 1) {  // decode only (kNTiles 1): sum the warps' partials in warp order
    if (ks > 0) {
#pragma unroll
      for (int c = 0; c < 4; ++c) red[((ks - 1) * 4 + c) * 32 + lane] = acc[0][c];
    }
    __syncthreads();
    if (ks > 0) return;
    for (int w = 1; w < k_split; ++w)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[0][c] += red[((w - 1) * 4 + c) * 32 + lane];
  }

  // acc[j]: c 0, 1 = row lo, tokens 8j + 2q + {0, 1}; c 2, 3 = row hi, same tokens.
#pragma unroll
  for (int j = 0; j < kNTiles; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int tok = 8 * j + 2 * q + c;
      if (tok >= n) continue;
      const int64_t pos = start + tok;
      if constexpr (kGated) {
        if (lo_ok) p.out[pos * p.out_rows + row_lo] = f32_to_bf16_bits(gelu_tanh(acc[j][c]) * acc[j][2 + c]);
      } else {
        const float wt = p.topk_weights[p.r.sorted_slots[pos]];
        if (lo_ok) p.out[pos * p.out_rows + row_lo] = f32_to_bf16_bits(acc[j][c] * wt);
        if (hi_ok) p.out[pos * p.out_rows + row_hi] = f32_to_bf16_bits(acc[j][2 + c] * wt);
      }
    }
}

template <bool kGated>
Status launch_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  const int64_t strips = kGated ? ceil_div64(p.out_rows, 8) : ceil_div64(p.out_rows, 16);
  if (p.tile_tokens == 8) {
    const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(p.max_tiles));
    const size_t smem = static_cast<size_t>(p.k_split - 1) * 4 * 32 * sizeof(float);
    moe_bf16_kernel<kGated, 1, 4><<<grid, 32 * p.k_split, smem, stream>>>(p);
  } else {
    const dim3 grid(static_cast<unsigned>(ceil_div64(strips, kPrefillWarps)), static_cast<unsigned>(p.max_tiles));
    moe_bf16_kernel<kGated, 8, 1><<<grid, 32 * kPrefillWarps, 0, stream>>>(p);
  }
  return launch_status("moe_bf16_kernel");
}

}  // namespace

Status launch_moe_bf16_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  if (p.k % 8 != 0) return unimplemented("bf16 experts: the inner dimension must be a multiple of 8");
  if (p.tile_tokens != 8 && p.tile_tokens != 64) return internal_error("bf16 experts: tiles of 8 or 64 tokens");
  if (p.tile_tokens == 64 && p.k_split != 1) return internal_error("bf16 experts: no k split with 64-token tiles");
  if (p.k_split < 1 || p.k_split > 8) return internal_error("bf16 experts: k split in [1, 8]");
  if (p.max_tiles == 0) return Status::ok();
  if (p.max_tiles > 65535) return unimplemented("bf16 experts: too many token tiles in one call");
  return p.gated ? launch_gemm<true>(p, stream) : launch_gemm<false>(p, stream);
}

}  // namespace mx::cuda
