// Dense linears at one to 8 tokens with each CTA's whole weight strip staged in shared memory before its PDL wait
// (CudaSkinnyLinearOptions::staged, sm_90+): the skinny kernel (skinny_linear.cu) issues one round of weight loads
// before the wait and streams the rest after it, so at one token a GEMV after a latency-bound kernel (Gemma-4's
// o_proj after the decode attention) starts its ~23 MB only once that kernel ends. Here the CTAs, launched as the
// attention's programmatic dependents while it runs, copy their strip (up to 16 rows of k, one bulk copy per row on
// one mbarrier) into shared memory at once, so the bytes arrive while HBM would otherwise be idle; after the wait
// only the activations come from memory.
// The same fragments, split and order as the skinny kernel's one-tile, 4-chunk form without k splits: warp w takes
// chunks w, w + 8, ... in groups of 4 (the masked chunks past k too: zero products, as there), lane (g, t) the 16
// bytes 8t.. of rows g and g + 8 of each 32-wide chunk, the warps' partials summed in warp order: the same bits.
// Rows sit at a pitch of 64 bytes past a multiple of 128, so that a quarter warp's two rows (g, g + 1, 64 bytes
// each) fall in different bank halves.
// FP8 weights (CudaSkinnyLinearOptions::fp8_staged; k % 16 == 0): the skinny kernel's FP8 one-tile form the same
// way, a 64-byte chunk being 64 codes (lane t's 16 bytes: codes 16t.., widened to bf16 eight at a time against two
// 16-byte activation loads), the row's scale times the warps' sum, then the bias. Past one wave
// (CudaSkinnyLinearOptions::fp8_staged_head_rows: the lm_head's 12,568 strips) a CTA still takes one strip, its copies
// issued as it starts: FP8's 47 KB strips at 4 CTAs an SM keep up to ~190 KB an SM in flight where the register
// kernel keeps 72 KB (3 CTAs of 8 warps x 3 chunks x 1 KB).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_configs.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/skinny_fp8.cuh"

namespace mx::cuda {
namespace {

constexpr int kWarps = kSkinnyLinearWarps;

// `pitch`: skinny_linear_staged_pitch(k, kFp8 ? 1 : 2). kCtasPerSm: 2, or 4 (FP8 past one wave: <= 64 registers).
template <bool kFp8, int kCtasPerSm>
__global__ void __launch_bounds__(kWarps * 32, kCtasPerSm)
    skinny_linear_staged_kernel(SkinnyLinearParams p, int strip_rows, int64_t pitch) {
  constexpr int kLaneK = kFp8 ? 16 : 8;      // elements of a lane's 16 bytes of a row
  constexpr int kGroups = kLaneK / 8;        // bf16 groups of 8 in them
  constexpr int kChunk = 4 * kLaneK;         // k per chunk (64 bytes of a row)
  constexpr int kChunks = kFp8 ? 2 : 4;      // chunks per warp and round (any count: the same order of sums)
  extern __shared__ __align__(128) uint8_t staged[];
  __shared__ float red[kWarps][4][32];
  __shared__ __align__(8) uint64_t full;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t strip = blockIdx.x, row0 = strip * strip_rows;
  const int rows = static_cast<int>(p.n - row0 < strip_rows ? p.n - row0 : strip_rows);
  const uint32_t bar = smem_addr(&full), base = smem_addr(staged);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  // The weights are constant: the whole strip is in flight before the wait on the kernel that writes x.
  if (warp == 0) {
    const auto row_bytes = static_cast<uint32_t>(kFp8 ? p.k : 2 * p.k);
    if (lane == 0) mbarrier_arrive_expect_tx(bar, row_bytes * static_cast<uint32_t>(rows));
    __syncwarp();
    const uint8_t* w = kFp8 ? p.w_fp8 : reinterpret_cast<const uint8_t*>(p.w);
    if (lane < rows) bulk_copy(base + static_cast<uint32_t>(lane * pitch), w + (row0 + lane) * row_bytes, row_bytes, bar);
  }
  pdl_wait();
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const bool lo_ok = g < rows, hi_ok = g + 8 < rows, x_ok = g < p.m;
  const uint16_t* x_row = p.x + (x_ok ? g : 0) * p.k + kLaneK * t;
  const uint8_t* a_lo = staged + g * pitch + 16 * t;
  const uint8_t* a_hi = staged + (g + 8) * pitch + 16 * t;
  const int64_t chunks = (p.k + kChunk - 1) / kChunk;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  mbarrier_wait(bar, 0);
  float acc[4] = {};
  for (int64_t c0 = warp; c0 < chunks; c0 += kChunks * kWarps) {
    uint4 lo[kChunks], hi[kChunks], b[kChunks][kGroups];
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kWarps;
      const bool in = c < chunks && c * kChunk + kLaneK * t < p.k;  // FP8: k % 16 == 0, so all 16 codes are
#pragma unroll
      for (int h = 0; h < kGroups; ++h)
        b[u][h] = in && x_ok ? __ldg(reinterpret_cast<const uint4*>(x_row + c * kChunk + 8 * h)) : zero;
      lo[u] = in && lo_ok ? *reinterpret_cast<const uint4*>(a_lo + c * 64) : zero;
      hi[u] = in && hi_ok ? *reinterpret_cast<const uint4*>(a_hi + c * 64) : zero;
    }
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
#pragma unroll
      for (int h = 0; h < kGroups; ++h) {
        const uint4 l = kFp8 ? (h == 0 ? widen_fp8x8(lo[u].x, lo[u].y) : widen_fp8x8(lo[u].z, lo[u].w)) : lo[u];
        const uint4 r = kFp8 ? (h == 0 ? widen_fp8x8(hi[u].x, hi[u].y) : widen_fp8x8(hi[u].z, hi[u].w)) : hi[u];
        const uint32_t a0[4] = {l.x, r.x, l.y, r.y};
        const uint32_t a1[4] = {l.z, r.z, l.w, r.w};
        mma_bf16_16816(acc, a0, b[u][h].x, b[u][h].y);
        mma_bf16_16816(acc, a1, b[u][h].z, b[u][h].w);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) red[warp][e][lane] = acc[e];
  __syncthreads();
  // One value per thread: fragment slot e of lane l, summed over the warps in order.
  const int v = threadIdx.x;
  if (v >= 4 * 32) return;
  float s = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) s += red[w][v / 32][v % 32];
  const int e = v / 32, l = v % 32;
  const int in_strip = l / 4 + (e >= 2 ? 8 : 0);
  const int64_t row = row0 + in_strip, token = 2 * (l % 4) + (e & 1);
  if (in_strip >= rows || token >= p.m) return;
  if constexpr (kFp8) s = __fmul_rn(s, p.w_scale[row]);  // rounded apart from the bias, as the skinny kernel
  if (p.bias) s = __fadd_rn(s, bf16_bits_to_f32(p.bias[row]));
  if (p.out_f32) {
    static_cast<float*>(p.out)[token * p.n + row] = s;
  } else {
    static_cast<uint16_t*>(p.out)[token * p.n + row] = f32_to_bf16_bits(s);
  }
}

template <bool kFp8, int kCtasPerSm>
Status launch(const SkinnyLinearParams& p, int strip_rows, cudaStream_t stream) {
  const int elem_bytes = kFp8 ? 1 : 2;
  const auto smem = static_cast<size_t>(skinny_linear_staged_smem_bytes(p.k, strip_rows, elem_bytes));
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(skinny_linear_staged_kernel<kFp8, kCtasPerSm>,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                                 "cudaFuncSetAttribute(skinny_linear_staged smem)"));
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.n, strip_rows)));
  return cuda_status(launch_pdl(skinny_linear_staged_kernel<kFp8, kCtasPerSm>, grid, dim3(kWarps * 32), smem, stream, p,
                                strip_rows, skinny_linear_staged_pitch(p.k, elem_bytes)),
                     "skinny_linear_staged_kernel");
}

}  // namespace

Status launch_skinny_linear_staged(const SkinnyLinearParams& p, int strip_rows, cudaStream_t stream, int ctas_per_sm) {
  const bool fp8 = p.w_fp8 != nullptr;
  if (fp8 == (p.w != nullptr) || (fp8 && (!p.w_scale || p.k % 16 != 0)) || p.m < 1 || p.m > 8 || p.k % 8 != 0 ||
      p.k <= 0 || strip_rows < 8 || strip_rows > 16 || (ctas_per_sm != 2 && ctas_per_sm != 4))
    return internal_error("skinny linear staged: bf16 weights or FP8 with scales and k % 16 == 0, 1 to 8 tokens, "
                          "k % 8 == 0, strips of 8 to 16 rows, 2 or 4 CTAs an SM");
  if (p.n == 0) return Status::ok();
  if (!fp8) return launch<false, 2>(p, strip_rows, stream);
  return ctas_per_sm == 4 ? launch<true, 4>(p, strip_rows, stream) : launch<true, 2>(p, strip_rows, stream);
}

}  // namespace mx::cuda
