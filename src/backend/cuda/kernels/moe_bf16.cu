// bf16 GeGLU experts (Gemma-4) at decode: the two expert GEMMs over 8-token routing tiles, swap AB on mma.sync
// (prefill, 64-token tiles: moe_bf16_grouped.cu).
//
// A CTA owns a strip of 16 weight rows of the tile's expert (the m16n8k16 A operand) and the tile's routed
// tokens as the 8-wide B operand; its warps split k (partials summed through shared memory in warp order,
// a split fixed by k, so a token's result does not depend on the batch). The first GEMM's strip is 8 gate
// rows and the same 8 channels' up rows (rows r and r + 8 of the fragment), so gate and up of a (token,
// channel) land in one lane and the GeGLU runs in registers. Operands come straight from global memory, 16
// bytes per lane: for a 64-wide k chunk, lane (r, q) reads k [16q, 16q + 16) of its rows and of its token's
// row, both operands in the same order of k inside the chunk (a permutation the dot product does not see);
// kDepth chunks of weights are requested before their mma. Rows or channels past the matrix and k past its
// end are zero-filled. Tiles past the step's count exit, so the grid can be sized for the worst case.
// Up to 32 slots the CTAs route themselves (moe_route_tile.cuh), the second GEMM is a programmatic
// dependent of the first that loads its first weights before waiting for h, and its last CTA per strip
// sums each token's k rows (ticket); else launch_moe_routing's metadata and the combine kernel are used.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/moe_route_tile.cuh"

namespace mx::cuda {
namespace {

constexpr int kDecodeDepth = 4;  // 64-wide k chunks of weights requested per warp before their mma

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// Activations: x (first GEMM) is shared by many CTAs, through L1; h (second GEMM) may have been written
// while this kernel already ran (PDL), so from L2 only.
template <bool kGated>
__device__ __forceinline__ uint4 load16_act(const uint16_t* p, bool ok) {
  if (!ok) return make_uint4(0, 0, 0, 0);
  if constexpr (kGated) return __ldg(reinterpret_cast<const uint4*>(p));
  return __ldcg(reinterpret_cast<const uint4*>(p));
}
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

// Self-routed second GEMM: the last tile of this 16-row strip to finish sums every token's top-k rows in
// router order (the arithmetic of moe_combine_kernel: bf16 y, fp32 sum, bf16 out).
__device__ void combine_strip_rows(const MoeBf16GemmParams& p, const TileRoute& rt, int64_t strip) {
  const int lane = threadIdx.x % 32, top_k = static_cast<int>(p.top_k);
  const int tokens = static_cast<int>(p.slots) / top_k;
  for (int b = 0; b < tokens * 16; b += 32) {
    const int idx = b + lane, t = min(idx / 16, tokens - 1);
    const int64_t row = strip * 16 + idx % 16;
    float sum = 0.f;
    for (int j = 0; j < top_k; ++j) {
      const int pos = __shfl_sync(0xffffffffu, rt.pos, t * top_k + j);
      if (row < p.out_rows) sum += bf16_bits_to_f32(__ldcg(p.out + pos * p.out_rows + row));
    }
    if (idx < tokens * 16 && row < p.out_rows) p.combined[t * p.out_rows + row] = f32_to_bf16_bits(sum);
  }
}

template <bool kGated, int kDepth>
__global__ void moe_bf16_kernel(MoeBf16GemmParams p) {
  extern __shared__ float red[];  // decode k split: [k_split - 1][4][32]
  const int tile = blockIdx.y;
  if constexpr (kGated) {
    pdl_wait();  // the ids and x come from earlier kernels
    pdl_launch_dependents();  // only after the wait: the second GEMM reads the ids before its own wait
  }
  const TileRoute rt = tile_route(p, tile);  // the second GEMM reads only ids, which precede the first GEMM
  if (tile >= rt.tiles) return;
  const int e = rt.expert, start = rt.start, n = rt.rows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, q = lane % 4;
  const int k_split = p.k_split, ks = warp % k_split;
  const int64_t strip = blockIdx.x;
  const int64_t rows_total = kGated ? 2 * p.out_rows : p.out_rows;
  const int64_t strips = kGated ? cdiv(p.out_rows, 8) : cdiv(p.out_rows, 16);

  // This lane's two weight rows: gate and up of channel 8 strip + r, or rows r and r + 8 of the strip.
  const int64_t row_lo = kGated ? 8 * strip + r : 16 * strip + r;
  const int64_t row_hi = kGated ? p.out_rows + row_lo : row_lo + 8;
  const bool lo_ok = row_lo < p.out_rows;
  const bool hi_ok = kGated ? lo_ok : row_hi < p.out_rows;
  const uint16_t* w_lo = p.w + (e * rows_total + (lo_ok ? row_lo : 0)) * p.k + 16 * q;
  const uint16_t* w_hi = p.w + (e * rows_total + (hi_ok ? row_hi : 0)) * p.k + 16 * q;

  const int64_t n_chunks = cdiv(p.k, 64);
  const int64_t c_begin = ks * n_chunks / k_split, c_end = (ks + 1) * n_chunks / k_split;
  uint4 a[kDepth][4];
  auto load_weights = [&](int64_t c0) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t k0 = (c0 + d) * 64 + 16 * q, off = (c0 + d) * 64;
      const bool in0 = c0 + d < c_end && k0 < p.k, in1 = c0 + d < c_end && k0 + 8 < p.k;
      a[d][0] = load16_stream(w_lo + off, in0 && lo_ok);
      a[d][1] = load16_stream(w_lo + off + 8, in1 && lo_ok);
      a[d][2] = load16_stream(w_hi + off, in0 && hi_ok);
      a[d][3] = load16_stream(w_hi + off + 8, in1 && hi_ok);
    }
  };
  load_weights(c_begin);  // constant: in flight before waiting for h
  if constexpr (!kGated) pdl_wait();

  // The B column of this lane: token r of the tile (its input row: x by token, or h by sorted position).
  const bool x_ok = r < n;
  int64_t src = 0;
  if (x_ok) {
    const int64_t slot = p.topk_ids ? rt.row_slot : kGated ? p.r.sorted_slots[start + r] : 0;
    src = kGated ? slot / p.top_k : start + r;
  }
  const uint16_t* x_row = p.in + src * p.k + 16 * q;

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t c0 = c_begin; c0 < c_end; c0 += kDepth) {
    if (c0 != c_begin) load_weights(c0);
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (c0 + d >= c_end) break;
      const int64_t k0 = (c0 + d) * 64 + 16 * q, off = (c0 + d) * 64;
      const uint4 x0 = load16_act<kGated>(x_row + off, x_ok && k0 < p.k);
      const uint4 x1 = load16_act<kGated>(x_row + off + 8, x_ok && k0 + 8 < p.k);
      chunk_mma(acc, a[d], x0, x1);
    }
  }

  if (k_split > 1) {  // sum the warps' partials in warp order
    if (ks > 0) {
#pragma unroll
      for (int c = 0; c < 4; ++c) red[((ks - 1) * 4 + c) * 32 + lane] = acc[c];
    }
    __syncthreads();
    if (ks > 0) return;
    for (int w = 1; w < k_split; ++w)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[c] += red[((w - 1) * 4 + c) * 32 + lane];
  }

  // acc: c 0, 1 = row lo, tokens 2q + {0, 1}; c 2, 3 = row hi, same tokens.
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int tok = 2 * q + c;
    // Self-routed: tile row tok's slot is lane 4 tok's row_slot (every lane takes part in the shuffle).
    const int self_slot = __shfl_sync(0xffffffffu, rt.row_slot, 4 * tok);
    if (tok >= n) continue;
    const int64_t pos = start + tok;
    if constexpr (kGated) {
      if (lo_ok) p.out[pos * p.out_rows + row_lo] = f32_to_bf16_bits(gelu_tanh(acc[c]) * acc[2 + c]);
    } else {
      const float wt = p.topk_weights[p.topk_ids ? self_slot : p.r.sorted_slots[pos]];
      if (lo_ok) p.out[pos * p.out_rows + row_lo] = f32_to_bf16_bits(acc[c] * wt);
      if (hi_ok) p.out[pos * p.out_rows + row_hi] = f32_to_bf16_bits(acc[2 + c] * wt);
    }
  }
  if constexpr (!kGated) {
    if (p.combined == nullptr) return;
    if (last_tile_of_strip(p.tickets, strip, rt.tiles)) combine_strip_rows(p, rt, strip);
  }
}

template <bool kGated>
Status launch_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  const int64_t strips = kGated ? cdiv(p.out_rows, 8) : cdiv(p.out_rows, 16);
  const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(p.max_tiles));
  const size_t smem = static_cast<size_t>(p.k_split - 1) * 4 * 32 * sizeof(float);
  return cuda_status(launch_pdl(moe_bf16_kernel<kGated, kDecodeDepth>, grid, dim3(32 * p.k_split), smem, stream, p),
                     "moe_bf16_kernel");
}

}  // namespace

Status launch_moe_bf16_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  if (p.k % 8 != 0) return unimplemented("bf16 experts: the inner dimension must be a multiple of 8");
  if (p.tile_tokens != 8 && p.tile_tokens != 64) return internal_error("bf16 experts: tiles of 8 or 64 tokens");
  if (p.k_split < 1 || p.k_split > 8) return internal_error("bf16 experts: k split in [1, 8]");
  if (p.topk_ids && (p.tile_tokens != 8 || p.slots > 32))
    return internal_error("bf16 experts: self-routing takes 8-token tiles and at most 32 slots");
  if (p.combined && (p.topk_ids == nullptr || p.gated || p.tickets == nullptr))
    return internal_error("bf16 experts: the combine is fused into the self-routed second GEMM only");
  if (p.max_tiles == 0) return Status::ok();
  if (p.max_tiles > 65535) return unimplemented("bf16 experts: too many token tiles in one call");
  if (p.tile_tokens == 64) return launch_moe_bf16_grouped_gemm(p, stream);
  return p.gated ? launch_gemm<true>(p, stream) : launch_gemm<false>(p, stream);
}

}  // namespace mx::cuda
