// Dense linears for a few tokens (decode): a bandwidth kernel. Each CTA owns 16 output channels (the
// mma.sync A side) and all M <= 16 tokens (one or two 8-wide B tiles); its 8 warps take the K axis in
// 32-element chunks round-robin, so at any moment the CTA reads a contiguous run of every weight row.
//
// Fragments straight from global memory: mma m16n8k16 wants lane (g, t) to hold A[g][2t, 2t+1, 2t+8,
// 2t+9] (and row g + 8) and B[2t, 2t+1, 2t+8, 2t+9][g]. A dot product does not care how k is ordered as
// long as A and B agree, so the kernel renames k inside each 32-chunk: lane t's 16-byte load of a weight
// row (elements 8t..8t+7) supplies logical k {2t, 2t+1, 2t+8, 2t+9} of the first k16 step with elements
// 0-3 and of the second step with elements 4-7, and the same 16-byte load of the token's activation row
// supplies B. No shared memory, no shuffles, one 16-byte load per 16 weight bytes. With k splits (grid
// y) each CTA covers a range of chunks and the strip's last CTA adds the fp32 partials in split order.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {
namespace {

constexpr int kChunk = 32;  // k elements per lane quad per step: 4 lanes x 8 bf16

__device__ __forceinline__ uint4 ldg_cached(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

template <int kTiles, int kChunks>
__global__ void __launch_bounds__(kSkinnyLinearWarps * 32, kSkinnyLinearCtasPerSm)
    skinny_linear_kernel(SkinnyLinearParams p, int64_t chunks_per_split) {
  __shared__ float red[kSkinnyLinearWarps][kTiles * 4][32];
  __shared__ bool last_of_strip;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t strip = blockIdx.x, row0 = strip * 16;
  const int64_t first = blockIdx.y * chunks_per_split;
  const int64_t end = min((p.k + kChunk - 1) / kChunk, first + chunks_per_split);
  // Rows past n and tokens past m read row 0 / token 0 (always valid) and are masked to zero.
  const bool lo_ok = row0 + g < p.n, hi_ok = row0 + g + 8 < p.n;
  const uint16_t* w_lo = p.w + (lo_ok ? row0 + g : 0) * p.k + 8 * t;
  const uint16_t* w_hi = p.w + (hi_ok ? row0 + g + 8 : 0) * p.k + 8 * t;
  const uint16_t* x_row[kTiles];
  bool x_ok[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    x_ok[j] = g + 8 * j < p.m;
    x_row[j] = p.x + (x_ok[j] ? g + 8 * j : 0) * p.k + 8 * t;
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 a_lo[kChunks], a_hi[kChunks], b[kChunks][kTiles];
  auto in_range = [&](int64_t c) { return c < end && c * kChunk + 8 * t < p.k; };
  auto load_weights = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kSkinnyLinearWarps;
      const bool in = in_range(c);
      a_lo[u] = in && lo_ok ? ldg_stream(w_lo + c * kChunk) : zero;
      a_hi[u] = in && hi_ok ? ldg_stream(w_hi + c * kChunk) : zero;
    }
  };
  auto load_activations = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kSkinnyLinearWarps;
      const bool in = in_range(c);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) b[u][j] = in && x_ok[j] ? ldg_cached(x_row[j] + c * kChunk) : zero;
    }
  };

  // The weights are constant: the first loads go out before waiting on the kernel that writes x.
  load_weights(first + warp);
  pdl_wait();
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  load_activations(first + warp);
  float acc[kTiles][4] = {};
  const int64_t step = static_cast<int64_t>(kChunks) * kSkinnyLinearWarps;
  for (int64_t c0 = first + warp; c0 < end; c0 += step) {
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const uint32_t a0[4] = {a_lo[u].x, a_hi[u].x, a_lo[u].y, a_hi[u].y};
      const uint32_t a1[4] = {a_lo[u].z, a_hi[u].z, a_lo[u].w, a_hi[u].w};
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        mma_bf16_16816(acc[j], a0, b[u][j].x, b[u][j].y);
        mma_bf16_16816(acc[j], a1, b[u][j].z, b[u][j].w);
      }
    }
    load_weights(c0 + step);  // past the end these are all masked: no memory traffic
    load_activations(c0 + step);
  }

#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[warp][j * 4 + e][lane] = acc[j][e];
  __syncthreads();
  // One value per thread: fragment slot (tile j, element e) of lane l, summed over the warps in order.
  constexpr int kValues = kTiles * 4 * 32;
  const int v = threadIdx.x;
  float s = 0;
  if (v < kValues) {
#pragma unroll
    for (int w = 0; w < kSkinnyLinearWarps; ++w) s += red[w][v / 32][v % 32];
  }
  if (gridDim.y > 1) {
    // Partials of this split, then the strip's last CTA sums every split in order.
    float* mine = p.partials + (strip * gridDim.y + blockIdx.y) * kValues;
    if (v < kValues) mine[v] = s;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint32_t done = atomicAdd(&p.tickets[strip], 1u);
      last_of_strip = done == gridDim.y - 1;
      if (last_of_strip) p.tickets[strip] = 0;  // every split has arrived: ready for the next launch
    }
    __syncthreads();
    if (!last_of_strip) return;
    __threadfence();
    if (v < kValues) {
      s = 0;
      for (unsigned y = 0; y < gridDim.y; ++y) s += __ldcg(p.partials + (strip * gridDim.y + y) * kValues + v);
    }
  }
  if (v >= kValues) return;
  const int slot = v / 32, l = v % 32, j = slot / 4, e = slot % 4;
  const int64_t row = row0 + l / 4 + (e >= 2 ? 8 : 0);
  const int64_t token = 8 * j + 2 * (l % 4) + (e & 1);
  if (row >= p.n || token >= p.m) return;
  if (p.bias) s += bf16_bits_to_f32(p.bias[row]);
  if (p.out_f32) {
    static_cast<float*>(p.out)[token * p.n + row] = s;
  } else {
    static_cast<uint16_t*>(p.out)[token * p.n + row] = f32_to_bf16_bits(s);
  }
}

template <int kTiles, int kChunks>
Status launch(const SkinnyLinearParams& p, const SkinnyLinearConfig& c, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(ceil_div64(p.n, 16)), static_cast<unsigned>(c.k_splits));
  cfg.blockDim = dim3(static_cast<unsigned>(c.threads));
  cfg.stream = stream;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = c.pdl ? 1 : 0;
  return cuda_status(cudaLaunchKernelEx(&cfg, skinny_linear_kernel<kTiles, kChunks>, p, c.chunks_per_split), "skinny_linear_kernel");
}

}  // namespace

Status launch_skinny_linear(const SkinnyLinearParams& p, const SkinnyLinearConfig& c, cudaStream_t stream) {
  if (p.k % 8 != 0 || p.k <= 0) return unimplemented("skinny linear: k must be a positive multiple of 8");
  if (p.m < 1 || p.m > 8 * c.n_tiles || c.threads != 32 * kSkinnyLinearWarps)
    return internal_error("skinny linear: config does not match the batch");
  if (p.n == 0) return Status::ok();
  if (c.k_splits < 1 || c.k_splits > kSkinnyLinearMaxKSplits || c.k_splits * c.chunks_per_split < ceil_div64(p.k, 32))
    return internal_error("skinny linear: k splits do not cover k");
  if (c.k_splits > 1 && (!p.partials || !p.tickets || ceil_div64(p.n, 16) > kSkinnyLinearMaxSplitStrips))
    return internal_error("skinny linear: k splits need the partials and tickets scratch");
  if (c.n_tiles == 1 && c.chunks_in_flight == 8) return launch<1, 8>(p, c, stream);
  if (c.n_tiles == 1 && c.chunks_in_flight == 4) return launch<1, 4>(p, c, stream);
  if (c.n_tiles == 2 && c.chunks_in_flight == 4) return launch<2, 4>(p, c, stream);
  return internal_error("skinny linear: no compiled variant for this config");
}

}  // namespace mx::cuda
