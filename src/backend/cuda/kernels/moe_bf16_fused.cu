// bf16 GeGLU experts at two to four tokens (self-routed, <= 32 slots; sm_90+): both expert GEMMs in one
// persistent launch. Why: as two launches (moe_bf16_bulk.cu) each GEMM is short (one token's second GEMM,
// 31.7 MB, ran at 27% of DRAM bandwidth under ncu: 1,408 three-stage CTAs in 1.5 waves), and the second can
// only prefetch its weights where the first left room on an SM. Here the second GEMM's weight rows stream
// while the first GEMM's last strips finish. H200 (session 15 W1, mx_kernel_bench --gemma-experts-only, us
// per call as the model calls them, routing ready; bulk copies -> this kernel at 3 / 4 / 6 ring slots): 4
// tokens (30 experts) 128.13 -> 119.84 / 115.74 / 113.18; one token 34.62 -> 35.69 / 37.28 / 36.92, so one
// token keeps the two launches (kAuto). An epilogue warp (so that the epilogue's fence and atomic round trips
// do not hold the ring) measured slower (W1b: one token 38.25, 4 tokens 117.02 at 4 slots; 80 registers with
// spills for 4 CTAs per SM) and is not kept.
//
// Work items: the first GEMM's (tile, 8-channel strip) pairs, tile-major (the lowest expert's h is complete
// first), then the second GEMM's (tile, 16-row strip) pairs, tile-major. A CTA's first item is its blockIdx
// (first-GEMM items only), the rest come from an atomic queue, so any second-GEMM item is taken only after
// every first-GEMM item was. A second-GEMM item waits for its tile's h: each first-GEMM item adds one to the
// tile's counter after storing its channels (threadfence, then the add). Waiting is safe because the grid
// is at most the CTAs resident at once (the occupancy query) and first-GEMM items never wait. The last CTA to
// exit resets the queue and the counters for the next launch or graph replay.
//
// A CTA: 4 consumer warps and a producer warp, one ring of `ring_slots` stages through all its items (as in
// moe_bf16_stream.cu): the producer's lanes 0-15 copy a stage's 16 weight rows (cp.async.bulk, counted on the slot's
// `full` barrier) once the 4 consumers released the slot (`empty`) and a proxy fence (fence_ring_refill) ordered their
// reads before the copies, and tag an item's first stage with the item. The consumers run the bulk kernel's fragments,
// k order, warp-order sums and epilogues (moe_bf16_decode.cuh: h = gelu_tanh(gate) * up; y times the routing weight,
// and the strip's last tile sums each token's k rows), so the result is bit for bit moe_bf16_bulk.cu's.
//
// PDL: the producer copies its first item's weights before the wait (weights and, with routing_ready, the
// ids precede the previous kernel); the queue, the counters, x, h and the outputs are touched after it.
#include <algorithm>

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
constexpr int kMaxRingSlots = 8;

// The counters' layout (moe_bf16_fused_counters() words, zeroed once): the queue, the exited CTAs, then a
// completed-first-GEMM-strips count per tile (<= 32 slots make <= 32 tiles).
constexpr int kQueue = 0, kExited = 1, kStripsDone = 2, kMaxTiles = 32;

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kConsumerWarps) : "memory"); }

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

struct RingPos {
  uint32_t slot = 0, parity = 0;
  __device__ __forceinline__ void advance(int slots) {
    if (++slot == static_cast<uint32_t>(slots)) {
      slot = 0;
      parity ^= 1u;
    }
  }
};

struct Ring {
  uint8_t* bytes;
  uint32_t base, full, empty;  // shared-memory addresses: slots, full barriers, empty barriers
  int slots;
  int* item;                   // the item whose first stage a slot holds
};

struct FusedParams {
  MoeBf16GemmParams up, down;  // the two GEMMs as launch_moe_bf16_gemm takes them (self-routed, combined)
  uint32_t* counters;
  int ring_slots;
};

// A work item: which GEMM, tile and strip.
struct Item {
  bool up = true;
  int tile = 0;
  int64_t strip = 0;
};
__device__ __forceinline__ Item item_at(uint32_t i, int64_t n_up, int64_t strips_up, int64_t strips_down) {
  Item it;
  it.up = i < n_up;
  const int64_t j = it.up ? i : i - n_up, strips = it.up ? strips_up : strips_down;
  it.tile = static_cast<int>(j / strips);
  it.strip = j % strips;
  return it;
}

// The producer's copies of one item's stages (the bulk kernel's slot rows: gate rows of channels 8 strip + i
// then the same channels' up rows, or rows 16 strip + i; rows past the matrix are not copied).
template <bool kGated>
__device__ __forceinline__ void produce(const MoeBf16GemmParams& g, const Item& it, int tag, const Ring& ring,
                                        RingPos& pos) {
  const int lane = threadIdx.x % 32;
  const int e = tile_route(g, it.tile).expert;
  const int64_t rows_total = kGated ? 2 * g.out_rows : g.out_rows;
  const int64_t row =
      kGated ? (lane < 8 ? 8 * it.strip + lane : g.out_rows + 8 * it.strip + lane - 8) : 16 * it.strip + lane;
  const bool row_ok = lane < kRows && (kGated ? 8 * it.strip + lane % 8 < g.out_rows : row < g.out_rows);
  const uint32_t valid_rows = __popc(__ballot_sync(0xffffffffu, row_ok));
  const uint16_t* src = g.w + (e * rows_total + (row_ok ? row : 0)) * g.k;
  const int64_t n_stages = cdiv(g.k, kStageK);
  for (int64_t ks = 0; ks < n_stages; ++ks, pos.advance(ring.slots)) {
    mbarrier_wait(ring.empty + 8 * pos.slot, pos.parity ^ 1u);
    fence_ring_refill();  // the consumers' reads of the slot, before the copies refill it
    const int64_t k0 = ks * kStageK;
    const uint32_t bytes = static_cast<uint32_t>(2 * (g.k - k0 < kStageK ? g.k - k0 : kStageK));
    const uint32_t bar = ring.full + 8 * pos.slot;
    if (lane == 0) {
      if (ks == 0) ring.item[pos.slot] = tag;
      mbarrier_arrive_expect_tx(bar, bytes * valid_rows);
    }
    __syncwarp();
    if (row_ok) bulk_copy(ring.base + pos.slot * kSlotBytes + lane * kRowPitch, src + k0, bytes, bar);
  }
}

// The consumers' share of one item: the bulk kernel's stage loop, warp-order sum and epilogue.
template <bool kGated>
__device__ __forceinline__ void consume(const MoeBf16GemmParams& g, const Item& it, const Ring& ring, RingPos& pos,
                                        float (&red)[kConsumerWarps - 1][4][32], uint32_t* counters,
                                        uint32_t strips_up) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, q = lane % 4;
  const TileRoute rt = tile_route(g, it.tile);
  if constexpr (!kGated) {  // the tile's h: every first-GEMM strip of it stored
    if (lane == 0) {
      while (load_acquire(counters + kStripsDone + it.tile) < strips_up) {
      }
    }
    __syncwarp();
  }
  bool x_ok;
  const uint16_t* x_row = token_row<kGated>(g, rt, r, q, x_ok);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int64_t n_stages = cdiv(g.k, kStageK);
  for (int64_t ks = 0; ks < n_stages; ++ks, pos.advance(ring.slots)) {
    const int64_t off = ks * kStageK + 64 * warp, k0 = off + 16 * q;  // this warp's chunk; this lane's first k
    const bool in0 = k0 < g.k, in1 = k0 + 8 < g.k;
    const uint4 x0 = load16_act<kGated>(x_row + off, x_ok && in0);  // issued before the wait
    const uint4 x1 = load16_act<kGated>(x_row + off + 8, x_ok && in1);
    mbarrier_wait(ring.full + 8 * pos.slot, pos.parity);
    const uint8_t* base = ring.bytes + pos.slot * kSlotBytes + (64 * warp + 16 * q) * 2;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const uint4 a[4] = {in0 ? *reinterpret_cast<const uint4*>(base + r * kRowPitch) : zero,
                        in1 ? *reinterpret_cast<const uint4*>(base + r * kRowPitch + 16) : zero,
                        in0 ? *reinterpret_cast<const uint4*>(base + (r + 8) * kRowPitch) : zero,
                        in1 ? *reinterpret_cast<const uint4*>(base + (r + 8) * kRowPitch + 16) : zero};
    chunk_mma(acc, a, x0, x1);
    __syncwarp();  // every lane's reads of the slot are done (their registers went into the mma)
    if (lane == 0) mbarrier_arrive(ring.empty + 8 * pos.slot);
  }
  if (warp > 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) red[warp - 1][c][lane] = acc[c];
  }
  consumers_sync();
  if (warp == 0) {
#pragma unroll
    for (int w = 0; w < kConsumerWarps - 1; ++w)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[c] += red[w][c][lane];
  }
  consumers_sync();  // `red` is free for the next item
  if (warp != 0) return;
  store_strip<kGated>(g, rt, strip_rows<kGated>(g, it.strip, r), it.strip, acc);
  if constexpr (kGated) {  // publish the strip's h, then count it
    __threadfence();
    __syncwarp();
    if (lane == 0) atomicAdd(counters + kStripsDone + it.tile, 1u);
  }
}

__global__ void __launch_bounds__(kThreads) moe_bf16_fused_kernel(FusedParams p) {
  extern __shared__ __align__(128) uint8_t ring_bytes[];
  __shared__ __align__(8) uint64_t full[kMaxRingSlots], empty[kMaxRingSlots];
  __shared__ int slot_item[kMaxRingSlots];
  __shared__ float red[kConsumerWarps - 1][4][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Ring ring{ring_bytes, smem_addr(ring_bytes), smem_addr(full), smem_addr(empty), p.ring_slots, slot_item};
  if (threadIdx.x == 0) {
    for (int i = 0; i < ring.slots; ++i) {
      mbarrier_init(ring.full + 8 * i, 1);
      mbarrier_init(ring.empty + 8 * i, kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (!p.up.routing_ready) pdl_wait();  // the ids may come from the previous kernel

  const int64_t strips_up = cdiv(p.up.out_rows, 8), strips_down = cdiv(p.down.out_rows, 16);
  const int tiles = tile_route(p.up, 0).tiles;
  const int64_t n_up = tiles * strips_up, total = n_up + tiles * strips_down;
  // Items [0, first_dynamic) are the CTAs' first items (by blockIdx), the rest come from the queue.
  const int64_t first_dynamic = n_up < gridDim.x ? n_up : gridDim.x;
  RingPos pos;
  if (warp == kConsumerWarps) {  // the producer
    int64_t i = blockIdx.x < first_dynamic ? static_cast<int64_t>(blockIdx.x) : -1;
    if (i >= 0) produce<true>(p.up, item_at(static_cast<uint32_t>(i), n_up, strips_up, strips_down),
                              static_cast<int>(i), ring, pos);
    pdl_wait();
    for (;;) {
      mbarrier_wait(ring.empty + 8 * pos.slot, pos.parity ^ 1u);  // a free slot before taking an item
      uint32_t next = 0;
      if (lane == 0) next = atomicAdd(p.counters + kQueue, 1u);
      i = first_dynamic + __shfl_sync(0xffffffffu, next, 0);
      if (i >= total) {  // the end: a slot tagged -1
        if (lane == 0) {
          ring.item[pos.slot] = -1;
          mbarrier_arrive(ring.full + 8 * pos.slot);
        }
        break;
      }
      const Item it = item_at(static_cast<uint32_t>(i), n_up, strips_up, strips_down);
      if (it.up) produce<true>(p.up, it, static_cast<int>(i), ring, pos);
      else produce<false>(p.down, it, static_cast<int>(i), ring, pos);
    }
  } else {
    pdl_wait();
    // The layer's end (gemma_layer_end) may launch now and read its constants and the residual while the
    // experts run; it waits for this grid before it reads the combined output.
    pdl_launch_dependents();
    for (;;) {
      mbarrier_wait(ring.full + 8 * pos.slot, pos.parity);
      const int tag = ring.item[pos.slot];
      if (tag < 0) break;
      const Item it = item_at(static_cast<uint32_t>(tag), n_up, strips_up, strips_down);
      if (it.up) consume<true>(p.up, it, ring, pos, red, p.counters, static_cast<uint32_t>(strips_up));
      else consume<false>(p.down, it, ring, pos, red, p.counters, static_cast<uint32_t>(strips_up));
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // the last CTA out resets the queue and the counters (every other CTA is done)
    __threadfence();
    if (atomicAdd(p.counters + kExited, 1u) == gridDim.x - 1) {
      p.counters[kQueue] = 0;
      for (int t = 0; t < kMaxTiles; ++t) p.counters[kStripsDone + t] = 0;
      p.counters[kExited] = 0;
    }
  }
}

}  // namespace

int moe_bf16_fused_counters() { return kStripsDone + kMaxTiles; }

Status launch_moe_bf16_fused(const MoeBf16GemmParams& up, const MoeBf16GemmParams& down, uint32_t* counters,
                             int ring_slots, cudaStream_t stream) {
  if (ring_slots < 2 || ring_slots > kMaxRingSlots)
    return internal_error("moe_bf16_fused: 2 to " + std::to_string(kMaxRingSlots) + " ring slots");
  if (!up.gated || down.gated || up.topk_ids == nullptr || up.topk_ids != down.topk_ids || up.slots > kMaxTiles ||
      up.tile_tokens != 8 || down.combined == nullptr || down.tickets == nullptr || counters == nullptr)
    return internal_error("moe_bf16_fused: self-routed 8-token tiles (<= 32 slots), the combine fused");
  if (up.k % 8 != 0 || down.k % 8 != 0) return unimplemented("moe_bf16_fused: inner dimensions must be multiples of 8");
  if (up.max_tiles == 0) return Status::ok();
  const size_t smem = static_cast<size_t>(ring_slots) * kSlotBytes;
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(moe_bf16_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      static_cast<int>(smem)),
                                 "cudaFuncSetAttribute(moe_bf16_fused smem)"));
  // Persistent, and second-GEMM items wait for first-GEMM ones: never more CTAs than are resident at once.
  int device = 0, sms = 0, per_sm = 0;
  MX_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  MX_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count"));
  MX_RETURN_IF_ERROR(cuda_status(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moe_bf16_fused_kernel, kThreads, smem), "moe_bf16_fused occupancy"));
  if (per_sm < 1) return internal_error("moe_bf16_fused: a CTA does not fit on an SM");
  const int64_t items = up.max_tiles * (cdiv(up.out_rows, 8) + cdiv(down.out_rows, 16));
  const int64_t grid = std::min<int64_t>(static_cast<int64_t>(sms) * per_sm, items);
  return cuda_status(launch_pdl(moe_bf16_fused_kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream,
                                FusedParams{up, down, counters, ring_slots}),
                     "moe_bf16_fused_kernel");
}

}  // namespace mx::cuda
