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
// refills a slot after the CTA barrier that ends its use and a proxy fence (fence_ring_refill). The second GEMM (k
// 704: 3 stages of 256 per tile) runs several tiles per CTA where there are many (fewer, longer CTAs; a ring no
// longer than the stages leaves more of them resident): from 8 tokens 1-2% faster on an H200 with 3; at one
// token (8 tiles) one tile per CTA, as fast as two (CudaBf16ExpertsOptions).
// Warp w multiplies chunk w (64 wide) of each block, in k order; the warps' partials are summed in warp order
// at the end (a split fixed by k: batch-independent, like the register kernel's; the same bits at every stage
// width). Rows of a slot are padded by 16 bytes (528 bytes a row at 256 k) so that a quarter warp's 16-byte
// reads of 2 rows x 4 k groups hit 8 different bank groups.
// Rows past the matrix are not copied (their stale results are never stored); k past the matrix in the last
// stage is zeroed in registers, since the slot holds an earlier stage's bytes there.
// The second GEMM issues its first stages before waiting for h (PDL): weights do not depend on earlier
// kernels, and the routing it reads precedes the first GEMM.
//
// Tensor boxes (MoeBf16GemmParams::bulk_tensor_boxes, k % 64 == 0): a stage is one TMA copy instead of a copy
// per row. The weights are seen as a rank-5 tensor (64 k, rows of a half, gate|up half, expert, 64-wide k chunk),
// so one box holds the strip's 16 rows (gated: 8 gate rows, then the same channels' 8 up rows) for each of the
// stage's chunks: chunk-major lines of 128 bytes, line c * 16 + row, with the 128-byte swizzle (the 16-byte unit
// u of line n at u ^ n % 8). A quarter warp's units (2q + h) ^ r then fall in 8 different bank groups, as the
// padded rows do. Rows and chunks past the tensor read as zero; a CTA's copies per call drop from 16 a stage to
// one. The default where k % 64 == 0 (CudaBf16ExpertsOptions::bulk_copy_form): H200, one token, stages 512/256,
// 32.36 -> 31.22 us per call; Gemma-4 batch-1 TPOT 3.156 -> 3.053 ms (docs/PERF.md).
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

// Tensor boxes (moe_bf16_decode.cuh): a slot is the box, 16 unpadded rows of the stage's k (box_stage_bytes, a
// multiple of 1024 bytes, the swizzle's period); the ring takes as many slots as the padded rows' (the same bytes,
// less the padding).

template <bool kGated, int kBlocks, bool kBoxes>
__device__ __forceinline__ void bulk_gemm(const MoeBf16GemmParams& p, const CUtensorMap* map) {
  constexpr int64_t kStageWidth = static_cast<int64_t>(kStageK) * kBlocks;
  constexpr int64_t kPitch = row_pitch(kBlocks), kSlot = kBoxes ? box_stage_bytes(kBlocks) : slot_bytes(kBlocks);
  extern __shared__ __align__(128) uint8_t smem_raw[];
  // The swizzle repeats every 1024 bytes: boxes start on that boundary (the launch adds 1 KB).
  uint8_t* const ring = kBoxes ? smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023) : smem_raw;
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
    if constexpr (kBoxes) tma_prefetch_map(map);
    for (int i = 0; i < slots; ++i) {
      mbarrier_init(full0 + 8 * i, 1);
      mbarrier_init_fence();
    }
  }
  __syncthreads();

  // Warp 0 issues stage c: lane 0 announces the bytes, then lane i < 16 copies slot row i (gated: gate rows of
  // channels 8 strip + i, then the same channels' up rows); tensor boxes: lane 0 copies the stage's box.
  const int64_t rows_left = p.out_rows - (kGated ? 8 : 16) * strip;
  const int valid_rows = static_cast<int>(kGated ? 2 * (rows_left < 8 ? rows_left : 8) : (rows_left < 16 ? rows_left : 16));
  auto issue = [&](int64_t c) {
    const int64_t k0 = c % n_stages * kStageWidth;
    int e = expert[0];
#pragma unroll
    for (int j = 1; j < kMaxTilesPerCta; ++j) e = c / n_stages == j ? expert[j] : e;
    const uint32_t bytes = static_cast<uint32_t>(2 * (p.k - k0 < kStageWidth ? p.k - k0 : kStageWidth));
    const uint32_t bar = full0 + 8 * static_cast<uint32_t>(c % slots);
    if (c >= slots) fence_ring_refill();
    if constexpr (kBoxes) {  // one box: (k 0, the strip's first row, gate half, expert e, the stage's first chunk)
      if (lane == 0) {
        mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(kSlot));
        const uint32_t dst = ring0 + static_cast<uint32_t>((c % slots) * kSlot);
        tma_load_5d(dst, map, 0, static_cast<int>((kGated ? 8 : 16) * strip), 0, e, static_cast<int>(k0 / 64), bar);
      }
      return;
    }
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
        if constexpr (kBoxes) {  // chunk 4 b + w
          uint4 a[4];
          box_fragment(ring + slot * kSlot + (b * kWarps + warp) * kRows * kBoxLineBytes, r, q, in0[b], in1[b], a);
          chunk_mma(acc, a, x0[b], x1[b]);
        } else {
          const uint4 zero = make_uint4(0, 0, 0, 0);
          const uint8_t* base = ring + slot * kSlot + (b * kStageK + 64 * warp + 16 * q) * 2;
          const uint4 a[4] = {in0[b] ? *reinterpret_cast<const uint4*>(base + r * kPitch) : zero,
                              in1[b] ? *reinterpret_cast<const uint4*>(base + r * kPitch + 16) : zero,
                              in0[b] ? *reinterpret_cast<const uint4*>(base + (r + 8) * kPitch) : zero,
                              in1[b] ? *reinterpret_cast<const uint4*>(base + (r + 8) * kPitch + 16) : zero};
          chunk_mma(acc, a, x0[b], x1[b]);
        }
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
  bulk_gemm<kGated, 1, false>(p, nullptr);
}
// Wide stages: registers for as many CTAs per SM as one-block stages get (first GEMM 6, shared memory; second 7,
// registers), where one wave holds the whole grid at one token.
template <bool kGated, int kBlocks>
__global__ void __launch_bounds__(kThreads, kGated ? 6 : 7) moe_bf16_bulk_wide_kernel(MoeBf16GemmParams p) {
  bulk_gemm<kGated, kBlocks, false>(p, nullptr);
}
// Tensor boxes, every stage width (the same registers' bound as the wide stages).
template <bool kGated, int kBlocks>
__global__ void __launch_bounds__(kThreads, kGated ? 6 : 7)
    moe_bf16_bulk_box_kernel(MoeBf16GemmParams p, const __grid_constant__ CUtensorMap map) {
  bulk_gemm<kGated, kBlocks, true>(p, &map);
}

}  // namespace

// The weights as the boxes read them (moe_bf16_decode.cuh): (k inner 64, rows of a half, 2 halves gated, experts,
// k / 64 chunks), a box of (64, 8 gated or 16, 2 or 1, 1, 4 blocks) with the 128-byte swizzle.
Status moe_bf16::encode_box_map(const MoeBf16GemmParams& p, int blocks, CUtensorMap* map) {
  constexpr int kRank = 5;
  const int64_t half_rows = p.out_rows, halves = p.gated ? 2 : 1, row_bytes = 2 * p.k;
  const uint64_t dims[kRank] = {64, static_cast<uint64_t>(half_rows), static_cast<uint64_t>(halves),
                                static_cast<uint64_t>(p.weight_experts), static_cast<uint64_t>(p.k / 64)};
  const uint64_t strides[kRank - 1] = {static_cast<uint64_t>(row_bytes), static_cast<uint64_t>(half_rows * row_bytes),
                                       static_cast<uint64_t>(halves * half_rows * row_bytes), kBoxLineBytes};
  const uint32_t box[kRank] = {64, static_cast<uint32_t>(p.gated ? 8 : 16), static_cast<uint32_t>(halves), 1,
                               static_cast<uint32_t>(4 * blocks)};
  return encode_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, kRank, p.w, dims, strides, box,
                           CU_TENSOR_MAP_SWIZZLE_128B);
}

bool moe_bf16_bulk_boxes_fit(const MoeBf16GemmParams& p) { return p.k % 64 == 0 && p.weight_experts > 0; }

Status launch_moe_bf16_bulk_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  if (p.tiles_per_cta < 1 || p.tiles_per_cta > kMaxTilesPerCta)
    return invalid_argument("moe_bf16_bulk: 1 to " + std::to_string(kMaxTilesPerCta) + " tiles per CTA");
  const int64_t strips = p.gated ? cdiv(p.out_rows, 8) : cdiv(p.out_rows, 16);
  const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(cdiv(p.max_tiles, p.tiles_per_cta)));
  const int blocks = p.bulk_stage_k == 0 ? 1 : static_cast<int>(p.bulk_stage_k / kStageK);
  if (blocks < 1 || blocks > 3 || (p.bulk_stage_k != 0 && p.bulk_stage_k % kStageK != 0))
    return invalid_argument("moe_bf16_bulk: stages of 256, 512 or 768 k");
  // Ring slots for a CTA's stages: the most any CTA runs (tiles_per_cta full tiles).
  const int64_t stages = p.tiles_per_cta * cdiv(p.k, kStageK * blocks);
  if (p.bulk_tensor_boxes) {
    if (!moe_bf16_bulk_boxes_fit(p))
      return invalid_argument("moe_bf16_bulk: tensor boxes need k % 64 == 0 and the weights' expert count");
    CUtensorMap map;
    MX_RETURN_IF_ERROR(encode_box_map(p, blocks, &map));
    auto kernel = blocks == 3   ? (p.gated ? moe_bf16_bulk_box_kernel<true, 3> : moe_bf16_bulk_box_kernel<false, 3>)
                  : blocks == 2 ? (p.gated ? moe_bf16_bulk_box_kernel<true, 2> : moe_bf16_bulk_box_kernel<false, 2>)
                                : (p.gated ? moe_bf16_bulk_box_kernel<true, 1> : moe_bf16_bulk_box_kernel<false, 1>);
    const size_t smem = static_cast<size_t>(ring_slots(stages, blocks) * box_stage_bytes(blocks) + 1024);  // <= 33 KB
    return cuda_status(launch_pdl(kernel, grid, dim3(kThreads), smem, stream, p, map), "moe_bf16_bulk_box_kernel");
  }
  auto kernel = blocks == 3   ? (p.gated ? moe_bf16_bulk_wide_kernel<true, 3> : moe_bf16_bulk_wide_kernel<false, 3>)
                : blocks == 2 ? (p.gated ? moe_bf16_bulk_wide_kernel<true, 2> : moe_bf16_bulk_wide_kernel<false, 2>)
                              : (p.gated ? moe_bf16_bulk_kernel<true> : moe_bf16_bulk_kernel<false>);
  const size_t smem = static_cast<size_t>(ring_slots(stages, blocks) * slot_bytes(blocks));
  return cuda_status(launch_pdl(kernel, grid, dim3(kThreads), smem, stream, p), "moe_bf16_bulk_kernel");
}

}  // namespace mx::cuda
