// Gemma-4's norms between a layer's blocks, fused so that a decode layer runs two row kernels where it ran
// eight (three norms, two residual adds, the layer scalar and the next layer's input norm were separate
// launches of ~1.5 us each at batch 1). One CTA per token row; each thread keeps its 8-element chunks in
// registers across the row's reductions, so every input is read once and every output written once. fp32
// math throughout, as the CPU twin (cpu::gemma_attention_end / gemma_layer_end) computes it.
// Everything but the branch outputs is read before the PDL wait: the norm weights and the layer scalar are
// constants, and the residual was last written by the other row kernel, several kernels back (each kernel
// of the chain lets its dependents launch only after its own wait, so that one has completed). Read after
// the reductions, as before, each was a dependent round trip to memory on a one-CTA critical path.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/gemma_row_parts.cuh"

namespace mx::cuda {
namespace {

using namespace gemma_rows;

// The row kernels' shape and 16-byte row accesses are row_norm.cuh's (hidden <= 8 * kThreads * kMaxChunks = 8192).
// Each kernel is instanced for kChunks chunks a thread (GemmaRowForm): kMaxChunks, or 2 where the hidden size fits
// (Gemma-4 26B-A4B's 2816); kMinCtas > 1 bounds the registers for that many CTAs an SM. By default (instance below)
// decode keeps 4 chunks, 1024 rows and more take 2, 4096 and more 2 bounded. The valid chunks,
// their order and the sums are the same in every instance, so the bits are; the 2-chunk instances hold about half
// the registers (4 chunks: 190 in the layer end, 138 in the attention end, one 256-thread CTA an SM; 2 chunks: 96
// and 79, 2 and 3 CTAs; bounded: 80 and 64 with 44 and 28 bytes spilled, 3 and 4 CTAs), which matters where there
// are many rows (prefill: a CTA per row).
constexpr int kThreads = kRowThreads;
constexpr int kFewChunks = 2;

template <int kChunks, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas) gemma_attention_end_kernel(GemmaAttentionEndKernelParams p) {
  __shared__ float2 scratch[kThreads / 32];
  const int64_t row = blockIdx.x, chunks = p.hidden / 8, base = row * p.hidden;
  // Read before the wait (see the top): the norm weights and the residual.
  uint4 w_attn[kChunks], w_mlp[kChunks], w_moe[kChunks];
  float r[kChunks][8];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    w_attn[c] = load_raw8(p.post_attention_norm, i);
    w_mlp[c] = load_raw8(p.pre_mlp_norm, i);
    if (p.pre_moe_norm) w_moe[c] = load_raw8(p.pre_moe_norm, i);
    load8(p.residual + base, i, r[c]);
  }
  pdl_wait();  // the attention output comes from the kernel before
  pdl_launch_dependents();
  float v[kChunks][8];
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    load8(p.attn_out + base, i, v[c]);
    s += sum_sq(v[c]);
  }
  const float inv_attn = rsqrtf(block_sum2(s, 0.f, scratch).x / static_cast<float>(p.hidden) + p.eps);
  s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    float w[8];
    unpack8(w_attn[c], w);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[c][j] = r[c][j] + w[j] * (v[c][j] * inv_attn);
    store8(p.residual + base, i, v[c]);
    s += sum_sq(v[c]);
  }
  const float inv_res = rsqrtf(block_sum2(s, 0.f, scratch).x / static_cast<float>(p.hidden) + p.eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    store_weighted_norm(w_mlp[c], p.mlp_in + base, i, v[c], inv_res);
    if (p.pre_moe_norm) store_weighted_norm(w_moe[c], p.moe_in + base, i, v[c], inv_res);
  }
}

template <int kChunks, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas) gemma_layer_end_kernel(GemmaLayerEndKernelParams p) {
  __shared__ float2 scratch[kThreads / 32];
  const float scalar = !p.layer_scalar ? 1.f
                       : p.scalar_f32  ? *static_cast<const float*>(p.layer_scalar)
                                       : bf16_bits_to_f32(*static_cast<const uint16_t*>(p.layer_scalar));
  const int64_t row = blockIdx.x, chunks = p.hidden / 8, base = row * p.hidden;
  const float inv_h = 1.f / static_cast<float>(p.hidden);
  // Read before the wait (see the top): the norm weights, the layer scalar and the residual.
  uint4 w_mlp[kChunks], w_moe[kChunks], w_ffn[kChunks], w_next[kChunks];
  float r[kChunks][8];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    w_mlp[c] = load_raw8(p.post_mlp_norm, i);
    if (p.moe) {
      w_moe[c] = load_raw8(p.post_moe_norm, i);
      w_ffn[c] = load_raw8(p.post_ffn_norm, i);
    }
    w_next[c] = load_raw8(p.next_norm, i);
    load8(p.residual + base, i, r[c]);
  }
  pdl_wait();  // the two FFN outputs come from the kernels before
  pdl_launch_dependents();
  float f[kChunks][8], m[kChunks][8];
  float sd = 0.f, sm = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    load8(p.dense + base, i, f[c]);
    sd += sum_sq(f[c]);
    if (p.moe) {
      load8(p.moe + base, i, m[c]);
      sm += sum_sq(m[c]);
    }
  }
  const float2 sums = block_sum2(sd, sm, scratch);
  const float inv_dense = rsqrtf(sums.x * inv_h + p.eps), inv_moe = rsqrtf(sums.y * inv_h + p.eps);
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    float w[8];
    unpack8(w_mlp[c], w);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[c][j] = w[j] * (f[c][j] * inv_dense);
    if (p.moe) {
      unpack8(w_moe[c], w);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[c][j] += w[j] * (m[c][j] * inv_moe);
      s += sum_sq(f[c]);
    }
  }
  if (p.moe) {  // uniform across the CTA: the barrier inside is reached by every thread
    const float inv_ffn = rsqrtf(block_sum2(s, 0.f, scratch).x * inv_h + p.eps);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t i = chunk_index(c, chunks);
      if (i < 0) break;
      float w[8];
      unpack8(w_ffn[c], w);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[c][j] = w[j] * (f[c][j] * inv_ffn);
    }
  }
  s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
#pragma unroll
    for (int j = 0; j < 8; ++j) f[c][j] = (r[c][j] + f[c][j]) * scalar;
    store8(p.residual + base, i, f[c]);
    s += sum_sq(f[c]);
  }
  const float inv_res = rsqrtf(block_sum2(s, 0.f, scratch).x * inv_h + p.eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    store_weighted_norm(w_next[c], p.next_in + base, i, f[c], inv_res);
  }
}

Status check_hidden(int64_t hidden, const char* op) {
  if (hidden <= 0 || hidden % 8 != 0 || hidden > 8 * kThreads * kMaxChunks)
    return unimplemented(std::string(op) + ": hidden size must be a positive multiple of 8 and at most 8192");
  return Status::ok();
}

// The instance a form takes: 0 = the 4-chunk kernel, 1 = 2 chunks, 2 = 2 chunks bounded (or an error). chunks 0:
// by rows where 2 chunks fit. H200, session 23 W2 (mx_kernel_bench --gemma-norms-only, 26B-A4B's 2816, us per call
// of the attention end / layer end, 4 chunks, 2, 2 bounded): 100 rows 2.52 / 2.61, 2.57 / 2.68, 2.56 / 2.94; 1024
// rows 15.11 / 16.86, 11.27 / 11.93, 11.35 / 12.22; 8192 rows 175.6 / 191.9, 122.9 / 131.2, 97.8 / 116.0.
constexpr int64_t kFewChunksFromRows = 1024, kBoundedFromRows = 4096;
Result<int> instance(const GemmaRowForm& form, int64_t hidden, int64_t rows, const char* op) {
  MX_RETURN_IF_ERROR(check_hidden(hidden, op));
  const bool few_fit = hidden <= 8 * kThreads * kFewChunks;
  if (form.chunks != 0 && form.chunks != kFewChunks && form.chunks != kMaxChunks)
    return invalid_argument(std::string(op) + ": 2 or 4 chunks a thread");
  if (form.chunks == kFewChunks && !few_fit) return invalid_argument(std::string(op) + ": 2 chunks hold 4096 values");
  if (form.chunks == 0) return !few_fit || rows < kFewChunksFromRows ? 0 : rows < kBoundedFromRows ? 1 : 2;
  if (form.chunks == kMaxChunks || !few_fit) return 0;
  return form.bounded ? 2 : 1;
}

}  // namespace

Status launch_gemma_attention_end(const GemmaAttentionEndKernelParams& p, cudaStream_t stream) {
  MX_ASSIGN_OR_RETURN(const int form, instance(p.form, p.hidden, p.rows, "gemma_attention_end"));
  if (p.rows == 0) return Status::ok();
  auto kernel = form == 0   ? gemma_attention_end_kernel<kMaxChunks, 1>
                : form == 1 ? gemma_attention_end_kernel<kFewChunks, 1>
                            : gemma_attention_end_kernel<kFewChunks, 4>;
  return cuda_status(launch_pdl(kernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p),
                     "gemma_attention_end_kernel");
}

Status launch_gemma_layer_end(const GemmaLayerEndKernelParams& p, cudaStream_t stream) {
  MX_ASSIGN_OR_RETURN(const int form, instance(p.form, p.hidden, p.rows, "gemma_layer_end"));
  if (p.rows == 0) return Status::ok();
  auto kernel = form == 0   ? gemma_layer_end_kernel<kMaxChunks, 1>
                : form == 1 ? gemma_layer_end_kernel<kFewChunks, 1>
                            : gemma_layer_end_kernel<kFewChunks, 3>;
  return cuda_status(launch_pdl(kernel, dim3(static_cast<unsigned>(p.rows)), dim3(kThreads), 0, stream, p),
                     "gemma_layer_end_kernel");
}

}  // namespace mx::cuda
