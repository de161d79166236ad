// bf16 GeGLU experts for many tokens per expert (prefill) on Hopper (sm_90a): moe_bf16_grouped.cu's GEMMs
// (same routing tiles, inputs, outputs and epilogues) on wgmma, both operands read by the tensor cores from
// shared memory, so no warp spends issue slots on ldmatrix or on one mma.sync per 16 x 8 x 16.
//
// A CTA: one routing tile of 64 or 128 expert-sorted tokens (wgmma's M: a warpgroup per 64, each skipping
// its MMAs when the tile has no token of its 64) x kBN weight rows (N, shared by the warpgroups; 128, and with
// 128-token tiles also 176 or 256), k in tiles of 64 through a kStages-stage cp.async ring (4 by default),
// both operands stored as wgmma's K-major 128-byte-swizzled image (16-byte chunk c of row n at chunk
// c ^ (n % 8)). Copies of k tile kt + kStages - 2 go out while tile kt multiplies (one wgmma group in flight:
// tile kt - 1's MMAs may still read their stage, tile kt - 2's are done, so its stage is refilled). 64-token
// tiles: two CTAs fit an SM (97 KB each), so one's copies overlap the other's MMAs; 128-token tiles (129 KB at
// 128 rows and 4 stages) read each weight tile once for twice the tokens; wider weight tiles read each token
// tile once for more rows (fewer bytes from L2 per MMA).
// The first GEMM's kBN rows are the gate rows of kBN / 2 channels, then the same channels' up rows: a lane's
// accumulator columns j and j + kBN / 2 are gate and up of one (token, channel), and the GeGLU runs on them
// (176 rows: 88 channels, 704 = 8 x 88).
// The second GEMM's epilogue multiplies by the slot's routing weight. Tokens past the tile's rows, weight
// rows past the matrix and k past its end are zero-filled by the copies (src size 0). Tiles past the
// device-side count exit (graph-safe grid).
//
// Numerics: fp32 sums over k in wgmma's order (not moe_bf16_grouped.cu's bits); a token's row depends on its
// own inputs only.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_bf16_wgmma.cuh"
#include "backend/cuda/kernels/moe_route_tile.cuh"

namespace mx::cuda {
namespace {

constexpr int kBK = kMoeBf16WgmmaK, kWarpgroupTokens = kMoeBf16WgmmaWarpgroupTokens;
constexpr int kWarpgroupATileBytes = kWarpgroupTokens * kBK * 2;  // a warpgroup's 64 tokens
constexpr int stage_bytes(int warpgroups, int rows) { return warpgroups * kWarpgroupATileBytes + rows * kBK * 2; }
constexpr size_t smem_bytes(int warpgroups, int rows, int stages) {
  return static_cast<size_t>(stages) * stage_bytes(warpgroups, rows) + 1024;  // + the 1024-byte alignment
}

template <bool kGated, int kWarpgroups, int kBN, int kStages>
__global__ void __launch_bounds__(128 * kWarpgroups) moe_bf16_wgmma_kernel(MoeBf16GemmParams p) {
#if MX_SM90A
  constexpr int kBM = kWarpgroups * kWarpgroupTokens, kThreads = 128 * kWarpgroups;
  constexpr int kATileBytes = kWarpgroups * kWarpgroupATileBytes, kStageBytes = stage_bytes(kWarpgroups, kBN);
  static_assert(kBN % 16 == 0 && kBN <= 256 && kStages >= 3, "wgmma n, the gate/up halves in 8-column groups");
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
    for (int j = 0; j < (kBN + kThreads / 8 - 1) / (kThreads / 8); ++j) {
      const int row = row0 + (kThreads / 8) * j;
      if (kBN % (kThreads / 8) != 0 && row >= kBN) break;  // 176 rows over 32 a pass: the last pass half
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

  moe_bf16_wgmma_store<kGated, kBN>(p, acc, start, n, col0, warp, r, q);
#endif
}

// The warp-specialized, persistent form (MoeBf16GemmParams::wgmma_ws; 128-token tiles): warpgroup 0 copies, the
// other two multiply. Each CTA walks the (tile, weight tile) items item = blockIdx.x + i gridDim.x (weight tile
// fastest, as the grid's x above) through one ring of kStages k tiles: the copying warpgroup's threads issue
// their cp.async of a stage (the same chunks and swizzle as the form above), arrive on its `full` barrier when
// they land (cp.async.mbarrier.arrive) and run on into the next item while the multiplying warpgroups finish one,
// so an item's epilogue overlaps the next one's first copies. A multiplying warp arrives on the stage's `empty`
// barrier once its MMAs of the stage are done (one wgmma group in flight). The same MMAs in the same k order as
// the form above: the same bits.
template <bool kGated, int kBN, int kStages>
__global__ void __launch_bounds__(384, 1) moe_bf16_wgmma_ws_kernel(MoeBf16GemmParams p) {
#if MX_SM90A
  constexpr int kBM = 2 * kWarpgroupTokens;
  constexpr int kATileBytes = 2 * kWarpgroupATileBytes, kStageBytes = stage_bytes(2, kBN);
  static_assert(kBN % 16 == 0 && kBN <= 256 && kStages >= 2, "wgmma n, the gate/up halves in 8-column groups");
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t bars[2 * kStages];  // full[s], then empty[s]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
  const uint32_t full0 = smem_addr(&bars[0]), empty0 = smem_addr(&bars[kStages]);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full0 + 8 * s, 128);  // each copying thread's cp.async arrival
      mbarrier_init(empty0 + 8 * s, 8);   // each multiplying warp, once its MMAs left the stage
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  pdl_wait();  // ids, metadata and activations come from earlier kernels
  pdl_launch_dependents();
  const int64_t cols = kGated ? (p.out_rows + kBN / 2 - 1) / (kBN / 2) : (p.out_rows + kBN - 1) / kBN;
  const int64_t items = static_cast<int64_t>(*p.r.num_tiles) * cols;
  const int64_t rows_total = kGated ? 2 * p.out_rows : p.out_rows;
  const int n_k = static_cast<int>((p.k + kBK - 1) / kBK);
  uint8_t* ring = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // the swizzle's 1024-byte period

  if (wg == 0) {
    // Thread tid copies 16-byte chunk tid % 8 of rows tid / 8 + 16 j of both tiles: the same swizzled chunk in
    // every row.
    constexpr int kAPasses = kBM / 16, kBPasses = kBN / 16;
    const int chunk = tid % 8, row0 = tid / 8, placed = (chunk ^ (row0 % 8)) * 16;
    int slot = 0;
    uint32_t parity = 1;  // a fresh ring is empty
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
      const int tile = static_cast<int>(item / cols);
      const int64_t col0 = (item % cols) * (kGated ? kBN / 2 : kBN);
      const int e = p.r.tile_expert[tile], start = p.r.tile_start[tile], n = p.r.tile_rows[tile];
      int src[kAPasses];
      int64_t wr[kBPasses];
#pragma unroll
      for (int j = 0; j < kAPasses; ++j) {
        const int row = row0 + 16 * j;
        src[j] = row >= n ? -1 : kGated ? p.r.sorted_slots[start + row] / static_cast<int>(p.top_k) : start + row;
      }
#pragma unroll
      for (int j = 0; j < kBPasses; ++j) {
        const int i = row0 + 16 * j;
        const int64_t ch = col0 + (kGated ? i % (kBN / 2) : i);
        const int64_t row = kGated && i >= kBN / 2 ? p.out_rows + ch : ch;  // gate rows, then up rows
        wr[j] = ch < p.out_rows ? e * rows_total + row : -1;
      }
      for (int kt = 0; kt < n_k; ++kt) {
        mbarrier_wait(empty0 + 8 * slot, parity);
        uint8_t* a = ring + slot * kStageBytes;
        uint8_t* b = a + kATileBytes;
        const int64_t k0 = static_cast<int64_t>(kt) * kBK + chunk * 8;
        const bool k_ok = k0 < p.k;
#pragma unroll
        for (int j = 0; j < kAPasses; ++j) {
          const bool ok = src[j] >= 0 && k_ok;
          cp_async_16(a + (row0 + 16 * j) * 128 + placed, ok ? p.in + src[j] * p.k + k0 : p.in, ok);
        }
#pragma unroll
        for (int j = 0; j < kBPasses; ++j) {
          const bool ok = wr[j] >= 0 && k_ok;
          cp_async_16(b + (row0 + 16 * j) * 128 + placed, ok ? p.w + wr[j] * p.k + k0 : p.w, ok);
        }
        cp_async_mbarrier_arrive(full0 + 8 * slot);
        if (++slot == kStages) {
          slot = 0;
          parity ^= 1;
        }
      }
    }
    cp_async_wait<0>();  // no thread leaves with copies in flight
    return;
  }

  const int cw = wg - 1, mwarp = warp - 4, r = lane / 4, q = lane % 4;  // mwarp: 0 .. 7, 16 tokens each
  int slot = 0;
  uint32_t parity = 0;
  float acc[kBN / 2];
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int tile = static_cast<int>(item / cols);
    const int64_t col0 = (item % cols) * (kGated ? kBN / 2 : kBN);
    const int start = p.r.tile_start[tile], n = p.r.tile_rows[tile];
    const bool busy = cw * kWarpgroupTokens < n;  // this warpgroup's 64 tokens hold some of the tile's
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
    wgmma_fence_regs(acc);
    int prev = -1;
    for (int kt = 0; kt < n_k; ++kt) {
      mbarrier_wait(full0 + 8 * slot, parity);
      fence_proxy_async_smem();  // the landed copies, seen through the barrier, made visible to wgmma's reads
      if (busy) {
        const uint32_t a = smem_addr(ring + slot * kStageBytes);
        const uint64_t desc_a = wgmma_desc_k128(a + cw * kWarpgroupATileBytes);
        const uint64_t desc_b = wgmma_desc_k128(a + kATileBytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) wgmma_bf16_ss<kBN, true>(acc, desc_a + 2 * kk, desc_b + 2 * kk);  // +32 B
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's MMAs are done
      }
      if (prev >= 0 && lane == 0) mbarrier_arrive(empty0 + 8 * prev);
      prev = slot;
      if (++slot == kStages) {
        slot = 0;
        parity ^= 1;
      }
    }
    wgmma_wait<0>();
    wgmma_fence_regs(acc);
    if (prev >= 0 && lane == 0) mbarrier_arrive(empty0 + 8 * prev);
    moe_bf16_wgmma_store<kGated, kBN>(p, acc, start, n, col0, mwarp, r, q);
  }
#endif
}

}  // namespace

Status launch_moe_bf16_wgmma_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  if (p.out_rows % 2 != 0) return internal_error("bf16 wgmma experts: even output rows expected");
  if (p.tile_tokens != 64 && p.tile_tokens != 128)
    return internal_error("bf16 wgmma experts: routing tiles of 64 or 128 tokens expected");
  const int rows = p.wgmma_rows != 0 ? p.wgmma_rows : kMoeBf16WgmmaRows, stages = p.wgmma_stages != 0 ? p.wgmma_stages : 4;
  const int64_t cols = p.gated ? ceil_div64(p.out_rows, rows / 2) : ceil_div64(p.out_rows, rows);
  const dim3 grid(static_cast<unsigned>(cols), static_cast<unsigned>(p.max_tiles));
  auto run = [&](auto kernel, int warpgroups) -> Status {
    const size_t smem = smem_bytes(warpgroups, rows, stages);
    MX_RETURN_IF_ERROR(
        cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                    "cudaFuncSetAttribute(moe bf16 wgmma smem)"));
    return cuda_status(launch_pdl(kernel, grid, dim3(128 * warpgroups), smem, stream, p), "moe_bf16_wgmma_kernel");
  };
  if (p.tile_tokens == 64) {
    if (rows != 128 || stages != 4) return internal_error("bf16 wgmma experts: 64-token tiles take 128 rows, 4 stages");
    return p.gated ? run(moe_bf16_wgmma_kernel<true, 1, 128, 4>, 1) : run(moe_bf16_wgmma_kernel<false, 1, 128, 4>, 1);
  }
  // 128-token tiles: the (rows, stages) forms instanced (moe_bf16_wgmma_form_ok).
  if (!moe_bf16_wgmma_form_ok(p.gated, rows, stages, p.wgmma_ws))
    return internal_error("bf16 wgmma experts: no kernel of this many rows and stages");
  if (p.wgmma_ws) {
    // Persistent: at most one CTA per SM (one fits), graph-safe (the items are counted on the device).
    const int64_t items = p.max_tiles * cols;
    const dim3 ws_grid(static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(items, p.sms > 0 ? p.sms : 132))));
    auto run_ws = [&](auto kernel) -> Status {
      const size_t smem = smem_bytes(2, rows, stages);
      MX_RETURN_IF_ERROR(cuda_status(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "cudaFuncSetAttribute(moe bf16 wgmma ws smem)"));
      return cuda_status(launch_pdl(kernel, ws_grid, dim3(384), smem, stream, p), "moe_bf16_wgmma_ws_kernel");
    };
    if (p.gated) {
      if (rows == 176) return run_ws(moe_bf16_wgmma_ws_kernel<true, 176, 5>);
      return run_ws(moe_bf16_wgmma_ws_kernel<true, 128, 6>);
    }
    if (rows == 256) return run_ws(moe_bf16_wgmma_ws_kernel<false, 256, 4>);
    return run_ws(moe_bf16_wgmma_ws_kernel<false, 128, 6>);
  }
  if (p.gated) {
    if (rows == 176) return run(moe_bf16_wgmma_kernel<true, 2, 176, 5>, 2);
    if (rows == 256) return run(moe_bf16_wgmma_kernel<true, 2, 256, 4>, 2);
    return stages == 6 ? run(moe_bf16_wgmma_kernel<true, 2, 128, 6>, 2) : run(moe_bf16_wgmma_kernel<true, 2, 128, 4>, 2);
  }
  if (rows == 256) return run(moe_bf16_wgmma_kernel<false, 2, 256, 4>, 2);
  return stages == 3   ? run(moe_bf16_wgmma_kernel<false, 2, 128, 3>, 2)
         : stages == 6 ? run(moe_bf16_wgmma_kernel<false, 2, 128, 6>, 2)
                       : run(moe_bf16_wgmma_kernel<false, 2, 128, 4>, 2);
}

bool moe_bf16_wgmma_form_ok(bool gated, int rows, int stages, bool ws) {
  if (ws) return (rows == 128 && stages == 6) || (gated && rows == 176 && stages == 5) || (!gated && rows == 256 && stages == 4);
  if (rows == 128) return stages == 4 || stages == 6 || (!gated && stages == 3);
  if (rows == 176) return gated && stages == 5;
  return rows == 256 && stages == 4;
}

}  // namespace mx::cuda
