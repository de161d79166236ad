// What the attention kernels share (attention.cu, attention_wgmma_parts.cuh, attention_wgmma_wide.cu): the end
// of a softmax row (the optional learned sink and the final normalisation, in the exp2 domain), a token's key
// range, and the passes of a prefill CTA's tokens.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

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

// Keys token t sees: [first, last] (causal, and the window's start when there is one).
__device__ __forceinline__ void attn_key_range(const AttentionKernelParams& p, int64_t t, int* first, int* last) {
  const int pos = p.kv.positions[t];
  *last = pos;
  *first = p.window > 0 ? max(0, pos - static_cast<int>(p.window) + 1) : 0;
}

// The pass of a prefill CTA's tokens that starts at token t0 + start: the tokens of its sequence (contiguous in
// a BatchView) up to t0 + *end (exclusive, at most n_tok), and the keys they see together, [*kmin, *kmax]
// (causal, from the window's start when there is one).
__device__ inline void attention_pass_bounds(const AttentionKernelParams& p, int64_t t0, int start, int n_tok, int* seq,
                                             int* end, int* kmin, int* kmax) {
  *seq = p.kv.token_seq[t0 + start];
  int e = start + 1;
  while (e < n_tok && p.kv.token_seq[t0 + e] == *seq) ++e;
  int lo = INT_MAX, hi = -1;
  for (int i = start; i < e; ++i) {
    const int pos = p.kv.positions[t0 + i];
    lo = min(lo, p.window > 0 ? max(0, pos - static_cast<int>(p.window) + 1) : 0);
    hi = max(hi, pos);
  }
  *end = e;
  *kmin = lo;
  *kmax = hi;
}

}  // namespace mx::cuda
