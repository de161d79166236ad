// MXFP4 experts at decode, second generation (kernel_configs.h, MoeFusedConfig). Same swap-AB fragments
// and epilogues as moe.cu, but:
//  * every warp keeps a ring of `depth` k tiles of weights in flight (activations: two), refilling a
//    slot as soon as its tile is multiplied: the first kernel had one 512-byte load per warp in flight
//    (the loads could not pass the previous mma) and reached 31% of HBM at one token;
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

template <bool kGated, int kDepth>
__global__ void moe_fused_gemm_kernel(MoeFusedParams p) {
  extern __shared__ float red[];  // [k_split - 1][4][32]
  const MoeGemmParams& g = p.g;
  const int tile = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, k_split = blockDim.x / 32;
  const int r = lane / 4, q = lane % 4;
  if constexpr (kGated) {
    pdl_wait();  // launched as a programmatic dependent: the top-k ids come from the router
    // Only after the wait: the second GEMM reads the top-k ids before its own wait.
    pdl_launch_dependents();  // the second GEMM may start routing and loading weights
  }
  const TileRoute rt = p.topk_ids ? route_tile(p.topk_ids, static_cast<int>(p.slots), static_cast<int>(p.experts), tile)
                                  : route_from_metadata(g.r, tile);
  if (tile >= rt.tiles) return;

  const int64_t strip = blockIdx.x, strips = g.rows / 16, n_k = g.k / 64;
  const int t_begin = static_cast<int>(warp * n_k / k_split), t_end = static_cast<int>((warp + 1) * n_k / k_split);
  const int64_t base = (rt.expert * strips + strip) * n_k;
  const uint8_t* wp = g.blocks + base * 512 + lane * 16;
  const uint8_t* sp = g.scales + base * 32 + (q >> 1) * 16 + r;
  const bool has_token = r < rt.rows;
  const int64_t in_row = !has_token ? 0 : kGated ? rt.row_slot / g.top_k : rt.start + r;
  const uint4* xr = reinterpret_cast<const uint4*>(g.in + in_row * g.k) + 2 * q;

  // A ring of kDepth k tiles of weights and scales per warp, refilled as soon as a tile is multiplied, so
  // every warp keeps kDepth 512-byte loads from HBM in flight (the first kernel had one). Activations come
  // from L2/L1 (shorter latency): a ring of two is enough and keeps registers for weight slots.
  // Instructions per tile are what bounds this loop at one token (ncu: ~150 issued per 512-byte tile, half
  // the issue slots busy), so: the scales become bf16x2 at load (one multiply each), the activation slots of
  // lanes without a token are zeroed once (not per tile), and each round of kDepth tiles addresses its
  // loads from one base per stream with constant offsets.
  constexpr int kActDepth = 2;
  static_assert(kDepth % kActDepth == 0, "activation slots are picked at compile time");
  uint4 w[kDepth], xa[kActDepth], xb[kActDepth];
  uint32_t sc0[kDepth], sc8[kDepth];
#pragma unroll
  for (int i = 0; i < kActDepth; ++i) xa[i] = xb[i] = make_uint4(0, 0, 0, 0);
  // Slot `slot` from tile `i` past the bases (tile t0 of this round): weights, scales, activations.
  auto load_weights = [&](int slot, const uint8_t* w_t0, const uint8_t* s_t0, int i) {
    w[slot] = ldg_stream(w_t0 + i * 512);
    sc0[slot] = mxfp4_scale_x2(__ldg(s_t0 + i * 32));
    sc8[slot] = mxfp4_scale_x2(__ldg(s_t0 + i * 32 + 8));
  };
  auto load_acts = [&](int slot, const uint4* x_t0, int i) {
    if (has_token) {
      xa[slot] = load_act<kGated>(x_t0 + i * 8);
      xb[slot] = load_act<kGated>(x_t0 + i * 8 + 1);
    }
  };
  const uint8_t* w_first = wp + static_cast<int64_t>(t_begin) * 512;
  const uint8_t* s_first = sp + t_begin * 32;
#pragma unroll
  for (int i = 0; i < kDepth; ++i)
    if (t_begin + i < t_end) load_weights(i, w_first, s_first, i);
  if constexpr (!kGated) pdl_wait();  // h comes from the first GEMM
#pragma unroll
  for (int i = 0; i < kActDepth; ++i)
    if (t_begin + i < t_end) load_acts(i, xr + t_begin * 8, i);

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int t0 = t_begin; t0 < t_end; t0 += kDepth) {
    const uint8_t* w_t0 = wp + static_cast<int64_t>(t0) * 512;
    const uint8_t* s_t0 = sp + t0 * 32;
    const uint4* x_t0 = xr + t0 * 8;
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      const int t = t0 + i, xs = i % kActDepth;
      if (t < t_end) {
        mxfp4_strip_mma(acc, w[i], sc0[i], sc8[i], xa[xs], xb[xs]);
        if (t + kDepth < t_end) load_weights(i, w_t0, s_t0, i + kDepth);  // refill the slots just consumed
        if (t + kActDepth < t_end) load_acts(xs, x_t0, i + kActDepth);
      }
    }
  }

  if (!reduce_k_split(acc, red, warp, lane, k_split)) return;
  if constexpr (kGated) {
    swap_ab_swiglu_epilogue(g, acc, rt.expert, rt.start, rt.rows, strip, r, q);
  } else {
    weighted_epilogue_and_combine(p, acc, rt, strip, r, q);
  }
}

template <bool kGated>
Status launch_fused(const MoeFusedParams& p, const MoeFusedConfig& c, dim3 grid, bool pdl, cudaStream_t stream) {
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
  switch (c.depth) {
    case 4: return cuda_status(cudaLaunchKernelEx(&cfg, moe_fused_gemm_kernel<kGated, 4>, p), "moe_fused_gemm_kernel");
    case 6: return cuda_status(cudaLaunchKernelEx(&cfg, moe_fused_gemm_kernel<kGated, 6>, p), "moe_fused_gemm_kernel");
    case 8: return cuda_status(cudaLaunchKernelEx(&cfg, moe_fused_gemm_kernel<kGated, 8>, p), "moe_fused_gemm_kernel");
    default: return internal_error("MoE fused GEMM: ring depth must be 4, 6 or 8");
  }
}

}  // namespace

Status launch_moe_fused_gemm(const MoeFusedParams& p, const MoeFusedConfig& c, cudaStream_t stream) {
  const MoeGemmParams& g = p.g;
  if (g.rows % 16 != 0 || g.k % 64 != 0) return internal_error("MoE GEMM: rows % 16 and k % 64 must be 0");
  if (c.k_split < 1 || c.k_split > kMoeFusedMaxKSplit || c.k_split > g.k / 64 || c.threads != 32 * c.k_split)
    return internal_error("MoE fused GEMM: bad config");
  if (p.topk_ids != nullptr && !use_fused_moe_routing(p.slots))
    return internal_error("MoE fused GEMM: self-routing takes at most 32 routed tokens");
  if (p.tickets != nullptr && (p.topk_ids == nullptr || g.gated || p.combined == nullptr))
    return internal_error("MoE fused GEMM: the combine is fused into the self-routed second GEMM only");
  if (p.slots == 0) return Status::ok();
  const int64_t tiles = moe_fused_max_tiles(p.slots, p.experts);
  if (tiles > 65535) return unimplemented("MoE fused GEMM: too many tiles for one launch");
  const dim3 grid(static_cast<unsigned>(g.rows / 16), static_cast<unsigned>(tiles));
  return g.gated ? launch_fused<true>(p, c, grid, c.pdl, stream) : launch_fused<false>(p, c, grid, c.pdl, stream);
}

}  // namespace mx::cuda
