// MXFP4 experts at decode, second generation (kernel_configs.h, MoeFusedConfig). Same swap-AB fragments
// and epilogues as moe.cu, but:
//  * every warp keeps a ring of kDepth = 4 k tiles of weights in flight (activations: two), refilling a
//    slot as soon as its tile is multiplied: the first kernel had one 512-byte load per warp in flight
//    (the loads could not pass the previous mma) and reached 31% of HBM at one token; rings of 6 and 8
//    measured slower (45.1 vs 35.5 us at one token on an H100, docs/PERF.md) and were deleted;
//  * the warp's scale bytes (32 a k tile) are copied into shared memory with its first weights (cp.async), so
//    the ring holds no scale registers: 56 registers instead of 64-70, 12 CTAs of 3 warps an SM (the first
//    GEMM's 1,440 CTAs at one token in one wave) and 6 of 6 warps (the second's 720 in one), docs/PERF.md
//    session 20; `kScalesInRegisters` keeps the form before as a measured option;
//  * the loop is counted in issued instructions (what bounds it at one token: docs/PERF.md): the three
//    streams advance by one pointer add each per round of kDepth tiles and every load of a round takes a
//    constant offset from them, rounds whose refills all exist run without a check per tile, scale bytes
//    arrive zero-extended; the epilogue's biases and routing weights are staged in shared memory before
//    the loop (cp.async, no registers held across it), so its loads are off the path after the last tile;
//  * up to kMoeFusedShiftSlots routed slots (kernel_configs.h) the fp4 decode takes two of a word's rotations as left
//    shifts (swap_ab_decode_word<true>: the same bits), which issue on the FMA pipe beside the ALU pipe's masks;
//  * the k split is a function of k alone, so a token's sums run in the same order in any batch;
//  * up to 32 routed tokens, every CTA derives its tile's routing from the top-k ids in registers (the
//    routing kernel, ~1 launch, is gone) and the second GEMM's last CTA of each 16-row strip (an atomic
//    ticket per strip, reset by that CTA for the next replay) sums the top-k rows in router order (the
//    combine kernel is gone); larger steps read the routing kernel's metadata and run the combine kernel;
//  * the second GEMM is a programmatic dependent of the first (SM90+): it routes and loads its weights
//    while the first one finishes, then waits for h.
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/moe_decode_parts.cuh"
#include "backend/cuda/kernels/moe_route_tile.cuh"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"

namespace mx::cuda {
namespace {

// Activations: x (first GEMM) is read by many CTAs of an SM, so through L1; h (second GEMM) was written by
// the previous kernel while this one was already running, so from L2 only.
template <bool kGated>
__device__ __forceinline__ uint4 load_act(const uint4* p) {
  if constexpr (kGated) return __ldg(p);
  return __ldcg(p);
}

// A scale byte, zero-extended by the load itself (a uint8_t load costs a mask after it).
__device__ __forceinline__ uint32_t ldg_u8(const uint8_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u8 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

// Weight tiles in flight per warp (and activation tiles), the default ring.
constexpr int kDepth = 4;
constexpr int kActDepthDefault = 2;

// a / b for 0 <= a < 2^20 and 1 <= b <= 64, without the ~25 instructions of a 32-bit integer division (three
// of them sat between a warp's routing and its first weight loads): (a + 1/2) / b is at least 1/(2b) away from
// an integer, and the approximate reciprocal's product is within a * 2^-21 / b of it.
__device__ __forceinline__ int small_div(int a, int b) {
  float rcp;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(rcp) : "f"(static_cast<float>(b)));
  return __float2int_rz((static_cast<float>(a) + 0.5f) * rcp);
}

// One warp's k loop on the register ring: its n tiles (weights of tile j at wq + 512 j, the lane's two scale
// bytes at sq + 32 j and + 8, activations at xq + 8 j), `stage()` called once the first weights are
// requested (before the second GEMM's PDL wait). Unless kScalesInRegisters, the warp's n blocks of 32 scale
// bytes (from sw) are first copied to `ss` in shared memory, and the lane reads its two bytes of tile j at
// ss + (sq - sw) + 32 j and + 8.
template <bool kGated, bool kScalesInRegisters, bool kShifts, int kDepth, int kActDepth, typename Stage,
          typename Waited>
__device__ __forceinline__ void register_ring_k_loop(float (&acc)[4], const uint8_t* wq, const uint8_t* sq,
                                                     const uint4* xq, bool has_token, int n, Stage stage,
                                                     const uint8_t* sw, uint8_t* ss, Waited waited) {
  // Activations come from L2/L1 (shorter latency than the weights' HBM): a ring of two is enough and keeps
  // registers for weight slots. Lanes without a token keep zeroed activation slots. The pointers move on by
  // kDepth tiles per round.
  static_assert(kDepth % kActDepth == 0, "activation slots are picked at compile time");
  // The slots keep the raw scale bytes: a scale is made a bf16x2 when its tile is multiplied, not when it is
  // requested. Converted at the load (before session 14), the conversion stalled the warp for the byte's HBM
  // round trip at every refill, so each tile after the first round waited on memory in turn (ncu, session 14
  // W1: the scale conversions after the loads held 22% of the one-token GEMMs' stall samples).
  uint4 w[kDepth], xa[kActDepth], xb[kActDepth];
  uint32_t sc0[kScalesInRegisters ? kDepth : 1], sc8[kScalesInRegisters ? kDepth : 1];
  const uint8_t* sl = ss + (sq - sw);  // the lane's staged bytes of the tile at the pointers
#pragma unroll
  for (int i = 0; i < kActDepth; ++i) xa[i] = xb[i] = make_uint4(0, 0, 0, 0);
  auto load_weights = [&](int slot, int j) {
    w[slot] = ldg_stream(wq + j * 512);
    if constexpr (kScalesInRegisters) {
      sc0[slot] = ldg_u8(sq + j * 32);
      sc8[slot] = ldg_u8(sq + j * 32 + 8);
    }
  };
  auto multiply = [&](int slot) {
    uint32_t s0, s8;
    if constexpr (kScalesInRegisters) {
      s0 = sc0[slot];
      s8 = sc8[slot];
    } else {
      s0 = sl[slot * 32];
      s8 = sl[slot * 32 + 8];
    }
    mxfp4_strip_mma<kShifts>(acc, w[slot], mxfp4_scale_x2(s0), mxfp4_scale_x2(s8), xa[slot % kActDepth],
                             xb[slot % kActDepth]);
  };
  auto load_acts = [&](int slot, int j) {
    if (has_token) {
      xa[slot] = load_act<kGated>(xq + j * 8);
      xb[slot] = load_act<kGated>(xq + j * 8 + 1);
    }
  };
#pragma unroll
  for (int i = 0; i < kDepth; ++i)
    if (i < n) load_weights(i, i);
  if constexpr (!kScalesInRegisters) {  // 16-byte halves of the n blocks, committed with stage()'s copies
    for (int c = static_cast<int>(threadIdx.x % 32); c < 2 * n; c += 32) cp_async_16(ss + c * 16, sw + c * 16, true);
  }
  stage();
  if constexpr (!kScalesInRegisters) cp_async_commit();
  if constexpr (!kGated) {
    pdl_wait();  // h comes from the first GEMM
    // Only after the wait: the norm after the experts routes before its own wait (moe_combine_rms_norm_kernel).
    pdl_launch_dependents();
    waited();
  }
#pragma unroll
  for (int i = 0; i < kActDepth; ++i)
    if (i < n) load_acts(i, i);

  if constexpr (!kScalesInRegisters) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // the scales (and stage()'s copies) have landed
    __syncwarp();
  }
  int left = n;  // tiles not multiplied yet, the first of them at the pointers
  for (; left >= 2 * kDepth; left -= kDepth) {  // every slot multiplied and refilled
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      multiply(i);
      load_weights(i, i + kDepth);
      load_acts(i % kActDepth, i + kActDepth);
    }
    wq += kDepth * 512;
    sq += kDepth * 32;
    sl += kDepth * 32;
    xq += kDepth * 8;
  }
  for (; left > 0; left -= kDepth) {  // the last one or two rounds: multiplies and refills checked
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      if (i < left) {
        multiply(i);
        if (i + kDepth < left) load_weights(i, i + kDepth);
        if (i + kActDepth < left) load_acts(i % kActDepth, i + kActDepth);
      }
    }
    wq += kDepth * 512;
    sq += kDepth * 32;
    sl += kDepth * 32;
    xq += kDepth * 8;
  }
}

// route_tile where every busy expert holds one tile (at most kMoeFusedTileTokens = 8 routed slots) and there are at
// most 128 experts: the tile's expert is the tile-th busy one, found in a mask of the busy experts (one OR reduction a
// 32 experts) instead of route_tile's pass over the slots; the same tiles, expert, start, rows and row slots. `pos`
// is left 0: the first GEMM only (the second's combine takes route_tile's; session 21 measured the mask in the
// second GEMM too: slower there, docs/PERF.md).
constexpr int kMaskRouteExperts = 128;
__device__ __forceinline__ TileRoute route_tile_mask(const int32_t* ids, int slots, int experts, int tile) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const bool valid = lane < slots;
  int e = INT_MAX;
  if (valid) {
    e = ids[lane];
    if (e < 0 || e >= experts) e = 0;  // as route_tile
  }
  const unsigned lanes_below = (1u << lane) - 1u;
  int busy = 0, expert = 0;
#pragma unroll
  for (int w = 0; w < kMaskRouteExperts / 32; ++w) {
    if (32 * w >= experts) break;
    const unsigned m = __reduce_or_sync(0xffffffffu, valid && (e >> 5) == w ? 1u << (e & 31) : 0u);
    const unsigned hit = __ballot_sync(0xffffffffu, ((m >> lane) & 1u) && busy + __popc(m & lanes_below) == tile);
    if (hit) expert = 32 * w + __ffs(hit) - 1;
    busy += __popc(m);
  }
  TileRoute t;
  t.tiles = busy;
  t.expert = expert;
  t.start = __popc(__ballot_sync(0xffffffffu, valid && e < expert));
  const unsigned members = __ballot_sync(0xffffffffu, valid && e == expert);
  t.rows = __popc(members);
  unsigned m = members;  // tile row i is the i-th member
  for (int i = 0; i < lane / 4 && m; ++i) m &= m - 1u;
  t.row_slot = m ? __ffs(m) - 1 : 0;
  return t;
}

// kMaskRoute (the first GEMM, self-routed at <= 8 slots and <= kMaskRouteExperts experts): route_tile_mask.
// Kernel bench (MoeFusedParams::trace): the SM and the global timer (ns) of a CTA's events.
__device__ __forceinline__ uint64_t moe_trace_time() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t moe_trace_smid() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(s));
  return s;
}

// kTrace (kernel bench): thread 0 records the CTA's SM and, against the global timer, its entry, its tile's routing
// (after the first GEMM's PDL wait), the second GEMM's PDL wait, warp 0's k loop, the k split's reduction and the end
// in MoeFusedParams::trace (8 words a CTA, CTA (x, y) at 8 (y gridDim.x + x); words of CTAs past the busy tiles stay).
template <bool kGated, bool kScalesInRegisters, bool kMaskRoute, bool kShifts, int kRing, int kActRing, bool kTrace>
__device__ __forceinline__ void moe_fused_gemm_body(const MoeFusedParams& p) {
  extern __shared__ float red[];  // [k_split - 1][4][32], then each warp's staged scales (moe_fused_smem_bytes)
  const MoeGemmParams& g = p.g;
  const int tile = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, k_split = blockDim.x / 32;
  const int r = lane / 4, q = lane % 4;
  uint64_t* tr = kTrace && threadIdx.x == 0 ? p.trace + 8 * (blockIdx.y * gridDim.x + blockIdx.x) : nullptr;
  if (kTrace && tr != nullptr) {
    tr[0] = moe_trace_smid();
    tr[1] = moe_trace_time();
  }
  if constexpr (kGated) {
    pdl_wait();  // launched as a programmatic dependent: the top-k ids come from the router
    // Only after the wait: the second GEMM reads the top-k ids before its own wait.
    pdl_launch_dependents();  // the second GEMM may start routing and loading weights
  }
  const int slots = static_cast<int>(p.slots), experts = static_cast<int>(p.experts);
  const TileRoute rt = !p.topk_ids  ? route_from_metadata(g.r, tile)
                       : kMaskRoute ? route_tile_mask(p.topk_ids, slots, experts, tile)
                                    : route_tile(p.topk_ids, slots, experts, tile);
  if (tile >= rt.tiles) return;
  if (kTrace && tr != nullptr) tr[2] = moe_trace_time();

  // Warp and token indices divide by a reciprocal (small_div: k_split <= 16, top_k <= 32).
  const int64_t strip = blockIdx.x, strips = g.rows / 16;
  const int n_k = static_cast<int>(g.k / 64);
  const int t_begin = small_div(warp * n_k, k_split), t_end = small_div((warp + 1) * n_k, k_split);
  const int64_t first = (rt.expert * strips + strip) * n_k + t_begin;
  const bool has_token = r < rt.rows;
  const int64_t in_row = !has_token ? 0 : kGated ? small_div(rt.row_slot, static_cast<int>(g.top_k)) : rt.start + r;
  // Tile j of this warp's k range: weights at w0 + 512 j (this lane's 16 bytes), its 32 scale bytes at s0 +
  // 32 j, the lane's activations at xq + 8 j.
  const uint8_t* w0 = g.blocks + first * 512 + lane * 16;
  const uint8_t* s0 = g.scales + first * 32;
  const uint4* xq = reinterpret_cast<const uint4*>(g.in + in_row * g.k) + 2 * q + t_begin * 8;
  const int n = t_end - t_begin;
  __shared__ StagedEpilogue staged;
  auto stage = [&] {
    if (warp == 0) stage_epilogue_inputs(&staged, g, rt, strip, /*weights=*/!kGated);
  };
  // The warp's staged scales: ceil(n_k / k_split) blocks of 32 bytes a warp after the reduction's floats.
  uint8_t* ss = reinterpret_cast<uint8_t*>(red + (k_split - 1) * 128) + warp * small_div(n_k + k_split - 1, k_split) * 32;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  register_ring_k_loop<kGated, kScalesInRegisters, kShifts, kRing, kActRing>(
      acc, w0, s0 + (q >> 1) * 16 + r, xq, has_token, n, stage, s0, ss, [&] {
        if (kTrace && tr != nullptr) tr[3] = moe_trace_time();
      });
  if (kTrace && tr != nullptr) tr[4] = moe_trace_time();

  if (!reduce_k_split(acc, red, warp, lane, k_split)) return;
  staged_epilogue_ready();
  if (kTrace && tr != nullptr) tr[5] = moe_trace_time();
  if constexpr (kGated) {
    staged_swiglu_epilogue(g, acc, staged, rt.start, rt.rows, strip, r, q);
  } else {
    const StripBias b{bf16_bits_to_f32(staged.bias[r]), bf16_bits_to_f32(staged.bias[r + 8])};
    weighted_epilogue_and_combine(p, acc, rt, b, [&](int c) { return staged.weight[2 * q + c]; }, strip, r, q);
  }
  if (kTrace && tr != nullptr) tr[6] = moe_trace_time();
}

template <bool kGated, bool kScalesInRegisters, bool kMaskRoute = false, bool kShifts = false, int kRing = kDepth,
          int kActRing = kActDepthDefault>
__global__ void moe_fused_gemm_kernel(MoeFusedParams p) {
  moe_fused_gemm_body<kGated, kScalesInRegisters, kMaskRoute, kShifts, kRing, kActRing, false>(p);
}
// The traced staged kernels (up to kMoeTraceMaxThreads a CTA), held to the untraced ones' 56 registers (one token's 12
// CTAs of 3 warps and 6 of 6 an SM).
constexpr int kMoeTraceMaxThreads = 192;
template <bool kGated, bool kMaskRoute, bool kShifts>
__global__ void __launch_bounds__(kMoeTraceMaxThreads, 6) moe_fused_gemm_trace_kernel(MoeFusedParams p) {
  moe_fused_gemm_body<kGated, false, kMaskRoute, kShifts, kDepth, kActDepthDefault, true>(p);
}

template <bool kGated, bool kScalesInRegisters, bool kMaskRoute = false, bool kShifts = false, int kRing = kDepth,
          int kActRing = kActDepthDefault>
Status launch_fused(const MoeFusedParams& p, const MoeFusedConfig& c, dim3 grid, bool pdl, cudaStream_t stream) {
  void (*kernel)(MoeFusedParams) =
      moe_fused_gemm_kernel<kGated, kScalesInRegisters, kMaskRoute, kShifts, kRing, kActRing>;
  if constexpr (!kScalesInRegisters && kShifts && kRing == kDepth && kActRing == kActDepthDefault) {
    if (p.trace != nullptr) kernel = moe_fused_gemm_trace_kernel<kGated, kMaskRoute, kShifts>;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(static_cast<unsigned>(c.threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(c.smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cuda_status(cudaLaunchKernelEx(&cfg, kernel, p), "moe_fused_gemm_kernel");
}

}  // namespace
Status launch_moe_fused_gemm(const MoeFusedParams& p, const MoeFusedConfig& c, cudaStream_t stream) {
  return launch_moe_fused_gemm(p, c, /*scales_in_registers=*/false, stream);
}

Status launch_moe_fused_gemm(const MoeFusedParams& p, const MoeFusedConfig& c, bool scales_in_registers,
                             cudaStream_t stream, bool mask_route, bool shifts, int ring) {
  const MoeGemmParams& g = p.g;
  if (g.rows % 16 != 0 || g.k % 64 != 0) return internal_error("MoE GEMM: rows % 16 and k % 64 must be 0");
  if (c.k_split < 1 || c.k_split > kMoeFusedMaxKSplit || c.k_split > g.k / 64 || c.threads != 32 * c.k_split ||
      c.smem_bytes != moe_fused_smem_bytes(g.k, c.k_split))
    return internal_error("MoE fused GEMM: bad config");
  if (c.smem_bytes > 48 * 1024) return unimplemented("MoE fused GEMM: k too long for the staged scales' shared memory");
  if (p.topk_ids != nullptr && !use_fused_moe_routing(p.slots))
    return internal_error("MoE fused GEMM: self-routing takes at most 32 routed tokens");
  if (p.tickets != nullptr && (p.topk_ids == nullptr || g.gated || p.combined == nullptr))
    return internal_error("MoE fused GEMM: the combine is fused into the self-routed second GEMM only");
  if (g.k / 64 * c.k_split >= (1 << 20) || g.top_k < 1 || g.top_k > 64 || p.slots >= (1 << 20))
    return unimplemented("MoE fused GEMM: k, top_k or the routed slots past small_div's range");
  if (reinterpret_cast<uintptr_t>(g.bias) % 4 != 0)
    return invalid_argument("MoE fused GEMM: the biases must be 4-byte aligned (copied in bf16 pairs)");
  if (!scales_in_registers && reinterpret_cast<uintptr_t>(g.scales) % 16 != 0)
    return invalid_argument("MoE fused GEMM: the scales must be 16-byte aligned (staged in 16-byte copies)");
  if (p.trace != nullptr && (scales_in_registers || !shifts || ring != 0 || c.threads > kMoeTraceMaxThreads))
    return internal_error("MoE fused GEMM: the trace takes the staged form with shifts at <= 6 warps a CTA");
  if (p.slots == 0) return Status::ok();
  const int64_t tiles = moe_fused_max_tiles(p.slots, p.experts);
  if (tiles > 65535) return unimplemented("MoE fused GEMM: too many tiles for one launch");
  const dim3 grid(static_cast<unsigned>(g.rows / 16), static_cast<unsigned>(tiles));
  if (scales_in_registers)
    return g.gated ? launch_fused<true, true>(p, c, grid, c.pdl, stream) : launch_fused<false, true>(p, c, grid, c.pdl, stream);
  const bool mask = mask_route && g.gated && p.topk_ids != nullptr && p.slots <= kMoeFusedTileTokens &&
                    p.experts <= kMaskRouteExperts;
  // Measurement build: the first GEMM at <= 4 self-routed slots on a ring of 5 weight tiles with one activation tile
  // ahead (the same registers; other cases run the default ring).
  if (ring == 5 && mask && shifts && p.slots <= 4)
    return launch_fused<true, false, true, true, 5, 1>(p, c, grid, c.pdl, stream);
  if (mask)
    return shifts ? launch_fused<true, false, true, true>(p, c, grid, c.pdl, stream)
                  : launch_fused<true, false, true>(p, c, grid, c.pdl, stream);
  if (shifts)
    return g.gated ? launch_fused<true, false, false, true>(p, c, grid, c.pdl, stream)
                   : launch_fused<false, false, false, true>(p, c, grid, c.pdl, stream);
  return g.gated ? launch_fused<true, false>(p, c, grid, c.pdl, stream) : launch_fused<false, false>(p, c, grid, c.pdl, stream);
}

}  // namespace mx::cuda
