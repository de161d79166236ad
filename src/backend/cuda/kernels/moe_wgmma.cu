// MXFP4 experts for many tokens per expert on Hopper (sm_90a): the grouped GEMM on warpgroup MMA.
//
// Swap AB as at decode: the weights are the MMA's M side, straight from the swap-AB layout (expert_repack.h),
// whose per-lane 16 bytes per 16-row strip and 64-k tile are exactly the A register fragments of four
// m64nNk16 steps for one warp once decoded (mxfp4_dequant_step): no shared-memory staging of bf16 weights.
// The expert-sorted tokens are the N side (a routing tile of kN = 96, 128 or 256 tokens), in shared memory
// as wgmma's K-major B operand with the 128-byte swizzle. A CTA is kWG = 2 warpgroups (three and four measured
// no faster and are not compiled, docs/PERF.md; 256-token tiles' 128 accumulators a thread allow one CTA per
// SM, smaller tiles two), each 64 weight rows (warp w of the CTA owns strip strip0 + w), sharing the B tile;
// k goes in tiles of 64 through a cp.async ring of kMoeWgmmaStages stages (activation rows, packed fp4 and
// scales of the CTA's rows), with two wgmma groups in flight so that a tile's fp4 decode overlaps the previous
// tile's MMAs. The decode and the per-tile barrier are paid once per kN tokens, which is what larger tiles
// buy; what they cost is MMA columns past an expert's tokens, so a 256- or 96-token tile with at most half its
// tokens runs its loads and MMAs at half width (96 fits the ~64 tokens per expert of a 512-token step in one
// tile, 48 the ~32 of a 256-token decode step).
//
// 96-token tiles run on a deep ring (MoeWgmmaConfig::deep_ring; the five-stage one was deleted in session 14):
// six stages, and a tile of at most 48 tokens (batched decode, 16-48 tokens per expert) has each warp multiply
// two 16-row strips, 256 weight rows a CTA (the CTA of the odd column block next to it exits), on stages of its
// own size. At those sizes the kernel is bound by its instruction stream (ncu, session 12: ~150 issued
// instructions per warp and k tile, the fp4 decode ~60 of them, at 58% of the issue slots; DRAM 40%): the
// loads of the token rows, the barrier, the ring's bookkeeping and the wgmma setup are then paid once per two
// strips.
//
// The layout's k permutation: in k-step kk of a 64-k tile, lane q's A registers hold physical k
// 16q + 4kk + {0, 1} (logical k 2q, 2q + 1 of the step) and 16q + 4kk + {2, 3} (logical 2q + 8, 2q + 9).
// The mma.sync kernels read lane q's 32 activation bytes from global directly; wgmma reads B rows of 16
// logical k from shared memory, so the activations are stored with k in logical order: the first GEMM's
// input through one permuting copy of x (moe_permute_k), the second GEMM's input h written permuted by the
// first GEMM's epilogue. Outputs y are in the natural order; the combine is unchanged.
//
// A (token, expert) pair's result depends only on its own row and the weights (the k order is fixed), not
// on which other tokens share its tile nor on the MMA's width (wgmma's columns are independent; the GPU
// tests check the bits of tokens alone against the same tokens in large tiles).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_wgmma_parts.cuh"
#include "backend/cuda/kernels/moe_wgmma_ws.h"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/wgmma.cuh"
#include "backend/cuda/moe_wgmma_narrow.h"

namespace mx::cuda {
namespace {

// out[t, logical_k(p)] = in[t, p]: one thread per 4 physical k (8 bytes in, two 4-byte pairs out).
__global__ void moe_permute_k_kernel(const uint16_t* in, uint16_t* out, int64_t rows, int64_t k) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * k / 4) return;
  const int64_t row = i / (k / 4), p = (i % (k / 4)) * 4;
  const uint2 v = *reinterpret_cast<const uint2*>(in + row * k + p);
  uint16_t* o = out + row * k;
  *reinterpret_cast<uint32_t*>(o + logical_k(p)) = v.x;
  *reinterpret_cast<uint32_t*>(o + logical_k(p + 2)) = v.y;
}

// The ring's geometry for a k loop of kCols token columns in a kernel of kN-token tiles whose ring is kRing
// stages of full width: with kHalfStages (a CTA per item only), a half-width loop cuts the same bytes into
// stages of its own size, for twice the weight rows (two strips a warp): 48 token rows and 256 weight rows of
// a 96-token tile's CTA take 15 KB instead of 17 KB; a loop of more than kN / 2 columns but fewer than kN (64 of a
// 96-token tile) keeps one strip a warp on stages of its own size (13 KB).
// The narrow kernels (kOwnStages) count kRing in stages of their own size.
template <int kN, int kWG, int kCols, int kRing, bool kHalfStages, bool kOwnStages>
struct RingShape {
  static constexpr bool kTwoStrips = kHalfStages && kCols <= kN / 2;
  static constexpr int kRows = moe_wgmma_weight_rows(kWG) * (kTwoStrips ? 2 : 1);
  static constexpr int kFullBytes = static_cast<int>(moe_wgmma_stage_bytes(kN, kWG));
  static constexpr int kStageBytes =
      kHalfStages ? static_cast<int>((kCols * 128 + kRows * 34 + 1023) / 1024 * 1024) : kFullBytes;
  static constexpr int kStages = kHalfStages && !kOwnStages ? kRing * kFullBytes / kStageBytes : kRing;
  static constexpr int kWeightsAt = (kHalfStages ? kCols : kN) * 128;  // after the B tile
  static constexpr int kScalesAt = kWeightsAt + kRows * 32;
  static_assert(kStages >= 3, "tile t - 1 in the MMAs, tile t decoded, at least one tile loading");
};

// The token columns a k loop multiplies: the tile's kN, or, with 256- and 96-token tiles, half of it for a
// tile of at most kN / 2 tokens (an expert's last, partly filled tile, or an expert with few tokens), which
// halves its MMAs and activation loads. Not with 128-token tiles: those kernels run at their 128-register cap,
// where a second MMA width made ptxas serialize every wgmma (C7512) to fit (the 96-token kernel fits both
// widths in 121 registers).
template <int N>
struct Columns {
  static constexpr int value = N;
};

// Two CTAs per SM with two warpgroups and tiles of <= 128 tokens (128 registers a thread), else one.
// kPersistent: a grid of at most one wave loops over the work items (tile-major, weight rows fastest, so
// concurrent CTAs share token tiles in L2), skipping the routing's unused tiles; the ring runs on across
// items, so the next item's first k tiles load while this one's last MMAs and epilogue run (the next item's
// row table is written, from global metadata, in the step that issues this item's last loads: every warp
// waits for those reads there). Otherwise one CTA per item on a (column blocks, max tiles) grid.
// kRowRegs (a CTA per item only): each thread keeps the input rows it copies (kN / 32 of them with two
// warpgroups) as pointers in registers for the whole k loop instead of reading them back from the shared row
// table for every 16-byte copy (a shared load, a 64-bit add and a scoreboard wait per copy).
// kRing: ring stages (of full width; of the narrow loop's own size with kNarrowCols); kHalfStages (a CTA per
// item, kN = 96): a tile of at most kN / 2 tokens runs two strips a warp on its own stages (RingShape), its CTA
// taking the next column block's rows too. kMidCols (64, with kHalfStages at kN = 96; 0 otherwise): instead, a
// tile of at most 64 tokens runs one strip a warp at 64 columns (MoeGemmParams::mid_width).
// kNarrowCols (16 or 32, with kHalfStages; 0 otherwise): the routing's tiles hold at most that many tokens
// and every one runs two strips a warp at that MMA width (the 96-token geometry otherwise: registers, row
// registers, epilogue). One loop width per kernel: ptxas serialized every wgmma (C7511) of a kernel that had a
// 16- or 32-column two-strip loop beside the 48- or 96-column ones, whatever the accumulators' arrangement.
// Every narrow tile runs two strips a warp, so the narrow grid has a CTA per even column block only (no CTA
// that exits at once), and its CTAs per SM are what its ring's shared memory allows (moe_wgmma_narrow.h: three
// of the 16-token kernel on six stages, <= 80 registers; two of the others).
template <int kN, int kWG, int kRing, int kNarrowCols>
constexpr int ctas_per_sm() {
  return kNarrowCols != 0 ? moe_wgmma_narrow_ctas_per_sm(kNarrowCols, kRing) : moe_wgmma_ctas_per_sm(kN, kWG);
}

template <int kN, int kWG, bool kPersistent, bool kRowRegs = false, int kRing = kMoeWgmmaStages,
          bool kHalfStages = false, int kNarrowCols = 0, int kMidCols = 0>
__global__ void __launch_bounds__(moe_wgmma_threads(kWG), (ctas_per_sm<kN, kWG, kRing, kNarrowCols>()))
    moe_wgmma_kernel(MoeGemmParams p) {
#if MX_SM90A
  static_assert(kMidCols == 0 || (kN == 96 && kHalfStages && kNarrowCols == 0 && kMidCols == 64),
                "the mid width: 64 columns of the deep ring's 96-token tiles");
  static_assert(!kHalfStages || (!kPersistent && kN == 96), "two strips a warp: half-width tiles, a CTA per item");
  static_assert(kNarrowCols == 0 || (kHalfStages && (kNarrowCols == 16 || kNarrowCols == 32)),
                "narrow tiles: 16 or 32 tokens, two strips a warp on the deep ring");
  if constexpr (kNarrowCols != 0)
    static_assert(RingShape<kN, kWG, kNarrowCols, kRing, kHalfStages, true>::kStageBytes ==
                      moe_wgmma_narrow_stage_bytes(kNarrowCols),
                  "the narrow ring's stages are moe_wgmma_narrow.h's");
  constexpr bool kHalfWidth = kN == 256 || kN == 96;  // see Columns
  constexpr int kStages = kRing;  // the persistent kernel's (one geometry for every item)
  constexpr int kThreads = moe_wgmma_threads(kWG), kRows = moe_wgmma_weight_rows(kWG), kStrips = kRows / 16;
  static_assert(kThreads == 32 * kStrips, "a warp per 16-row strip");
  extern __shared__ uint8_t smem_raw[];
  // Where each tile row's input row starts, for the item being loaded (two tables in persistent mode: the
  // next item's is written while the current one's loads may still read theirs). Rows past the tile's tokens
  // are zero-filled without a read (they point at input row 0 only to stay a valid address).
  __shared__ const uint8_t* row_src[kPersistent ? 2 : 1][kRowRegs ? 1 : kN];
  // The swizzle pattern repeats every 1024 bytes; B tiles start on that boundary.
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);

  const int64_t strips = p.rows / 16;
  const int n_k = static_cast<int>(p.k / 64);
  const int n_cols = static_cast<int>((strips + kStrips - 1) / kStrips);  // column blocks of kRows weight rows
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4;
  // Items are numbered tile * n_cols + column block.
  int item, n_items, stride;
  if constexpr (kPersistent) {
    item = blockIdx.x;
    n_items = *p.r.num_tiles * n_cols;
    stride = gridDim.x;
  } else {
    if (static_cast<int>(blockIdx.y) >= *p.r.num_tiles) return;
    item = blockIdx.y * n_cols + static_cast<int>(blockIdx.x) * (kNarrowCols != 0 ? 2 : 1);
    n_items = item + 1;
    stride = 1;
  }
  if (item >= n_items) return;
  auto item_at = [&](int i) { return moe_work_item(p, i, n_cols, kStrips); };
  auto fill_rows = [&](const WorkItem& w, int buf) {
    for (int i = tid; i < kN; i += kThreads) {
      const int64_t row = i >= w.n ? 0 : p.gated ? p.r.sorted_slots[w.start + i] / static_cast<int>(p.top_k) : w.start + i;
      row_src[buf][i] = reinterpret_cast<const uint8_t*>(p.in + row * p.k);
    }
  };

  WorkItem cur = item_at(item);  // the item being multiplied
  // Two strips a warp: the even column block's CTA takes the odd one's rows, which therefore has nothing to do.
  const bool two_strips = kHalfStages && kMidCols == 0 && cur.n <= kN / 2;
  if (kNarrowCols == 0 && two_strips && (blockIdx.x & 1)) return;

  // Stage s of the ring: the B tile (kN rows of 128 bytes, swizzled), this CTA's packed fp4 (32 B per
  // weight row), then its scales (2 B per row).
  const uint32_t ring = smem_addr(smem);

  // The loads' loop-invariant parts (the per-tile address arithmetic was a large share of the kernel's
  // issued instructions): thread tid copies 16-byte chunk tid % 8 of tile rows tid / 8 + j x kRowsPerPass,
  // whose swizzled place is the same in every pass (kRowsPerPass is a multiple of 8), and its warp's strip of
  // fp4 blocks and scales; a k tile t then only adds t x 128, t x 512 or t x 32 bytes.
  constexpr int kRowsPerPass = kThreads / 8;
  static_assert(kRowsPerPass % 8 == 0, "one swizzle phase per thread");
  const int ch = tid % 8, row0 = tid / 8;
  static_assert(!kRowRegs || !kPersistent, "row registers hold one item's rows");
  constexpr int kPasses = (kN + kRowsPerPass - 1) / kRowsPerPass;
  const uint8_t* row_ptr[kRowRegs ? kPasses : 1];  // this thread's chunk of input row j (kRowRegs)
  uint32_t row_live = 0;                            // bit j: row j holds a token (else zero-filled)
  if constexpr (kRowRegs) {
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      const int row = row0 + j * kRowsPerPass;
      const bool live = row < cur.n;
      const int64_t src = !live  ? 0
                          : p.gated ? p.r.sorted_slots[cur.start + row] / static_cast<int>(p.top_k)
                                    : cur.start + row;
      row_ptr[j] = reinterpret_cast<const uint8_t*>(p.in + src * p.k) + ch * 16;
      row_live |= live ? 1u << j : 0u;
    }
  }
  const uint32_t b_dst = ring + row0 * 128 + ((ch ^ (row0 & 7)) * 16);
  const uint32_t w_dst = ring + tid * 16;                          // + the shape's kWeightsAt
  const uint32_t s_dst = ring + warp * 32 + (lane & 1) * 16;       // + the shape's kScalesAt
  // The item being loaded: its row table, this warp's strip of weights and scales (at k tile 0), its width.
  struct LoadItem {
    const uint8_t* w_src;
    const uint8_t* s_src;
    int n;       // the tile's tokens: rows from n on are zero-filled
    int w_size;  // 16, or 0 for a strip past the matrix (zero weights and scales)
    int w_size2;  // the same for the warp's second strip (two strips a warp), kStrips strips further
    int buf;     // which row table (0 unless persistent)
    bool half;
  };
  auto load_item = [&](const WorkItem& w, int buf) {
    const int64_t my_strip = w.strip0 + warp;
    const bool ok = my_strip < strips;
    const int64_t strip_tiles = (w.e * strips + (ok ? my_strip : 0)) * n_k;
    return LoadItem{p.blocks + strip_tiles * 512 + lane * 16, p.scales + strip_tiles * 32 + (lane & 1) * 16, w.n,
                    ok ? 16 : 0, my_strip + kStrips < strips ? 16 : 0, buf, kHalfWidth && w.n <= kN / 2};
  };
  // This warp's strip of k tile t into slot s: 16 bytes per lane (the lane reads back exactly its own bytes),
  // 32 B of scales. With two strips a warp the second is kStrips strips on: its bytes follow the first strips'
  // in the stage, and lanes 2 and 3 copy its scales.
  auto load_weights = [&](auto columns, const LoadItem& li, int t, int s) {
    using Shape = RingShape<kN, kWG, decltype(columns)::value, kRing, kHalfStages, kNarrowCols != 0>;
    const uint32_t stage = static_cast<uint32_t>(s) * Shape::kStageBytes;
    cp_async_16_to(w_dst + Shape::kWeightsAt + stage, li.w_src + t * 512, li.w_size);
    if constexpr (Shape::kTwoStrips) {
      // Strip tiles between the two strips (none for a second strip past the matrix: a valid address, no read);
      // 32-bit byte offsets (an expert's strips are far below 4 GB) keep the loop within its registers.
      const uint32_t next = li.w_size2 != 0 ? static_cast<uint32_t>(kStrips * n_k) : 0u;
      cp_async_16_to(w_dst + Shape::kWeightsAt + kStrips * 512 + stage, li.w_src + (next * 512u + t * 512u),
                     li.w_size2);
      if (lane < 4) {
        const bool second = lane >= 2;
        cp_async_16_to(s_dst + Shape::kScalesAt + (second ? kStrips * 32 : 0) + stage,
                       li.s_src + ((second ? next * 32u : 0u) + t * 32u), second ? li.w_size2 : li.w_size);
      }
    } else {
      if (lane < 2) cp_async_16_to(s_dst + Shape::kScalesAt + stage, li.s_src + t * 32, li.w_size);
    }
  };
  // This thread's chunks of the tile's activation rows of k tile t into slot s.
  auto load_rows = [&](auto columns, const LoadItem& li, int t, int s) {
    constexpr int kCols = decltype(columns)::value;
    using Shape = RingShape<kN, kWG, kCols, kRing, kHalfStages, kNarrowCols != 0>;
    const uint32_t stage = static_cast<uint32_t>(s) * Shape::kStageBytes;
#pragma unroll
    for (int j = 0; j < (kCols + kRowsPerPass - 1) / kRowsPerPass; ++j) {
      const int row = row0 + j * kRowsPerPass;
      if (kCols % kRowsPerPass != 0 && row >= kCols) break;
      // Rows past the tile's tokens read nothing. Letting them all read input row 0 instead (no zero fill)
      // measured 11% slower at 64 tokens per expert, where partly filled tiles are common (docs/PERF.md).
      if constexpr (kRowRegs) {
        cp_async_16_to(b_dst + stage + j * kRowsPerPass * 128, row_ptr[j] + t * 128, (row_live >> j) & 1 ? 16 : 0);
      } else {
        const uint32_t kb = ch * 16 + static_cast<uint32_t>(t) * 128;  // bytes into the input row
        cp_async_16_to(b_dst + stage + j * kRowsPerPass * 128, row_src[kPersistent ? li.buf : 0][row] + kb,
                       row < (kPersistent ? li.n : cur.n) ? 16 : 0);
      }
    }
  };
  auto load = [&](auto columns, const LoadItem& li, int t, int s) {
    load_rows(columns, li, t, s);
    load_weights(columns, li, t, s);
  };

  if constexpr (!kRowRegs) fill_rows(cur, 0);
  LoadItem li = load_item(cur, 0);
  int ld_item = item, ld_t = 0, load_slot = 0;
  __syncthreads();
  // Issues the next k tile's loads into load_slot (an empty group past the last one) and moves on. In
  // persistent mode the loads run on into the next item: after an item's last k tile it writes the next
  // item's row table, which the next call reads after a barrier; returns whether it moved to a new item.
  // Otherwise the k loop's width `columns` is the load's.
  auto advance_load = [&](auto columns) {
    bool moved = false;
    if constexpr (kPersistent) {
      if (ld_item < n_items) {
        if (li.half) {
          load(Columns<kN / 2>{}, li, ld_t, load_slot);
        } else {
          load(Columns<kN>{}, li, ld_t, load_slot);
        }
        if (++ld_t == n_k) {
          ld_t = 0;
          ld_item += stride;
          moved = true;
          if (ld_item < n_items) {
            const WorkItem next = item_at(ld_item);
            fill_rows(next, li.buf ^ 1);
            li = load_item(next, li.buf ^ 1);
          }
        }
      }
    } else {
      if (ld_t < n_k) load(columns, li, ld_t, load_slot);
      ++ld_t;
    }
    cp_async_commit();
    constexpr int kSlots = RingShape<kN, kWG, decltype(columns)::value, kRing, kHalfStages, kNarrowCols != 0>::kStages;
    load_slot = load_slot == kSlots - 1 ? 0 : load_slot + 1;
    return moved;
  };
  if constexpr (kPersistent)
    for (int s = 0; s < kStages - 2; ++s)
      if (advance_load(Columns<kN>{})) __syncthreads();  // a new row table before its first load (short items)

  float acc[kN / 2];
  int slot = 0;  // ring slot of the k tile being multiplied

  // The deep ring's first n k tiles' loads. The weights (constant) first, then the wait for the previous
  // kernel (a programmatic dependent launch, MoeWgmmaConfig::pdl: the input rows are its output; a no-op
  // otherwise), then the rows, a commit group per tile as advance_load makes them (the first group also holds
  // every prologue tile's weights, which only makes them land earlier). The routing metadata read before the
  // wait is older than the previous kernel: that one started after it was written (stream order), and with PDL
  // the first GEMM lets the second start only after its own wait.
  auto prologue = [&](auto columns, int n) {
    for (int s = 0; s < n; ++s)
      if (s < n_k) load_weights(columns, li, s, s);
    pdl_wait();
    pdl_launch_dependents();
    for (int s = 0; s < n; ++s) {
      if (ld_t < n_k) load_rows(columns, li, ld_t, load_slot);
      ++ld_t;
      cp_async_commit();
      ++load_slot;  // n < the loop's stages: no wrap
    }
  };
  // Two wgmma groups in flight: tile t's dequant overlaps tile t - 1's MMAs, so the A registers alternate
  // between two sets (the k loop is unrolled by 2 to keep their indices static). The slot reloaded at a
  // step is that of the k tile two steps back, which every warpgroup has finished (wait<1> before the
  // barrier); the k tiles of the next kS - 2 steps (across items in persistent mode) are in flight.
  // Two strips a warp (the k loop of a tile of at most kN / 2 tokens, or of every narrow tile): each step strip
  // A's decode and MMAs into da (wait<1>: strip B's of the previous tile are done, its A registers free), then
  // strip B's into db (wait<1>: strip A's are done). The caller zeroes da and db (kCols / 2 floats each);
  // `fence_a()` fences da's registers (or the whole accumulator that holds them) around the asynchronous MMAs.
  // (Fencing db before the loop too, or the 96-token accumulator around the whole loop, made ptxas serialize
  // every wgmma of the 96-token kernel, C7511.)
  auto two_strip_loop = [&](auto columns, auto& da, auto& db, auto fence_a) {
    constexpr int kCols = decltype(columns)::value;
    using Shape = RingShape<kN, kWG, kCols, kRing, kHalfStages, kNarrowCols != 0>;
    static_assert(Shape::kTwoStrips, "two strips a warp");
    constexpr int kS = Shape::kStages;
    prologue(columns, kS - 2);
    uint32_t a[2][4][4];
    fence_a();
    for (int t = 0; t < n_k; ++t) {
      cp_async_wait<kS - 3>();
      fence_proxy_async_smem();
      __syncthreads();
      advance_load(columns);
      const uint32_t stage = ring + slot * Shape::kStageBytes;
      const uint32_t weights = stage + Shape::kWeightsAt + tid * 16;
      const uint32_t scales = stage + Shape::kScalesAt + warp * 32 + (q >> 1) * 16;
      // The decode's shifts only in the narrow tiles: the 96-token kernel serialized its wgmma with them.
      moe_wgmma_k_tile<kCols, kNarrowCols != 0>(da, a[0], stage, weights, scales, r);
      moe_wgmma_k_tile<kCols, kNarrowCols != 0>(db, a[1], stage, weights + kStrips * 512, scales + kStrips * 32, r);
      slot = slot == kS - 1 ? 0 : slot + 1;
    }
    wgmma_wait<0>();
    fence_a();
    wgmma_fence_regs(db);
  };
  auto k_loop = [&](auto columns) {
    constexpr int kCols = decltype(columns)::value;
    using Shape = RingShape<kN, kWG, kCols, kRing, kHalfStages, kNarrowCols != 0>;
    constexpr int kS = Shape::kStages;
    // The accumulator's first kCols / 2 registers are columns 0 .. kCols - 1 in wgmma's layout.
    float(&d)[kCols / 2] = *reinterpret_cast<float(*)[kCols / 2]>(&acc[0]);
    auto tile = [&](uint32_t(&at)[4][4]) {
      const uint32_t stage = ring + slot * Shape::kStageBytes;
      moe_wgmma_k_tile<kCols>(d, at, stage, stage + Shape::kWeightsAt + tid * 16,
                              stage + Shape::kScalesAt + warp * 32 + (q >> 1) * 16, r);
      slot = slot == kS - 1 ? 0 : slot + 1;
    };
    if constexpr (Shape::kTwoStrips) {
      // Strip A in acc[0, 24), B in its own d2, copied to acc[24, 48) at the end (as the upper half of the
      // 96-column accumulator, B made ptxas serialize every wgmma, C7511).
      float d2[kCols / 2];
#pragma unroll
      for (int i = 0; i < kCols / 2; ++i) d2[i] = 0.f;
      two_strip_loop(columns, d, d2, [&] { wgmma_fence_regs(acc); });
#pragma unroll
      for (int i = 0; i < kCols / 2; ++i) acc[kCols / 2 + i] = d2[i];
    } else {
      // Only the deep ring's kernel is ever a programmatic dependent (MoeWgmmaConfig::pdl); the others keep
      // their loads in the order they were measured in.
      if constexpr (kHalfStages) {
        prologue(columns, kS - 2);
      } else if constexpr (!kPersistent) {
        for (int s = 0; s < kS - 2; ++s) advance_load(columns);
      }
      auto step = [&](uint32_t(&at)[4][4]) {
        cp_async_wait<kS - 3>();  // this thread's copies of this step's k tile landed
        fence_proxy_async_smem();  // ... and are visible to wgmma's reads
        __syncthreads();           // everyone's; everyone finished the slot reloaded next, and its row table
        advance_load(columns);
        tile(at);
      };
      moe_wgmma_k_loop(acc, n_k, step);
    }
  };

  if constexpr (kNarrowCols != 0) {
    // Every tile fits (the routing's tile size): two strips a warp at kNarrowCols columns, each with
    // accumulators of that width only (no unused columns of the 96-token tile's kept live in registers).
    float da[kNarrowCols / 2], db[kNarrowCols / 2];
#pragma unroll
    for (int i = 0; i < kNarrowCols / 2; ++i) da[i] = db[i] = 0.f;
    two_strip_loop(Columns<kNarrowCols>{}, da, db, [&] { wgmma_fence_regs(da); });
    cur = item_at(item);
    const int64_t my_strip = cur.strip0 + warp;
    if (my_strip < strips) moe_wgmma_store<kNarrowCols>(p, da, cur, my_strip, r, q);
    if (my_strip + kStrips < strips) moe_wgmma_store<kNarrowCols>(p, db, cur, my_strip + kStrips, r, q);
  } else {
    for (;;) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;
      if constexpr (kMidCols != 0) {
        // MoeGemmParams::mid_width: a tile of at most 64 tokens at 64 columns, one strip a warp on stages of its
        // own size (no 48-column two-strip loop beside it: three widths made ptxas serialize every wgmma, C7511).
        if (cur.n <= kMidCols) {
          k_loop(Columns<kMidCols>{});
        } else {
          k_loop(Columns<kN>{});
        }
      } else if constexpr (kHalfWidth) {
        if (cur.n <= kN / 2) {
          k_loop(Columns<kN / 2>{});
        } else {
          k_loop(Columns<kN>{});
        }
      } else {
        k_loop(Columns<kN>{});
      }
      // The item's metadata read again (cached) rather than kept live through the k loop, which keeps the
      // persistent 256-token kernel within its 255 registers and the deep ring's two-strip loop within its 128.
      if constexpr (kPersistent || kHalfStages) cur = item_at(item);
      const int64_t my_strip = cur.strip0 + warp;
      if (two_strips) {
        using Half = float[kN / 4];
        if (my_strip < strips) moe_wgmma_store<kN / 2>(p, *reinterpret_cast<Half*>(&acc[0]), cur, my_strip, r, q);
        if (my_strip + kStrips < strips)
          moe_wgmma_store<kN / 2>(p, *reinterpret_cast<Half*>(&acc[kN / 4]), cur, my_strip + kStrips, r, q);
      } else if (my_strip < strips) {
        moe_wgmma_store<kN>(p, acc, cur, my_strip, r, q);  // else a strip past the matrix
      }
      if constexpr (!kPersistent) break;
      item += stride;
      if (item >= n_items) break;
      cur = item_at(item);
    }
  }
  cp_async_wait<0>();
#endif
}

// The narrow tiles with every k tile's loads by the copy engine (launch_moe_wgmma_bulk_gemm): the same CTA work,
// ring geometry, decode, MMAs and epilogue as moe_wgmma_kernel's narrow form, bitwise, but each stage arrives as
// three copies, issued by lane 0 of warps 0 to 2 (one each) and counted on the stage's mbarrier: the CTA's 16 strips
// of fp4 and of scales as one box each of a rank-4 tensor map ([experts][strips][k tiles][bytes]: strips past the
// matrix read as zeros, as the cp.async form zero-fills them), and the tile's activation rows as one bulk copy from
// the tiled input (moe_wgmma_ws.h: x gathered so by launch_moe_gather_tiled, h written so by the first GEMM). The
// other warps issue no copy, no address arithmetic, no cp.async group bookkeeping and no generic-to-async proxy
// fence per tile (the copy engine's writes are the async proxy's): ~30 of the cp.async loop's 193 instructions
// a warp and k tile (docs/PERF.md, session 16's SASS).
struct MoeWgmmaMaps {
  CUtensorMap weights, scales;
  CUtensorMap half_weights;  // one strip group's 8 strips (the paired tiles' CTAs)
  // Whether a tile's rows copy stops after its routed tokens' 8-row blocks (1 KB each; the smem rows past them keep
  // an older tile's bits, multiplied into token columns that are never stored) or moves the whole padded tile.
  bool trim_rows;
};

// The bytes of a tile's rows that its stage copies: the n routed tokens' 8-row blocks, or all kCols rows.
template <int kCols>
__device__ __forceinline__ uint32_t moe_bulk_row_bytes(bool trim, int n) {
  return trim && n < kCols ? static_cast<uint32_t>((n + 7) / 8) * 1024 : kCols * 128;
}

// One stage's copies for k tile t into ring slot s of a BulkRing<16 or 32> (lane 0 of warps 0 to 2, `warp`): warp 0
// the fp4 box of `weights` (the CTA's 16 strips, or a pair's strip group of 8) from strip `strip`, weight_bytes of it
// after the stage's rows (rows_bytes in); warp 1 the scales' box of the CTA's 16 strips from strip0; warp 2 the
// tile's rows (row_bytes from rows + t * plane: one k tile of every padded row a plane).
struct BulkStage {
  const CUtensorMap* weights;
  const CUtensorMap* scales;
  int e, strip, strip0;
  uint32_t weight_bytes, weights_at, scales_at, scale_bytes, stage_bytes, row_bytes;
  const uint8_t* rows;
  int64_t plane;
};
// kBoxes 2 (moe_wgmma_bulk_tile_kernel's two strips a warp): the fp4 and the scales as two boxes each, of kBoxStrips
// strips from strip (strip0) and kBoxStrips further, the second's bytes after the first's (weight_bytes and scale_bytes
// are both boxes').
#if MX_SM90A
template <int kBoxes = 1, int kBoxStrips = 0>
__device__ __forceinline__ void moe_bulk_load(const BulkStage& b, uint32_t ring, uint32_t full0, int warp, int t, int s) {
  static_assert(kBoxes == 1 || (kBoxes == 2 && kBoxStrips > 0), "one box, or two of kBoxStrips strips");
  const uint32_t stage = ring + static_cast<uint32_t>(s) * b.stage_bytes, bar = full0 + 8 * s;
  if (warp == 0) {
    mbarrier_arrive_expect_tx(bar, b.weight_bytes);
    tma_load_4d(stage + b.weights_at, b.weights, 0, t, b.strip, b.e, bar);
    if constexpr (kBoxes == 2)
      tma_load_4d(stage + b.weights_at + b.weight_bytes / 2, b.weights, 0, t, b.strip + kBoxStrips, b.e, bar);
  } else if (warp == 1) {
    mbarrier_arrive_expect_tx(bar, b.scale_bytes);
    tma_load_4d(ring + b.scales_at + s * b.scale_bytes, b.scales, 0, t, b.strip0, b.e, bar);
    if constexpr (kBoxes == 2)
      tma_load_4d(ring + b.scales_at + s * b.scale_bytes + b.scale_bytes / 2, b.scales, 0, t, b.strip0 + kBoxStrips,
                  b.e, bar);
  } else {
    mbarrier_arrive_expect_tx(bar, b.row_bytes);
    bulk_copy(stage, b.rows + t * b.plane, b.row_bytes, bar);
  }
}

// The first kS - 2 k tiles' copies (`copier`: lane 0 of warps 0 to 2): the constant fp4 and scales before the wait
// for the previous kernel (a programmatic dependent launch; a no-op otherwise), the rows, which it writes, after.
template <int kS, int kBoxes = 1, int kBoxStrips = 0>
__device__ __forceinline__ void moe_bulk_prologue(const BulkStage& b, uint32_t ring, uint32_t full0, bool copier,
                                                  int warp, int n_k) {
  const int prologue = n_k < kS - 2 ? n_k : kS - 2;
  if (copier && warp < 2)
    for (int s = 0; s < prologue; ++s) moe_bulk_load<kBoxes, kBoxStrips>(b, ring, full0, warp, s, s);
  pdl_wait();
  pdl_launch_dependents();
  if (copier && warp == 2)
    for (int s = 0; s < prologue; ++s) moe_bulk_load<kBoxes, kBoxStrips>(b, ring, full0, warp, s, s);
}
#endif

// The three copies of a stage are issued by lane 0 of warps 0 (fp4), 1 (scales) and 2 (rows), each arming the
// stage's barrier with its own bytes: one thread issuing all three (with the uniform-register loops ptxas wraps
// around each) made its warp ~47 instructions a k tile longer than the others, which the CTA barrier waits for.
// kWarpRelease: no CTA barrier per k tile; each warp releases a slot on its empty mbarrier once its MMAs of the
// slot's tile are done, and the copying lanes wait for the slot's eight releases before reloading it (the other
// warps run ahead of the slowest by up to the ring's depth). Otherwise a __syncthreads per k tile, as the cp.async
// form.
// The copy engine's ring: six stages of the tile's rows (each stage 1024-byte aligned for the swizzle) and the
// CTA's 16 strips of fp4, then every stage's scales after them (a stage of rows and fp4 is a multiple of 1024
// bytes: no padding), for three CTAs an SM, the cp.async kernel's count and depth. (Four CTAs an SM on five
// stages would fit in shared memory, but at <= 64 registers ptxas serializes the wgmma, C7512.)
template <int kCols>
struct BulkRing {
  static constexpr int kStrips = moe_wgmma_weight_rows(kMoeWgmmaWarpgroups) / 16;
  static constexpr uint32_t kRowBytes = kCols * 128, kWeightBytes = 2 * kStrips * 512, kScaleBytes = 2 * kStrips * 32;
  static constexpr uint32_t kStageBytes = kRowBytes + kWeightBytes;  // the fp4 at kRowBytes
  // 16-token tiles: six stages, three CTAs (the cp.async kernel's); 32: seven of 12 KB, two CTAs (likewise).
  static constexpr int kStages = kCols == 16 ? 6 : 7, kCtas = kCols == 16 ? 3 : 2;
  static constexpr uint32_t kScalesAt = kStages * kStageBytes;
  static constexpr int64_t kSmemBytes = kScalesAt + kStages * kScaleBytes + 1024;  // + 1 KB to align the ring
  static_assert(kStageBytes % 1024 == 0 && kRowBytes % 128 == 0, "stages 1024-byte aligned, copies 128-byte");
  static_assert(kCtas * (kSmemBytes + 1024 + 128) <= 233472, "the rings fit an SM (1 KB reserved a CTA, barriers)");
};

// One CTA of a pair of 16-token tiles (moe_wgmma_bulk_kernel's kPairs): strip group `group` (0: strips strip0 to
// strip0 + 7, 1: the next 8) of the expert against tile s0's rows (da) and tile s0 + 1's (db), s0 = w.tile - group.
// Each stage: one 4 KB bulk copy of both tiles' rows (adjacent in the tiled input), the group's 8 strips of fp4
// (half_weights' box) and the CTA's 16 strips of scales (the unpaired box, this group's half read).
#if MX_SM90A
__device__ __forceinline__ void moe_wgmma_bulk_pair(const MoeGemmParams& p, const MoeWgmmaMaps& maps, const WorkItem& w,
                                                    int group, int n_k, uint32_t ring, uint32_t full0) {
  using Ring = BulkRing<16>;
  constexpr int kS = Ring::kStages, kStrips = Ring::kStrips;
  constexpr uint32_t kRowBytes = 2 * Ring::kRowBytes, kWeightBytes = Ring::kWeightBytes / 2, kScaleBytes = Ring::kScaleBytes;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4;
  const int s0 = w.tile - group, strip_g = w.strip0 + group * kStrips;
  const bool copier = lane == 0 && warp < 3;
  // Tile s0 is full (16 tokens); tile s0 + 1's rows follow it.
  const BulkStage b{&maps.half_weights, &maps.scales, w.e, strip_g, w.strip0, kWeightBytes, kRowBytes, Ring::kScalesAt,
                    kScaleBytes, Ring::kStageBytes,
                    Ring::kRowBytes + moe_bulk_row_bytes<16>(maps.trim_rows, p.r.tile_rows[s0 + 1]),
                    reinterpret_cast<const uint8_t*>(p.in) + static_cast<int64_t>(s0) * Ring::kRowBytes,
                    p.max_tiles * Ring::kRowBytes};
  moe_bulk_prologue<kS>(b, ring, full0, copier, warp, n_k);

  float da[8], db[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) da[i] = db[i] = 0.f;
  int slot = 0, load_slot = kS - 2;
  uint32_t parity = 0;
  int t = 0;
  // Tile t: strip decode into `at`, tile s0's group on it, then tile s0 + 1's on the same registers. The next
  // tile decodes into the other set (the second group may still read these), as the unpaired loop's strips do.
  auto step = [&](uint32_t(&at)[4][4]) {
    mbarrier_wait(full0 + 8 * slot, parity);
    __syncthreads();
    if (copier && t + kS - 2 < n_k) moe_bulk_load(b, ring, full0, warp, t + kS - 2, load_slot);
    if (++load_slot == kS) load_slot = 0;
    const uint32_t stage = ring + static_cast<uint32_t>(slot) * Ring::kStageBytes;
    const uint32_t weights = stage + kRowBytes + tid * 16;
    const uint32_t scales = ring + Ring::kScalesAt + slot * kScaleBytes + group * kStrips * 32 + warp * 32 + (q >> 1) * 16;
    moe_wgmma_k_tile<16, true>(da, at, stage, weights, scales, r);
    const uint64_t desc = wgmma_desc_k128(stage + Ring::kRowBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_bf16_rs<16>(db, at[kk], desc + 2 * kk);
    wgmma_commit();
    wgmma_wait<1>();
    if (++slot == kS) {
      slot = 0;
      parity ^= 1;
    }
    ++t;
  };
  uint32_t a[2][4][4];
  wgmma_fence_regs(da);
  wgmma_fence_regs(db);
  while (t + 1 < n_k) {
    step(a[0]);
    step(a[1]);
  }
  if (t < n_k) step(a[0]);
  wgmma_wait<0>();
  wgmma_fence_regs(da);
  wgmma_fence_regs(db);
  const int64_t my_strip = strip_g + warp;
  if (my_strip >= p.rows / 16) return;
  const WorkItem w0{w.e, p.r.tile_start[s0], p.r.tile_rows[s0], w.strip0, s0};
  const WorkItem w1{w.e, p.r.tile_start[s0 + 1], p.r.tile_rows[s0 + 1], w.strip0, s0 + 1};
  moe_wgmma_store<16, true>(p, da, w0, my_strip, r, q, 16);
  moe_wgmma_store<16, true>(p, db, w1, my_strip, r, q, 16);
}
#endif

// kPairs (16-token tiles): an expert's routing tiles 2i and 2i + 1 (slots s0 and s0 + 1: 16 tokens and 1 to 16)
// run as a pair of CTAs, each one strip group (8 strips: its warps' strip A of the unpaired form, or strip B) against
// both tiles' rows: a k tile's fp4 is decoded once for up to 32 tokens (two m64n16k16 groups on the same A
// registers), where two unpaired CTAs each decode both groups for 16. Same products in the same k order: the bits of
// the unpaired form. At a skewed routing (a few experts with more than 16 tokens) the unpaired tiles decoded those
// experts' weights twice.
template <int kCols, bool kWarpRelease, bool kPairs = false>
__global__ void __launch_bounds__(moe_wgmma_threads(kMoeWgmmaWarpgroups), (BulkRing<kCols>::kCtas))
    moe_wgmma_bulk_kernel(MoeGemmParams p, const __grid_constant__ MoeWgmmaMaps maps) {
#if MX_SM90A
  using Ring = BulkRing<kCols>;
  constexpr int kS = Ring::kStages, kStrips = Ring::kStrips;
  constexpr uint32_t kRowBytes = Ring::kRowBytes, kWeightBytes = Ring::kWeightBytes, kScaleBytes = Ring::kScaleBytes;
  constexpr int kCopies = 3;
  static_assert(!kPairs || (kCols == 16 && !kWarpRelease), "paired tiles: 16-token tiles, a CTA barrier per k tile");
  // A pair's stage: both tiles' rows (2 x kRowBytes), then the CTA's strip group's fp4 (half of kWeightBytes).
  static_assert(!kPairs || 2 * kRowBytes + kWeightBytes / 2 <= Ring::kStageBytes, "a pair's stage fits the ring's");
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full_bar[kS], empty_bar[kWarpRelease ? kS : 1];
  const uint32_t ring = smem_addr(smem_raw) + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const uint32_t full0 = smem_addr(full_bar), empty0 = smem_addr(empty_bar);

  const int64_t strips = p.rows / 16;
  const int n_k = static_cast<int>(p.k / 64);
  const int n_cols = static_cast<int>((strips + kStrips - 1) / kStrips);
  if (static_cast<int>(blockIdx.y) >= *p.r.num_tiles) return;
  const int item = blockIdx.y * n_cols + static_cast<int>(blockIdx.x) * 2;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4;
  const WorkItem w = moe_work_item(p, item, n_cols, kStrips);
  // kPairs: the tile's place among its expert's, j = 2i (with a tile j + 1) or 2i + 1 runs paired (strip group
  // j & 1); -1 unpaired.
  int pair_group = -1;
  if constexpr (kPairs) {
    const int first = p.r.offsets[w.e], count = p.r.offsets[w.e + 1] - first, j = (w.start - first) / kCols;
    if ((j & 1) != 0 || (j + 1) * kCols < count) pair_group = j & 1;
  }
  if (tid == 0) {
    for (int s = 0; s < kS; ++s) {
      mbarrier_init(full0 + 8 * s, kCopies);
      if constexpr (kWarpRelease) mbarrier_init(empty0 + 8 * s, kStrips);  // a warp per strip pair
    }
    mbarrier_init_fence();
    tma_prefetch_map(kPairs && pair_group >= 0 ? &maps.half_weights : &maps.weights);
    tma_prefetch_map(&maps.scales);
  }
  __syncthreads();
  if constexpr (kPairs)
    if (pair_group >= 0) return moe_wgmma_bulk_pair(p, maps, w, pair_group, n_k, ring, full0);
  // This lane's copies (lane 0 of warps 0 to 2): the constant fp4 or scales, or the rows, which the previous kernel
  // writes.
  const bool copier = lane == 0 && warp < kCopies;
  const BulkStage b{&maps.weights, &maps.scales, w.e, w.strip0, w.strip0, kWeightBytes, kRowBytes, Ring::kScalesAt,
                    kScaleBytes, Ring::kStageBytes, moe_bulk_row_bytes<kCols>(maps.trim_rows, w.n),
                    reinterpret_cast<const uint8_t*>(p.in) + static_cast<int64_t>(w.tile) * kRowBytes,
                    p.max_tiles * kRowBytes};
  moe_bulk_prologue<kS>(b, ring, full0, copier, warp, n_k);

  // Two strips a warp as moe_wgmma_kernel's two_strip_loop: strip A's decode and MMAs into da, then strip B's
  // into db. The slot reloaded at step t is tile t - 2's, whose MMAs every warp has finished (wait<1> in step
  // t - 1) before the barrier, and whose phase every thread has seen.
  float da[kCols / 2], db[kCols / 2];
#pragma unroll
  for (int i = 0; i < kCols / 2; ++i) da[i] = db[i] = 0.f;
  uint32_t a[2][4][4];
  // load_slot starts at kS - 2 (slots kS - 2 and kS - 1 are fresh: their empty phase of parity 1 counts as
  // complete), then every reload waits for the release of the slot's previous tile.
  int slot = 0, prev_slot = 0, load_slot = kS - 2;
  uint32_t parity = 0, load_parity = 1;
  wgmma_fence_regs(da);
  for (int t = 0; t < n_k; ++t) {
    mbarrier_wait(full0 + 8 * slot, parity);  // the copies landed, visible to these loads and to wgmma
    if constexpr (!kWarpRelease) __syncthreads();
    if (copier && t + kS - 2 < n_k) {
      if constexpr (kWarpRelease) mbarrier_wait(empty0 + 8 * load_slot, load_parity);
      moe_bulk_load(b, ring, full0, warp, t + kS - 2, load_slot);
    }
    if (++load_slot == kS) {
      load_slot = 0;
      load_parity ^= 1;
    }
    const uint32_t stage = ring + static_cast<uint32_t>(slot) * Ring::kStageBytes;
    const uint32_t weights = stage + kRowBytes + tid * 16;
    const uint32_t scales = ring + Ring::kScalesAt + slot * kScaleBytes + warp * 32 + (q >> 1) * 16;
    moe_wgmma_k_tile<kCols, true>(da, a[0], stage, weights, scales, r);
    // Strip A's wait<1> left only its own group running: every MMA of tile t - 1 is done.
    if constexpr (kWarpRelease)
      if (t > 0 && lane == 0) mbarrier_arrive(empty0 + 8 * prev_slot);
    moe_wgmma_k_tile<kCols, true>(db, a[1], stage, weights + kStrips * 512, scales + kStrips * 32, r);
    prev_slot = slot;
    if (++slot == kS) {
      slot = 0;
      parity ^= 1;
    }
  }
  wgmma_wait<0>();
  wgmma_fence_regs(da);
  wgmma_fence_regs(db);
  // The first GEMM writes h tiled for the second one's bulk copies.
  const WorkItem cur = moe_work_item(p, item, n_cols, kStrips);
  const int64_t my_strip = cur.strip0 + warp;
  if (my_strip < strips) moe_wgmma_store<kCols, true>(p, da, cur, my_strip, r, q, kCols);
  if (my_strip + kStrips < strips) moe_wgmma_store<kCols, true>(p, db, cur, my_strip + kStrips, r, q, kCols);
#endif
}

// The 96-token tiles' kernels (64/96 columns: moe_wgmma_kernel's kMidCols; 48/96) and the 256-token tiles' (128 or 256
// columns, a CTA per item) with every k tile's loads by the copy engine (launch_moe_wgmma_bulk_gemm at 96- or 256-token
// tiles): the same CTA work (one strip a warp, 8 strips a CTA; the 96/48 form's tiles of <= 48 tokens two strips a warp
// with MoeGemmParams::two_strips, as the cp.async kernel's), decode, MMAs and
// epilogue, bitwise, but each stage arrives as three copies counted on its mbarrier (moe_bulk_load: the CTA's 8
// strips of fp4 and of scales as one box each, the tile's rows as one bulk copy from the tiled input: x gathered so
// by the routing launch, h written so by the first GEMM). No cp.async group wait, no generic-to-async proxy fence
// (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, ~1.4-2.2% of the 20b layer at T=512 in session 21) and no per-thread copy
// arithmetic per k tile; a CTA barrier per k tile still frees the slot reloaded. The ring holds what the cp.async
// kernel's does (96: six of its 17 KB stages, for 48-column stages of 10 KB (nine; 14.5 KB, six, two strips a warp),
// 64-column ones of 12 KB (eight) or 96-column ones of 16 KB (six);
// 256: five of its 37 KB, for 128-column stages of 20 KB (nine) or 256-column ones of 36 KB (five)), every stage's
// scales after them.
template <int kN>
inline constexpr uint32_t kTileBulkRingBytes = static_cast<uint32_t>(
    (kN == 96 ? kMoeWgmmaDeepStages : kMoeWgmmaStages) * moe_wgmma_stage_bytes(kN, kMoeWgmmaWarpgroups));
// The narrower loop's width: 64 columns of a 96-token tile at MoeGemmParams::mid_width, 128 of a 256-token one; a
// 96-token tile's 48 columns otherwise (moe_wgmma_bulk_tile_kernel<96, 48>).
template <int kN>
inline constexpr int kTileBulkHalfCols = kN == 96 ? 64 : kN / 2;
// kTwoStrips (96-token tiles' 48 columns only): each warp's two strips, the CTA's 16 (its fp4 and scales twice the
// bytes a stage).
template <int kN, int kCols, bool kTwoStrips = false>
struct TileBulkRing {
  static_assert(kN == 96 || kN == 256, "96- or 256-token tiles");
  static_assert(!kTwoStrips || (kN == 96 && kCols == 48), "two strips a warp: a 96-token tile's 48 columns");
  static constexpr int kStrips = moe_wgmma_weight_rows(kMoeWgmmaWarpgroups) / 16;
  static constexpr uint32_t kRowBytes = kCols * 128, kWeightBytes = (kTwoStrips ? 2 : 1) * kStrips * 512,
                            kScaleBytes = (kTwoStrips ? 2 : 1) * kStrips * 32;
  static constexpr uint32_t kStageBytes = kRowBytes + kWeightBytes;  // the fp4 at kRowBytes
  static constexpr int kStages = static_cast<int>(kTileBulkRingBytes<kN> / (kStageBytes + kScaleBytes));
  static constexpr uint32_t kScalesAt = kStages * kStageBytes;
  static_assert(kStageBytes % 1024 == 0, "stages 1024-byte aligned (the swizzle)");
  static_assert(kStages >= 4, "tile t - 1 in the MMAs, tile t decoded, tiles loading ahead");
};
template <int kN>
inline constexpr int64_t kTileBulkSmemBytes = kTileBulkRingBytes<kN> + 1024;  // + 1 KB to align the ring

#if MX_SM90A
// One item's k loop at kCols columns (kTileBulkHalfCols: a tile of at most that many tokens; else kN) into acc's
// first kCols / 2. (Each warp releasing slots on mbarriers instead of the CTA barrier, as moe_wgmma_bulk_kernel's
// kWarpRelease, measured no faster at 96: session 22, docs/PERF.md.)
template <int kN, int kCols>
__device__ __forceinline__ void moe_bulk_tile_k_loop(const MoeGemmParams& p, const MoeWgmmaMaps& maps, const WorkItem& w,
                                                     float (&acc)[kN / 2], int n_k, uint32_t ring, uint32_t full0) {
  using Ring = TileBulkRing<kN, kCols>;
  constexpr int kS = Ring::kStages;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4;
  const bool copier = lane == 0 && warp < 3;
  constexpr int64_t kTileBytes = kN * 128;  // a tile's rows in each k tile's plane of the tiled input
  const BulkStage b{&maps.weights, &maps.scales, w.e, w.strip0, w.strip0, Ring::kWeightBytes, Ring::kRowBytes,
                    Ring::kScalesAt, Ring::kScaleBytes, Ring::kStageBytes, moe_bulk_row_bytes<kCols>(maps.trim_rows, w.n),
                    reinterpret_cast<const uint8_t*>(p.in) + static_cast<int64_t>(w.tile) * kTileBytes,
                    p.max_tiles * kTileBytes};
  moe_bulk_prologue<kS>(b, ring, full0, copier, warp, n_k);
  float(&d)[kCols / 2] = *reinterpret_cast<float(*)[kCols / 2]>(&acc[0]);
  int slot = 0, load_slot = kS - 2, t = 0;
  uint32_t parity = 0;
  // The slot reloaded at step t is tile t - 2's, whose MMAs every warp has finished (wait<1> in step t - 1) before
  // the barrier, and whose phase every thread has seen.
  auto step = [&](uint32_t(&at)[4][4]) {
    mbarrier_wait(full0 + 8 * slot, parity);  // the copies landed, visible to these loads and to wgmma
    __syncthreads();
    if (copier && t + kS - 2 < n_k) moe_bulk_load(b, ring, full0, warp, t + kS - 2, load_slot);
    if (++load_slot == kS) load_slot = 0;
    const uint32_t stage = ring + static_cast<uint32_t>(slot) * Ring::kStageBytes;
    moe_wgmma_k_tile<kCols>(d, at, stage, stage + Ring::kRowBytes + tid * 16,
                            ring + Ring::kScalesAt + slot * Ring::kScaleBytes + warp * 32 + (q >> 1) * 16, r);
    if (++slot == kS) {
      slot = 0;
      parity ^= 1;
    }
    ++t;
  };
  moe_wgmma_k_loop(acc, n_k, step);
}

// A 96-token tile of at most 48 tokens with two strips a warp (moe_wgmma_bulk_tile_kernel's kTwoStrips): the CTA's 8
// strips into da, the next column block's 8 into db, each k tile's stage the tile's 48 rows and both strip groups' fp4
// and scales (two boxes each), as the cp.async kernel's two-strip loop: strip A's decode and MMAs, then strip B's on
// the other A registers. The slot reloaded at step t is tile t - 2's, whose MMAs every warp has finished (wait<1> in
// step t - 1) before the barrier.
__device__ __forceinline__ void moe_bulk_tile_two_strip_loop(const MoeGemmParams& p, const MoeWgmmaMaps& maps,
                                                             const WorkItem& w, float (&da)[24], float (&db)[24],
                                                             int n_k, uint32_t ring, uint32_t full0) {
  using Ring = TileBulkRing<96, 48, true>;
  constexpr int kS = Ring::kStages, kStrips = Ring::kStrips;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4;
  const bool copier = lane == 0 && warp < 3;
  constexpr int64_t kTileBytes = 96 * 128;  // a tile's rows in each k tile's plane of the tiled input
  const BulkStage b{&maps.weights, &maps.scales, w.e, w.strip0, w.strip0, Ring::kWeightBytes, Ring::kRowBytes,
                    Ring::kScalesAt, Ring::kScaleBytes, Ring::kStageBytes, moe_bulk_row_bytes<48>(maps.trim_rows, w.n),
                    reinterpret_cast<const uint8_t*>(p.in) + static_cast<int64_t>(w.tile) * kTileBytes,
                    p.max_tiles * kTileBytes};
  moe_bulk_prologue<kS, 2, kStrips>(b, ring, full0, copier, warp, n_k);
  uint32_t a[2][4][4];
  int slot = 0, load_slot = kS - 2;
  uint32_t parity = 0;
  wgmma_fence_regs(da);
  for (int t = 0; t < n_k; ++t) {
    mbarrier_wait(full0 + 8 * slot, parity);  // the copies landed, visible to these loads and to wgmma
    __syncthreads();
    if (copier && t + kS - 2 < n_k) moe_bulk_load<2, kStrips>(b, ring, full0, warp, t + kS - 2, load_slot);
    if (++load_slot == kS) load_slot = 0;
    const uint32_t stage = ring + static_cast<uint32_t>(slot) * Ring::kStageBytes;
    const uint32_t weights = stage + Ring::kRowBytes + tid * 16;
    const uint32_t scales = ring + Ring::kScalesAt + slot * Ring::kScaleBytes + warp * 32 + (q >> 1) * 16;
    moe_wgmma_k_tile<48>(da, a[0], stage, weights, scales, r);
    moe_wgmma_k_tile<48>(db, a[1], stage, weights + kStrips * 512, scales + kStrips * 32, r);
    if (++slot == kS) {
      slot = 0;
      parity ^= 1;
    }
  }
  wgmma_wait<0>();
  wgmma_fence_regs(da);
  wgmma_fence_regs(db);
}
#endif

// kHalf: the narrower loop's columns (a tile of at most that many tokens runs it). kTwoStrips (kHalf 48 only,
// MoeGemmParams::two_strips): that loop runs two strips a warp (moe_bulk_tile_two_strip_loop) and the odd column
// block's CTA of such a tile exits, as the cp.async kernel's 96/48 form; else one strip a warp at 48 columns.
template <int kN, int kHalf = kTileBulkHalfCols<kN>, bool kTwoStrips = false>
__global__ void __launch_bounds__(moe_wgmma_threads(kMoeWgmmaWarpgroups), (moe_wgmma_ctas_per_sm(kN, kMoeWgmmaWarpgroups)))
    moe_wgmma_bulk_tile_kernel(MoeGemmParams p, const __grid_constant__ MoeWgmmaMaps maps) {
#if MX_SM90A
  static_assert(kHalf == kTileBulkHalfCols<kN> || (kN == 96 && kHalf == 48), "64 or 48 columns of 96, 128 of 256");
  static_assert(!kTwoStrips || (kN == 96 && kHalf == 48), "two strips a warp at a 96-token tile's 48 columns");
  constexpr int kMaxStages = TileBulkRing<kN, kHalf>::kStages;  // the narrower loop's (one strip a warp: the most)
  static_assert(TileBulkRing<96, 48, true>::kStages <= TileBulkRing<96, 48>::kStages, "the two-strip ring's barriers");
  constexpr int kStrips = TileBulkRing<kN, kN>::kStrips, kCopies = 3;
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full_bar[kMaxStages];
  const uint32_t ring = smem_addr(smem_raw) + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const uint32_t full0 = smem_addr(full_bar);
  const int64_t strips = p.rows / 16;
  const int n_k = static_cast<int>(p.k / 64);
  const int n_cols = static_cast<int>((strips + kStrips - 1) / kStrips);
  if (static_cast<int>(blockIdx.y) >= *p.r.num_tiles) return;
  const int item = blockIdx.y * n_cols + static_cast<int>(blockIdx.x);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4;
  const WorkItem w = moe_work_item(p, item, n_cols, kStrips);
  // Two strips a warp: the even column block's CTA takes the odd one's strips, which therefore has nothing to do.
  const bool two_strips = kTwoStrips && w.n <= kHalf;
  if (two_strips && (blockIdx.x & 1)) return;
  if (tid == 0) {
    for (int s = 0; s < kMaxStages; ++s) mbarrier_init(full0 + 8 * s, kCopies);
    mbarrier_init_fence();
    tma_prefetch_map(&maps.weights);
    tma_prefetch_map(&maps.scales);
  }
  __syncthreads();
  // The epilogue's bias loaded now: its wait hides behind the k loop (ncu, session 21: the cp.async kernel's bias
  // load after the loop held 1.5% of T=512's first-GEMM samples).
  const int64_t my_strip = w.strip0 + warp;
  const StripBias bias = my_strip < strips ? moe_wgmma_strip_bias(p, w.e, my_strip, r) : StripBias{0.f, 0.f};
  if constexpr (kTwoStrips) {
    if (two_strips) {
      const StripBias bias2 =
          my_strip + kStrips < strips ? moe_wgmma_strip_bias(p, w.e, my_strip + kStrips, r) : StripBias{0.f, 0.f};
      float da[24], db[24];
#pragma unroll
      for (int i = 0; i < 24; ++i) da[i] = db[i] = 0.f;
      moe_bulk_tile_two_strip_loop(p, maps, w, da, db, n_k, ring, full0);
      const WorkItem cur = moe_work_item(p, item, n_cols, kStrips);
      if (my_strip < strips) moe_wgmma_store<48, true, true>(p, da, cur, my_strip, r, q, kN, bias);
      if (my_strip + kStrips < strips) moe_wgmma_store<48, true, true>(p, db, cur, my_strip + kStrips, r, q, kN, bias2);
      return;
    }
  }
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;
  if (w.n <= kHalf) {
    moe_bulk_tile_k_loop<kN, kHalf>(p, maps, w, acc, n_k, ring, full0);
  } else {
    moe_bulk_tile_k_loop<kN, kN>(p, maps, w, acc, n_k, ring, full0);
  }
  // The item's metadata read again (cached) rather than kept live through the k loop. The first GEMM writes h
  // tiled for the second one's bulk copies.
  const WorkItem cur = moe_work_item(p, item, n_cols, kStrips);
  if (my_strip < strips) moe_wgmma_store<kN, true, true>(p, acc, cur, my_strip, r, q, kN, bias);
#endif
}

template <int kN, int kWG, bool kPersistent, bool kRowRegs = false, int kRing = kMoeWgmmaStages,
          bool kHalfStages = false, int kNarrowCols = 0, int kMidCols = 0>
Status launch(const MoeGemmParams& p, const MoeWgmmaConfig& c, cudaStream_t stream) {
  auto* kernel = moe_wgmma_kernel<kN, kWG, kPersistent, kRowRegs, kRing, kHalfStages, kNarrowCols, kMidCols>;
  if (c.stages != kRing) return internal_error("MoE wgmma GEMM: the config's ring is not the kernel's");
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem_bytes)),
      "cudaFuncSetAttribute(moe wgmma smem)"));
  if (kNarrowCols != 0 && c.smem_bytes < moe_wgmma_narrow_smem_bytes(kNarrowCols, kRing))
    return internal_error("MoE wgmma GEMM: the config's shared memory is smaller than the narrow kernel's ring");
  const int64_t n_cols = ceil_div64(p.rows / 16, moe_wgmma_weight_rows(kWG) / 16);
  // Narrow: a CTA per even column block (two strips a warp: it takes the odd one's rows too).
  const int64_t grid_cols = kNarrowCols != 0 ? ceil_div64(n_cols, 2) : n_cols;
  // Persistent: one wave of resident CTAs, fewer when the routing cannot have that many items.
  const dim3 grid = kPersistent ? dim3(static_cast<unsigned>(std::min<int64_t>(
                                      n_cols * p.max_tiles, int64_t{c.sms} * ctas_per_sm<kN, kWG, kRing, kNarrowCols>())))
                                : dim3(static_cast<unsigned>(grid_cols), static_cast<unsigned>(p.max_tiles));
  if (c.pdl) return cuda_status(launch_pdl(kernel, grid, dim3(c.threads), c.smem_bytes, stream, p), "moe_wgmma_kernel");
  kernel<<<grid, c.threads, c.smem_bytes, stream>>>(p);
  return launch_status("moe_wgmma_kernel");
}

// The copy engine's views of one call's experts: [experts][strips][k tiles][512 B of fp4 or 32 B of scales], as bf16
// elements (bytes moved as they are), in boxes of box_strips strips; half_weights in boxes of half_box_strips (0: a
// copy of weights, for kernels that take no half boxes). The experts' count is not a parameter: any bound above it
// reads the same boxes (every expert index is < it).
Status encode_moe_fp4_maps(const MoeGemmParams& p, bool trim_rows, uint32_t box_strips, uint32_t half_box_strips,
                           MoeWgmmaMaps& maps) {
  constexpr uint64_t kExpertsBound = uint64_t{1} << 16;
  const uint64_t strips = static_cast<uint64_t>(p.rows / 16), n_k = static_cast<uint64_t>(p.k / 64);
  maps.trim_rows = trim_rows;
  const uint64_t w_dims[4] = {256, n_k, strips, kExpertsBound}, w_strides[3] = {512, n_k * 512, strips * n_k * 512};
  const uint64_t s_dims[4] = {16, n_k, strips, kExpertsBound}, s_strides[3] = {32, n_k * 32, strips * n_k * 32};
  const uint32_t w_box[4] = {256, 1, box_strips, 1}, s_box[4] = {16, 1, box_strips, 1};
  MX_RETURN_IF_ERROR(encode_tensor_map(&maps.weights, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, p.blocks, w_dims, w_strides,
                                       w_box, CU_TENSOR_MAP_SWIZZLE_NONE));
  MX_RETURN_IF_ERROR(encode_tensor_map(&maps.scales, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, p.scales, s_dims, s_strides,
                                       s_box, CU_TENSOR_MAP_SWIZZLE_NONE));
  if (half_box_strips == 0) {
    maps.half_weights = maps.weights;
    return Status::ok();
  }
  const uint32_t half_box[4] = {256, 1, half_box_strips, 1};
  return encode_tensor_map(&maps.half_weights, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, p.blocks, w_dims, w_strides,
                           half_box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

// The copy engine's 96-token tiles (at 64/96 columns with MoeGemmParams::mid_width, else 48/96) or 256-token tiles
// (moe_wgmma_bulk_tile_kernel): a CTA per (column block of 8 strips, tile), as the cp.async kernel's grid.
template <int kN>
Status launch_bulk_tiles(const MoeGemmParams& p, const MoeWgmmaConfig& c, bool trim_rows, cudaStream_t stream) {
  if (!c.enabled || c.warp_specialized || c.persistent || c.deep_ring != (kN == 96) ||
      c.threads != moe_wgmma_threads(c.warpgroups) || c.warpgroups != kMoeWgmmaWarpgroups)
    return internal_error("MoE wgmma GEMM (copy engine): 96- or 256-token tiles, a CTA per item");
  if (p.max_tiles == 0) return Status::ok();
  if (p.max_tiles > 65535) return unimplemented("MoE wgmma GEMM: too many token tiles in one call");
  constexpr int kStrips = TileBulkRing<kN, kN>::kStrips;
  // Boxes of the CTA's 8 strips (strips past the matrix read as zeros); no half boxes.
  MoeWgmmaMaps maps;
  MX_RETURN_IF_ERROR(encode_moe_fp4_maps(p, trim_rows, kStrips, 0, maps));
  auto* kernel = kN == 96 && !p.mid_width ? (p.two_strips ? moe_wgmma_bulk_tile_kernel<96, 48, true>
                                                            : moe_wgmma_bulk_tile_kernel<96, 48>)
                                          : moe_wgmma_bulk_tile_kernel<kN>;
  constexpr int64_t kSmem = kTileBulkSmemBytes<kN>;
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)),
      "cudaFuncSetAttribute(moe wgmma bulk tile smem)"));
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.rows / 16, kStrips)), static_cast<unsigned>(p.max_tiles));
  if (c.pdl)
    return cuda_status(launch_pdl(kernel, grid, dim3(c.threads), kSmem, stream, p, maps), "moe_wgmma_bulk_tile_kernel");
  kernel<<<grid, c.threads, kSmem, stream>>>(p, maps);
  return launch_status("moe_wgmma_bulk_tile_kernel");
}

}  // namespace

Status launch_moe_permute_k(const uint16_t* in, uint16_t* out, int64_t rows, int64_t k, cudaStream_t stream) {
  if (k % 64 != 0) return internal_error("MoE k permutation: k % 64 must be 0");
  const int64_t items = rows * k / 4;
  if (items == 0) return Status::ok();
  moe_permute_k_kernel<<<static_cast<unsigned>(ceil_div64(items, 256)), 256, 0, stream>>>(in, out, rows, k);
  return launch_status("moe_permute_k_kernel");
}

Status launch_moe_wgmma_bulk_gemm(const MoeGemmParams& p, const MoeWgmmaConfig& c, bool warp_release, bool pairs,
                                  bool trim_rows, cudaStream_t stream) {
  if (p.rows % 16 != 0 || p.k % 64 != 0) return internal_error("MoE wgmma GEMM: rows % 16 and k % 64 must be 0");
  if (c.tile_tokens == 96 || c.tile_tokens == 256) {
    if (warp_release || pairs)
      return unimplemented("MoE wgmma GEMM (copy engine): 96- and 256-token tiles take a CTA barrier per k tile, "
                           "unpaired");
    return c.tile_tokens == 96 ? launch_bulk_tiles<96>(p, c, trim_rows, stream)
                               : launch_bulk_tiles<256>(p, c, trim_rows, stream);
  }
  if (!c.enabled || c.warp_specialized || (c.tile_tokens != 16 && c.tile_tokens != 32) || !c.deep_ring ||
      c.threads != moe_wgmma_threads(c.warpgroups) || c.warpgroups != kMoeWgmmaWarpgroups)
    return internal_error("MoE wgmma GEMM (copy engine): a 16- or 32-token tiles' config");
  if ((warp_release || pairs) && c.tile_tokens != 16)
    return unimplemented("MoE wgmma GEMM (copy engine): warps' releases and paired tiles at 16 tokens");
  if (warp_release && pairs)
    return unimplemented("MoE wgmma GEMM (copy engine): paired tiles take a CTA barrier per k tile, not warps' releases");
  if (p.max_tiles == 0) return Status::ok();
  if (p.max_tiles > 65535) return unimplemented("MoE wgmma GEMM: too many token tiles in one call");
  // Boxes of 16 strips, half boxes of 8.
  MoeWgmmaMaps maps;
  MX_RETURN_IF_ERROR(encode_moe_fp4_maps(p, trim_rows, 16, 8, maps));
  auto* kernel = c.tile_tokens == 32 ? moe_wgmma_bulk_kernel<32, false>
                 : pairs              ? moe_wgmma_bulk_kernel<16, false, true>
                 : warp_release       ? moe_wgmma_bulk_kernel<16, true>
                                      : moe_wgmma_bulk_kernel<16, false>;
  const int64_t smem = c.tile_tokens == 32 ? BulkRing<32>::kSmemBytes : BulkRing<16>::kSmemBytes;
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
      "cudaFuncSetAttribute(moe wgmma bulk smem)"));
  const int64_t n_cols = ceil_div64(p.rows / 16, moe_wgmma_weight_rows(kMoeWgmmaWarpgroups) / 16);
  const dim3 grid(static_cast<unsigned>(ceil_div64(n_cols, 2)), static_cast<unsigned>(p.max_tiles));
  if (c.pdl)
    return cuda_status(launch_pdl(kernel, grid, dim3(c.threads), smem, stream, p, maps), "moe_wgmma_bulk_kernel");
  kernel<<<grid, c.threads, smem, stream>>>(p, maps);
  return launch_status("moe_wgmma_bulk_kernel");
}

Status launch_moe_wgmma_gemm(const MoeGemmParams& p, const MoeWgmmaConfig& c, cudaStream_t stream) {
  if (c.warp_specialized) return launch_moe_wgmma_ws_gemm(p, c, stream);
  if (p.rows % 16 != 0 || p.k % 64 != 0) return internal_error("MoE wgmma GEMM: rows % 16 and k % 64 must be 0");
  const bool narrow = c.tile_tokens == 16 || c.tile_tokens == 32;
  if (!c.enabled || c.threads != moe_wgmma_threads(c.warpgroups) ||
      c.deep_ring != (c.tile_tokens == 96 || narrow))
    return internal_error("MoE wgmma GEMM: config does not fit this GPU");
  if (p.max_tiles == 0) return Status::ok();
  if (p.max_tiles > 65535) return unimplemented("MoE wgmma GEMM: too many token tiles in one call");
  if (c.persistent && c.sms <= 0) return internal_error("MoE wgmma GEMM: a persistent grid needs the SM count");
  if (c.pdl && !c.deep_ring)
    return internal_error("MoE wgmma GEMM: only the deep ring's kernel waits for its programmatic predecessor");
  switch (c.tile_tokens * 100 + c.warpgroups * 10 + (c.persistent ? 1 : 0)) {
    case 1620: return launch<96, 2, false, true, moe_wgmma_narrow_stages(16), true, 16>(p, c, stream);
    case 3220: return launch<96, 2, false, true, moe_wgmma_narrow_stages(32), true, 32>(p, c, stream);
    case 9620:
      return p.mid_width ? launch<96, 2, false, true, kMoeWgmmaDeepStages, true, 0, 64>(p, c, stream)
                         : launch<96, 2, false, true, kMoeWgmmaDeepStages, true>(p, c, stream);
    case 12820: return launch<128, 2, false>(p, c, stream);
    case 25620: return launch<256, 2, false>(p, c, stream);
    case 25621: return launch<256, 2, true>(p, c, stream);
    default:
      return internal_error(
          "MoE wgmma GEMM: tiles of 16, 32, 96, 128 or 256 tokens at 2 warpgroups (256: persistent or not)");
  }
}

}  // namespace mx::cuda
