// Row-wise kernels: embedding gather, RMSNorm (optionally fused with the residual add), row gather, and the
// f32 bias add. One CTA per row, 16-byte accesses, fp32 math.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/moe_route_tile.cuh"
#include "backend/cuda/kernels/norm_fusion_kernels.h"
#include "backend/cuda/kernels/row_norm.cuh"

namespace mx::cuda {
namespace {

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

// Res: the residual stream's element type (float or bf16 bits).
template <typename Res>
__global__ void __launch_bounds__(kRowThreads) rms_norm_kernel(RmsNormParams p) {
  __shared__ float scratch[kRowThreads / 32];
  NormWeights w;
  read_norm_weights(p, w);
  pdl_wait();  // launched as a programmatic dependent: x / residual / delta come from earlier kernels
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  rms_norm_row<Res>(p, blockIdx.x, scratch, &w);
}

// Row t: the token's k rows of y summed in router order (fp32, rounded to bf16) as the delta of rms_norm_row. Every
// chunk's k rows are requested before any is summed (as moe_combine_kernel does), and the sums are handed to
// rms_norm_row in its chunk order (no longer k loads a chunk between the residual's load and store; on an H200 the
// glue chain's time did not move, session 19: docs/PERF.md).
template <typename Res, int kMaxTopK>
__global__ void __launch_bounds__(kRowThreads) moe_combine_rms_norm_kernel(RmsNormParams p, MoeCombineNormParams m) {
  __shared__ float scratch[kRowThreads / 32];
  __shared__ int pos[kMaxTopK];  // the token's slots' rows of y
  const int64_t t = blockIdx.x;
  // The ids (or slot_pos) before the wait: the router (the routing kernel) wrote them before the first GEMM passed
  // its wait, and the second GEMM lets this kernel start only after its own.
  if (m.slot_pos != nullptr) {
    if (threadIdx.x < m.top_k) pos[threadIdx.x] = m.slot_pos[t * m.top_k + threadIdx.x];
  } else if (threadIdx.x < 32) {  // the decode GEMMs' sorted order, as their CTAs computed it
    const TileRoute rt = route_tile(m.topk_ids, m.slots, m.experts, 0);
    const int lane = static_cast<int>(threadIdx.x);
    if (lane >= t * m.top_k && lane < (t + 1) * m.top_k) pos[lane - t * m.top_k] = rt.pos;
  }
  NormWeights w;
  read_norm_weights(p, w);
  if (m.dependents_first) pdl_launch_dependents();  // the dependent's pre-wait part reads only weights
  pdl_wait();  // launched as a programmatic dependent: y and the residual come from earlier kernels
  if (!m.dependents_first) pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  __syncthreads();
  const int64_t h = p.hidden, chunks = h / 8;
  const int k = m.top_k;
  float delta[kMaxChunks][8];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i >= chunks) break;
    uint4 v[kMaxTopK];
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j)
      if (j < k) v[j] = reinterpret_cast<const uint4*>(m.y + pos[j] * h)[i];
    float sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < kMaxTopK; ++j) {
      if (j >= k) break;
      const uint16_t* vs = reinterpret_cast<const uint16_t*>(&v[j]);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] += bf16_bits_to_f32(vs[e]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) delta[c][e] = bf16_bits_to_f32(f32_to_bf16_bits(sum[e]));
  }
  int next = 0;  // rms_norm_row asks for its chunks in this order (c = 0, 1, ...): constant indices once unrolled
  rms_norm_row<Res>(p, t, scratch, [&](int64_t, float(&d)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) d[e] = delta[next][e];
    ++next;
  }, &w);
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

Status launch_moe_combine_add_rms_norm(const RmsNormParams& p, const MoeCombineNormParams& m, cudaStream_t stream) {
  if (p.hidden % 8 != 0 || p.hidden > 8 * kRowThreads * kMaxChunks || p.residual == nullptr)
    return unimplemented("moe_combine_add_rms_norm: a residual of hidden size a multiple of 8 and at most 8192");
  if (m.top_k < 1 || m.top_k > 8 || m.slots != p.rows * m.top_k)
    return internal_error("moe_combine_add_rms_norm: rows * top_k slots, top_k from 1 to 8");
  if (m.slot_pos == nullptr && m.slots > kMoeFusedMaxSlots)
    return internal_error("moe_combine_add_rms_norm: the self-routed decode's slots (<= 32) without slot_pos");
  if (p.rows == 0) return Status::ok();
  auto kernel = m.top_k <= 4 ? (p.residual_f32 ? moe_combine_rms_norm_kernel<float, 4> : moe_combine_rms_norm_kernel<uint16_t, 4>)
                             : (p.residual_f32 ? moe_combine_rms_norm_kernel<float, 8> : moe_combine_rms_norm_kernel<uint16_t, 8>);
  return cuda_status(launch_pdl(kernel, dim3(static_cast<unsigned>(p.rows)), dim3(kRowThreads), 0, stream, p, m),
                     "moe_combine_rms_norm_kernel");
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
