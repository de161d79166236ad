// Parameter structs and launchers of the kernels Gemma-4 adds (gemma_ops.cu, gemma_norms.cu, gemma_router.cu,
// gemma_attention_end_route.cu, moe_bf16*.cu).
// Same conventions as kernels.h: raw device pointers, int64 sizes, a Status per launch. Host-only header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/kernels.h"
#include "core/status.h"

namespace mx::cuda {

// x = cap * tanh(x / cap) over n f32 values (the final logit soft-cap).
Status launch_soft_cap(float* x, int64_t n, float cap, cudaStream_t stream);
// out = gelu_tanh(gate) * up over n bf16 values; out may alias gate or up.
Status launch_gelu_tanh_mul(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n, cudaStream_t stream);
// out[r, i] = gelu_tanh(gate_up[r, i]) * gate_up[r, inter + i]: bf16 gate_up [rows, 2 inter], out [rows, inter].
Status launch_geglu(const uint16_t* gate_up, uint16_t* out, int64_t rows, int64_t inter, cudaStream_t stream);
// x *= factor[0]: x f32 or bf16 (n values), factor f32 or bf16 in device memory (read on the device, so a
// captured graph sees the checkpoint's value).
Status launch_scale_by(void* x, bool x_f32, int64_t n, const void* factor, bool factor_f32, cudaStream_t stream);

// Per-head RMSNorms of a fused bf16 q|k|v row, in place: q heads times q_norm, k heads times k_norm, v heads
// without a weight. One warp per (token, head); head_dim % 8 == 0 and <= 1024.
struct QkvNormKernelParams {
  uint16_t* qkv = nullptr;           // bf16 [tokens, (n_q + 2 n_kv) head_dim]
  const uint16_t* q_norm = nullptr;  // bf16 [head_dim]
  const uint16_t* k_norm = nullptr;  // bf16 [head_dim]
  int64_t tokens = 0, n_q = 0, n_kv = 0, head_dim = 0;
  float eps = 1e-6f;
};
Status launch_qkv_norms(const QkvNormKernelParams& p, cudaStream_t stream);

// QkvRopeParams with norm_eps > 0 (gemma_rope.cu): the per-head RMSNorms of launch_qkv_norms and the RoPE +
// paged KV write of launch_qkv_rope in one launch; qkv is read, not written. head_dim % 8 == 0, <= 512.
struct GemmaQkvNormRopeParams {
  const uint16_t* qkv = nullptr;     // bf16 [tokens, (n_q + 2 n_kv) head_dim]
  uint16_t* q_out = nullptr;         // bf16 [tokens, n_q head_dim]
  const float* inv_freq = nullptr;   // [head_dim / 2]
  const uint16_t* q_norm = nullptr;  // bf16 [head_dim]
  const uint16_t* k_norm = nullptr;  // bf16 [head_dim]
  PagedKv kv;
  int64_t tokens = 0, n_q = 0, n_kv = 0, head_dim = 0;
  float rope_scale = 1.0f, eps = 1e-6f;
  // Bytes [prefetch, prefetch + prefetch_bytes) into the L2 (bulk prefetches before the PDL wait; sm_90+);
  // prefetch 16-byte aligned, prefetch_bytes % 16 == 0; 0 = none.
  const void* prefetch = nullptr;
  int64_t prefetch_bytes = 0;
};
Status launch_gemma_qkv_norm_rope(const GemmaQkvNormRopeParams& p, cudaStream_t stream);

// The fused norms of Backend::gemma_attention_end / gemma_layer_end (gemma_norms.cu): one CTA per row; the
// residual stream f32, everything else bf16; hidden % 8 == 0 and <= 8192.
// The fused row kernels' instance (gemma_norms.cu; the same bits in every one): `chunks`, the 8-value chunks a thread
// holds (2 where hidden <= 4096, or 4, the form before session 23; 0 = by rows: 4 below 1024 rows, then 2, bounded
// from 4096), and `bounded`, register bounds for more CTAs an SM with 2 chunks (3 layer ends, 4 attention ends; a few
// registers spilled).
struct GemmaRowForm {
  int chunks = 0;
  bool bounded = false;
};
struct GemmaAttentionEndKernelParams {
  const uint16_t* attn_out = nullptr;             // [rows, hidden]
  float* residual = nullptr;                      // [rows, hidden], updated
  const uint16_t* post_attention_norm = nullptr;  // [hidden]
  const uint16_t* pre_mlp_norm = nullptr;         // [hidden]
  const uint16_t* pre_moe_norm = nullptr;         // [hidden] or null (then moe_in is not written)
  uint16_t* mlp_in = nullptr;                     // [rows, hidden]
  uint16_t* moe_in = nullptr;                     // [rows, hidden]
  int64_t rows = 0, hidden = 0;
  float eps = 1e-6f;
  GemmaRowForm form;
};
Status launch_gemma_attention_end(const GemmaAttentionEndKernelParams& p, cudaStream_t stream);

struct GemmaLayerEndKernelParams {
  const uint16_t* dense = nullptr;          // [rows, hidden]
  const uint16_t* moe = nullptr;            // [rows, hidden] or null (no experts)
  const uint16_t* post_mlp_norm = nullptr;  // [hidden]
  const uint16_t* post_moe_norm = nullptr;  // [hidden], with moe
  const uint16_t* post_ffn_norm = nullptr;  // [hidden], with moe
  const void* layer_scalar = nullptr;       // [1], f32 when scalar_f32 else bf16; null = 1
  float* residual = nullptr;                // [rows, hidden], updated
  const uint16_t* next_norm = nullptr;      // [hidden]
  uint16_t* next_in = nullptr;              // [rows, hidden]
  int64_t rows = 0, hidden = 0;
  float eps = 1e-6f;
  bool scalar_f32 = false;
  GemmaRowForm form;
};
Status launch_gemma_layer_end(const GemmaLayerEndKernelParams& p, cudaStream_t stream);

// Gemma-4's router in one launch: per token the weightless RMSNorm of x (norm_eps > 0; else x as is), times
// x_scale per dimension (the learned scale * H^-1/2), the fp32 logits against the checkpoint's bf16 weight,
// top-k (ties to the lower expert), softmax over the k, times expert_scale[id]. CTAs split the experts; the last CTA of a token tile
// (atomic ticket, reset by it for the next replay) selects the top-k of the tile's tokens, or, with
// cluster_ctas at decode, CTA 0 of the token's CTA cluster, from the logits the others stored into its
// shared memory; with split_ctas, the owner CTA of each token in its tile's cluster (gemma_router_split.cu).
struct GemmaRouterParams {
  const void* x = nullptr;             // [tokens, hidden], f32 when x_f32 else bf16
  const uint16_t* weight = nullptr;    // bf16 [experts, hidden]
  const float* x_scale = nullptr;      // f32 [hidden]
  const void* expert_scale = nullptr;  // [experts], f32 when scale_f32 else bf16; null = 1
  float* logits = nullptr;             // f32 [tokens, experts]
  int32_t* topk_ids = nullptr;         // [tokens, top_k]
  float* topk_weights = nullptr;       // [tokens, top_k]
  uint32_t* tickets = nullptr;         // [gemma_router_tickets(tokens)] zeroed once
  int64_t tokens = 0, hidden = 0, experts = 0, top_k = 0;
  float norm_eps = 0.0f;
  bool x_f32 = false, scale_f32 = false;
  // 0 = the ticket kernel; else one cluster of this many CTAs per token (a value gemma_router_cluster_ctas()
  // returned on this device; meant for a few tokens).
  int cluster_ctas = 0;
  // With cluster_ctas: each CTA's weight rows by cp.async.bulk into shared memory (where they fit:
  // gemma_router_bulk_weights_fit: rows of hidden % 8 == 0) instead of 8-byte loads into registers.
  bool bulk_weights = false;
  // > 0 (8 or 16, a value gemma_router_split_ctas() returned on this device): the split kernel instead
  // (gemma_router_split.cu; launch_gemma_router_split): a cluster of this many CTAs per tile of up to 32
  // tokens, each CTA a slice of the hidden dimension for every expert, on bf16 tensor cores. Meant for
  // batches (cluster_ctas is for a few tokens); needs hidden % 8 == 0 (gemma_router_split_fits).
  int split_ctas = 0;
};
int64_t gemma_router_tickets(int64_t tokens);
// The largest CTA cluster the router's cluster kernel runs on with the current device (16 where the device
// schedules non-portable clusters of 16, else 8), or 0 where it has none (below sm_90): a host query.
int gemma_router_cluster_ctas();
bool gemma_router_bulk_weights_fit(const GemmaRouterParams& p);
Status launch_gemma_router(const GemmaRouterParams& p, cudaStream_t stream);
// The split kernel's cluster size on the current device (16 where it runs non-portable clusters of 16, else
// 8), or 0 below sm_90: a host query. Then whether p (with split_ctas set) fits the kernel, and its launch
// (launch_gemma_router takes it where p.split_ctas > 0).
int gemma_router_split_ctas();
bool gemma_router_split_fits(const GemmaRouterParams& p);
Status launch_gemma_router_split(const GemmaRouterParams& p, cudaStream_t stream);
// The attention end and the router of its new residual in one launch (gemma_attention_end_route.cu, sm_90+): a
// cluster of router.cluster_ctas (8 or 16) CTAs per row; router.x, tickets and the other kernel choices are
// unused. Where it fits (hidden % 8 == 0 and <= 4096, a CTA's router rows in shared memory), and its launch.
bool gemma_attention_end_route_fits(const GemmaAttentionEndKernelParams& end, const GemmaRouterParams& router);
Status launch_gemma_attention_end_route(const GemmaAttentionEndKernelParams& end, const GemmaRouterParams& router,
                                        cudaStream_t stream);

// bf16 GeGLU experts over launch_moe_routing's tiles (or self-routed, below): 8-token tiles on a swap-AB
// decode kernel (moe_bf16.cu or moe_bf16_bulk.cu), 64-token tiles on the grouped GEMM (moe_bf16_grouped.cu).
// First GEMM (gated): out = h [slots, I] by sorted position, h = gelu_tanh(gate) * up. Second GEMM: out =
// y [slots, H] by sorted position, times the slot's routing weight. launch_moe_combine sums a token's k rows.
struct MoeBf16GemmParams {
  const uint16_t* w = nullptr;          // gated: bf16 [E, 2I, H]; else [E, H, I]
  const uint16_t* in = nullptr;         // gated: x [tokens, H]; else h [slots, I] by sorted position
  uint16_t* out = nullptr;
  const float* topk_weights = nullptr;  // [slots] (second GEMM)
  MoeRouting r;
  int64_t out_rows = 0;                 // gated: I (channels); else H
  int64_t k = 0, top_k = 0, max_tiles = 0, tile_tokens = 0;
  int k_split = 1;                      // warps per strip (8-token tiles, register loads)
  bool gated = false;
  // 64- or 128-token tiles on wgmma (moe_bf16_wgmma.cu, sm_90a) instead of mma.sync (moe_bf16_grouped.cu,
  // 64 only).
  bool wgmma = false;
  // wgmma, 128-token tiles: weight rows a CTA (wgmma's N: 128, 176 or 256; the first GEMM's are half gate, half up
  // rows) and k tiles in its cp.async ring; 0 = 128 and 4 (the only form of 64-token tiles).
  // moe_bf16_wgmma_form_ok says which pairs are instanced.
  int wgmma_rows = 0, wgmma_stages = 0;
  // wgmma, 128-token tiles: the warp-specialized persistent kernel (a copying warpgroup, two multiplying; one CTA
  // per SM over `sms` SMs) instead of one CTA per (tile, weight tile) whose warps all copy and multiply.
  bool wgmma_ws = false;
  int sms = 0;
  // 8-token tiles: weights by cp.async.bulk into shared memory (moe_bf16_bulk.cu, sm_90+; 4 warps per strip)
  // instead of 16-byte loads into registers (moe_bf16.cu).
  bool bulk_copies = false;
  // Decode, at most 32 slots (tile_tokens 8): every CTA routes itself from the ids (moe_route_tile.cuh) and
  // `r` is unused; the second GEMM is a programmatic dependent of the first (loads its first weights before
  // waiting for h), and with `combined` set the last CTA of each 16-row strip (a ticket per strip, reset by
  // it) writes combined[t] = sum over j in router order of y[pos(t, j)] (no combine kernel).
  const int32_t* topk_ids = nullptr;    // [slots] or null
  int64_t slots = 0, experts = 0;
  uint32_t* tickets = nullptr;          // [ceil(H / 16)] zeroed once
  uint16_t* combined = nullptr;         // bf16 [slots / top_k, H]
  // Self-routed, bulk copies: the ids were written before the previous kernel (GegluMoeParams::routing_ready),
  // so the first GEMM routes itself and issues its first weight copies before its PDL wait.
  bool routing_ready = false;
  // Bulk copies: tiles one CTA runs in turn (1 to 4; fewer, longer CTAs where one-tile CTAs need waves).
  int tiles_per_cta = 1;
  // Bulk copies: k per ring stage (a copy per row and stage), 256, 512 or 768; 0 = 256.
  int64_t bulk_stage_k = 0;
  // Bulk copies: each ring stage as one TMA tensor box (the strip's rows of the stage's k, 128-byte swizzle)
  // instead of a copy per row; needs k % 64 == 0 (moe_bf16_bulk_boxes_fit) and weight_experts, the experts in w.
  bool bulk_tensor_boxes = false;
  int64_t weight_experts = 0;
  // Routing metadata with tiles of 8, 16 or 32 tokens: persistent CTAs stream (tile, strip) items through one
  // ring of `ring_slots` stages (moe_bf16_stream.cu, sm_90+) instead of one CTA per item.
  bool streamed = false;
  int ring_slots = 0;
};
Status launch_moe_bf16_gemm(const MoeBf16GemmParams& p, cudaStream_t stream);
// The wgmma kernel's 128-token-tile forms (MoeBf16GemmParams::wgmma_rows, wgmma_stages; moe_bf16_wgmma.cu): gate|up
// 128 rows at 4 or 6 stages, 176 at 5, 256 at 4; down 128 at 3, 4 or 6 stages, 256 at 4. Warp-specialized
// (wgmma_ws): gate|up 128 at 6 or 176 at 5, down 128 at 6 or 256 at 4.
bool moe_bf16_wgmma_form_ok(bool gated, int rows, int stages, bool ws = false);
// Tokens per routing tile of the prefill experts (slots >= 32 x experts) where the caller does not choose:
// moe_bf16.cu's measured choice for the wgmma kernel; 64 for mma.sync (its only size).
int64_t moe_bf16_prefill_tile_tokens(bool wgmma, int64_t slots, int64_t experts);
// The 64-token-tile path of launch_moe_bf16_gemm (moe_bf16_grouped.cu); out_rows even.
Status launch_moe_bf16_grouped_gemm(const MoeBf16GemmParams& p, cudaStream_t stream);
// The same on wgmma, tiles of 64 or 128 tokens (moe_bf16_wgmma.cu; sm_90a only: the caller checks the device).
Status launch_moe_bf16_wgmma_gemm(const MoeBf16GemmParams& p, cudaStream_t stream);
// The 8-token-tile path with bulk_copies (moe_bf16_bulk.cu).
Status launch_moe_bf16_bulk_gemm(const MoeBf16GemmParams& p, cudaStream_t stream);
bool moe_bf16_bulk_boxes_fit(const MoeBf16GemmParams& p);
// The streamed path (moe_bf16_stream.cu): as many persistent CTAs as the device holds at once.
Status launch_moe_bf16_stream_gemm(const MoeBf16GemmParams& p, cudaStream_t stream);
// Both GEMMs of a self-routed step (<= 32 slots, 8-token tiles, the combine fused) in one persistent launch
// (moe_bf16_fused.cu, sm_90+; bit for bit the bulk kernels' result): up and down as launch_moe_bf16_gemm
// takes them, counters = moe_bf16_fused_counters() words zeroed once (reset by each launch), a ring of 2 to 8
// stages per CTA.
int moe_bf16_fused_counters();
Status launch_moe_bf16_fused(const MoeBf16GemmParams& up, const MoeBf16GemmParams& down, uint32_t* counters,
                             int ring_slots, cudaStream_t stream);

}  // namespace mx::cuda
