// Launchers of the small ops a Llama-style layer adds (llama_ops.cu), for the EAGLE-3 drafter: SwiGLU's
// silu(gate) * up and a dtype convert. Same conventions as kernels.h: raw device pointers, int64 sizes, a
// Status per launch. Host-only header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace mx::cuda {

// out = silu(gate) * up over n bf16 values, fp32 math; out may alias gate or up.
Status launch_silu_mul(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n, cudaStream_t stream);
// out = x over n values, each f32 or bf16 (x_f32 / out_f32); f32 -> bf16 rounds to nearest even.
Status launch_convert(const void* x, bool x_f32, void* out, bool out_f32, int64_t n, cudaStream_t stream);

}  // namespace mx::cuda
