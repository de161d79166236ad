// Gemma-4's small ops: the logit soft-cap, GeGLU's gelu_tanh(gate) * up (gate and up apart, or the halves of
// one fused gate|up row), the layer scalar, and the per-head q/k/v RMSNorms. Elementwise ops move 16 bytes per thread access where the size allows, else one value;
// fp32 math and the precise tanhf, as the CPU twin computes them.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gated_mul.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/head_rows.cuh"

namespace mx::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(ceil_div64(n, kThreads)); }

__global__ void soft_cap_kernel(float* x, int64_t n, float cap, bool vec) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const float inv = 1.0f / cap;
  if (vec) {
    if (i >= n / 4) return;
    float4 v = reinterpret_cast<float4*>(x)[i];
    v.x = cap * tanhf(v.x * inv), v.y = cap * tanhf(v.y * inv), v.z = cap * tanhf(v.z * inv), v.w = cap * tanhf(v.w * inv);
    reinterpret_cast<float4*>(x)[i] = v;
  } else if (i < n) {
    x[i] = cap * tanhf(x[i] * inv);
  }
}

// vec: 8 values per thread (n % 8 == 0 and 16-byte aligned pointers), else one.
__global__ void gelu_tanh_mul_kernel(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n, bool vec) {
  pdl_wait();
  pdl_launch_dependents();
  gated_mul(gate, up, out, n, vec, [](float x) { return gelu_tanh(x); });
}

// One row of a fused gate|up projection per (row, group): vec = 8 values per thread (inter % 8 == 0 and 16-byte
// aligned pointers), else one.
__global__ void geglu_kernel(const uint16_t* gate_up, uint16_t* out, int64_t rows, int64_t inter, bool vec) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    const int64_t per_row = inter / 8;
    if (i >= rows * per_row) return;
    const int64_t r = i / per_row, c = i % per_row;
    const uint4 g = reinterpret_cast<const uint4*>(gate_up + 2 * r * inter)[c];
    const uint4 u = reinterpret_cast<const uint4*>(gate_up + (2 * r + 1) * inter)[c];
    const uint16_t* gs = reinterpret_cast<const uint16_t*>(&g);
    const uint16_t* us = reinterpret_cast<const uint16_t*>(&u);
    uint16_t o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = f32_to_bf16_bits(gelu_tanh(bf16_bits_to_f32(gs[j])) * bf16_bits_to_f32(us[j]));
    reinterpret_cast<uint4*>(out + r * inter)[c] = *reinterpret_cast<const uint4*>(o);
  } else if (i < rows * inter) {
    const int64_t r = i / inter, c = i % inter;
    out[i] = f32_to_bf16_bits(gelu_tanh(bf16_bits_to_f32(gate_up[2 * r * inter + c])) *
                              bf16_bits_to_f32(gate_up[(2 * r + 1) * inter + c]));
  }
}

__global__ void scale_by_kernel(void* x, bool x_f32, int64_t n, const void* factor, bool factor_f32, bool vec) {
  pdl_wait();
  pdl_launch_dependents();
  const float f = factor_f32 ? *static_cast<const float*>(factor) : bf16_bits_to_f32(*static_cast<const uint16_t*>(factor));
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x_f32) {
    float* v = static_cast<float*>(x);
    if (vec) {
      if (i >= n / 4) return;
      float4 a = reinterpret_cast<float4*>(v)[i];
      a.x *= f, a.y *= f, a.z *= f, a.w *= f;
      reinterpret_cast<float4*>(v)[i] = a;
    } else if (i < n) {
      v[i] *= f;
    }
  } else if (i < n) {
    uint16_t* v = static_cast<uint16_t*>(x);
    v[i] = f32_to_bf16_bits(bf16_bits_to_f32(v[i]) * f);
  }
}

constexpr int kMaxNormChunks = 4;  // head_dim <= 32 lanes * 4 chunks * 8

// One warp per (token, head): the row stays in registers between the sum of squares and the write.
__global__ void __launch_bounds__(kThreads) qkv_norms_kernel(QkvNormKernelParams p) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t heads = p.n_q + 2 * p.n_kv;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= p.tokens * heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t h = row % heads, chunks = p.head_dim / 8;
  const uint16_t* weight = h < p.n_q ? p.q_norm : h < p.n_q + p.n_kv ? p.k_norm : nullptr;
  uint4* x = reinterpret_cast<uint4*>(p.qkv + row * p.head_dim);
  float v[kMaxNormChunks][8];
  const float sum_sq = load_head_row(p.qkv + row * p.head_dim, static_cast<int>(chunks), v);
  const float inv = rsqrtf(sum_sq / static_cast<float>(p.head_dim) + p.eps);
#pragma unroll
  for (int c = 0; c < kMaxNormChunks; ++c) {
    const int64_t i = lane + 32 * c;
    if (i >= chunks) break;
    uint16_t o[8];
    if (weight) {
      const uint4 w = reinterpret_cast<const uint4*>(weight)[i];
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(&w);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = f32_to_bf16_bits(bf16_bits_to_f32(ws[j]) * (v[c][j] * inv));
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = f32_to_bf16_bits(v[c][j] * inv);
    }
    x[i] = *reinterpret_cast<const uint4*>(o);
  }
}

}  // namespace

Status launch_soft_cap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (!(cap > 0.0f)) return invalid_argument("soft_cap: cap must be > 0");
  if (n == 0) return Status::ok();
  const bool vec = n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  return cuda_status(launch_pdl(soft_cap_kernel, dim3(blocks_for(vec ? n / 4 : n)), dim3(kThreads), 0, stream, x, n,
                                cap, vec),
                     "soft_cap_kernel");
}

Status launch_gelu_tanh_mul(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  const bool vec = n % 8 == 0 && (reinterpret_cast<uintptr_t>(gate) | reinterpret_cast<uintptr_t>(up) |
                                    reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  return cuda_status(launch_pdl(gelu_tanh_mul_kernel, dim3(blocks_for(vec ? n / 8 : n)), dim3(kThreads), 0, stream,
                                gate, up, out, n, vec),
                     "gelu_tanh_mul_kernel");
}

Status launch_geglu(const uint16_t* gate_up, uint16_t* out, int64_t rows, int64_t inter, cudaStream_t stream) {
  const int64_t n = rows * inter;
  if (n == 0) return Status::ok();
  const bool vec = inter % 8 == 0 && (reinterpret_cast<uintptr_t>(gate_up) | reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  return cuda_status(launch_pdl(geglu_kernel, dim3(blocks_for(vec ? n / 8 : n)), dim3(kThreads), 0, stream, gate_up,
                                out, rows, inter, vec),
                     "geglu_kernel");
}

Status launch_scale_by(void* x, bool x_f32, int64_t n, const void* factor, bool factor_f32, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  const bool vec = x_f32 && n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  return cuda_status(launch_pdl(scale_by_kernel, dim3(blocks_for(vec ? n / 4 : n)), dim3(kThreads), 0, stream, x,
                                x_f32, n, factor, factor_f32, vec),
                     "scale_by_kernel");
}

Status launch_qkv_norms(const QkvNormKernelParams& p, cudaStream_t stream) {
  if (p.head_dim % 8 != 0 || p.head_dim > 32 * 8 * kMaxNormChunks)
    return unimplemented("qkv_norms: head_dim must be a multiple of 8 and at most 1024");
  const int64_t rows = p.tokens * (p.n_q + 2 * p.n_kv);
  if (rows == 0) return Status::ok();
  return cuda_status(launch_pdl(qkv_norms_kernel, dim3(static_cast<unsigned>(ceil_div64(rows, kThreads / 32))),
                                dim3(kThreads), 0, stream, p),
                     "qkv_norms_kernel");
}

}  // namespace mx::cuda
