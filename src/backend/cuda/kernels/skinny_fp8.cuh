// e4m3 weight codes widened to bf16 for the skinny kernels' mma.sync (skinny_linear.cu, skinny_linear_staged.cu):
// exact, every e4m3 value is a bf16 value.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace mx::cuda {

// Two e4m3 codes (low byte first) -> a bf16x2 word with the first code in the low half.
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 b = __float22bfloat162_rn(f);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Eight codes (two words, low byte first) -> eight bf16 in one 16-byte fragment.
__device__ __forceinline__ uint4 widen_fp8x8(uint32_t lo, uint32_t hi) {
  return make_uint4(fp8x2_to_bf16x2(lo & 0xffffu), fp8x2_to_bf16x2(lo >> 16), fp8x2_to_bf16x2(hi & 0xffffu),
                    fp8x2_to_bf16x2(hi >> 16));
}

}  // namespace mx::cuda
