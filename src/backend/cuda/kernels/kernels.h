// Parameter structs and launchers of the CUDA kernels. Params are plain structs of raw device pointers
// with int64 sizes; each launcher validates what it can and returns a Status (launch errors included).
// Included by host code compiled without nvcc: no device code here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernel_configs.h"
#include "backend/sampling_math.h"
#include "core/status.h"

namespace mx::cuda {

struct EmbeddingParams {
  const uint16_t* table = nullptr;  // bf16 [vocab, hidden]
  const int32_t* ids = nullptr;     // [tokens]
  void* out = nullptr;              // [tokens, hidden], f32 when out_f32 else bf16
  int64_t tokens = 0, hidden = 0, vocab = 0;
  bool out_f32 = false;
};
Status launch_embedding(const EmbeddingParams& p, cudaStream_t stream);

// out = rms_norm(x) * weight. With `residual` set: residual += delta first, then the norm of the result
// (x is ignored). fp32 math; x and residual are f32 when `residual_f32`, else bf16; out is bf16.
struct RmsNormParams {
  const void* x = nullptr;           // [rows, hidden]
  void* residual = nullptr;          // [rows, hidden] or null
  const uint16_t* delta = nullptr;   // bf16 [rows, hidden] with residual
  const uint16_t* weight = nullptr;  // bf16 [hidden]; null = no weight
  uint16_t* out = nullptr;           // bf16 [rows, hidden]
  int64_t rows = 0, hidden = 0;
  float eps = 1e-5f;
  bool residual_f32 = false;
  // The weight's chunks read before the kernel's PDL wait (a constant: its round trip overlaps the kernel before)
  // instead of after the row's sum of squares: the same bits.
  bool weight_before_wait = false;
};
Status launch_rms_norm(const RmsNormParams& p, cudaStream_t stream);

struct GatherRowsParams {
  const uint8_t* x = nullptr;     // [src_rows, row_bytes]
  const int32_t* rows = nullptr;  // [num_rows]
  uint8_t* out = nullptr;         // [num_rows, row_bytes]
  int64_t num_rows = 0, src_rows = 0, row_bytes = 0;
};
Status launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream);

// out[r, n] += bias[n] for an f32 output (cuBLASLt's bias epilogue is used for bf16 outputs).
struct AddBiasParams {
  float* out = nullptr;             // f32 [rows, cols]
  const uint16_t* bias = nullptr;   // bf16 [cols]
  int64_t rows = 0, cols = 0;
};
Status launch_add_bias_f32(const AddBiasParams& p, cudaStream_t stream);

// The paged KV cache and the batch, as the attention-side kernels see them.
struct PagedKv {
  uint16_t* k = nullptr;             // bf16 [num_pages, page_size, n_kv, head_dim]
  uint16_t* v = nullptr;             // bf16 [num_pages, page_size, n_kv, head_dim]
  const int32_t* positions = nullptr;   // [tokens]
  const int32_t* token_seq = nullptr;   // [tokens]
  const int32_t* page_table = nullptr;  // [seqs, max_pages]
  int64_t page_size = 0, max_pages = 0, num_pages = 0;
};

// The qkv projection's RoPE and KV write in the skinny kernel's epilogue (SkinnyLinearParams::rope; gpt-oss
// decode): with q_out set, the linear's rows are q | k | v heads of head_dim, and a strip of 2P rows holds P of
// the heads' RoPE pairs (rows i and i + half of a head) so that a thread holds both halves of a pair; the
// epilogue rounds qkv to bf16, rotates q and k with launch_qkv_rope's arithmetic (within a bf16 step near zero:
// skinny_linear.cu) and writes q to q_out and k, v to the paged cache (p.out unused).
struct SkinnyRope {
  uint16_t* q_out = nullptr;        // bf16 [m, n_q head_dim]; null: a plain linear
  const float* inv_freq = nullptr;  // [head_dim / 2]
  PagedKv kv;
  int64_t n_q = 0, n_kv = 0, head_dim = 0;  // n = (n_q + 2 n_kv) head_dim; head_dim even
  float scale = 1.0f;
};

// out[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) for a few rows m (kernel_configs.h, SkinnyLinearConfig):
// fp32 accumulation, the bias added in fp32, bf16 or f32 output. k % 8 == 0.
struct SkinnyLinearParams {
  const uint16_t* x = nullptr;     // bf16 [m, k]
  const uint16_t* w = nullptr;     // bf16 [n, k], or null with w_fp8
  const uint8_t* w_fp8 = nullptr;  // fp8 e4m3 [n, k] (--dense-dtype fp8), with w_scale f32 [n]: out = scale * x w^T
  const float* w_scale = nullptr;
  const uint16_t* bias = nullptr;  // bf16 [n] or null
  void* out = nullptr;             // [m, n], f32 when out_f32 else bf16
  float* partials = nullptr;       // k splits > 1: kSkinnyLinearPartialFloats
  uint32_t* tickets = nullptr;     // k splits > 1: [kSkinnyLinearMaxSplitStrips] zeroed once; the last CTA
                                   // of a strip resets its ticket
  int64_t m = 0, n = 0, k = 0;
  bool out_f32 = false;
  // Each output value's epilogue inputs (its row's scale and bias; with `rope` its cos / sin and destination, through
  // the token's position and page table) read before the PDL wait, not after the sums. Same bits.
  bool inputs_first = false;
  SkinnyRope rope;                 // q_out set: qkv + RoPE + KV write (even strip rows, bf16 out, no k split)
};
Status launch_skinny_linear(const SkinnyLinearParams& p, const SkinnyLinearConfig& c, cudaStream_t stream);
// The one-tile, unsplit skinny linear with each CTA's strip staged whole in shared memory before its PDL wait
// (skinny_linear_staged.cu, sm_90+; bf16 weights, or FP8 with k % 16 == 0; 1 to 8 tokens; where
// skinny_linear_staged_fits, or past one wave where skinny_linear_staged_head_ctas): the skinny kernel's bits.
// `ctas_per_sm`: 2, or 4 for FP8 strips of which four fit an SM (the 4-CTA form's register bound).
Status launch_skinny_linear_staged(const SkinnyLinearParams& p, int strip_rows, cudaStream_t stream, int ctas_per_sm = 2);
// out[r, k] = bf16(scale[r] * w[r, k]) for rows [0, rows): fp8 dense weights widened for cuBLASLt (M > 16).
Status launch_dequant_fp8_rows(const uint8_t* w, const float* scale, uint16_t* out, int64_t rows, int64_t k,
                               cudaStream_t stream);


struct RopeParams {
  const uint16_t* qkv = nullptr;   // bf16 [tokens, (n_q + 2 n_kv) head_dim]
  uint16_t* q_out = nullptr;       // bf16 [tokens, n_q head_dim]; null: Q is left to the attention (its Q load
                                   // rotates it: AttentionKernelParams::q_inv_freq), only K and V are written
  const float* inv_freq = nullptr; // [head_dim / 2]
  PagedKv kv;                      // k null: K and V are not written (Q alone)
  int64_t tokens = 0, n_q = 0, n_kv = 0, head_dim = 0;
  float rope_scale = 1.0f;
};
Status launch_qkv_rope(const RopeParams& p, cudaStream_t stream);
// The same op in its many-token form (prefill): CTAs of `tokens_per_cta` whole tokens, `items` (2, 4 or 8) runs of
// 8 pairs per thread, their 16-byte loads issued before the tables. head_dim % 16 != 0 or buffers not 16-byte
// aligned: launch_qkv_rope's form.
Status launch_qkv_rope_stream(const RopeParams& p, int tokens_per_cta, int items, cudaStream_t stream);

// Gemma-4's per-head q/k/v norms and RoPE inside the clustered decode attention (AttentionKernelParams::norm_rope;
// GemmaQkvNormRopeParams' arithmetic): qkv non-null turns it on.
struct AttentionNormRope {
  const uint16_t* qkv = nullptr;     // bf16 [tokens, (n_q + 2 n_kv) head_dim]: the q|k|v projection
  const float* inv_freq = nullptr;   // [head_dim / 2]
  const uint16_t* q_norm = nullptr;  // bf16 [head_dim]
  const uint16_t* k_norm = nullptr;  // bf16 [head_dim]
  float rope_scale = 1.0f, eps = 1e-6f;
  // Bytes into the L2 before the PDL wait (the weight read after the attention), as GemmaQkvNormRopeParams.
  const void* prefetch = nullptr;
  int64_t prefetch_bytes = 0;
};

struct AttentionKernelParams {
  const uint16_t* q = nullptr;      // bf16 [tokens, n_q, head_dim], rows q_stride apart
  const uint16_t* sinks = nullptr;  // bf16 [n_q], or null: no sinks
  uint16_t* out = nullptr;          // bf16 [tokens, n_q, head_dim]
  PagedKv kv;
  int64_t tokens = 0, n_q = 0, n_kv = 0, head_dim = 0;
  int64_t window = 0;               // 0 = full causal
  float scale_log2 = 0;             // softmax_scale * log2(e)
  float* partials = nullptr;        // decode split-KV scratch: f32 [tokens, n_q, splits, head_dim + 2]
  int64_t q_stride = 0;             // elements from one token's queries to the next; 0: n_q * head_dim
  // RoPE in the Q load (the window kernel): non-null, q holds the unrotated queries (the q|k|v projection's
  // rows) and the kernel rotates them as qkv_rope does (cos and sin of positions x q_inv_freq, times
  // q_rope_scale; NeoX halves; bf16 results).
  const float* q_inv_freq = nullptr;  // [head_dim / 2]
  float q_rope_scale = 1.0f;
  // One query per sequence (decode): every key before a query's own position comes from an earlier step, so the
  // 4-warp swap-AB decode kernel (head dims 256 and 512) copies the ring's first stages of those keys before its
  // PDL wait; only the query's own key, which the kernel before (qkv_rope) writes, and Q wait for it.
  bool keys_before_wait = false;
  // launch_attention_decode_swap_cluster at one query per sequence (keys_before_wait's condition) with norm_rope.qkv
  // set: q is not read; the kernel norms and rotates each token's q heads and its own K/V from the q|k|v projection
  // and writes K/V into the cache (qkv_rope's work; V must not alias K).
  AttentionNormRope norm_rope;
};
// Many queries per sequence: FlashAttention-2 on mma.sync. Tokens of a sequence must be contiguous.
Status launch_attention_prefill(const AttentionKernelParams& p, const AttentionPrefillConfig& c, cudaStream_t stream);
// The same on wgmma for sm_90a, warp-specialized (attention_wgmma_ws.cu): a producer warpgroup and an mbarrier
// K/V ring; the config says whether the device and head dim have it.
Status launch_attention_prefill_wgmma_ws(const AttentionKernelParams& p, const AttentionPrefillWgmmaConfig& c,
                                         cudaStream_t stream);
// Sliding windows on wgmma for sm_90a (attention_wgmma_window.cu): persistent CTAs over consecutive query blocks
// of a kv head, K/V tiles kept in the ring across blocks. Only where attention_window_wgmma_takes the layer.
Status launch_attention_prefill_wgmma_window(const AttentionKernelParams& p, const AttentionWindowWgmmaConfig& c,
                                             cudaStream_t stream);
// Any batch, one CTA per (token, kv head, head block, split); merges splits when there are several.
Status launch_attention_decode(const AttentionKernelParams& p, const AttentionDecodeConfig& c, cudaStream_t stream);
// Head dims 64, 256 and 512 with up to 8 q heads per kv head (attention_decode_swap.cu): one warp (64) or a
// CTA of 4 warps (256, 512) per (token, kv head, split), keys as the mma's M side; merges splits when there
// are several.
Status launch_attention_decode_swap(const AttentionKernelParams& p, const AttentionDecodeSwapConfig& c,
                                    cudaStream_t stream);
// Combines a decode kernel's `splits` partial states per (token, head) in p.partials into p.out, adding the sink.
Status launch_attention_split_merge(const AttentionKernelParams& p, int splits, cudaStream_t stream);

struct RouterKernelParams {
  const uint16_t* x = nullptr;       // bf16 [tokens, hidden]
  const uint16_t* weight = nullptr;  // bf16 [experts, hidden]
  const uint16_t* bias = nullptr;    // bf16 [experts]
  float* logits = nullptr;           // f32 [tokens, experts]
  int32_t* topk_ids = nullptr;       // [tokens, top_k]
  float* topk_weights = nullptr;     // [tokens, top_k]
  uint32_t* tickets = nullptr;       // [tokens] zeroed once; the last CTA of a token resets its ticket
  int64_t tokens = 0, hidden = 0, experts = 0, top_k = 0;
  bool bias_before_wait = false;     // each warp's expert's bias read before the PDL wait (a constant): the same bits
};
// Logits (fp32 accumulation), then top-k and softmax over the k by the last CTA of each token.
Status launch_router_topk(const RouterKernelParams& p, cudaStream_t stream);
// Top-k + softmax when `logits` already hold x W^T without the bias (large batches through cuBLASLt):
// adds the bias in fp32 and writes the biased logits back.
Status launch_topk_softmax(const RouterKernelParams& p, cudaStream_t stream);

// Expert parallel: each slot's expert as an index into this rank's experts [first_expert, + num_experts),
// or expert 0 with weight 0 when another rank holds it.
struct LocalRoutingParams {
  const int32_t* ids = nullptr;  // [slots] the router's expert ids
  const float* weights = nullptr;
  int32_t* local_ids = nullptr;
  float* local_weights = nullptr;
  int64_t slots = 0;
  int32_t first_expert = 0, num_experts = 0;
};
Status launch_local_routing(const LocalRoutingParams& p, cudaStream_t stream);

// Routing metadata for the expert GEMMs, built on the GPU, deterministic (stable by slot index).
struct MoeRouting {
  int32_t* offsets = nullptr;       // [experts + 1] exclusive scan of per-expert slot counts
  int32_t* sorted_slots = nullptr;  // [slots] slot (token * top_k + j) at each expert-sorted position
  int32_t* slot_pos = nullptr;      // [slots] inverse of sorted_slots
  int32_t* tile_expert = nullptr;   // [max_tiles]
  int32_t* tile_start = nullptr;    // [max_tiles] first sorted position of the tile
  int32_t* tile_rows = nullptr;     // [max_tiles] routed tokens in the tile (<= tile_tokens)
  int32_t* num_tiles = nullptr;     // [1]
};
struct MoeRoutingParams {
  const int32_t* topk_ids = nullptr;  // [slots]
  MoeRouting r;
  int64_t slots = 0, experts = 0, tile_tokens = 0, max_tiles = 0;
};
Status launch_moe_routing(const MoeRoutingParams& p, cudaStream_t stream);

// One expert GEMM over all tiles. Gated (first GEMM): in = x rows gathered by token, out = h [slots, rows/2]
// after bias + clamped SwiGLU. Second GEMM: in = h by sorted position, out = y [slots, rows] =
// routing weight * (acc + bias).
struct MoeGemmParams {
  const uint8_t* blocks = nullptr;   // kMxfp4SwapAb [E, rows/16, k/64, 32, 16]
  const uint8_t* scales = nullptr;   // [E, rows/16, k/64, 2, 16]
  const uint16_t* bias = nullptr;    // bf16 [E, rows] in checkpoint row order
  const uint16_t* in = nullptr;      // bf16 [*, k]
  uint16_t* out = nullptr;           // bf16 [slots, gated ? rows / 2 : rows] by sorted position
  const float* topk_weights = nullptr;  // [slots] (second GEMM)
  MoeRouting r;
  int64_t rows = 0, k = 0, top_k = 0, max_tiles = 0;
  bool gated = false;
  float swiglu_limit = 7.0f, swiglu_alpha = 1.702f;
  // moe_wgmma.cu's 96-token tiles only: the kernel whose tiles of at most 64 tokens multiply 64 token columns.
  bool mid_width = false;
  // And on the copy engine at 96/48 columns (not mid_width): a tile of at most 48 tokens runs two strips a warp.
  bool two_strips = false;
};
Status launch_moe_gemm(const MoeGemmParams& p, const MoeConfig& c, cudaStream_t stream);

// The decode GEMMs with weights loaded up front (kernel_configs.h, MoeFusedConfig; moe_decode.cu). With
// `topk_ids` set (at most kMoeFusedMaxSlots slots) every CTA routes itself and `r` is unused; else `r`
// holds the routing kernel's metadata. With `tickets` and `combined` set (second GEMM, self-routed only)
// the last CTA of each strip also writes combined[t] = sum over j in router order of y[pos(t, j)].
// With c.pdl both GEMMs are programmatic dependents: the first of the router (or routing kernel), the
// second of the first GEMM, which lets it start routing and loading weights early.
struct MoeFusedParams {
  MoeGemmParams g;
  const int32_t* topk_ids = nullptr;  // [slots], or null: use g.r
  int64_t slots = 0, experts = 0;
  uint32_t* tickets = nullptr;        // [rows / 16], zeroed once; the last CTA of a strip resets it
  uint16_t* combined = nullptr;       // bf16 [slots / top_k, rows]
  uint64_t* trace = nullptr;          // kernel bench: 8 words a CTA (SM, global-timer events: moe_decode.cu), or null
};
Status launch_moe_fused_gemm(const MoeFusedParams& p, const MoeFusedConfig& c, cudaStream_t stream);
// The same in either form of the MXFP4 decode GEMMs (kernel_configs.h, moe_fused_smem_bytes): the scales staged
// in shared memory (what the launcher above runs) or in the ring's registers (the form before). `mask_route`: the
// staged first GEMM, self-routed at <= 8 slots (one tile an expert) and <= 128 experts, finds its tile's expert in a
// mask of the busy experts instead of route_tile's pass over the slots (the same tiles and bits). `shifts`: the
// staged form decodes each fp4 word with two of its rotations as left shifts (swap_ab_decode_word<true>: the same
// bits; the shifts can issue on the FMA pipe instead of the ALU pipe). `ring`: 5 runs the staged first GEMM at <= 4
// self-routed slots (with the mask route and shifts) on a ring of 5 weight tiles and one activation tile ahead (the
// same registers and bits); otherwise the ring of 4 and 2 (kernel_configs.h: moe_fused_auto_ring). p.trace (kernel
// bench) takes the staged form with shifts at <= 6 warps a CTA on the ring of 4.
Status launch_moe_fused_gemm(const MoeFusedParams& p, const MoeFusedConfig& c, bool scales_in_registers,
                             cudaStream_t stream, bool mask_route = true, bool shifts = false, int ring = 0);

// The same two GEMMs for many tokens per expert: tokens as the mma M side in tiles of c.tile_tokens (the
// routing must have been built with that tile size), same inputs, outputs and epilogues.
Status launch_moe_grouped_gemm(const MoeGemmParams& p, const MoeGroupedConfig& c, cudaStream_t stream);

// The grouped GEMMs on Hopper wgmma (moe_wgmma.cu, sm_90a only): the first one reads its input with k in
// the permuted order that launch_moe_permute_k writes and writes h in that order too; the second reads h
// so. Outputs and epilogues otherwise as launch_moe_grouped_gemm.
Status launch_moe_wgmma_gemm(const MoeGemmParams& p, const MoeWgmmaConfig& c, cudaStream_t stream);
// Its warp-specialized form (moe_wgmma_ws.cu; launch_moe_wgmma_gemm hands c.warp_specialized configs to it).
Status launch_moe_wgmma_ws_gemm(const MoeGemmParams& p, const MoeWgmmaConfig& c, cudaStream_t stream);
// out [rows, k] = in with k permuted within each 64-k tile into the order the wgmma GEMM reads.
Status launch_moe_permute_k(const uint16_t* in, uint16_t* out, int64_t rows, int64_t k, cudaStream_t stream);

// out[t] = sum over j < top_k (in router order) of y[slot_pos[t * top_k + j]]: a fixed-order fp32 sum.
struct MoeCombineParams {
  const uint16_t* y = nullptr;       // bf16 [slots, hidden]
  const int32_t* slot_pos = nullptr; // [slots]
  uint16_t* out = nullptr;           // bf16 [tokens, hidden]
  int64_t tokens = 0, hidden = 0, top_k = 0;
};
Status launch_moe_combine(const MoeCombineParams& p, cudaStream_t stream);

// One token per row (backend/sampling_math.h); kernels/sampling.cu describes the four launches.
struct SampleKernelParams {
  const float* logits = nullptr;            // f32 [rows, vocab]
  const SampleRowParams* params = nullptr;  // [rows]
  int32_t* tokens = nullptr;                // [rows]
  float* logprobs = nullptr;                // [rows] or null
  void* scratch = nullptr;                  // sample_scratch_bytes(rows, vocab)
  int64_t scratch_bytes = 0, rows = 0, vocab = 0;
};
int64_t sample_scratch_bytes(int64_t rows, int64_t vocab);
Status launch_sample(const SampleKernelParams& p, cudaStream_t stream);
// Sets the disallowed logits of rows with mask_rows[r] != 0 to -inf (SampleParams::token_mask).
Status launch_apply_token_mask(float* logits, int64_t rows, int64_t vocab, const uint32_t* mask,
                               const int32_t* mask_rows, cudaStream_t stream);

// One thread that waits `nanoseconds` on the device clock: queued before a profiled step so that the ops
// queued behind it start back to back (their event marks then measure GPU time, not launch latency).
Status launch_device_wait(uint64_t nanoseconds, cudaStream_t stream);

}  // namespace mx::cuda
