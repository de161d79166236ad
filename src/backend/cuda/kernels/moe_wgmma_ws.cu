// MXFP4 experts for many tokens per expert on Hopper (sm_90a), warp-specialized, every load by the copy engine:
// the same GEMM as moe_wgmma.cu (weights as wgmma's M side decoded from the swap-AB layout into A registers,
// expert-sorted tokens as N in shared memory with the 128-byte swizzle, the same k order, epilogues and bits),
// with the work split by role instead of every warp doing everything.
//
// Its input is tiled (moe_wgmma_ws.h): routing tile i's row j is padded row i x kN + j of max_tiles x kN, stored
// k tile by k tile as the swizzled image wgmma reads from shared memory (launch_moe_gather_tiled writes x so,
// with the rows gathered by token and k permuted; the first GEMM's epilogue writes h so). A tile's k tile is then one
// contiguous run of rows x 128 bytes, and the CTA's fp4 strips (512 B) and scales (32 B) of a k tile are
// contiguous in the swap-AB layout: a k tile is 17 bulk copies, no per-row address arithmetic anywhere.
//
// - warp 0, the producer (its warpgroup keeps 24 registers; warps 1-3 leave at once): lane 0 waits until the
//   k tile's ring slot is empty and arms the slot's full barrier with the bytes to come; then lane 0 copies the
//   tile's activation rows, lanes 1-8 the fp4 strips and lanes 9-16 their scales (strips past the matrix are
//   not copied: their rows' results are never stored, and wgmma's rows are independent).
// - warpgroups 1 and 2 (240 registers): 64 weight rows each (warp w owns strip strip0 + w), sharing the B
//   tile. Per k tile: wait for the slot's full barrier, decode the warp's fp4 into A registers, four wgmma,
//   and release the previous tile's slot once its MMAs are done (two wgmma groups in flight, as before).
//   No CTA-wide barrier: each warpgroup runs at its own pace, so one's decode overlaps the other's MMAs.
//
// One CTA per SM on a persistent grid: every role walks the same items (tile-major, column blocks fastest),
// the ring running on across items, so the producer loads the next item while the MMA warpgroups finish
// this one and run its epilogue. An item's MMAs run at kN / 2 token columns when its tokens fit (an expert's
// last, partly filled tile), else kN; only its rows rounded up to 8 are copied. The B columns past a tile's
// tokens hold whatever the padded rows or the slot held before: wgmma's columns are independent and the
// epilogue stores only the tile's tokens, so a token's bits do not depend on them nor on the width (the GPU
// tests check it against the same tokens alone).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/moe_route_tile.cuh"
#include "backend/cuda/kernels/moe_tile_order.h"
#include "backend/cuda/kernels/moe_wgmma_parts.cuh"
#include "backend/cuda/kernels/moe_wgmma_ws.h"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {
namespace {

constexpr int kProducerThreads = 128;
constexpr int kMmaWarps = 8;        // two warpgroups, a 16-row strip each warp
constexpr int kStrips = kMmaWarps;  // 128 weight rows per item
// Registers a thread after setmaxnreg: what the producer gives back, the MMA warpgroups take (the sum over the
// three warpgroups stays the 3 x 168 the CTA was launched with). 240 leave the 256-column MMAs unserialized
// next to the half-width ones (232 did not: ptxas C7512); a producer that only issues bulk copies needs few.
constexpr int kProducerRegisters = 24;
constexpr int kMmaRegisters = 240;
static_assert(kProducerRegisters + 2 * kMmaRegisters == 3 * 168, "the launch's register pool");
static_assert(kProducerThreads + 32 * kMmaWarps == kMoeWgmmaWsThreads, "one producer and two MMA warpgroups");
// Bytes of one strip's k tile: 512 of fp4, 32 of scales.
constexpr uint32_t kStripWeightBytes = 512, kStripScaleBytes = 32;
static_assert(kStripWeightBytes == 16 * 64 / 2 && kStripScaleBytes == 16 * 64 / 32, "16 rows x 64 k of e2m1, e8m0 per 32");

// Token columns of an item's MMAs: kN / 2 when its n tokens fit, else kN. (A third width, 64 of 256, made
// ptxas serialize the 256-column wgmma even at 240 registers.)
template <int kN>
__device__ __forceinline__ int columns_for(int n) {
  return n <= kN / 2 ? kN / 2 : kN;
}

template <int N>
struct Columns {
  static constexpr int value = N;
};

template <int kN>
__global__ void __launch_bounds__(kMoeWgmmaWsThreads, 1) moe_wgmma_ws_kernel(MoeGemmParams p, int stages) {
#if MX_SM90A
  constexpr int kStageBytes = static_cast<int>(moe_wgmma_stage_bytes(kN, 2));
  // Stage s of the ring: the B tile (kN rows of 128 bytes, swizzled), the CTA's packed fp4 (512 B per strip),
  // then its scales (32 B per strip).
  constexpr int kWeightsAt = kN * 128, kScalesAt = kWeightsAt + kStrips * kStripWeightBytes;
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t full_bar[kMoeWgmmaWsMaxStages], empty_bar[kMoeWgmmaWsMaxStages];
  // The swizzle pattern repeats every 1024 bytes; B tiles start on that boundary.
  const uint32_t ring = smem_addr(smem_raw) + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const uint32_t full0 = smem_addr(full_bar), empty0 = smem_addr(empty_bar);

  const int64_t strips = p.rows / 16;
  const int n_k = static_cast<int>(p.k / 64);
  const int n_cols = static_cast<int>((strips + kStrips - 1) / kStrips);
  const int n_items = *p.r.num_tiles * n_cols;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < stages; ++s) {
      mbarrier_init(full0 + 8 * s, 1);          // the producer's arrival with the bytes to come
      mbarrier_init(empty0 + 8 * s, kMmaWarps);  // each MMA warp, once its MMAs left the slot
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (static_cast<int>(blockIdx.x) >= n_items) return;

  if (tid < kProducerThreads) {
    setmaxnreg_dec<kProducerRegisters>();
    if (tid >= 32) return;
    const int lane = tid;
    int slot = 0;
    uint32_t parity = 1;  // a fresh ring is empty
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
      const WorkItem w = moe_work_item(p, item, n_cols, kStrips);
      const int rows = min(kN, (w.n + 7) & ~7);
      const int valid_strips = static_cast<int>(strips - w.strip0 < kStrips ? strips - w.strip0 : kStrips);
      const uint32_t bytes = rows * 128 + valid_strips * (kStripWeightBytes + kStripScaleBytes);
      // This lane's copy per k tile: source at k tile 0, its advance per k tile, place in the stage, size.
      const uint8_t* src = nullptr;
      int64_t step = 0;
      uint32_t dst = 0, size = 0;
      if (lane == 0) {
        src = reinterpret_cast<const uint8_t*>(p.in) + static_cast<int64_t>(w.tile) * kN * 128;
        step = p.max_tiles * kN * 128;  // one k tile of every padded row
        size = rows * 128;
      } else if (lane <= 2 * kStrips) {
        const int s = (lane - 1) % kStrips;
        const bool scales = lane > kStrips;
        const int64_t strip_tiles = (w.e * strips + w.strip0 + s) * n_k;
        src = scales ? p.scales + strip_tiles * kStripScaleBytes : p.blocks + strip_tiles * kStripWeightBytes;
        step = scales ? kStripScaleBytes : kStripWeightBytes;
        dst = scales ? kScalesAt + s * kStripScaleBytes : kWeightsAt + s * kStripWeightBytes;
        size = s < valid_strips ? step : 0;
      }
      for (int t = 0; t < n_k; ++t) {
        const uint32_t full = full0 + 8 * slot;
        if (lane == 0) {
          mbarrier_wait(empty0 + 8 * slot, parity);
          mbarrier_arrive_expect_tx(full, bytes);
        }
        __syncwarp();  // no lane copies into the slot before it is empty
        if (size != 0) bulk_copy(ring + static_cast<uint32_t>(slot) * kStageBytes + dst, src + t * step, size, full);
        if (++slot == stages) {
          slot = 0;
          parity ^= 1;
        }
      }
    }
    return;
  }

  setmaxnreg_inc<kMmaRegisters>();
  const int mt = tid - kProducerThreads, warp = mt / 32, lane = mt % 32, r = lane / 4, q = lane % 4;
  int slot = 0, held = -1;  // held: the slot of the k tile whose MMAs may still be running
  uint32_t parity = 0;

  // One item at `columns` token columns, its accumulators private to the width (one array sized for the widest
  // kept live through the narrow loops made ptxas serialize the wgmma, C7512). The k loop: tile t's decode
  // overlaps tile t - 1's MMAs (wgmma.wait_group 1; the A registers alternate between two sets, the loop
  // unrolled by 2 to keep their indices static), and tile t - 1's slot goes back to the producer as soon as
  // those MMAs are done. Then the epilogue, with the item's metadata read again rather than kept live.
  auto run_item = [&](auto columns, int item) {
    constexpr int kCols = decltype(columns)::value;
    float d[kCols / 2];
#pragma unroll
    for (int i = 0; i < kCols / 2; ++i) d[i] = 0.f;
    auto step = [&](uint32_t(&at)[4][4]) {
      // The copy engine's writes, completed on the barrier, are visible to this thread's loads and to wgmma.
      mbarrier_wait(full0 + 8 * slot, parity);
      const uint32_t stage = ring + static_cast<uint32_t>(slot) * kStageBytes;
      moe_wgmma_k_tile<kCols>(d, at, stage, stage + kWeightsAt + mt * 16,
                              stage + kScalesAt + warp * kStripScaleBytes + (q >> 1) * 16, r);
      // The previous step's group is done: its slot goes back to the producer.
      if (held >= 0 && lane == 0) mbarrier_arrive(empty0 + 8 * held);
      held = slot;
      if (++slot == stages) {
        slot = 0;
        parity ^= 1;
      }
    };
    moe_wgmma_k_loop(d, n_k, step);
    if (lane == 0) mbarrier_arrive(empty0 + 8 * held);
    held = -1;
    const WorkItem w = moe_work_item(p, item, n_cols, kStrips);
    const int64_t my_strip = w.strip0 + warp;
    if (my_strip < strips) moe_wgmma_store<kCols, true>(p, d, w, my_strip, r, q, kN);  // else a strip past the matrix
  };

  for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
    if (columns_for<kN>(p.r.tile_rows[item / n_cols]) == kN / 2) {
      run_item(Columns<kN / 2>{}, item);
    } else {
      run_item(Columns<kN>{}, item);
    }
  }
#endif
}

// Tiled input of the first GEMM (see the header comment): thread (k tile t = blockIdx.y, padded row P, 16-byte
// chunk position c) writes chunk c of row P's k tile t from token sorted_slots[...] / top_k's 64 values of k tile t,
// permuted into the logical k order (logical_k): in 32-bit words (bf16 pairs), logical chunk lc holds physical words
// lc, 8 + lc, 16 + lc, 24 + lc (physical k 16q + 4kk + 2h + {0, 1} is logical 16kk + 8h + 2q + {0, 1}: chunk
// 2kk + h, word q), and sits at chunk position lc ^ (P % 8). Consecutive threads write consecutive 16 bytes of a
// plane (a thread per row and k tile, writing its row's 8 chunks, stored 16 bytes 400 KB apart from its neighbours'
// at gpt-oss-120b's 16-token tiles: ncu measured 13 us for 256 tokens x 4, session 18). Padded rows past a tile's
// tokens are left as they are.
// Chunk c of padded row P's k tile t, from `token`'s row of x (the store described above).
__device__ __forceinline__ void gather_tiled_chunk(const uint16_t* x, int64_t token, int64_t k, int64_t t, int64_t P,
                                                   int c, uint16_t* out, int64_t tiled_rows) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(x + token * k + t * 64);
  const int lc = c ^ static_cast<int>(P & 7);
  reinterpret_cast<uint4*>(out + (t * tiled_rows + P) * 64)[c] =
      make_uint4(__ldg(src + lc), __ldg(src + 8 + lc), __ldg(src + 16 + lc), __ldg(src + 24 + lc));
}

__global__ void moe_gather_tiled_kernel(const uint16_t* x, MoeRouting r, uint16_t* out, int64_t tiled_rows,
                                        int tile_tokens, int64_t k, int top_k) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, t = blockIdx.y;
  const int64_t P = i / 8;
  const int c = static_cast<int>(i % 8);
  if (P >= tiled_rows) return;
  const int tile = static_cast<int>(P / tile_tokens), j = static_cast<int>(P % tile_tokens);
  if (tile >= *r.num_tiles || j >= r.tile_rows[tile]) return;
  gather_tiled_chunk(x, r.sorted_slots[r.tile_start[tile] + j] / top_k, k, t, P, c, out, tiled_rows);
}

// The routing and the tiled gather in one launch of many CTAs (launch_moe_route_gather_tiled), or the routing and
// the k permutation of x (launch_moe_route_permute, !kTiled). CTA b owns slots [b * per_cta, + per_cta): every CTA
// counts all the step's ids (per expert, and those before its slots), scans them as moe_routing_kernel does
// (expert_run_scan), places its own slots (the same stable order: an expert's slots by slot index) and, kTiled,
// copies their token rows into the tiled input, 32 slots' rows at a time; otherwise the grid permutes all of x, a
// 16-byte chunk of logical k a thread at a time. CTA 0 also writes the per-expert offsets and the tiles.
// Replaces a one-CTA routing kernel (6 us for 1,024 slots, session 18's ncu; it scatters 1,024 slots at a time
// between CTA barriers) and the gather's grid of a thread per padded row, k tile and chunk, whose every thread
// walked the metadata chain (num_tiles, tile_rows, tile_start, sorted_slots) before its one copy, or the permuting
// copy. Launched as a programmatic dependent of the router; it never triggers its dependents early: the GEMMs after
// it read the routing before their wait.
// The tiled form: kRouteGatherSlots slots a CTA up to kRouteGatherSmallSlots (the narrow tiles' batched decode), then
// as the permuting form: a grid of at most kRoutePermuteCtas CTAs (the slots per CTA grow with the step: each CTA's
// count of all the ids is then what grows), up to kRoutePermuteMaxSlots (a 16,384-token chunk at top-4).
constexpr int kRouteGatherThreads = 256, kRouteGatherSlots = 4, kRouteGatherMaxExperts = 256;
constexpr int64_t kRouteGatherSmallSlots = 4096;
constexpr int kRoutePermuteCtas = 256;
constexpr int64_t kRoutePermuteMaxSlots = 65536;

// out row `row`'s 16-byte chunk lc of k tile t: x's physical words lc, 8 + lc, 16 + lc, 24 + lc of that k tile
// (the logical k order, gather_tiled_chunk's without the swizzle: launch_moe_permute_k's bits).
__device__ __forceinline__ uint4 permute_chunk_load(const uint16_t* x, int64_t c) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(x) + (c / 8) * 32;  // c / 8: row * n_k + t
  const int lc = static_cast<int>(c % 8);
  return make_uint4(__ldg(src + lc), __ldg(src + 8 + lc), __ldg(src + 16 + lc), __ldg(src + 24 + lc));
}

// wide_over > 0: the tiles of more than wide_over tokens are numbered first, then the others, each class in expert
// order (launch_moe_route_permute_wide_first, launch_moe_route_gather_tiled_wide_first): CTA 0 writes them so, and
// the tiled form places each slot's row in its tile's numbered place.
template <bool kTiled>
__global__ void __launch_bounds__(kRouteGatherThreads)
    moe_route_gather_kernel(MoeRoutingParams p, const uint16_t* x, uint16_t* out, int64_t rows, int64_t k, int top_k,
                            int per_cta, int wide_over) {
  __shared__ int counts[kRouteGatherMaxExperts], before[kRouteGatherMaxExperts];
  __shared__ int offset[kRouteGatherMaxExperts], tile_base[kRouteGatherMaxExperts];
  __shared__ int wide_base[kRouteGatherMaxExperts];
  __shared__ int wide_total;
  __shared__ int row_token[kTiled ? 32 : 1];
  __shared__ int64_t row_at[kTiled ? 32 : 1];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int experts = static_cast<int>(p.experts), bm = static_cast<int>(p.tile_tokens);
  const int slots = static_cast<int>(p.slots), s0 = static_cast<int>(blockIdx.x) * per_cta;
  const int mine = max(0, min(per_cta, slots - s0));
  for (int e = tid; e < experts; e += kRouteGatherThreads) counts[e] = before[e] = 0;
  __syncthreads();
  pdl_wait();  // the ids and x come from the router and the norm before it
  auto expert_of = [&](int e) {
    return e < 0 || e >= experts ? 0 : e;  // ids come from our router; never index out of bounds
  };
  // Eight ids a thread in flight: a CTA of the permuting form counts up to 64K of them.
  constexpr int kUnroll = 8;
  for (int base = tid; base < slots; base += kUnroll * kRouteGatherThreads) {
    int id[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRouteGatherThreads;
      id[u] = i < slots ? p.topk_ids[i] : 0;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRouteGatherThreads;
      if (i >= slots) break;
      const int e = expert_of(id[u]);
      atomicAdd(&counts[e], 1);
      if (i < s0) atomicAdd(&before[e], 1);
    }
  }
  __syncthreads();
  const bool lead = blockIdx.x == 0;
  if (warp == 0) {  // the exclusive scans of moe_routing_kernel
    const ExpertRun run = expert_run_scan(counts, experts, bm);
    int off = run.offset, tiles = run.tile;
    for (int e = run.e0; e < run.e1; ++e) {
      if (lead) p.r.offsets[e] = off;
      offset[e] = off;
      tile_base[e] = tiles;
      off += counts[e];
      tiles += (counts[e] + bm - 1) / bm;
    }
    if (lead && lane == 31) {
      p.r.offsets[experts] = run.slots_through;
      *p.r.num_tiles = run.tiles_through;
    }
    // Wide tiles first: an expert's wide tiles (every full one, and a last one of more than wide_over tokens) are
    // scanned over the experts as its tiles are; its narrow last tile goes after every wide one, at the narrow tiles
    // before it (its tiles before it minus the wide ones). Every CTA of the tiled form places rows by it.
    if ((kTiled || lead) && wide_over > 0) {
      auto wide_tiles = [&](int n) { return n / bm + (n % bm > wide_over ? 1 : 0); };
      int run_wide = 0;
      for (int e = run.e0; e < run.e1; ++e) run_wide += wide_tiles(counts[e]);
      int through = run_wide;
      for (int d = 1; d < 32; d <<= 1) {
        const int w = __shfl_up_sync(0xffffffffu, through, d);
        if (lane >= d) through += w;
      }
      int wide = through - run_wide;
      for (int e = run.e0; e < run.e1; ++e) {
        wide_base[e] = wide;
        wide += wide_tiles(counts[e]);
      }
      if (lane == 31) wide_total = through;
    }
  }
  __syncthreads();
  // Expert e's tile j's number.
  auto tile_at = [&](int e, int j) {
    const int n = counts[e], base = tile_base[e];
    if (wide_over <= 0) return base + j;
    const bool narrow = (j + 1) * bm > n && n - j * bm <= wide_over;
    return narrow ? wide_total + base - wide_base[e] : wide_base[e] + j;
  };
  if (lead) {
    for (int e = tid; e < experts; e += kRouteGatherThreads) {
      const int n = counts[e], off = offset[e];
      for (int j = 0; j * bm < n; ++j) {
        const int at = tile_at(e, j);
        p.r.tile_expert[at] = e;
        p.r.tile_start[at] = off + j * bm;
        p.r.tile_rows[at] = min(bm, n - j * bm);
      }
    }
  }
  const int n_k = static_cast<int>(k / 64);
  // This CTA's slots, 32 at a time: warp 0 places them (a lane each, ranked among their expert's by slot index);
  // the tiled form's whole CTA then copies those 32 slots' rows before the next 32 reuse row_token and row_at.
  for (int c = 0; c < mine; c += 32) {
    if (warp == 0) {
      const bool valid = c + lane < mine;
      const int i = s0 + c + lane, e = valid ? expert_of(p.topk_ids[i]) : -1 - lane;
      const unsigned peers = __match_any_sync(0xffffffffu, e), lower = peers & ((1u << lane) - 1u);
      if (valid) {
        const int local = before[e] + __popc(lower), dst = offset[e] + local;
        p.r.sorted_slots[dst] = i;
        p.r.slot_pos[i] = dst;
        if constexpr (kTiled) {
          row_token[lane] = i / top_k;
          row_at[lane] = static_cast<int64_t>(tile_at(e, local / bm)) * bm + local % bm;
        }
      }
      __syncwarp();
      if (valid && lower == 0) before[e] += __popc(peers);  // the next 32 slots' view
      __syncwarp();
    }
    if constexpr (kTiled) {
      __syncthreads();
      // The rows: chunk c of k tile t of row l at item (l * n_k + t) * 8 + c, four items a thread in flight.
      const int items = min(32, mine - c) * n_k * 8;
      const int64_t tiled_rows = p.max_tiles * p.tile_tokens;
      for (int base = tid; base < items; base += 4 * kRouteGatherThreads) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int item = base + u * kRouteGatherThreads;
          if (item >= items) break;
          const int l = item / (n_k * 8), t = item / 8 % n_k;
          gather_tiled_chunk(x, row_token[l], k, t, row_at[l], item % 8, out, tiled_rows);
        }
      }
      __syncthreads();  // row_token and row_at free for the next 32
    }
  }
  if constexpr (!kTiled) {
    // All of x permuted, chunk c (row * n_k + t) * 8 + lc of the grid's, four chunks a thread in flight.
    const int64_t chunks = rows * n_k * 8, stride = static_cast<int64_t>(gridDim.x) * kRouteGatherThreads;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRouteGatherThreads + tid; base < chunks;
         base += 4 * stride) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (base + u * stride < chunks) v[u] = permute_chunk_load(x, base + u * stride);
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (base + u * stride < chunks) reinterpret_cast<uint4*>(out)[base + u * stride] = v[u];
    }
  }
}

template <int kN>
Status launch(const MoeGemmParams& p, const MoeWgmmaConfig& c, cudaStream_t stream) {
  auto* kernel = moe_wgmma_ws_kernel<kN>;
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem_bytes)),
      "cudaFuncSetAttribute(moe wgmma ws smem)"));
  // One wave of CTAs (one per SM), fewer when the routing cannot have that many items.
  const int64_t n_cols = ceil_div64(p.rows / 16, kStrips);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(n_cols * p.max_tiles, c.sms)));
  kernel<<<grid, kMoeWgmmaWsThreads, c.smem_bytes, stream>>>(p, c.stages);
  return launch_status("moe_wgmma_ws_kernel");
}

}  // namespace

Status launch_moe_gather_tiled(const uint16_t* x, const MoeRouting& r, uint16_t* out, int64_t max_tiles,
                               int tile_tokens, int64_t k, int64_t top_k, cudaStream_t stream) {
  if (k % 64 != 0 || tile_tokens % 8 != 0 || tile_tokens <= 0 || top_k <= 0)
    return internal_error("MoE tiled gather: k % 64 and tile_tokens % 8 must be 0, top_k > 0");
  const int64_t tiled_rows = max_tiles * tile_tokens;
  if (tiled_rows == 0) return Status::ok();
  if (k / 64 > 65535) return unimplemented("MoE tiled gather: at most 65535 k tiles");
  const dim3 grid(static_cast<unsigned>(ceil_div64(tiled_rows * 8, 256)), static_cast<unsigned>(k / 64));
  moe_gather_tiled_kernel<<<grid, 256, 0, stream>>>(x, r, out, tiled_rows, tile_tokens, k, static_cast<int>(top_k));
  return launch_status("moe_gather_tiled_kernel");
}

bool moe_route_gather_fits(int64_t slots, int64_t experts) {
  return slots <= kRoutePermuteMaxSlots && experts <= kRouteGatherMaxExperts;
}

Status launch_moe_route_gather_tiled(const MoeRoutingParams& p, const uint16_t* x, uint16_t* out, int64_t k,
                                     int64_t top_k, cudaStream_t stream) {
  return launch_moe_route_gather_tiled_wide_first(p, x, out, k, top_k, 0, stream);
}

Status launch_moe_route_gather_tiled_wide_first(const MoeRoutingParams& p, const uint16_t* x, uint16_t* out, int64_t k,
                                                int64_t top_k, int wide_over, cudaStream_t stream) {
  if (k % 64 != 0 || p.tile_tokens % 8 != 0 || p.tile_tokens <= 0 || top_k <= 0)
    return internal_error("MoE routing and tiled gather: k % 64 and tile_tokens % 8 must be 0, top_k > 0");
  if (wide_over < 0 || wide_over >= p.tile_tokens)
    return internal_error("MoE routing and tiled gather: wide tiles hold more than 0 to tile_tokens - 1 tokens");
  if (!moe_route_gather_fits(p.slots, p.experts))
    return unimplemented("MoE routing and tiled gather: at most 65536 slots and 256 experts");
  if (p.slots == 0) return Status::ok();
  const int64_t per_cta =
      p.slots <= kRouteGatherSmallSlots ? kRouteGatherSlots : ceil_div64(p.slots, kRoutePermuteCtas);
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.slots, per_cta)));
  return cuda_status(launch_pdl(moe_route_gather_kernel<true>, grid, dim3(kRouteGatherThreads), 0, stream, p, x, out,
                                int64_t{0}, k, static_cast<int>(top_k), static_cast<int>(per_cta), wide_over),
                     "moe_route_gather_kernel");
}

bool moe_route_permute_fits(int64_t slots, int64_t experts) {
  return slots <= kRoutePermuteMaxSlots && experts <= kRouteGatherMaxExperts;
}

Status launch_moe_route_permute(const MoeRoutingParams& p, const uint16_t* x, uint16_t* out, int64_t rows, int64_t k,
                                int64_t top_k, cudaStream_t stream) {
  return launch_moe_route_permute_wide_first(p, x, out, rows, k, top_k, 0, stream);
}

Status launch_moe_route_permute_wide_first(const MoeRoutingParams& p, const uint16_t* x, uint16_t* out, int64_t rows,
                                           int64_t k, int64_t top_k, int wide_over, cudaStream_t stream) {
  if (k % 64 != 0 || p.tile_tokens <= 0 || top_k <= 0 || rows * top_k != p.slots)
    return internal_error("MoE routing and k permutation: k % 64 must be 0, tile_tokens > 0, slots = rows x top_k");
  if (wide_over < 0 || wide_over >= p.tile_tokens)
    return internal_error("MoE routing and k permutation: wide tiles hold more than 0 to tile_tokens - 1 tokens");
  if (!moe_route_permute_fits(p.slots, p.experts))
    return unimplemented("MoE routing and k permutation: at most 65536 slots and 256 experts");
  if (p.slots == 0) return Status::ok();
  const int64_t per_cta = std::max<int64_t>(kRouteGatherSlots, ceil_div64(p.slots, kRoutePermuteCtas));
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.slots, per_cta)));
  return cuda_status(launch_pdl(moe_route_gather_kernel<false>, grid, dim3(kRouteGatherThreads), 0, stream, p, x, out,
                                rows, k, static_cast<int>(top_k), static_cast<int>(per_cta), wide_over),
                     "moe_route_gather_kernel (permute)");
}

Status launch_moe_wgmma_ws_gemm(const MoeGemmParams& p, const MoeWgmmaConfig& c, cudaStream_t stream) {
  if (p.rows % 16 != 0 || p.k % 64 != 0) return internal_error("MoE wgmma GEMM: rows % 16 and k % 64 must be 0");
  if (!c.enabled || !c.warp_specialized || c.threads != kMoeWgmmaWsThreads || c.warpgroups != 2 || c.stages < 3 ||
      c.stages > kMoeWgmmaWsMaxStages || c.sms <= 0)
    return internal_error("MoE wgmma GEMM (warp-specialized): config does not fit this GPU");
  if (p.max_tiles == 0) return Status::ok();
  if (p.max_tiles * ceil_div64(p.rows / 16, kStrips) > INT32_MAX)
    return unimplemented("MoE wgmma GEMM (warp-specialized): too many work items in one call");
  switch (c.tile_tokens) {
    case 128: return launch<128>(p, c, stream);
    case 256: return launch<256>(p, c, stream);
    default: return internal_error("MoE wgmma GEMM (warp-specialized): tiles of 128 or 256 tokens");
  }
}

}  // namespace mx::cuda
