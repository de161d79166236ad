// MXFP4 experts for many tokens per expert (prefill): a grouped GEMM over the expert-sorted tokens.
//
// Same routing metadata, weight layout (kMxfp4SwapAb), epilogues and combine as the swap-AB decode kernels
// in moe.cu; only the GEMM differs. Here the tokens are the mma M side: a CTA takes one routing tile of 64
// or 128 tokens of one expert and 128 weight rows (8 strips of 16), 4 warps in 2 x 2, each warp 32 or 64
// tokens x 64 rows. K goes in tiles of 64 through a cp.async ring: per stage the tile's activation rows
// (gathered through the routing permutation for the first GEMM), its 4 KB of packed fp4 and 256 B of
// scales. Each stage's fp4 is dequantized once per CTA into a bf16 buffer in fragment order, so the cost
// is shared by all the tile's tokens and every warp reads its B fragments with one 16-byte load; two such
// buffers let the dequantization of tile t + 1 run beside the mma of tile t.
//
// Why the swap-AB layout works unchanged as the B operand: lane (r, q) of the packed strip holds, per
// k-step, A registers {row r, row r+8} x {k pair 0, k pair 1}; the B fragment of m16n8k16 for column
// n = r is {k pair 0, k pair 1} of that column, so registers (0, 2) are B for strip rows 0..7 and (1, 3)
// for rows 8..15. The k permutation of the layout (lane q's 4 k of step kk are physical
// 16q + 4kk .. +3) is applied to the activations by reading 16 contiguous bytes per lane.
//
// The result of a (token, expert) pair depends only on its own row and the weights (fixed k order), not on
// which other tokens share its tile.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/moe_route_tile.cuh"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"

namespace mx::cuda {
namespace {

constexpr int kStrips = kMoeGroupedWeightRows / 16;
constexpr int kPitch = kMoeGroupedRowPitch;  // 16 bytes of padding: 16-byte row loads are conflict-free
constexpr int kWeightBytes = kMoeGroupedWeightRows * 32;
static_assert(kMoeGroupedThreads == 128, "2 x 2 warps");

__device__ __forceinline__ void cp_async_wait_upto(int pending) {
  if (pending >= 2) {
    cp_async_wait<2>();
  } else if (pending == 1) {
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

// kMTiles: 16-token m-tiles per warp; the routing tile is 32 * kMTiles tokens.
template <int kMTiles>
__global__ void __launch_bounds__(kMoeGroupedThreads) moe_grouped_kernel(MoeGemmParams p, int stages) {
  constexpr int kTileTokens = 32 * kMTiles;
  constexpr int kRowsPerThread = kTileTokens * 8 / kMoeGroupedThreads;  // 16-byte activation chunks
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int src_row[kTileTokens];  // input row of each tile row, -1 past the tile's tokens

  const int tile = blockIdx.y;
  if (tile >= *p.r.num_tiles) return;
  const GroupedTile gt = grouped_tile<kTileTokens, kMoeGroupedThreads>(p.r, tile, p.gated, p.top_k, src_row);
  const int e = gt.expert, start = gt.start, n = gt.rows;
  const int64_t strips = p.rows / 16, n_k64 = p.k / 64;
  const int strip0 = blockIdx.x * kStrips;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4;
  const int wm = warp / 2, wn = warp % 2;

  __syncthreads();

  // Two dequantized buffers [strip][kk][lane][4 bf16x2 registers]: tile t + 1 is dequantized while tile t
  // is multiplied, so the ALU work overlaps the tensor work and one barrier per k tile suffices.
  auto bf = [&](int t) { return smem + (t & 1) * kMoeGroupedBf16Bytes; };
  const int stage_bytes = static_cast<int>(moe_grouped_stage_bytes(kTileTokens));
  auto a_tile = [&](int s) { return smem + 2 * kMoeGroupedBf16Bytes + s * stage_bytes; };
  auto w_tile = [&](int s) { return a_tile(s) + kTileTokens * kPitch; };
  auto s_tile = [&](int s) { return w_tile(s) + kWeightBytes; };

  auto load = [&](int t, int s) {
    uint8_t* a = a_tile(s);
    const int col = tid % 8;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int row = tid / 8 + 16 * j;
      const int src = src_row[row];
      const uint16_t* g = src < 0 ? p.in : p.in + static_cast<int64_t>(src) * p.k + t * 64 + col * 8;
      cp_async_16(a + row * kPitch + col * 16, g, src >= 0);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int c = tid + kMoeGroupedThreads * j, st = c / 32, l = c % 32;
      const int64_t gs = strip0 + st;
      const bool ok = gs < strips;
      const uint8_t* g = ok ? p.blocks + ((e * strips + gs) * n_k64 + t) * 512 + l * 16 : p.blocks;
      cp_async_16(w_tile(s) + c * 16, g, ok);
    }
    if (tid < 2 * kStrips) {
      const int64_t gs = strip0 + tid / 2;
      const bool ok = gs < strips;
      const uint8_t* g = ok ? p.scales + ((e * strips + gs) * n_k64 + t) * 32 + (tid % 2) * 16 : p.scales;
      cp_async_16(s_tile(s) + tid * 16, g, ok);
    }
  };

  // fp4 -> bf16 as in the swap-AB kernels (mxfp4_swap_ab.cuh). Strips past the matrix were zero-filled:
  // zero scale, zero weights.
  auto dequant = [&](int s, uint8_t* out) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int c = tid + kMoeGroupedThreads * j, st = c / 32, l = c % 32, lr = l / 4, lq = l % 4;
      const uint4 wq = lds128(w_tile(s) + c * 16);
      const uint8_t* sc = s_tile(s) + st * 32 + (lq >> 1) * 16;
      const uint32_t sc0 = mxfp4_scale_x2(sc[lr]), sc8 = mxfp4_scale_x2(sc[lr + 8]);
      const uint32_t w4[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t a[4];
        mxfp4_dequant_step(w4[kk], sc0, sc8, a);
        *reinterpret_cast<uint4*>(out + ((st * 4 + kk) * 32 + l) * 16) = make_uint4(a[0], a[1], a[2], a[3]);
      }
    }
  };

  float acc[kMTiles][8][4];
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  // Ring of `stages` (>= 3) k tiles, prefetch distance stages - 1; at iteration t tile t + 1 must have
  // landed (it is dequantized), tile t was dequantized in the previous iteration.
  const int n_k = static_cast<int>(p.k / 64);
  for (int s = 0; s < stages - 1; ++s) {
    if (s < n_k) load(s, s);
    cp_async_commit();
  }
  cp_async_wait_upto(stages - 2);
  __syncthreads();
  dequant(0, bf(0));
  for (int t = 0; t < n_k; ++t) {
    const int slot = t % stages;
    cp_async_wait_upto(stages - 3);  // this thread's copies of tile t + 1 landed
    __syncthreads();  // everyone's did; bf(t) is complete; iteration t - 1 is done with bf(t + 1) and its slot
    {
      const int next = t + stages - 1;
      if (next < n_k) load(next, next % stages);
      cp_async_commit();
    }
    if (t + 1 < n_k) dequant((t + 1) % stages, bf(t + 1));
    const uint8_t* b_tile = bf(t);
    const uint8_t* a = a_tile(slot) + (wm * 16 * kMTiles + r) * kPitch + q * 32;
#pragma unroll
    for (int kk2 = 0; kk2 < 2; ++kk2) {
      // 8 activations per lane and row: physical k 16q + 8kk2 .. +7, i.e. k-steps 2kk2 and 2kk2 + 1.
      uint4 lo[kMTiles], hi[kMTiles];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        lo[i] = lds128(a + (i * 16) * kPitch + kk2 * 16);
        hi[i] = lds128(a + (i * 16 + 8) * kPitch + kk2 * 16);
      }
#pragma unroll
      for (int kh = 0; kh < 2; ++kh) {
        const int kk = 2 * kk2 + kh;
        uint4 b[4];
#pragma unroll
        for (int sl = 0; sl < 4; ++sl) b[sl] = lds128(b_tile + (((wn * 4 + sl) * 4 + kk) * 32 + lane) * 16);
#pragma unroll
        for (int i = 0; i < kMTiles; ++i) {
          const uint32_t af[4] = {kh ? lo[i].z : lo[i].x, kh ? hi[i].z : hi[i].x, kh ? lo[i].w : lo[i].y,
                                  kh ? hi[i].w : hi[i].y};
#pragma unroll
          for (int sl = 0; sl < 4; ++sl) {
            mma_bf16_16816(acc[i][2 * sl], af, b[sl].x, b[sl].z);
            mma_bf16_16816(acc[i][2 * sl + 1], af, b[sl].y, b[sl].w);
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  // acc[i][j]: tokens wm*16*kMTiles + 16i + r (c 0, 1) and + 8 (c 2, 3); columns 2q, 2q + 1 of strip
  // strip0 + wn*4 + j/2, rows 0..7 (j even) or 8..15 (j odd) of it.
#pragma unroll
  for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
    for (int hrow = 0; hrow < 2; ++hrow) {
      const int tok = wm * 16 * kMTiles + i * 16 + r + 8 * hrow;
      if (tok >= n) continue;
      if (p.gated) {
        const int64_t half = p.rows / 2;
#pragma unroll
        for (int sl = 0; sl < 4; ++sl) {
          const int64_t gs = strip0 + wn * 4 + sl;
          if (gs >= strips) continue;
          const int64_t channel = gs * 8 + 2 * q;
          const uint16_t* b = p.bias + e * p.rows + 2 * channel;  // gate, up, gate, up of 2 channels
          float h[2];
#pragma unroll
          for (int c = 0; c < 2; ++c)
            h[c] = swiglu_clamped(acc[i][2 * sl][2 * hrow + c] + bf16_bits_to_f32(b[2 * c]),
                                  acc[i][2 * sl + 1][2 * hrow + c] + bf16_bits_to_f32(b[2 * c + 1]), p.swiglu_limit,
                                  p.swiglu_alpha);
          *reinterpret_cast<uint32_t*>(p.out + (start + tok) * half + channel) = pack_bf16x2(h[0], h[1]);
        }
      } else {
        const float w = p.topk_weights[p.r.sorted_slots[start + tok]];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int64_t gs = strip0 + wn * 4 + j / 2;
          if (gs >= strips) continue;
          const int64_t row = gs * 16 + (j % 2) * 8 + 2 * q;
          const float v0 = (acc[i][j][2 * hrow] + bf16_bits_to_f32(p.bias[e * p.rows + row])) * w;
          const float v1 = (acc[i][j][2 * hrow + 1] + bf16_bits_to_f32(p.bias[e * p.rows + row + 1])) * w;
          *reinterpret_cast<uint32_t*>(p.out + (start + tok) * p.rows + row) = pack_bf16x2(v0, v1);
        }
      }
    }
  }
}

// Also asks for the largest shared-memory carveout: the default may leave room for one CTA per SM only.
template <typename Kernel>
Status set_smem(Kernel kernel, int64_t bytes) {
  MX_RETURN_IF_ERROR(
      cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                  "cudaFuncSetAttribute(moe grouped smem)"));
  return cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
      "cudaFuncSetAttribute(moe grouped carveout)");
}

}  // namespace

Status launch_moe_grouped_gemm(const MoeGemmParams& p, const MoeGroupedConfig& c, cudaStream_t stream) {
  if (p.rows % 16 != 0 || p.k % 64 != 0) return internal_error("MoE grouped GEMM: rows % 16 and k % 64 must be 0");
  if (c.stages < 3 || c.stages > kMoeGroupedMaxStages || c.threads != kMoeGroupedThreads)
    return internal_error("MoE grouped GEMM: config does not fit this GPU");
  if (c.tile_tokens != 64 && c.tile_tokens != 128) return internal_error("MoE grouped GEMM: tiles of 64 or 128");
  if (p.max_tiles == 0) return Status::ok();
  if (p.max_tiles > 65535) return unimplemented("MoE grouped GEMM: too many token tiles in one call");
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.rows / 16, kStrips)), static_cast<unsigned>(p.max_tiles));
  if (c.tile_tokens == 128) {
    MX_RETURN_IF_ERROR(set_smem(moe_grouped_kernel<4>, c.smem_bytes));
    moe_grouped_kernel<4><<<grid, c.threads, c.smem_bytes, stream>>>(p, c.stages);
  } else {
    MX_RETURN_IF_ERROR(set_smem(moe_grouped_kernel<2>, c.smem_bytes));
    moe_grouped_kernel<2><<<grid, c.threads, c.smem_bytes, stream>>>(p, c.stages);
  }
  return launch_status("moe_grouped_kernel");
}

}  // namespace mx::cuda
