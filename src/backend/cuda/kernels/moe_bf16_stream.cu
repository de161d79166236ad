// bf16 GeGLU experts at batched decode (sm_90+): launch_moe_routing's tiles of 8, 16 or 32 tokens of one
// expert, streamed by persistent CTAs. Why: the bulk-copy kernel (moe_bf16_bulk.cu) runs one CTA per
// (tile, 16-row strip), so every CTA fills its ring, waits for it and drains it; the second GEMM's strips
// are only 3 stages long (k 704), and at 64 tokens it moved 2.56 TB/s against the first GEMM's 3.68 (ncu,
// H200), with a third of its grid rows empty (the grid is sized for the most tiles a routing can make).
// Here a CTA walks the work items i = blockIdx.x, + gridDim.x, ... (item i: tile i / strips, strip i %
// strips) until the device-side tile count, and one ring of stages runs through all its items: item n + 1's
// weights are in flight while item n is summed and stored, and no CTA is launched for an empty tile.
//
// A CTA: 4 consumer warps and a producer warp. The producer's lanes 0-15 copy the stage's 16 weight rows
// (cp.async.bulk, one per row, counted on the slot's `full` barrier) once the slot's `empty` barrier says the 4
// consumer warps are done with it, after a proxy fence (fence_ring_refill: the consumers read the slot through the
// generic proxy, the copies write it through the async one). A stage is 256 k; consumer warp w multiplies its 64-wide
// chunk w with the same fragments and k order as the bulk kernel (moe_bf16_decode.cuh), for each 8-token group of the
// tile (a tile of 32 tokens is 4 mma B operands against one A fragment: an expert's weights are read once for up to 32
// of its tokens, where 8-token tiles read them once per 8). At an item's end the warps' partials go through shared
// memory and warp g sums group g's in warp order 0-3, as the bulk kernel does: a token's result is bitwise the bulk
// kernel's, whatever the tile size and the batch.
// The producer loads the next item's expert an item ahead, the consumers the next item's routing at the start
// of an item and its token rows before the epilogue, so those dependent loads do not stall the ring. The
// second GEMM's producer copies weights before the PDL wait (weights and routing precede the first GEMM);
// its consumers wait before reading h. Tiles of up to 16 tokens run an instance with 2 groups of registers
// (72 registers: 5 CTAs per SM), 32-token tiles one with 4 (96: 4 CTAs); on an H200 (session 13) 4 CTAs of
// 16-token tiles took 461.7 us at 64 tokens, 5 CTAs 419.0 (docs/PERF.md).
// Ring bookkeeping ("lean ring", 32-token tiles only): both sides step their ring position (slot, phase
// parity) by increments and the producer's lane 0 issues a stage's row copies in a loop, where the other
// form divides a 64-bit stage count by the slot count on both sides every stage and copies a row per lane
// (compiled into a loop that elects each lane and moves its operands to uniform registers: ~230 producer
// instructions per 8 KB stage, ncu). One H200, session 14, one process, median of 3 interleaved rounds: the
// 32-token instance at 256 tokens 612.6 -> 557.1 us with it; the 16-token one 4-5% slower with it at 64, 100
// and 256 tokens (413.6 -> 432.5 us at 64), so it keeps the per-lane copies.
// Tensor boxes (MoeBf16GemmParams::bulk_tensor_boxes, k % 64 == 0; moe_bf16_decode.cuh): the producer's lane 0
// brings a stage as one TMA copy (the strip's 16 rows of its four 64-wide chunks, 128-byte swizzle) instead of
// 16 row copies, and the consumers read the swizzled lines; the same fragments and k order, so the same bits.
// Session 14's ncu had the first GEMM's consumers waiting on a ring the producer could not keep full.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_bf16_decode.cuh"

namespace mx::cuda {
namespace {

using namespace moe_bf16;

constexpr int kConsumerWarps = 4;
constexpr int kThreads = 32 * (kConsumerWarps + 1);
constexpr int kRows = 16;
constexpr int kStageK = 64 * kConsumerWarps;
constexpr int kRowPitch = kStageK * 2 + 16;  // padded like the bulk kernel's: conflict-free quarter-warp reads
constexpr int kSlotBytes = kRows * kRowPitch;
constexpr int kMaxSlots = 8;
// 8-token groups per tile: a kernel for tiles of up to 16 tokens (72 registers: 5 CTAs per SM) and one for
// up to 32 (96 registers: 4 CTAs).
constexpr int ctas_per_sm(int max_groups) { return max_groups <= 2 ? 5 : 4; }

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kConsumerWarps) : "memory"); }

// A ring position: its slot and the parity of that slot's current phase (flips with each pass through the ring).
struct RingPos {
  uint32_t slot = 0, parity = 0;
  __device__ __forceinline__ void advance(int slots) {
    if (++slot == static_cast<uint32_t>(slots)) {
      slot = 0;
      parity ^= 1u;
    }
  }
};

// A work item's routing tile (warp-uniform).
struct Item {
  int64_t tile = 0, strip = 0;
  int expert = 0, start = 0, rows = 0;
};
__device__ __forceinline__ Item load_item(const MoeBf16GemmParams& p, int64_t i, int64_t strips, int n_tiles) {
  Item it;
  it.tile = i / strips;
  it.strip = i % strips;
  if (it.tile < n_tiles) {
    it.expert = p.r.tile_expert[it.tile];
    it.start = p.r.tile_start[it.tile];
    it.rows = p.r.tile_rows[it.tile];
  }
  return it;
}

// This lane's input row of token r of each group (x by the slot's token, or h by sorted position); null past
// the tile's tokens.
template <bool kGated, int kMaxGroups>
__device__ __forceinline__ void token_rows(const MoeBf16GemmParams& p, const Item& it, int r, int q,
                                           const uint16_t* (&rows)[kMaxGroups]) {
#pragma unroll
  for (int g = 0; g < kMaxGroups; ++g) {
    const int row = 8 * g + r;
    rows[g] = nullptr;
    if (row < it.rows) {
      const int64_t src = kGated ? p.r.sorted_slots[it.start + row] / p.top_k : it.start + row;
      rows[g] = p.in + src * p.k + 16 * q;
    }
  }
}

template <bool kGated, int kMaxGroups, bool kBoxes>
__global__ void __launch_bounds__(kThreads, ctas_per_sm(kMaxGroups))
    moe_bf16_stream_kernel(MoeBf16GemmParams p, int slots, const __grid_constant__ CUtensorMap map) {
  constexpr bool kLeanRing = kMaxGroups > 2;  // measured faster only there (above)
  constexpr uint32_t kSlot = kBoxes ? box_stage_bytes(1) : kSlotBytes;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  // The swizzle repeats every 1024 bytes: boxes start on that boundary (the launch adds 1 KB).
  uint8_t* const ring = kBoxes ? smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023) : smem_raw;
  __shared__ __align__(8) uint64_t full[kMaxSlots], empty[kMaxSlots];
  __shared__ float red[kConsumerWarps][kMaxGroups][4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, q = lane % 4;
  const int64_t strips = kGated ? cdiv(p.out_rows, 8) : cdiv(p.out_rows, 16);
  const int64_t rows_total = kGated ? 2 * p.out_rows : p.out_rows;
  const int64_t n_stages = cdiv(p.k, kStageK);
  const uint32_t ring0 = smem_addr(ring), full0 = smem_addr(full), empty0 = smem_addr(empty);
  if (threadIdx.x == 0) {
    if constexpr (kBoxes) tma_prefetch_map(&map);
    for (int i = 0; i < slots; ++i) {
      mbarrier_init(full0 + 8 * i, 1);
      mbarrier_init(empty0 + 8 * i, kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // The first GEMM reads the routing and x, both from earlier kernels; the second GEMM's routing precedes
  // the first GEMM (which lets it launch only after its own wait), and only its consumers read h.
  if constexpr (kGated) {
    pdl_wait();
    pdl_launch_dependents();
  }

  const int n_tiles = *p.r.num_tiles;
  RingPos ring_pos;  // the lean ring's position
  int64_t c = 0;     // the other form's stage count
  if (warp == kConsumerWarps) {  // the producer
    int64_t i = blockIdx.x, tile = i / strips;
    int64_t e = tile < n_tiles ? p.r.tile_expert[tile] : 0;
    while (tile < n_tiles) {
      const int64_t strip = i % strips, i_next = i + gridDim.x, tile_next = i_next / strips;
      const int64_t e_next = tile_next < n_tiles ? p.r.tile_expert[tile_next] : 0;  // used an item later
      if constexpr (kBoxes) {
        // One box a stage: (k 0, the strip's first row, gate half, expert e, the stage's first chunk).
        const int row0 = static_cast<int>((kGated ? 8 : 16) * strip);
        for (int64_t ks = 0; ks < n_stages; ++ks) {
          const uint32_t slot = kLeanRing ? ring_pos.slot : static_cast<uint32_t>(c % slots);
          const uint32_t parity = kLeanRing ? ring_pos.parity : static_cast<uint32_t>(c / slots) & 1u;
          mbarrier_wait(empty0 + 8 * slot, parity ^ 1u);
          fence_ring_refill();  // the consumers' reads of the slot, before the copy refills it
          if (lane == 0) {
            const uint32_t bar = full0 + 8 * slot;
            mbarrier_arrive_expect_tx(bar, kSlot);
            tma_load_5d(ring0 + slot * kSlot, &map, 0, row0, 0, static_cast<int>(e), static_cast<int>(4 * ks), bar);
          }
          __syncwarp();
          if constexpr (kLeanRing) {
            ring_pos.advance(slots);
          } else {
            ++c;
          }
        }
      } else if constexpr (kLeanRing) {
        // Slot rows 0-7 and 8-15: the gate rows of channels 8 strip + j and the same channels' up rows (first
        // GEMM), or rows 16 strip + j; rows past out_rows are not copied (their results are never stored).
        const int64_t left = kGated ? p.out_rows - 8 * strip : p.out_rows - 16 * strip;
        const int lo = static_cast<int>(left < 8 ? left : 8);
        const int hi = kGated ? lo : static_cast<int>(left > 16 ? 8 : left > 8 ? left - 8 : 0);
        const uint16_t* w_lo = p.w + (e * rows_total + (kGated ? 8 * strip : 16 * strip)) * p.k;
        const uint16_t* w_hi = w_lo + (kGated ? p.out_rows : 8) * p.k;
        for (int64_t ks = 0; ks < n_stages; ++ks, ring_pos.advance(slots)) {
          mbarrier_wait(empty0 + 8 * ring_pos.slot, ring_pos.parity ^ 1u);
          fence_ring_refill();  // the consumers' reads of the slot, before the copies refill it
          const int64_t k0 = ks * kStageK;
          const uint32_t bytes = static_cast<uint32_t>(2 * (p.k - k0 < kStageK ? p.k - k0 : kStageK));
          if (lane == 0) {
            const uint32_t bar = full0 + 8 * ring_pos.slot, dst = ring0 + ring_pos.slot * kSlotBytes;
            mbarrier_arrive_expect_tx(bar, bytes * static_cast<uint32_t>(lo + hi));
            for (int j = 0; j < lo; ++j) bulk_copy(dst + j * kRowPitch, w_lo + j * p.k + k0, bytes, bar);
            for (int j = 0; j < hi; ++j) bulk_copy(dst + (8 + j) * kRowPitch, w_hi + j * p.k + k0, bytes, bar);
          }
          __syncwarp();
        }
      } else {
        // Lane i < 16 copies slot row i: gate rows of channels 8 strip + i, then the same channels' up rows.
        const int64_t row = kGated ? (lane < 8 ? 8 * strip + lane : p.out_rows + 8 * strip + lane - 8) : 16 * strip + lane;
        const bool row_ok = lane < kRows && (kGated ? 8 * strip + lane % 8 < p.out_rows : row < p.out_rows);
        const uint32_t valid_rows = __popc(__ballot_sync(0xffffffffu, row_ok));
        const uint16_t* src = p.w + (e * rows_total + row) * p.k;
        for (int64_t ks = 0; ks < n_stages; ++ks, ++c) {
          const uint32_t slot = static_cast<uint32_t>(c % slots);
          mbarrier_wait(empty0 + 8 * slot, (static_cast<uint32_t>(c / slots) & 1u) ^ 1u);
          fence_ring_refill();
          const int64_t k0 = ks * kStageK;
          const uint32_t bytes = static_cast<uint32_t>(2 * (p.k - k0 < kStageK ? p.k - k0 : kStageK));
          if (lane == 0) mbarrier_arrive_expect_tx(full0 + 8 * slot, bytes * valid_rows);
          __syncwarp();
          if (row_ok) bulk_copy(ring0 + slot * kSlotBytes + lane * kRowPitch, src + k0, bytes, full0 + 8 * slot);
        }
      }
      i = i_next;
      tile = tile_next;
      e = e_next;
    }
    return;
  }

  if constexpr (!kGated) {
    pdl_wait();
    // The layer's end may launch now and read its constants while the experts run; it waits for this grid
    // before it reads the combined output.
    pdl_launch_dependents();
  }
  Item it = load_item(p, blockIdx.x, strips, n_tiles);
  const uint16_t* x_rows[kMaxGroups];
  token_rows<kGated, kMaxGroups>(p, it, r, q, x_rows);
  while (it.tile < n_tiles) {
    const Item next = load_item(p, it.tile * strips + it.strip + gridDim.x, strips, n_tiles);  // used an item later
    const int groups = (it.rows + 7) / 8;
    float acc[kMaxGroups][4];
#pragma unroll
    for (int g = 0; g < kMaxGroups; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.f;
    for (int64_t ks = 0; ks < n_stages; ++ks, ++c) {
      const int64_t off = ks * kStageK + 64 * warp, k0 = off + 16 * q;  // this warp's chunk; this lane's first k
      const bool in0 = k0 < p.k, in1 = k0 + 8 < p.k;
      uint4 x[kMaxGroups][2];
#pragma unroll
      for (int g = 0; g < kMaxGroups; ++g) {  // issued before the wait
        x[g][0] = load16_act<kGated>(x_rows[g] + off, g < groups && x_rows[g] && in0);
        x[g][1] = load16_act<kGated>(x_rows[g] + off + 8, g < groups && x_rows[g] && in1);
      }
      const uint32_t slot = kLeanRing ? ring_pos.slot : static_cast<uint32_t>(c % slots);
      mbarrier_wait(full0 + 8 * slot, kLeanRing ? ring_pos.parity : static_cast<uint32_t>(c / slots) & 1u);
      if constexpr (kLeanRing) ring_pos.advance(slots);
      uint4 a[4];
      if constexpr (kBoxes) {  // chunk w's lines
        box_fragment(ring + slot * kSlot + warp * kRows * kBoxLineBytes, r, q, in0, in1, a);
      } else {
        const uint8_t* base = ring + slot * kSlot + (64 * warp + 16 * q) * 2;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        a[0] = in0 ? *reinterpret_cast<const uint4*>(base + r * kRowPitch) : zero;
        a[1] = in1 ? *reinterpret_cast<const uint4*>(base + r * kRowPitch + 16) : zero;
        a[2] = in0 ? *reinterpret_cast<const uint4*>(base + (r + 8) * kRowPitch) : zero;
        a[3] = in1 ? *reinterpret_cast<const uint4*>(base + (r + 8) * kRowPitch + 16) : zero;
      }
#pragma unroll
      for (int g = 0; g < kMaxGroups; ++g)
        if (g < groups) chunk_mma(acc[g], a, x[g][0], x[g][1]);
      __syncwarp();  // every lane's reads of the slot are done (their registers went into the mma)
      if (lane == 0) mbarrier_arrive(empty0 + 8 * slot);
    }

    // Warp g stores group g: its tokens' routing weights (second GEMM) load while the partials meet.
    const StripRows s = strip_rows<kGated>(p, it.strip, r);
    float wt[2] = {0.f, 0.f};
    if (!kGated && warp < groups) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tok = 8 * warp + 2 * q + j;
        if (tok < it.rows) wt[j] = p.topk_weights[p.r.sorted_slots[it.start + tok]];
      }
    }
    token_rows<kGated, kMaxGroups>(p, next, r, q, x_rows);  // the next item's rows load during the epilogue
#pragma unroll
    for (int g = 0; g < kMaxGroups; ++g)
      if (g < groups) {
#pragma unroll
        for (int j = 0; j < 4; ++j) red[warp][g][j][lane] = acc[g][j];
      }
    consumers_sync();
    if (warp < groups) {
      float sum[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sum[j] = red[0][warp][j][lane];
#pragma unroll
        for (int w = 1; w < kConsumerWarps; ++w) sum[j] += red[w][warp][j][lane];
      }
      // sum[0, 1]: row lo, tokens 2q, 2q + 1 of the group; sum[2, 3]: row hi.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tok = 8 * warp + 2 * q + j;
        if (tok >= it.rows) continue;
        const int64_t pos = it.start + tok;
        if constexpr (kGated) {
          if (s.lo_ok) p.out[pos * p.out_rows + s.lo] = f32_to_bf16_bits(gelu_tanh(sum[j]) * sum[2 + j]);
        } else {
          if (s.lo_ok) p.out[pos * p.out_rows + s.lo] = f32_to_bf16_bits(sum[j] * wt[j]);
          if (s.hi_ok) p.out[pos * p.out_rows + s.hi] = f32_to_bf16_bits(sum[2 + j] * wt[j]);
        }
      }
    }
    consumers_sync();  // `red` is free for the next item
    it = next;
  }
}

}  // namespace

Status launch_moe_bf16_stream_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  if (p.tile_tokens != 8 && p.tile_tokens != 16 && p.tile_tokens != 32)
    return internal_error("moe_bf16_stream: tiles of 8, 16 or 32 tokens");
  if (p.ring_slots < 2 || p.ring_slots > kMaxSlots)
    return internal_error("moe_bf16_stream: 2 to " + std::to_string(kMaxSlots) + " ring slots");
  if (p.topk_ids != nullptr) return internal_error("moe_bf16_stream: routing metadata expected, not self-routing");
  CUtensorMap map{};
  if (p.bulk_tensor_boxes) {
    if (!moe_bf16_bulk_boxes_fit(p))
      return invalid_argument("moe_bf16_stream: tensor boxes need k % 64 == 0 and the weights' expert count");
    MX_RETURN_IF_ERROR(encode_box_map(p, 1, &map));
  }
  auto pick = [&](auto boxes) {
    constexpr bool kB = decltype(boxes)::value;
    return p.tile_tokens <= 16
               ? (p.gated ? moe_bf16_stream_kernel<true, 2, kB> : moe_bf16_stream_kernel<false, 2, kB>)
               : (p.gated ? moe_bf16_stream_kernel<true, 4, kB> : moe_bf16_stream_kernel<false, 4, kB>);
  };
  auto kernel = p.bulk_tensor_boxes ? pick(std::true_type{}) : pick(std::false_type{});
  const size_t smem = p.bulk_tensor_boxes ? static_cast<size_t>(p.ring_slots * box_stage_bytes(1) + 1024)
                                          : static_cast<size_t>(p.ring_slots) * kSlotBytes;
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
      "cudaFuncSetAttribute(moe_bf16_stream smem)"));
  // Persistent: the CTAs that are resident at once (more would wait for a free SM and then find no items).
  int device = 0, sms = 0, per_sm = 0;
  MX_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  MX_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count"));
  MX_RETURN_IF_ERROR(cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem),
                                 "moe_bf16_stream occupancy"));
  if (per_sm < 1) return internal_error("moe_bf16_stream: a CTA does not fit on an SM");
  const int64_t strips = p.gated ? cdiv(p.out_rows, 8) : cdiv(p.out_rows, 16);
  const int64_t grid = std::min<int64_t>(static_cast<int64_t>(sms) * per_sm, strips * p.max_tiles);
  if (grid == 0) return Status::ok();
  return cuda_status(launch_pdl(kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream, p,
                                p.ring_slots, map),
                     "moe_bf16_stream_kernel");
}

}  // namespace mx::cuda
