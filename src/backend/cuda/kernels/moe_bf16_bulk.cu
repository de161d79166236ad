// bf16 GeGLU experts at decode with the weights brought in by the copy engine (sm_90+): the same work split,
// fragment order and epilogue as moe_bf16.cu (moe_bf16_decode.cuh), but a strip's 16 weight rows reach
// shared memory through cp.async.bulk copies (one per row and stage) that complete on an mbarrier, instead
// of 16-byte register loads through the LSU. The register-load kernel keeps only 4 chunks in flight per
// warp and measured ~2.0-2.1 TB/s on an H100 at one token (docs/PERF.md), and deeper register rings were
// slower in the MXFP4 kernels (the L1TEX miss path saturating was the suspect); a bulk copy is one
// instruction per 512 bytes and keeps a whole ring of stages in flight per CTA.
//
// A CTA: 4 warps, a 16-row strip and MoeBf16GemmParams::tiles_per_cta 8-token tiles in turn. k goes in
// stages of MoeBf16GemmParams::bulk_stage_k: 256, 512 or 768 (one to three 256-wide blocks; by default 512 in
// the first GEMM where the experts route themselves, <= 32 slots, else 256, and 256 in the second:
// CudaBf16ExpertsOptions). The ring holds the same bytes at every width (4 slots of one block, 2 of two, 1 of
// three; ring_slots), the tiles' stages one after the other; stage c sits in slot c % slots, and thread 0
// refills a slot after the CTA barrier that ends its use. The second GEMM (k 704: 3 stages of 256 per tile)
// runs several tiles per CTA where there are many (fewer, longer CTAs; a ring no longer than the stages leaves
// more of them resident): from 8 tokens 1-2% faster on an H200 with 3; at one token (8 tiles) one tile per
// CTA, as fast as two (CudaBf16ExpertsOptions).
// Warp w multiplies chunk w (64 wide) of each block, in k order; the warps' partials are summed in warp order
// at the end (a split fixed by k: batch-independent, like the register kernel's; the same bits at every stage
// width). Rows of a slot are padded by 16 bytes (528 bytes a row at 256 k) so that a quarter warp's 16-byte
// reads of 2 rows x 4 k groups hit 8 different bank groups.
// Rows past the matrix are not copied (their stale results are never stored); k past the matrix in the last
// stage is zeroed in registers, since the slot holds an earlier stage's bytes there.
// The second GEMM issues its first stages before waiting for h (PDL): weights do not depend on earlier
// kernels, and the routing it reads precedes the first GEMM.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_bf16_decode.cuh"

namespace mx::cuda {
namespace {

using namespace moe_bf16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;
constexpr int kStageK = 64 * kWarps;               // k per stage: a 64-wide chunk per warp
constexpr int kStages = 4;                         // slots in the ring
constexpr int kRowPitch = kStageK * 2 + 16;        // bytes per row of a slot (padded: see the top)
constexpr int kSlotBytes = kRows * kRowPitch;

constexpr int kMaxTilesPerCta = 4;

// Wide stages (MoeBf16GemmParams::bulk_stage_k): kBlocks of the kStageK-wide blocks per stage, a copy per row and
// stage, in a ring of the same bytes (4 slots of one block, 2 of two, 1 of three); each warp still multiplies
// chunk w of every block in k order, so the sums and bits are the one-block kernel's.
__host__ __device__ constexpr int64_t row_pitch(int blocks) { return 2 * kStageK * blocks + 16; }
__host__ __device__ constexpr int64_t slot_bytes(int blocks) { return kRows * row_pitch(blocks); }
__host__ __device__ constexpr int max_slots(int blocks) {
  return kStages * kSlotBytes / slot_bytes(blocks) > 1 ? static_cast<int>(kStages * kSlotBytes / slot_bytes(blocks)) : 1;
}

// The ring's slots for a CTA's `stages`: every stage in flight at once where there are no more than max_slots.
__host__ __device__ constexpr int ring_slots(int64_t stages, int blocks = 1) {
  return stages < max_slots(blocks) ? static_cast<int>(stages) : max_slots(blocks);
}

template <bool kGated, int kBlocks>
__device__ __forceinline__ void bulk_gemm(const MoeBf16GemmParams& p) {
  constexpr int64_t kStageWidth = static_cast<int64_t>(kStageK) * kBlocks, kPitch = row_pitch(kBlocks);
  constexpr int64_t kSlot = slot_bytes(kBlocks);
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ float red[kWarps - 1][4][32];
  const int tile0 = blockIdx.y * p.tiles_per_cta;
  // With the routing ready the first GEMM routes itself and starts its copies before the PDL wait (below).
  const bool early = kGated && p.routing_ready && p.topk_ids;
  const TileRoute rt0 = early ? tile_route(p, tile0) : begin_tile<kGated>(p, tile0);
  if (tile0 >= rt0.tiles) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, q = lane % 4;
  const int64_t strip = blockIdx.x;
  const int64_t rows_total = kGated ? 2 * p.out_rows : p.out_rows;
  const StripRows s = strip_rows<kGated>(p, strip, r);
  // The CTA's tiles run in turn through one ring: stage c is k stage c % n_stages of tile c / n_stages.
  const int n_tiles = rt0.tiles - tile0 < p.tiles_per_cta ? rt0.tiles - tile0 : p.tiles_per_cta;
  int expert[kMaxTilesPerCta];
#pragma unroll
  for (int j = 0; j < kMaxTilesPerCta; ++j)
    expert[j] = j == 0 ? rt0.expert : j < n_tiles ? tile_route(p, tile0 + j).expert : 0;
  const int64_t n_stages = cdiv(p.k, kStageWidth), total = n_tiles * n_stages, n_blocks = cdiv(p.k, kStageK);
  const int slots = ring_slots(total, kBlocks);
  const uint32_t ring0 = smem_addr(ring), full0 = smem_addr(full);

  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) {
      mbarrier_init(full0 + 8 * i, 1);
      mbarrier_init_fence();
    }
  }
  __syncthreads();

  // Warp 0 issues stage c: lane 0 announces the bytes, then lane i < 16 copies slot row i (gated: gate
  // rows of channels 8 strip + i, then the same channels' up rows).
  const int64_t rows_left = p.out_rows - (kGated ? 8 : 16) * strip;
  const int valid_rows = static_cast<int>(kGated ? 2 * (rows_left < 8 ? rows_left : 8) : (rows_left < 16 ? rows_left : 16));
  auto issue = [&](int64_t c) {
    const int64_t k0 = c % n_stages * kStageWidth;
    int e = expert[0];
#pragma unroll
    for (int j = 1; j < kMaxTilesPerCta; ++j) e = c / n_stages == j ? expert[j] : e;
    const uint32_t bytes = static_cast<uint32_t>(2 * (p.k - k0 < kStageWidth ? p.k - k0 : kStageWidth));
    const uint32_t bar = full0 + 8 * static_cast<uint32_t>(c % slots);
    if (lane == 0) mbarrier_arrive_expect_tx(bar, bytes * valid_rows);
    __syncwarp();
    const int i = lane;
    const bool row_ok = kGated ? i < 16 && i % 8 < valid_rows / 2 : i < valid_rows;
    if (row_ok) {
      const int64_t row = kGated ? (i < 8 ? 8 * strip + i : p.out_rows + 8 * strip + i - 8) : 16 * strip + i;
      const uint32_t dst = ring0 + static_cast<uint32_t>((c % slots) * kSlot + i * kPitch);
      bulk_copy(dst, p.w + (e * rows_total + row) * p.k + k0, bytes, bar);
    }
  };
  if (warp == 0) {
    for (int64_t c = 0; c < slots; ++c) issue(c);  // constant: in flight before waiting for h
  }
  if constexpr (kGated) {
    if (early) {  // x may come from the previous kernel; a dependent may rely on what came before it
      pdl_wait();
      pdl_launch_dependents();
    }
  } else {
    pdl_wait();
    // The layer's end (gemma_layer_end) may launch now and read its constants and the residual while the
    // experts run; it waits for this grid before it reads the combined output.
    pdl_launch_dependents();
  }

  for (int j = 0; j < n_tiles; ++j) {
    const TileRoute rt = j == 0 ? rt0 : tile_route(p, tile0 + j);
    bool x_ok;
    const uint16_t* x_row = token_row<kGated>(p, rt, r, q, x_ok);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t ks = 0; ks < n_stages; ++ks) {
      const int64_t c = j * n_stages + ks;
      bool in0[kBlocks], in1[kBlocks];
      uint4 x0[kBlocks], x1[kBlocks];
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {  // blocks past the last of k do not exist (no mma, as in one-block stages)
        const int64_t off = ks * kStageWidth + b * kStageK + 64 * warp, k0 = off + 16 * q;  // this warp's chunk
        const bool block_ok = ks * kBlocks + b < n_blocks;
        in0[b] = block_ok && k0 < p.k, in1[b] = block_ok && k0 + 8 < p.k;
        x0[b] = load16_act<kGated>(x_row + off, x_ok && in0[b]);  // issued before the wait
        x1[b] = load16_act<kGated>(x_row + off + 8, x_ok && in1[b]);
      }
      const uint32_t slot = static_cast<uint32_t>(c % slots);
      while (!mbarrier_try_wait(full0 + 8 * slot, static_cast<uint32_t>(c / slots) & 1u)) {
      }
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        if (ks * kBlocks + b >= n_blocks) break;
        const uint8_t* base = ring + slot * kSlot + (b * kStageK + 64 * warp + 16 * q) * 2;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        const uint4 a[4] = {in0[b] ? *reinterpret_cast<const uint4*>(base + r * kPitch) : zero,
                            in1[b] ? *reinterpret_cast<const uint4*>(base + r * kPitch + 16) : zero,
                            in0[b] ? *reinterpret_cast<const uint4*>(base + (r + 8) * kPitch) : zero,
                            in1[b] ? *reinterpret_cast<const uint4*>(base + (r + 8) * kPitch + 16) : zero};
        chunk_mma(acc, a, x0[b], x1[b]);
      }
      __syncthreads();  // every warp is done with this slot
      if (warp == 0 && c + slots < total) issue(c + slots);
    }
    // Sum the warps' partials in warp order; the barrier after the store frees `red` for the next tile.
    if (warp > 0) {
#pragma unroll
      for (int c = 0; c < 4; ++c) red[warp - 1][c][lane] = acc[c];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int w = 0; w < kWarps - 1; ++w)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[c] += red[w][c][lane];
      store_strip<kGated>(p, rt, s, strip, acc);
    }
    if (j + 1 < n_tiles) __syncthreads();
  }
}

template <bool kGated>
__global__ void __launch_bounds__(kThreads) moe_bf16_bulk_kernel(MoeBf16GemmParams p) {
  bulk_gemm<kGated, 1>(p);
}
// Wide stages: registers for as many CTAs per SM as one-block stages get (first GEMM 6, shared memory; second 7,
// registers), where one wave holds the whole grid at one token.
template <bool kGated, int kBlocks>
__global__ void __launch_bounds__(kThreads, kGated ? 6 : 7) moe_bf16_bulk_wide_kernel(MoeBf16GemmParams p) {
  bulk_gemm<kGated, kBlocks>(p);
}

}  // namespace

Status launch_moe_bf16_bulk_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  if (p.tiles_per_cta < 1 || p.tiles_per_cta > kMaxTilesPerCta)
    return invalid_argument("moe_bf16_bulk: 1 to " + std::to_string(kMaxTilesPerCta) + " tiles per CTA");
  const int64_t strips = p.gated ? cdiv(p.out_rows, 8) : cdiv(p.out_rows, 16);
  const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(cdiv(p.max_tiles, p.tiles_per_cta)));
  const int blocks = p.bulk_stage_k == 0 ? 1 : static_cast<int>(p.bulk_stage_k / kStageK);
  if (blocks < 1 || blocks > 3 || (p.bulk_stage_k != 0 && p.bulk_stage_k % kStageK != 0))
    return invalid_argument("moe_bf16_bulk: stages of 256, 512 or 768 k");
  auto kernel = blocks == 3   ? (p.gated ? moe_bf16_bulk_wide_kernel<true, 3> : moe_bf16_bulk_wide_kernel<false, 3>)
                : blocks == 2 ? (p.gated ? moe_bf16_bulk_wide_kernel<true, 2> : moe_bf16_bulk_wide_kernel<false, 2>)
                              : (p.gated ? moe_bf16_bulk_kernel<true> : moe_bf16_bulk_kernel<false>);
  // Ring slots for a CTA's stages: the most any CTA runs (tiles_per_cta full tiles).
  const int64_t stages = p.tiles_per_cta * cdiv(p.k, kStageK * blocks);
  const size_t smem = static_cast<size_t>(ring_slots(stages, blocks) * slot_bytes(blocks));
  return cuda_status(launch_pdl(kernel, grid, dim3(kThreads), smem, stream, p), "moe_bf16_bulk_kernel");
}

}  // namespace mx::cuda
