// MXFP4 experts for many tokens per expert on Hopper (sm_90a): the grouped GEMM on warpgroup MMA.
//
// Swap AB as at decode: the weights are the MMA's M side, straight from the swap-AB layout (expert_repack.h),
// whose per-lane 16 bytes per 16-row strip and 64-k tile are exactly the A register fragments of four
// m64nNk16 steps for one warp once decoded (mxfp4_dequant_step): no shared-memory staging of bf16 weights.
// The expert-sorted tokens are the N side (a routing tile of kN = 64 or 128 tokens), in shared memory as
// wgmma's K-major B operand with the 128-byte swizzle. A CTA is kWG warpgroups (2 to 4), each 64 weight rows
// (warp w of the CTA owns strip strip0 + w), sharing the B tile; k goes in tiles of 64 through a cp.async ring of
// kMoeWgmmaStages stages (activation rows, 4 KB of packed fp4, 256 B of scales), with two wgmma groups in
// flight so that a tile's fp4 decode overlaps the previous tile's MMAs.
//
// The layout's k permutation: in k-step kk of a 64-k tile, lane q's A registers hold physical k
// 16q + 4kk + {0, 1} (logical k 2q, 2q + 1 of the step) and 16q + 4kk + {2, 3} (logical 2q + 8, 2q + 9).
// The mma.sync kernels read lane q's 32 activation bytes from global directly; wgmma reads B rows of 16
// logical k from shared memory, so the activations are stored with k in logical order: the first GEMM's
// input through one permuting copy of x (moe_permute_k), the second GEMM's input h written permuted by the
// first GEMM's epilogue. Outputs y are in the natural order; the combine is unchanged.
//
// A (token, expert) pair's result depends only on its own row and the weights (the k order is fixed), not
// on which other tokens share its tile.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/mxfp4_swap_ab.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {
namespace {


// Position in the logical k order of physical k `p` (see the header comment): within a 64-k tile, physical
// 16q + 4kk + j goes to 16kk + 2q + (j & 1) + 8 (j >> 1).
__device__ __forceinline__ int64_t logical_k(int64_t p) {
  const int w = static_cast<int>(p & 63), q = w >> 4, kk = (w >> 2) & 3, j = w & 3;
  return (p & ~int64_t{63}) + 16 * kk + 2 * q + (j & 1) + 8 * (j >> 1);
}

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

#if MX_SM90A
constexpr int kStages = kMoeWgmmaStages;
static_assert(kStages >= 3, "tile t - 1 in the MMAs, tile t decoded, at least one tile loading");
__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
#endif

// Two CTAs per SM with two warpgroups (128 registers a thread), one with three or four.
template <int kN, int kWG>
__global__ void __launch_bounds__(moe_wgmma_threads(kWG), kWG == 2 ? 2 : 1) moe_wgmma_kernel(MoeGemmParams p) {
#if MX_SM90A
  constexpr int kThreads = moe_wgmma_threads(kWG), kRows = moe_wgmma_weight_rows(kWG), kStrips = kRows / 16;
  static_assert(kThreads == 32 * kStrips, "a warp per 16-row strip");
  constexpr int kStageBytes = static_cast<int>(moe_wgmma_stage_bytes(kN, kWG));
  extern __shared__ uint8_t smem_raw[];
  __shared__ int64_t src_off[kN];  // where each tile row's input row starts (elements), -1 past the tile's tokens
  // The swizzle pattern repeats every 1024 bytes; B tiles start on that boundary.
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);

  const int tile = blockIdx.y;
  if (tile >= *p.r.num_tiles) return;
  const int e = p.r.tile_expert[tile], start = p.r.tile_start[tile], n = p.r.tile_rows[tile];
  const int64_t strips = p.rows / 16;
  const int n_k = static_cast<int>(p.k / 64);
  const int strip0 = blockIdx.x * kStrips;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4;

  for (int i = tid; i < kN; i += kThreads)
    src_off[i] = i >= n ? -1
                        : p.k * (p.gated ? p.r.sorted_slots[start + i] / static_cast<int>(p.top_k) : start + i);
  __syncthreads();

  auto b_tile = [&](int s) { return smem + s * kStageBytes; };
  auto w_tile = [&](int s) { return b_tile(s) + kN * 128; };
  auto s_tile = [&](int s) { return w_tile(s) + kRows * 32; };

  // The loads' loop-invariant parts, once per CTA (the per-tile address arithmetic was a large share of the
  // kernel's issued instructions): thread tid copies 16-byte chunk tid % 8 of tile rows tid / 8 + j x
  // kRowsPerPass, whose swizzled place is the same in every pass (kRowsPerPass is a multiple of 8), and its
  // warp's strip of fp4 blocks and scales; a k tile t then only adds t x 64 elements, t x 512 or t x 32 bytes.
  constexpr int kRowsPerPass = kThreads / 8;
  static_assert(kRowsPerPass % 8 == 0, "one swizzle phase per thread");
  const int ch = tid % 8, row0 = tid / 8;
  const int b_off = row0 * 128 + ((ch ^ (row0 & 7)) * 16);
  const uint16_t* in_ch = p.in + ch * 8;
  const int64_t my_strip = strip0 + warp;
  const bool strip_ok = my_strip < strips;
  const int64_t strip_tiles = (e * strips + (strip_ok ? my_strip : 0)) * n_k;
  const uint8_t* w_src = p.blocks + strip_tiles * 512 + lane * 16;
  const uint8_t* s_src = p.scales + strip_tiles * 32 + (lane & 1) * 16;
  auto load = [&](int t, int s) {
    uint8_t* b = b_tile(s) + b_off;
    const int64_t kt = static_cast<int64_t>(t) * 64;
#pragma unroll
    for (int j = 0; j < (kN + kRowsPerPass - 1) / kRowsPerPass; ++j) {
      const int row = row0 + j * kRowsPerPass;
      if (kN % kRowsPerPass != 0 && row >= kN) break;
      const int64_t off = src_off[row];
      cp_async_16(b + j * kRowsPerPass * 128, off < 0 ? p.in : in_ch + off + kt, off >= 0);
    }
    // This warp's strip: 16 bytes per lane (the lane reads back exactly its own bytes), 32 B of scales.
    cp_async_16(w_tile(s) + tid * 16, w_src + kt * 8, strip_ok);
    if (lane < 2) cp_async_16(s_tile(s) + warp * 32 + lane * 16, s_src + kt / 2, strip_ok);
  };

  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;

  // Two wgmma groups in flight: tile t's dequant overlaps tile t - 1's MMAs, so the A registers alternate
  // between two sets (the k loop is unrolled by 2 to keep their indices static). The slot reloaded at
  // iteration t is tile t - 2's, which every warpgroup has finished (wait<1> before the barrier); tiles
  // t + 1 .. t + kStages - 2 are in flight.
  for (int s = 0; s < kStages - 2; ++s) {
    if (s < n_k) load(s, s);
    cp_async_commit();
  }
  uint32_t a[2][4][4];
  int slot = 0, load_slot = kStages - 2;  // t % kStages and (t + kStages - 2) % kStages, counted
  auto step = [&](int t, uint32_t(&at)[4][4]) {
    cp_async_wait<kStages - 3>();  // this thread's copies of tile t landed
    fence_proxy_async_smem();      // ... and are visible to wgmma's reads
    __syncthreads();               // everyone's; every warpgroup finished tile t - 2, whose slot is reloaded next
    {
      const int next = t + kStages - 2;
      if (next < n_k) load(next, load_slot);
      cp_async_commit();
      load_slot = load_slot == kStages - 1 ? 0 : load_slot + 1;
    }
    const uint4 wq = lds128(w_tile(slot) + tid * 16);
    const uint8_t* sc = s_tile(slot) + warp * 32 + (q >> 1) * 16;
    const uint32_t sc0 = mxfp4_scale_x2(sc[r]), sc8 = mxfp4_scale_x2(sc[r + 8]);
    const uint32_t w4[4] = {wq.x, wq.y, wq.z, wq.w};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) mxfp4_dequant_step(w4[kk], sc0, sc8, at[kk]);
    const uint32_t b_addr = smem_addr(b_tile(slot));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_bf16_rs<kN>(acc, at[kk], wgmma_desc_k128(b_addr + kk * 32));
    wgmma_commit();
    wgmma_wait<1>();  // tile t - 1's group done: its A registers and its smem slot are free
    slot = slot == kStages - 1 ? 0 : slot + 1;
  };
  wgmma_fence_regs(acc);
  int t = 0;
  for (; t + 1 < n_k; t += 2) {
    step(t, a[0]);
    step(t + 1, a[1]);
  }
  if (t < n_k) step(t, a[0]);
  wgmma_wait<0>();
  wgmma_fence_regs(acc);
  cp_async_wait<0>();
  if (!strip_ok) return;

  // acc[4j + c]: strip row r (c 0, 1) or r + 8 (c 2, 3) for tile tokens 8j + 2q + (c & 1).
  if (p.gated) {
    // Gate and up of channel my_strip * 8 + r; h is written in the second GEMM's logical k order.
    const int64_t channel = my_strip * 8 + r, half = p.rows / 2, col = logical_k(channel);
    const float gate_b = bf16_bits_to_f32(p.bias[e * p.rows + 2 * channel]);
    const float up_b = bf16_bits_to_f32(p.bias[e * p.rows + 2 * channel + 1]);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int tok = 8 * j + 2 * q + c;
        if (tok >= n) continue;
        const float h = swiglu_clamped(acc[4 * j + c] + gate_b, acc[4 * j + 2 + c] + up_b, p.swiglu_limit, p.swiglu_alpha);
        p.out[(start + tok) * half + col] = f32_to_bf16_bits(h);
      }
  } else {
    const StripBias bias = load_strip_bias(p, e, my_strip, r);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      if (8 * j >= n) break;
      const float part[4] = {acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]};
      swap_ab_weighted_epilogue(p, part, bias, start + 8 * j, n - 8 * j, my_strip, r, q, [&](int c) {
        return p.topk_weights[p.r.sorted_slots[start + 8 * j + 2 * q + c]];
      });
    }
  }
#endif
}

template <int kN, int kWG>
Status launch(const MoeGemmParams& p, const MoeWgmmaConfig& c, cudaStream_t stream) {
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(moe_wgmma_kernel<kN, kWG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      static_cast<int>(c.smem_bytes)),
                                 "cudaFuncSetAttribute(moe wgmma smem)"));
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.rows / 16, moe_wgmma_weight_rows(kWG) / 16)),
                  static_cast<unsigned>(p.max_tiles));
  moe_wgmma_kernel<kN, kWG><<<grid, c.threads, c.smem_bytes, stream>>>(p);
  return launch_status("moe_wgmma_kernel");
}

}  // namespace

Status launch_moe_permute_k(const uint16_t* in, uint16_t* out, int64_t rows, int64_t k, cudaStream_t stream) {
  if (k % 64 != 0) return internal_error("MoE k permutation: k % 64 must be 0");
  const int64_t items = rows * k / 4;
  if (items == 0) return Status::ok();
  moe_permute_k_kernel<<<static_cast<unsigned>(ceil_div64(items, 256)), 256, 0, stream>>>(in, out, rows, k);
  return launch_status("moe_permute_k_kernel");
}

Status launch_moe_wgmma_gemm(const MoeGemmParams& p, const MoeWgmmaConfig& c, cudaStream_t stream) {
  if (p.rows % 16 != 0 || p.k % 64 != 0) return internal_error("MoE wgmma GEMM: rows % 16 and k % 64 must be 0");
  if (!c.enabled || c.threads != moe_wgmma_threads(c.warpgroups) || c.stages != kMoeWgmmaStages)
    return internal_error("MoE wgmma GEMM: config does not fit this GPU");
  if (p.max_tiles == 0) return Status::ok();
  if (p.max_tiles > 65535) return unimplemented("MoE wgmma GEMM: too many token tiles in one call");
  switch (c.tile_tokens * 10 + c.warpgroups) {
    case 642: return launch<64, 2>(p, c, stream);
    case 643: return launch<64, 3>(p, c, stream);
    case 644: return launch<64, 4>(p, c, stream);
    case 1282: return launch<128, 2>(p, c, stream);
    case 1283: return launch<128, 3>(p, c, stream);
    case 1284: return launch<128, 4>(p, c, stream);
    default: return internal_error("MoE wgmma GEMM: tiles of 64 or 128 tokens, 2 to 4 warpgroups");
  }
}

}  // namespace mx::cuda
