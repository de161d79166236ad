// bf16 GeGLU experts (Gemma-4) at decode: the two expert GEMMs over 8-token routing tiles, swap AB on mma.sync,
// the weights by 16-byte loads into registers (the same GEMMs with bulk copies into shared memory:
// moe_bf16_bulk.cu; prefill, 64-token tiles: moe_bf16_grouped.cu). Shared parts: moe_bf16_decode.cuh.
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
#include "backend/cuda/kernels/moe_bf16_decode.cuh"

namespace mx::cuda {
namespace {

using namespace moe_bf16;

constexpr int kDecodeDepth = 4;  // 64-wide k chunks of weights requested per warp before their mma

__device__ __forceinline__ uint4 load16_stream(const uint16_t* p, bool ok) { return ok ? ldg_stream(p) : make_uint4(0, 0, 0, 0); }

template <bool kGated, int kDepth>
__global__ void moe_bf16_kernel(MoeBf16GemmParams p) {
  extern __shared__ float red[];  // decode k split: [k_split - 1][4][32]
  const int tile = blockIdx.y;
  const TileRoute rt = begin_tile<kGated>(p, tile);
  if (tile >= rt.tiles) return;
  const int e = rt.expert;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, q = lane % 4;
  const int k_split = p.k_split, ks = warp % k_split;
  const int64_t strip = blockIdx.x;
  const int64_t rows_total = kGated ? 2 * p.out_rows : p.out_rows;
  const StripRows s = strip_rows<kGated>(p, strip, r);
  const uint16_t* w_lo = p.w + (e * rows_total + (s.lo_ok ? s.lo : 0)) * p.k + 16 * q;
  const uint16_t* w_hi = p.w + (e * rows_total + (s.hi_ok ? s.hi : 0)) * p.k + 16 * q;

  const int64_t n_chunks = cdiv(p.k, 64);
  const int64_t c_begin = ks * n_chunks / k_split, c_end = (ks + 1) * n_chunks / k_split;
  uint4 a[kDepth][4];
  auto load_weights = [&](int64_t c0) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t k0 = (c0 + d) * 64 + 16 * q, off = (c0 + d) * 64;
      const bool in0 = c0 + d < c_end && k0 < p.k, in1 = c0 + d < c_end && k0 + 8 < p.k;
      a[d][0] = load16_stream(w_lo + off, in0 && s.lo_ok);
      a[d][1] = load16_stream(w_lo + off + 8, in1 && s.lo_ok);
      a[d][2] = load16_stream(w_hi + off, in0 && s.hi_ok);
      a[d][3] = load16_stream(w_hi + off + 8, in1 && s.hi_ok);
    }
  };
  load_weights(c_begin);  // constant: in flight before waiting for h
  if constexpr (!kGated) pdl_wait();

  bool x_ok;
  const uint16_t* x_row = token_row<kGated>(p, rt, r, q, x_ok);
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
  store_strip<kGated>(p, rt, s, strip, acc);
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

// The wgmma kernel's tile: 128 tokens from 128 routed tokens per expert on average, else 64. H200, session 15
// W1c, one process (mx_kernel_bench --gemma-experts-only=1024,8192, us per call of routing + GEMMs + combine;
// mma.sync / wgmma 64-token tiles / wgmma 128): 64 tokens per expert 744.7 / 665.7 / 700.6, 512 per expert
// 4335.4 / 3679.7 / 3174.9. (Between the two the threshold is not measured.)
int64_t moe_bf16_prefill_tile_tokens(bool wgmma, int64_t slots, int64_t experts) {
  return wgmma && slots >= 128 * experts ? 128 : 64;
}

Status launch_moe_bf16_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  if (p.k % 8 != 0) return unimplemented("bf16 experts: the inner dimension must be a multiple of 8");
  if (p.tile_tokens != 8 && p.tile_tokens != 64 && !(p.streamed && (p.tile_tokens == 16 || p.tile_tokens == 32)) &&
      !(p.wgmma && p.tile_tokens == 128))
    return internal_error("bf16 experts: tiles of 8 or 64 tokens (streamed: also 16 or 32; wgmma: also 128)");
  if (p.k_split < 1 || p.k_split > 8) return internal_error("bf16 experts: k split in [1, 8]");
  if (p.topk_ids && (p.tile_tokens != 8 || p.slots > 32))
    return internal_error("bf16 experts: self-routing takes 8-token tiles and at most 32 slots");
  if (p.combined && (p.topk_ids == nullptr || p.gated || p.tickets == nullptr))
    return internal_error("bf16 experts: the combine is fused into the self-routed second GEMM only");
  if (p.max_tiles == 0) return Status::ok();
  if (p.max_tiles > 65535) return unimplemented("bf16 experts: too many token tiles in one call");
  if (p.streamed) return launch_moe_bf16_stream_gemm(p, stream);
  if (p.wgmma) return launch_moe_bf16_wgmma_gemm(p, stream);
  if (p.tile_tokens == 64) return launch_moe_bf16_grouped_gemm(p, stream);
  if (p.bulk_copies) return launch_moe_bf16_bulk_gemm(p, stream);
  return p.gated ? launch_gemm<true>(p, stream) : launch_gemm<false>(p, stream);
}

}  // namespace mx::cuda
