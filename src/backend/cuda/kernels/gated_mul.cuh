// out = act(gate) * up elementwise over bf16, the gate of GeGLU (gemma_ops.cu) and SwiGLU (llama_ops.cu): one
// body, each kernel passing its activation as a functor so it inlines. fp32 math, round to nearest even. Also
// GeGLU's activation itself (gelu_tanh), which the bf16 expert kernels apply in their epilogues.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/common.cuh"

namespace mx::cuda {

// GeGLU's activation, the tanh approximation of GELU in fp32 with the precise tanhf, as the CPU twin computes it:
// the one definition of Gemma-4's dense MLP (gemma_ops.cu) and its bf16 experts (moe_bf16_*.cu).
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// vec: 8 values per thread (n % 8 == 0 and 16-byte aligned pointers), else one. Thread i of the grid.
template <class Activation>
__device__ __forceinline__ void gated_mul(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n, bool vec,
                                          Activation act) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    if (i >= n / 8) return;
    const uint4 g = reinterpret_cast<const uint4*>(gate)[i], u = reinterpret_cast<const uint4*>(up)[i];
    const uint16_t* gs = reinterpret_cast<const uint16_t*>(&g);
    const uint16_t* us = reinterpret_cast<const uint16_t*>(&u);
    uint16_t o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = f32_to_bf16_bits(act(bf16_bits_to_f32(gs[j])) * bf16_bits_to_f32(us[j]));
    reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(o);
  } else if (i < n) {
    out[i] = f32_to_bf16_bits(act(bf16_bits_to_f32(gate[i])) * bf16_bits_to_f32(up[i]));
  }
}

}  // namespace mx::cuda
