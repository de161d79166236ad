// bf16 GeGLU experts for many tokens per expert (prefill): a grouped GEMM over launch_moe_routing's
// 64-token tiles on mma.sync, the expert-sorted tokens as the M side.
//
// A CTA: one routing tile (64 tokens of one expert) x 128 weight rows, 4 warps in 2 x 2 (32 tokens x 64 rows
// each), k in tiles of 64 through a 3-stage cp.async ring; rows padded to 72 elements so that ldmatrix
// reads of 8 rows hit 8 different bank groups. The first GEMM's 128 rows are 64 channels as 8 groups of
// [8 gate rows, the same 8 channels' up rows], so each warp's n-tiles 2g and 2g + 1 hold gate and up of the
// same (token, channel) and the GeGLU runs on the accumulators. The second GEMM's epilogue multiplies by the
// slot's routing weight. Tokens past the tile's rows, rows past the matrix and k past its end are
// zero-filled by the copies (src size 0). Tiles past the device-side count exit (graph-safe grid).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gated_mul.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/moe_route_tile.cuh"

namespace mx::cuda {
namespace {

constexpr int kBM = 64, kBN = 128, kBK = 64;
constexpr int kPitch = kBK + 8;  // elements per smem row
constexpr int kStages = 3;
constexpr int kThreads = 128;
constexpr int kStageElems = (kBM + kBN) * kPitch;
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageElems * 2;

template <bool kGated>
__global__ void __launch_bounds__(kThreads) moe_bf16_grouped_kernel(MoeBf16GemmParams p) {
  extern __shared__ __align__(16) uint16_t smem[];
  __shared__ int src_row[kBM];  // input row of each tile row, -1 past the tile's tokens
  __shared__ int64_t w_row[kBN];  // weight row of each B row, -1 past the matrix
  pdl_wait();  // ids, metadata and activations come from earlier kernels
  pdl_launch_dependents();
  const int tile = blockIdx.y;
  if (tile >= *p.r.num_tiles) return;
  const GroupedTile gt = grouped_tile<kBM, kThreads>(p.r, tile, kGated, p.top_k, src_row);
  const int e = gt.expert, start = gt.start, n = gt.rows;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r = lane / 4, q = lane % 4;
  const int wm = warp / 2, wn = warp % 2;
  const int64_t rows_total = kGated ? 2 * p.out_rows : p.out_rows;

  for (int i = tid; i < kBN; i += kThreads) {
    int64_t row;
    bool ok;
    if constexpr (kGated) {
      const int64_t ch = static_cast<int64_t>(blockIdx.x) * (kBN / 2) + 8 * (i / 16) + i % 8;
      ok = ch < p.out_rows;
      row = i % 16 < 8 ? ch : p.out_rows + ch;
    } else {
      row = static_cast<int64_t>(blockIdx.x) * kBN + i;
      ok = row < p.out_rows;
    }
    w_row[i] = ok ? e * rows_total + row : -1;
  }
  __syncthreads();

  auto a_tile = [&](int s) { return smem + s * kStageElems; };
  auto b_tile = [&](int s) { return smem + s * kStageElems + kBM * kPitch; };
  const int n_k = static_cast<int>((p.k + kBK - 1) / kBK);
  auto load = [&](int kt, int s) {
    const int col = tid % 8;
    const int64_t k0 = static_cast<int64_t>(kt) * kBK + col * 8;
    const bool k_ok = k0 < p.k;
#pragma unroll
    for (int j = 0; j < kBM / 16; ++j) {
      const int row = tid / 8 + 16 * j, src = src_row[row];
      const bool ok = src >= 0 && k_ok;
      cp_async_16(a_tile(s) + row * kPitch + col * 8, ok ? p.in + src * p.k + k0 : p.in, ok);
    }
#pragma unroll
    for (int j = 0; j < kBN / 16; ++j) {
      const int row = tid / 8 + 16 * j;
      const int64_t wr = w_row[row];
      const bool ok = wr >= 0 && k_ok;
      cp_async_16(b_tile(s) + row * kPitch + col * 8, ok ? p.w + wr * p.k + k0 : p.w, ok);
    }
  };

  float acc[2][8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_k) load(s, s);
    cp_async_commit();
  }
  const int m = lane / 8;  // ldmatrix: this lane's row address is in matrix m
  for (int kt = 0; kt < n_k; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile kt landed for everyone; everyone is done with the slot refilled below
    if (kt + kStages - 1 < n_k) load(kt + kStages - 1, (kt + kStages - 1) % kStages);
    cp_async_commit();
    const uint16_t* a = a_tile(kt % kStages);
    const uint16_t* b = b_tile(kt % kStages);
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], a + (wm * 32 + mi * 16 + (m % 2) * 8 + lane % 8) * kPitch + kk * 16 + (m / 2) * 8);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bf[4];  // n-tiles 2np (regs 0, 1) and 2np + 1 (regs 2, 3)
        ldmatrix_x4(bf, b + (wn * 64 + np * 16 + (m / 2) * 8 + lane % 8) * kPitch + kk * 16 + (m % 2) * 8);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_bf16_16816(acc[mi][2 * np], af[mi], bf[0], bf[1]);
          mma_bf16_16816(acc[mi][2 * np + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  // acc[mi][nt]: tokens wm*32 + 16mi + r (c 0, 1) and + 8 (c 2, 3); columns 2q, 2q + 1 of n-tile nt.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int tok = wm * 32 + mi * 16 + r + 8 * half;
      if (tok >= n) continue;
      const int64_t pos = start + tok;
      if constexpr (kGated) {
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          const int64_t ch = static_cast<int64_t>(blockIdx.x) * (kBN / 2) + 8 * (wn * 4 + g) + 2 * q;
          if (ch >= p.out_rows) continue;
          const float h0 = gelu_tanh(acc[mi][2 * g][2 * half]) * acc[mi][2 * g + 1][2 * half];
          const float h1 = gelu_tanh(acc[mi][2 * g][2 * half + 1]) * acc[mi][2 * g + 1][2 * half + 1];
          *reinterpret_cast<uint32_t*>(p.out + pos * p.out_rows + ch) = pack_bf16x2(h0, h1);
        }
      } else {
        const float wt = p.topk_weights[p.r.sorted_slots[pos]];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int64_t row = static_cast<int64_t>(blockIdx.x) * kBN + wn * 64 + nt * 8 + 2 * q;
          if (row >= p.out_rows) continue;
          *reinterpret_cast<uint32_t*>(p.out + pos * p.out_rows + row) =
              pack_bf16x2(acc[mi][nt][2 * half] * wt, acc[mi][nt][2 * half + 1] * wt);
        }
      }
    }
}

}  // namespace

Status launch_moe_bf16_grouped_gemm(const MoeBf16GemmParams& p, cudaStream_t stream) {
  if (p.out_rows % 2 != 0) return internal_error("bf16 grouped experts: even output rows expected");
  const int64_t cols = p.gated ? ceil_div64(p.out_rows, kBN / 2) : ceil_div64(p.out_rows, kBN);
  const dim3 grid(static_cast<unsigned>(cols), static_cast<unsigned>(p.max_tiles));
  auto run = [&](auto kernel) -> Status {
    MX_RETURN_IF_ERROR(cuda_status(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)),
        "cudaFuncSetAttribute(moe bf16 grouped smem)"));
    return cuda_status(launch_pdl(kernel, grid, dim3(kThreads), kSmemBytes, stream, p), "moe_bf16_grouped_kernel");
  };
  return p.gated ? run(moe_bf16_grouped_kernel<true>) : run(moe_bf16_grouped_kernel<false>);
}

}  // namespace mx::cuda
