// The end of a softmax row shared by the attention kernels (attention.cu, attention_wgmma_parts.cuh): the
// optional learned sink and the final normalisation, in the exp2 domain.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels/common.cuh"

namespace mx::cuda {

inline constexpr float kAttnLog2e = 1.4426950408889634f;

// The sink of `head` as a log2-domain logit; -inf without sinks (Gemma-4), so it adds nothing.
__device__ __forceinline__ float attention_sink_log2(const uint16_t* sinks, int64_t head) {
  return sinks ? bf16_bits_to_f32(sinks[head]) * kAttnLog2e : -INFINITY;
}

// Factor that turns a row's accumulator (scaled to its running max m, sum l) into the output: the sink
// joins the denominator once, m' = max(m, s), l' = l 2^(m - m') + 2^(s - m'). A row that saw no key and
// has no sink (m' = -inf) gets 0 instead of a NaN.
__device__ __forceinline__ float attention_final_factor(float m, float l, float sink_log2) {
  const float m_f = fmaxf(m, sink_log2);
  if (m_f == -INFINITY) return 0.f;
  const float scale = exp2f(m - m_f);
  const float denom = l * scale + exp2f(sink_log2 - m_f);
  return denom > 0.f ? scale / denom : 0.f;
}

}  // namespace mx::cuda
