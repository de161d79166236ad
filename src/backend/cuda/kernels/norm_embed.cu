// Row-wise kernels: embedding gather, RMSNorm (optionally fused with the residual add), row gather, and the
// f32 bias add. One CTA per row, 16-byte accesses, fp32 math.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {
namespace {

constexpr int kRowThreads = 256;

// 8 consecutive elements of a bf16 or f32 row as floats, and back.
__device__ __forceinline__ void load8(const uint16_t* p, int64_t i, float (&v)[8]) {
  const uint4 a = reinterpret_cast<const uint4*>(p)[i];
  const uint16_t* as = reinterpret_cast<const uint16_t*>(&a);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = bf16_bits_to_f32(as[j]);
}
__device__ __forceinline__ void load8(const float* p, int64_t i, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[2 * i], b = reinterpret_cast<const float4*>(p)[2 * i + 1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(uint16_t* p, int64_t i, const float (&v)[8]) {
  uint16_t o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = f32_to_bf16_bits(v[j]);
  reinterpret_cast<uint4*>(p)[i] = *reinterpret_cast<const uint4*>(o);
}
__device__ __forceinline__ void store8(float* p, int64_t i, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[2 * i] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[2 * i + 1] = make_float4(v[4], v[5], v[6], v[7]);
}

template <typename Out>
__global__ void embedding_kernel(EmbeddingParams p) {
  const int64_t t = blockIdx.x;
  int32_t id = p.ids[t];
  if (id < 0 || id >= p.vocab) id = 0;  // validated on the host; never read out of bounds
  const uint16_t* src = p.table + id * p.hidden;
  Out* dst = static_cast<Out*>(p.out) + t * p.hidden;
  for (int64_t i = threadIdx.x; i < p.hidden / 8; i += blockDim.x) {
    float v[8];
    load8(src, i, v);
    store8(dst, i, v);
  }
}

__device__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += scratch[w];
  return total;
}

// Each thread keeps its 8-element chunks in registers between the two passes (hidden <= 8 * 256 * kMaxChunks).
constexpr int kMaxChunks = 4;

// Res: the residual stream's element type (float or bf16 bits).
template <typename Res>
__global__ void __launch_bounds__(kRowThreads) rms_norm_kernel(RmsNormParams p) {
  __shared__ float scratch[kRowThreads / 32];
  pdl_wait();  // launched as a programmatic dependent: x / residual / delta come from earlier kernels
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const int64_t row = blockIdx.x;
  const int64_t chunks = p.hidden / 8;
  float v[kMaxChunks][8];
  float sum_sq = 0;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i >= chunks) break;
    if (p.residual) {
      Res* res = static_cast<Res*>(p.residual) + row * p.hidden;
      float d[8];
      load8(res, i, v[c]);
      load8(p.delta + row * p.hidden, i, d);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[c][j] += d[j];
      store8(res, i, v[c]);
      // The norm sees what the residual now holds (rounded to bf16 when the stream is bf16).
      load8(res, i, v[c]);
    } else {
      load8(static_cast<const Res*>(p.x) + row * p.hidden, i, v[c]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) sum_sq += v[c][j] * v[c][j];
  }
  const float total = block_sum(sum_sq, scratch);
  const float inv = rsqrtf(total / static_cast<float>(p.hidden) + p.eps);
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i >= chunks) break;
    float w[8] = {1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f}, o[8];
    if (p.weight) load8(p.weight, i, w);  // null: weightless (Gemma-4's router and v norms)
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = w[j] * (v[c][j] * inv);
    store8(p.out + row * p.hidden, i, o);
  }
}

__global__ void gather_rows_kernel(GatherRowsParams p) {
  pdl_wait();  // launched as a programmatic dependent
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const int64_t r = blockIdx.x;
  int32_t src = p.rows[r];
  if (src < 0 || src >= p.src_rows) src = 0;
  const uint4* s = reinterpret_cast<const uint4*>(p.x + src * p.row_bytes);
  uint4* d = reinterpret_cast<uint4*>(p.out + r * p.row_bytes);
  for (int64_t i = threadIdx.x; i < p.row_bytes / 16; i += blockDim.x) d[i] = s[i];
}

__global__ void add_bias_f32_kernel(AddBiasParams p) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= p.rows * p.cols) return;
  p.out[i] += bf16_bits_to_f32(p.bias[i % p.cols]);
}

}  // namespace

Status launch_embedding(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.hidden % 8 != 0) return unimplemented("embedding: hidden size must be a multiple of 8");
  if (p.tokens == 0) return Status::ok();
  if (p.out_f32) {
    embedding_kernel<float><<<static_cast<unsigned>(p.tokens), 128, 0, stream>>>(p);
  } else {
    embedding_kernel<uint16_t><<<static_cast<unsigned>(p.tokens), 128, 0, stream>>>(p);
  }
  return launch_status("embedding_kernel");
}

Status launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.hidden % 8 != 0 || p.hidden > 8 * kRowThreads * kMaxChunks)
    return unimplemented("rms_norm: hidden size must be a multiple of 8 and at most 8192");
  if (p.rows == 0) return Status::ok();
  if (p.residual_f32) {
    return cuda_status(launch_pdl(rms_norm_kernel<float>, dim3(static_cast<unsigned>(p.rows)), dim3(kRowThreads), 0,
                                  stream, p),
                       "rms_norm_kernel");
  } else {
    return cuda_status(launch_pdl(rms_norm_kernel<uint16_t>, dim3(static_cast<unsigned>(p.rows)), dim3(kRowThreads), 0,
                                  stream, p),
                       "rms_norm_kernel");
  }
  return launch_status("rms_norm_kernel");
}

Status launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  if (p.row_bytes % 16 != 0) return unimplemented("gather_rows: rows must be a multiple of 16 bytes");
  if (p.num_rows == 0) return Status::ok();
  return cuda_status(launch_pdl(gather_rows_kernel, dim3(static_cast<unsigned>(p.num_rows)), dim3(128), 0, stream, p),
                     "gather_rows_kernel");
}

Status launch_add_bias_f32(const AddBiasParams& p, cudaStream_t stream) {
  const int64_t n = p.rows * p.cols;
  if (n == 0) return Status::ok();
  add_bias_f32_kernel<<<static_cast<unsigned>(ceil_div64(n, 256)), 256, 0, stream>>>(p);
  return launch_status("add_bias_f32_kernel");
}

}  // namespace mx::cuda
