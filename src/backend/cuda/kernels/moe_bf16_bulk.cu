// bf16 GeGLU experts at decode with the weights brought in by the copy engine (sm_90+): the same work split,
// fragment order and epilogue as moe_bf16.cu (moe_bf16_decode.cuh), but a strip's 16 weight rows reach
// shared memory through cp.async.bulk copies (one per row and stage) that complete on an mbarrier, instead
// of 16-byte register loads through the LSU. The register-load kernel keeps only 4 chunks in flight per
// warp and measured ~2.0-2.1 TB/s on an H100 at one token (docs/PERF.md), and deeper register rings were
// slower in the MXFP4 kernels (the L1TEX miss path saturating was the suspect); a bulk copy is one
// instruction per 512 bytes and keeps a whole ring of stages in flight per CTA.
//
// A CTA: 4 warps, one (16-row strip, 8-token tile) pair. k goes in stages of 256 through a ring of
// kStages slots; stage c sits in slot c % kStages, and thread 0 refills a slot after the CTA barrier that
// ends its use. Warp w multiplies the stage's 64-wide chunk w; the warps' partials are summed in warp order
// at the end (a split fixed by k: batch-independent, like the register kernel's). Rows of a slot are padded
// to 528 bytes so that a quarter warp's 16-byte reads of 2 rows x 4 k groups hit 8 different bank groups.
// Rows past the matrix are not copied (their stale results are never stored); k past the matrix in the last
// stage is zeroed in registers, since the slot holds an earlier stage's bytes there.
// The second GEMM issues its first stages before waiting for h (PDL): weights do not depend on earlier
// kernels, and the routing it reads precedes the first GEMM.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/moe_bf16_decode.cuh"

namespace mx::cuda {
namespace {

using namespace moe_bf16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16;
constexpr int kStageK = 64 * kWarps;               // k per stage: a 64-wide chunk per warp
constexpr int kStages = 4;                         // slots in the ring
constexpr int kRowPitch = kStageK * 2 + 16;        // bytes per row of a slot (padded: see the top)
constexpr int kSlotBytes = kRows * kRowPitch;
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kSlotBytes;

template <bool kGated>
__global__ void __launch_bounds__(kThreads) moe_bf16_bulk_kernel(MoeBf16GemmParams p) {
  extern __shared__ __align__(128) uint8_t ring[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ float red[kWarps - 1][4][32];
  const int tile = blockIdx.y;
  const TileRoute rt = begin_tile<kGated>(p, tile);
  if (tile >= rt.tiles) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, q = lane % 4;
  const int64_t strip = blockIdx.x;
  const int64_t rows_total = kGated ? 2 * p.out_rows : p.out_rows;
  const StripRows s = strip_rows<kGated>(p, strip, r);
  const int64_t n_stages = cdiv(p.k, kStageK);
  const uint32_t ring0 = smem_addr(ring), full0 = smem_addr(full);

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      mbarrier_init(full0 + 8 * i, 1);
      mbarrier_init_fence();
    }
  }
  __syncthreads();

  // Warp 0 issues stage c: lane 0 announces the bytes, then lane i < 16 copies slot row i (gated: gate
  // rows of channels 8 strip + i, then the same channels' up rows).
  const int64_t rows_left = p.out_rows - (kGated ? 8 : 16) * strip;
  const int valid_rows = static_cast<int>(kGated ? 2 * (rows_left < 8 ? rows_left : 8) : (rows_left < 16 ? rows_left : 16));
  auto issue = [&](int64_t c) {
    const int64_t k0 = c * kStageK;
    const uint32_t bytes = static_cast<uint32_t>(2 * (p.k - k0 < kStageK ? p.k - k0 : kStageK));
    const uint32_t bar = full0 + 8 * static_cast<uint32_t>(c % kStages);
    if (lane == 0) mbarrier_arrive_expect_tx(bar, bytes * valid_rows);
    __syncwarp();
    const int i = lane;
    const bool row_ok = kGated ? i < 16 && i % 8 < valid_rows / 2 : i < valid_rows;
    if (row_ok) {
      const int64_t row = kGated ? (i < 8 ? 8 * strip + i : p.out_rows + 8 * strip + i - 8) : 16 * strip + i;
      const uint32_t dst = ring0 + static_cast<uint32_t>((c % kStages) * kSlotBytes + i * kRowPitch);
      bulk_copy(dst, p.w + (rt.expert * rows_total + row) * p.k + k0, bytes, bar);
    }
  };
  if (warp == 0) {
    for (int64_t c = 0; c < kStages && c < n_stages; ++c) issue(c);  // constant: in flight before waiting for h
  }
  if constexpr (!kGated) pdl_wait();

  bool x_ok;
  const uint16_t* x_row = token_row<kGated>(p, rt, r, q, x_ok);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t c = 0; c < n_stages; ++c) {
    const int64_t off = c * kStageK + 64 * warp, k0 = off + 16 * q;  // this warp's chunk; this lane's first k
    const bool in0 = k0 < p.k, in1 = k0 + 8 < p.k;
    const uint4 x0 = load16_act<kGated>(x_row + off, x_ok && in0);  // issued before the wait
    const uint4 x1 = load16_act<kGated>(x_row + off + 8, x_ok && in1);
    const uint32_t slot = static_cast<uint32_t>(c % kStages);
    while (!mbarrier_try_wait(full0 + 8 * slot, static_cast<uint32_t>(c / kStages) & 1u)) {
    }
    const uint8_t* base = ring + slot * kSlotBytes + (64 * warp + 16 * q) * 2;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const uint4 a[4] = {in0 ? *reinterpret_cast<const uint4*>(base + r * kRowPitch) : zero,
                        in1 ? *reinterpret_cast<const uint4*>(base + r * kRowPitch + 16) : zero,
                        in0 ? *reinterpret_cast<const uint4*>(base + (r + 8) * kRowPitch) : zero,
                        in1 ? *reinterpret_cast<const uint4*>(base + (r + 8) * kRowPitch + 16) : zero};
    chunk_mma(acc, a, x0, x1);
    __syncthreads();  // every warp is done with this slot
    if (warp == 0 && c + kStages < n_stages) issue(c + kStages);
  }

  // Sum the warps' partials in warp order.
  if (warp > 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) red[warp - 1][c][lane] = acc[c];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] += red[w][c][lane];
  store_strip<kGated>(p, rt, s, strip, acc);
}

}  // namespace

Status launch_moe_bf16_bulk_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  const int64_t strips = p.gated ? cdiv(p.out_rows, 8) : cdiv(p.out_rows, 16);
  const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(p.max_tiles));
  auto kernel = p.gated ? moe_bf16_bulk_kernel<true> : moe_bf16_bulk_kernel<false>;
  return cuda_status(launch_pdl(kernel, grid, dim3(kThreads), kSmemBytes, stream, p), "moe_bf16_bulk_kernel");
}

}  // namespace mx::cuda
