// The fp32 CPU reference of every op gpt-oss and Gemma-4 need (ref-gpt-oss-model.md section 1 and
// ref-gemma4-mtp-spec.md section 1 are the specs).
// Activations are f32; weights are read as stored (bf16, MXFP4) and widened exactly. These functions are
// the twins the CUDA kernels are tested against. Loops over rows, heads and experts use the thread pool.
#pragma once

#include "backend/backend.h"
#include "backend/cpu/thread_pool.h"

namespace mx::cpu {

// Reads element i of a bf16 or f32 tensor as f32.
float load_f32(const TensorView& t, int64_t i);

void embedding(const TensorView& table, const TensorView& token_ids, TensorView out);
// weight empty = weightless (x * rsqrt(mean(x^2) + eps)).
void rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView out);
void soft_cap(TensorView x, float cap);  // x = cap * tanh(x / cap)
float gelu_tanh(float x);                // GELU, tanh approximation (gelu_pytorch_tanh)
void gelu_tanh_mul(const TensorView& gate, const TensorView& up, TensorView out);
void geglu(const TensorView& gate_up, TensorView out);  // Backend::geglu
void scale_by(TensorView x, const TensorView& factor);  // x *= factor[0]
float silu(float x);                     // x * sigmoid(x)
void silu_mul(const TensorView& gate, const TensorView& up, TensorView out);
// out = x in out's dtype (f32 or bf16; x f32 or bf16), bf16 rounded to nearest even.
void convert(const TensorView& x, TensorView out);
void add_rms_norm(TensorView residual, const TensorView& delta, const TensorView& weight, float eps, TensorView out);
void linear(ThreadPool& pool, const TensorView& x, const TensorView& weight, const TensorView& bias, TensorView out);
// linear with fp8 e4m3 weights [N, K] and an f32 scale per output channel [N] (Backend::linear_fp8).
void linear_fp8(ThreadPool& pool, const TensorView& x, const TensorView& weight, const TensorView& scale,
                const TensorView& bias, TensorView out);
void qkv_rope(const QkvRopeParams& p, const BatchView& batch);
void attention(ThreadPool& pool, const AttentionParams& p, const BatchView& batch);
void router_topk(const RouterParams& p);
void moe_experts(ThreadPool& pool, const MoeParams& p);
void qkv_norms(const QkvNormParams& p);
void gemma_attention_end(const GemmaAttentionEndParams& p);
void gemma_layer_end(const GemmaLayerEndParams& p);
void moe_geglu_experts(ThreadPool& pool, const GegluMoeParams& p);
void gather_rows(const TensorView& x, const TensorView& rows, TensorView out);
void sample(ThreadPool& pool, const SampleParams& p);  // rows in parallel; cpu/sampling.cc

// Dequantizes one MXFP4 row of K elements (K/32 blocks of 16 bytes plus K/32 e8m0 scales) to f32.
void dequantize_mxfp4_row(const uint8_t* blocks, const uint8_t* scales, int64_t k, float* out);

}  // namespace mx::cpu
