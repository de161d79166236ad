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
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_configs.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/mbarrier.cuh"

namespace mx::cuda {
namespace {

constexpr int kWarps = kSkinnyLinearWarps;
constexpr int kChunks = 4;      // chunks per warp and round, as the skinny kernel's one-tile form
constexpr int kChunk = 32;      // k per chunk
// `pitch`: skinny_linear_staged_pitch(k).
__global__ void __launch_bounds__(kWarps * 32, kSkinnyLinearCtasPerSm)
    skinny_linear_staged_kernel(SkinnyLinearParams p, int strip_rows, int64_t pitch) {
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
    const auto row_bytes = static_cast<uint32_t>(2 * p.k);
    if (lane == 0) mbarrier_arrive_expect_tx(bar, row_bytes * static_cast<uint32_t>(rows));
    __syncwarp();
    if (lane < rows) bulk_copy(base + static_cast<uint32_t>(lane * pitch), p.w + (row0 + lane) * p.k, row_bytes, bar);
  }
  pdl_wait();
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const bool lo_ok = g < rows, hi_ok = g + 8 < rows, x_ok = g < p.m;
  const uint16_t* x_row = p.x + (x_ok ? g : 0) * p.k + 8 * t;
  const uint8_t* a_lo = staged + g * pitch + 16 * t;
  const uint8_t* a_hi = staged + (g + 8) * pitch + 16 * t;
  const int64_t chunks = (p.k + kChunk - 1) / kChunk;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  mbarrier_wait(bar, 0);
  float acc[4] = {};
  for (int64_t c0 = warp; c0 < chunks; c0 += kChunks * kWarps) {
    uint4 lo[kChunks], hi[kChunks], b[kChunks];
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kWarps;
      const bool in = c < chunks && c * kChunk + 8 * t < p.k;
      b[u] = in && x_ok ? __ldg(reinterpret_cast<const uint4*>(x_row + c * kChunk)) : zero;
      lo[u] = in && lo_ok ? *reinterpret_cast<const uint4*>(a_lo + c * 2 * kChunk) : zero;
      hi[u] = in && hi_ok ? *reinterpret_cast<const uint4*>(a_hi + c * 2 * kChunk) : zero;
    }
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const uint32_t a0[4] = {lo[u].x, hi[u].x, lo[u].y, hi[u].y};
      const uint32_t a1[4] = {lo[u].z, hi[u].z, lo[u].w, hi[u].w};
      mma_bf16_16816(acc, a0, b[u].x, b[u].y);
      mma_bf16_16816(acc, a1, b[u].z, b[u].w);
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
  if (p.bias) s += bf16_bits_to_f32(p.bias[row]);
  if (p.out_f32) {
    static_cast<float*>(p.out)[token * p.n + row] = s;
  } else {
    static_cast<uint16_t*>(p.out)[token * p.n + row] = f32_to_bf16_bits(s);
  }
}

}  // namespace

Status launch_skinny_linear_staged(const SkinnyLinearParams& p, int strip_rows, cudaStream_t stream) {
  if (!p.w || p.w_fp8 || p.m < 1 || p.m > 8 || p.k % 8 != 0 || p.k <= 0 || strip_rows < 8 || strip_rows > 16)
    return internal_error("skinny linear staged: bf16 weights, 1 to 8 tokens, k % 8 == 0, strips of 8 to 16 rows");
  if (p.n == 0) return Status::ok();
  const auto smem = static_cast<size_t>(skinny_linear_staged_smem_bytes(p.k, strip_rows));
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(skinny_linear_staged_kernel,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                                 "cudaFuncSetAttribute(skinny_linear_staged smem)"));
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.n, strip_rows)));
  return cuda_status(launch_pdl(skinny_linear_staged_kernel, grid, dim3(kWarps * 32), smem, stream, p, strip_rows,
                                skinny_linear_staged_pitch(p.k)),
                     "skinny_linear_staged_kernel");
}

}  // namespace mx::cuda
