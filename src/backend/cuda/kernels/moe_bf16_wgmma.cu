// bf16 GeGLU experts for many tokens per expert (prefill) on Hopper (sm_90a): moe_bf16_grouped.cu's GEMMs
// (same routing tiles, inputs, outputs and epilogues) on wgmma, both operands read by the tensor cores from
// shared memory, so no warp spends issue slots on ldmatrix or on one mma.sync per 16 x 8 x 16.
//
// A CTA: one routing tile of 64 or 128 expert-sorted tokens (wgmma's M: a warpgroup per 64, each skipping
// its MMAs when the tile has no token of its 64) x 128 weight rows (N, shared by the warpgroups), k in tiles
// of 64 through a 4-stage cp.async ring, both operands stored as wgmma's K-major 128-byte-swizzled image
// (16-byte chunk c of row n at chunk c ^ (n % 8)). Copies of k tile kt + 2 go out while tile kt multiplies
// (one wgmma group in flight: tile kt - 1's MMAs may still read their stage, tile kt - 2's are done, so its
// stage is refilled). 64-token tiles: two CTAs fit an SM (97 KB each), so one's copies overlap the other's
// MMAs; 128-token tiles (129 KB) read each weight tile once for twice the tokens.
// The first GEMM's 128 rows are the gate rows of 64 channels, then the same channels' up rows: a lane's
// accumulator columns j and j + 64 are gate and up of one (token, channel), and the GeGLU runs on them.
// The second GEMM's epilogue multiplies by the slot's routing weight. Tokens past the tile's rows, weight
// rows past the matrix and k past its end are zero-filled by the copies (src size 0). Tiles past the
// device-side count exit (graph-safe grid).
//
// Numerics: fp32 sums over k in wgmma's order (not moe_bf16_grouped.cu's bits); a token's row depends on its
// own inputs only.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/moe_bf16_wgmma.cuh"
#include "backend/cuda/kernels/moe_route_tile.cuh"

namespace mx::cuda {
namespace {

constexpr int kBN = kMoeBf16WgmmaRows, kBK = kMoeBf16WgmmaK, kWarpgroupTokens = kMoeBf16WgmmaWarpgroupTokens;
constexpr int kStages = 4;
constexpr int kBTileBytes = kBN * kBK * 2;
constexpr int kWarpgroupATileBytes = kWarpgroupTokens * kBK * 2;  // a warpgroup's 64 tokens
constexpr int stage_bytes(int warpgroups) { return warpgroups * kWarpgroupATileBytes + kBTileBytes; }
constexpr size_t smem_bytes(int warpgroups) {
  return static_cast<size_t>(kStages) * stage_bytes(warpgroups) + 1024;  // + the 1024-byte alignment
}

template <bool kGated, int kWarpgroups>
__global__ void __launch_bounds__(128 * kWarpgroups) moe_bf16_wgmma_kernel(MoeBf16GemmParams p) {
#if MX_SM90A
  constexpr int kBM = kWarpgroups * kWarpgroupTokens, kThreads = 128 * kWarpgroups;
  constexpr int kATileBytes = kWarpgroups * kWarpgroupATileBytes, kStageBytes = stage_bytes(kWarpgroups);
  constexpr int kPrefetch = kStages - 2;  // k tiles in flight beyond the one multiplying (see the header)
  extern __shared__ uint8_t smem_raw[];
  __shared__ int src_row[kBM];    // input row of each tile row, -1 past the tile's tokens
  __shared__ int64_t w_row[kBN];  // weight row of each B row, -1 past the matrix
  pdl_wait();  // ids, metadata and activations come from earlier kernels
  pdl_launch_dependents();
  const int tile = blockIdx.y;
  if (tile >= *p.r.num_tiles) return;
  const GroupedTile gt = grouped_tile<kBM, kThreads>(p.r, tile, kGated, p.top_k, src_row);
  const int e = gt.expert, start = gt.start, n = gt.rows;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4, wg = warp / 4;
  const bool busy = wg * kWarpgroupTokens < n;  // this warpgroup's 64 tokens hold some of the tile's
  const int64_t rows_total = kGated ? 2 * p.out_rows : p.out_rows;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * (kGated ? kBN / 2 : kBN);

  for (int i = tid; i < kBN; i += kThreads) {
    const int64_t ch = col0 + (kGated ? i % (kBN / 2) : i);
    const int64_t row = kGated && i >= kBN / 2 ? p.out_rows + ch : ch;  // gate rows, then up rows
    w_row[i] = ch < p.out_rows ? e * rows_total + row : -1;
  }
  __syncthreads();

  // The swizzle pattern repeats every 1024 bytes; tiles start on that boundary.
  uint8_t* ring = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const int n_k = static_cast<int>((p.k + kBK - 1) / kBK);
  // Thread tid copies 16-byte chunk tid % 8 of rows tid / 8 + (kThreads / 8) j: the same swizzled chunk in
  // every row.
  const int chunk = tid % 8, row0 = tid / 8, placed = (chunk ^ (row0 % 8)) * 16;
  auto load = [&](int kt, int s) {
    uint8_t* a = ring + s * kStageBytes;
    uint8_t* b = a + kATileBytes;
    const int64_t k0 = static_cast<int64_t>(kt) * kBK + chunk * 8;
    const bool k_ok = k0 < p.k;
#pragma unroll
    for (int j = 0; j < kBM / (kThreads / 8); ++j) {
      const int row = row0 + (kThreads / 8) * j, src = src_row[row];
      const bool ok = src >= 0 && k_ok;
      cp_async_16(a + row * 128 + placed, ok ? p.in + src * p.k + k0 : p.in, ok);
    }
#pragma unroll
    for (int j = 0; j < kBN / (kThreads / 8); ++j) {
      const int row = row0 + (kThreads / 8) * j;
      const int64_t wr = w_row[row];
      const bool ok = wr >= 0 && k_ok;
      cp_async_16(b + row * 128 + placed, ok ? p.w + wr * p.k + k0 : p.w, ok);
    }
  };

  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
  for (int s = 0; s < kPrefetch; ++s) {
    if (s < n_k) load(s, s);
    cp_async_commit();
  }
  wgmma_fence_regs(acc);
  for (int kt = 0; kt < n_k; ++kt) {
    cp_async_wait<kPrefetch - 1>();  // this thread's copies of tile kt landed
    fence_proxy_async_smem();        // ... and are visible to the tensor cores' reads
    __syncthreads();  // everyone's copies of tile kt are in; everyone's MMAs of tile kt - 2 are done
    if (kt + kPrefetch < n_k) load(kt + kPrefetch, (kt + kPrefetch) % kStages);
    cp_async_commit();
    if (busy) {
      const uint32_t a = smem_addr(ring + (kt % kStages) * kStageBytes);
      const uint64_t desc_a = wgmma_desc_k128(a + wg * kWarpgroupATileBytes);
      const uint64_t desc_b = wgmma_desc_k128(a + kATileBytes);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) wgmma_bf16_ss<kBN, true>(acc, desc_a + 2 * kk, desc_b + 2 * kk);  // +32 B
      wgmma_commit();
      wgmma_wait<1>();
    }
  }
  wgmma_wait<0>();
  wgmma_fence_regs(acc);
  cp_async_wait<0>();

  moe_bf16_wgmma_store<kGated>(p, acc, start, n, col0, warp, r, q);
#endif
}

}  // namespace

Status launch_moe_bf16_wgmma_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  if (p.out_rows % 2 != 0) return internal_error("bf16 wgmma experts: even output rows expected");
  if (p.tile_tokens != 64 && p.tile_tokens != 128)
    return internal_error("bf16 wgmma experts: routing tiles of 64 or 128 tokens expected");
  const int64_t cols = p.gated ? ceil_div64(p.out_rows, kBN / 2) : ceil_div64(p.out_rows, kBN);
  const dim3 grid(static_cast<unsigned>(cols), static_cast<unsigned>(p.max_tiles));
  auto run = [&](auto kernel, int warpgroups) -> Status {
    const size_t smem = smem_bytes(warpgroups);
    MX_RETURN_IF_ERROR(
        cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                    "cudaFuncSetAttribute(moe bf16 wgmma smem)"));
    return cuda_status(launch_pdl(kernel, grid, dim3(128 * warpgroups), smem, stream, p), "moe_bf16_wgmma_kernel");
  };
  if (p.tile_tokens == 128)
    return p.gated ? run(moe_bf16_wgmma_kernel<true, 2>, 2) : run(moe_bf16_wgmma_kernel<false, 2>, 2);
  return p.gated ? run(moe_bf16_wgmma_kernel<true, 1>, 1) : run(moe_bf16_wgmma_kernel<false, 1>, 1);
}

}  // namespace mx::cuda
