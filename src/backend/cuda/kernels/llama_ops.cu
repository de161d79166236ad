// SwiGLU's silu(gate) * up and the f32 <-> bf16 convert (llama_kernels.h). Elementwise: silu_mul moves 16
// bytes per thread access where the size and alignment allow, else one value; fp32 math with the precise
// expf, as the CPU twin computes it.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gated_mul.cuh"
#include "backend/cuda/kernels/llama_kernels.h"

namespace mx::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(ceil_div64(n, kThreads)); }

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__global__ void silu_mul_kernel(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n, bool vec) {
  pdl_wait();
  pdl_launch_dependents();
  gated_mul(gate, up, out, n, vec, [](float x) { return silu(x); });
}

__global__ void convert_kernel(const void* x, bool x_f32, void* out, bool out_f32, int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x_f32 ? static_cast<const float*>(x)[i] : bf16_bits_to_f32(static_cast<const uint16_t*>(x)[i]);
  if (out_f32) static_cast<float*>(out)[i] = v;
  else static_cast<uint16_t*>(out)[i] = f32_to_bf16_bits(v);
}

}  // namespace

Status launch_silu_mul(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  const bool vec = n % 8 == 0 && (reinterpret_cast<uintptr_t>(gate) | reinterpret_cast<uintptr_t>(up) |
                                    reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  return cuda_status(launch_pdl(silu_mul_kernel, dim3(blocks_for(vec ? n / 8 : n)), dim3(kThreads), 0, stream, gate,
                                up, out, n, vec),
                     "silu_mul_kernel");
}

Status launch_convert(const void* x, bool x_f32, void* out, bool out_f32, int64_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  return cuda_status(launch_pdl(convert_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, x, x_f32, out,
                                out_f32, n),
                     "convert_kernel");
}

}  // namespace mx::cuda
