// MXFP4 experts for many tokens per expert on Hopper (sm_90a), warp-specialized: the same GEMM as
// moe_wgmma.cu (weights as wgmma's M side decoded from the swap-AB layout into A registers, expert-sorted
// tokens as N in shared memory with the 128-byte swizzle, the same k order, epilogues and bits), with the
// work split by role instead of every warp doing everything:
//
// - warpgroup 0, the producer (24 registers a thread after setmaxnreg): for each k tile waits until its ring
//   slot is empty, issues the cp.async copies of the tile's gathered activation rows (zero-filled past the
//   item's tokens), the CTA's fp4 strips and scales, and arms the slot's full barrier with
//   cp.async.mbarrier.arrive: it never waits for its own copies, so it runs as far ahead as the ring allows.
// - warpgroups 1 and 2 (240 registers): 64 weight rows each (warp w owns strip strip0 + w), sharing the B
//   tile. Per k tile: wait for the slot's full barrier, decode the warp's fp4 into A registers, four wgmma,
//   and release the previous tile's slot once its MMAs are done (two wgmma groups in flight, as before).
//   No CTA-wide barrier: each warpgroup runs at its own pace, so one's decode overlaps the other's MMAs.
//
// One CTA per SM on a persistent grid: every role walks the same items (tile-major, column blocks fastest),
// the ring running on across items, so the producer loads the next item while the MMA warpgroups finish
// this one and run its epilogue. An item's MMAs (and its activation loads) run at kN / 2 token columns when
// its tokens fit (an expert's last, partly filled tile), else kN; wgmma's columns are independent, so a token's bits do not depend on
// the width (the GPU tests check it against the same tokens alone).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/moe_wgmma_parts.cuh"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {
namespace {

constexpr int kProducerThreads = 128;
constexpr int kMmaWarps = 8;                  // two warpgroups, a 16-row strip each warp
constexpr int kStrips = kMmaWarps;            // 128 weight rows per item
// Registers a thread after setmaxnreg: what the producer gives back, the MMA warpgroups take (the sum over the
// three warpgroups stays the 3 x 168 the CTA was launched with). 240 leave the 256-column MMAs unserialized
// next to the half-width ones (232 did not: ptxas C7512); the producer then spills a few bytes to local memory.
constexpr int kProducerRegisters = 24;
constexpr int kMmaRegisters = 240;
static_assert(kProducerRegisters + 2 * kMmaRegisters == 3 * 168, "the launch's register pool");
constexpr int kRowTableBarrier = 1;           // named barrier of the producer's row-table rewrites
static_assert(kProducerThreads + 32 * kMmaWarps == kMoeWgmmaWsThreads, "one producer and two MMA warpgroups");

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
  // Stage s of the ring: the B tile (kN rows of 128 bytes, swizzled), the CTA's packed fp4 (32 B per weight
  // row, strip after strip), then its scales (2 B per row).
  constexpr int kWeightsAt = kN * 128, kScalesAt = kWeightsAt + kStrips * 16 * 32;
  extern __shared__ uint8_t smem_raw[];
  // Where each tile row's input row starts, for the item the producer is loading (rows past its tokens are
  // zero-filled without a read: they point at input row 0 only to stay a valid address).
  __shared__ const uint8_t* row_src[kN];
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
      mbarrier_init(full0 + 8 * s, kProducerThreads);  // each producer thread's cp.async arrival
      mbarrier_init(empty0 + 8 * s, kMmaWarps);        // each MMA warp, once its MMAs left the slot
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (static_cast<int>(blockIdx.x) >= n_items) return;

  if (tid < kProducerThreads) {
    setmaxnreg_dec<kProducerRegisters>();
    // Thread tid copies 16-byte chunk tid % 8 of tile rows tid / 8 + 16j (one swizzle phase: 16j % 8 == 0),
    // weight chunks tid and tid + 128 (strips tid / 32 and tid / 32 + 4, the lane's 16 bytes of each), and
    // for tid < 16 half tid % 2 of strip tid / 2's scales.
    const int ch = tid % 8, row0 = tid / 8;
    const uint32_t b_dst = ring + row0 * 128 + ((ch ^ (row0 & 7)) * 16);
    int slot = 0;
    uint32_t parity = 1;  // a fresh ring is empty
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
      const WorkItem w = moe_work_item(p, item, n_cols, kStrips);
      const int cols = columns_for<kN>(w.n);
      named_barrier_sync(kRowTableBarrier, kProducerThreads);  // every producer issued the last item's copies
      for (int i = tid; i < cols; i += kProducerThreads) {
        const int64_t row = i >= w.n ? 0 : p.gated ? p.r.sorted_slots[w.start + i] / static_cast<int>(p.top_k) : w.start + i;
        row_src[i] = reinterpret_cast<const uint8_t*>(p.in + row * p.k);
      }
      named_barrier_sync(kRowTableBarrier, kProducerThreads);
      // This thread's two weight chunks and its scales at k tile 0 (size 0: a strip past the matrix).
      const int64_t strip_a = w.strip0 + tid / 32, strip_b = strip_a + 4, strip_s = w.strip0 + tid / 2;
      const int size_a = strip_a < strips ? 16 : 0, size_b = strip_b < strips ? 16 : 0;
      const int size_s = tid < 16 && strip_s < strips ? 16 : 0;
      const uint8_t* w_a = p.blocks + ((w.e * strips + (size_a ? strip_a : 0)) * n_k) * 512 + (tid % 32) * 16;
      const uint8_t* w_b = p.blocks + ((w.e * strips + (size_b ? strip_b : 0)) * n_k) * 512 + (tid % 32) * 16;
      const uint8_t* s_src = p.scales + ((w.e * strips + (size_s ? strip_s : 0)) * n_k) * 32 + (tid % 2) * 16;
      const int passes = cols / 16;
      for (int t = 0; t < n_k; ++t) {
        mbarrier_wait(empty0 + 8 * slot, parity);
        const uint32_t stage = ring + static_cast<uint32_t>(slot) * kStageBytes;
        const uint32_t kb = ch * 16 + static_cast<uint32_t>(t) * 128;  // bytes into the input row
        for (int j = 0; j < passes; ++j) {
          const int row = row0 + 16 * j;
          cp_async_16_to(b_dst + (stage - ring) + j * 2048, row_src[row] + kb, row < w.n ? 16 : 0);
        }
        cp_async_16_to(stage + kWeightsAt + tid * 16, w_a + t * 512, size_a);
        cp_async_16_to(stage + kWeightsAt + (tid + kProducerThreads) * 16, w_b + t * 512, size_b);
        if (tid < 16) cp_async_16_to(stage + kScalesAt + tid * 16, s_src + t * 32, size_s);
        cp_async_mbarrier_arrive(full0 + 8 * slot);
        if (++slot == stages) {
          slot = 0;
          parity ^= 1;
        }
      }
    }
    cp_async_wait<0>();  // no thread leaves with copies in flight
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
      mbarrier_wait(full0 + 8 * slot, parity);
      fence_proxy_async_smem();  // the landed copies, seen through the barrier, made visible to wgmma's reads
      const uint32_t stage = ring + static_cast<uint32_t>(slot) * kStageBytes;
      moe_wgmma_k_tile<kCols>(d, at, stage, stage + kWeightsAt + mt * 16,
                              stage + kScalesAt + warp * 32 + (q >> 1) * 16, r);
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
    if (my_strip < strips) moe_wgmma_store<kCols>(p, d, w, my_strip, r, q);  // else a strip past the matrix
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
