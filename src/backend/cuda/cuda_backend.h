// The CUDA backend: bf16 activations and paged KV cache, fp32 accumulation, MXFP4 experts repacked at
// upload into the swap-AB fragment layout. Everything runs on one stream owned by the backend; scratch is
// sized by prepare() so that forward passes allocate nothing and can be captured as CUDA graphs.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/kernel_configs.h"

namespace mx {

// Which MXFP4 expert GEMMs moe_experts runs: by tokens per expert (kAuto, kernel_configs.h), or forced
// (tests and benchmarks compare both paths on the same shapes).
// kDecode: the ring decode GEMMs (moe_decode.cu; kAuto uses them at one token); kDecodeV1: the first
// decode kernels (moe.cu, routing + 2 GEMMs + combine; kAuto's choice from two tokens to the grouped
// threshold). kGrouped: the grouped GEMM, on wgmma where the device has it (sm_90, moe_wgmma.cu, also
// kAuto's choice there), else on mma.sync (moe_grouped.cu); kGroupedMmaSync: always the mma.sync one.
enum class CudaMoePath { kAuto, kDecode, kGrouped, kDecodeV1, kGroupedMmaSync };

// A CUDA backend's MoE choices; the defaults are what serving uses. Tests and benchmarks force the rest.
struct CudaMoeOptions {
  CudaMoePath path = CudaMoePath::kAuto;
  int grouped_tile_tokens = 0;  // 64 (mma.sync only) or 128 (wgmma: also 16, 32, 96, 256) forces the grouped kernel's tile; 0 = by tokens per expert
  // Decode GEMM knobs (0 = kernel_configs.h's choice): target k tiles per warp (sets the k split), whether
  // the second GEMM is a programmatic dependent of the first, and `only_gemm` (1 or 2: launch just that
  // GEMM, to time it alone; the output is then garbage).
  int decode_k_tiles_per_warp = 0;
  bool decode_pdl = true;
  int decode_only_gemm = 0;
  // The second GEMM's own k tiles per warp (0: decode_k_tiles_per_warp, or kAuto's choice for that GEMM), and
  // the form before session 20 (each ring slot's scale bytes in registers, 4 warps a CTA at one token).
  int decode_k_tiles_gemm2 = 0;
  bool decode_scales_in_registers = false;
  // kAuto's staged form runs 3 warps a CTA in both GEMMs from 5 routed slots up to this many (0: kAuto's,
  // kMoeFusedAutoThreeWarpSlots; 4: session 20's, 2 warps from 5 slots on).
  int decode_three_warp_slots = 0;
  // The staged first GEMM at <= 8 self-routed slots finds its tile's expert in a mask of the busy experts (true) or
  // by route_tile's pass over the slots (false: the form before session 22); the same tiles and bits.
  bool decode_mask_route = true;
  // kAuto's staged GEMMs decode each fp4 word with two of its rotations as left shifts up to this many routed slots
  // (0: kMoeFusedShiftSlots; -1: never, session 23's form). The same bits.
  int decode_shift_slots = 0;
  // The staged first GEMM's ring: 0 = kAuto's (moe_fused_auto_ring), 4 = 4 weight and 2 activation tiles, 5 = 5 weight
  // tiles and one activation tile at <= 4 self-routed slots with shifts (elsewhere 4 and 2).
  int decode_ring_gemm1 = 0;
  // Kernel bench: the self-routed staged GEMMs' CTA events (MoeFusedParams::trace; the first GEMM's CTAs, then the
  // second's, 8 words each), or null.
  uint64_t* decode_trace = nullptr;
  int wgmma_persistent = 0;  // 1 forces its persistent grid (256-token tiles), -1 a CTA per item; 0 = default
  int wgmma_warp_specialized = 0;  // 1 forces the warp-specialized wgmma kernel (moe_wgmma_ws.cu), -1 the other; 0 = default
  int wgmma_pdl = 0;  // -1: the deep ring's wgmma GEMMs not as programmatic dependents; 0 or 1: as dependents
  int wgmma_bulk = 0;  // the 16-token wgmma tiles' k tiles: 1 by the copy engine (launch_moe_wgmma_bulk_gemm), 2 so
                       // with each warp freeing ring slots on mbarriers, 3 so with an expert's tiles paired (one
                       // decode for two tiles' rows), -1 by cp.async; 0 = kMoeWgmmaBulk's choice
  int wgmma_bulk_rows = 0;  // the copy engine's row copies: 0 a tile's routed tokens' 8-row blocks, -1 the whole tile
  // moe_experts_add_rms_norm at <= 32 routed slots: the experts' rows summed in the norm's kernel (true), or the
  // second decode GEMM's own combine and then add_rms_norm (false: the two ops, the before of that join).
  bool decode_combine_in_norm = true;
  // That norm's kernel lets its programmatic dependent (gpt-oss: the next layer's qkv, or after the last layer the
  // lm_head's gather) launch before its own wait, so the next qkv's CTAs load their weights beside the experts' second
  // GEMM (true), or only after the wait (false: the form before).
  bool decode_norm_dependents_first = true;
  // The row norms (rms_norm, add_rms_norm, that norm, the router's fused one) read their weight, and the router its
  // bias, before their PDL wait (constants: the same bits), not after the row's sum (false: the form before).
  bool norm_inputs_before_wait = true;
  // add_rms_norm_route at <= 32 tokens where the router's expert blocks are more than a cluster takes (120b's 16):
  // one launch, the router's ticketed form with the norm in every CTA (true), or add_rms_norm, then the router
  // (false: the two launches before session 24).
  bool norm_route_tickets = true;
  // The tiled wgmma path (16- and 32-token tiles on the copy engine): 1 = the routing and the tiled gather in one
  // launch (launch_moe_route_gather_tiled, where moe_route_gather_fits), then the combine kernel and add_rms_norm;
  // 2 = the same with the combine in the next add_rms_norm's kernel (moe_experts_add_rms_norm); -1 = the routing
  // kernel, the gather, the combine kernel and add_rms_norm (the before, for benchmarks); 0 = kMoeWgmmaGlue's choice.
  // The 96-, 128- and 256-token tiles: >= 1 = the routing and x's k permutation in one launch
  // (launch_moe_route_permute, where moe_route_permute_fits), -1 = the routing kernel and the permuting copy; 2 also
  // sums the experts' rows in the next add_rms_norm's kernel there.
  int wgmma_glue = 0;
  // 96-token tiles: 1 = the kernel whose tiles of at most 64 tokens multiply 64 token columns, one strip a warp
  // (MoeGemmParams::mid_width), -1 = the kernel of 96 columns and of 48 (two strips a warp) for tiles of at most 48;
  // 0 = kMoeWgmmaMidWidth's choice (the former between 48 and 80 tokens per expert on average).
  int wgmma_mid_width = 0;
  // The 96- and 256-token tiles behind the one-launch routing (wgmma_glue >= 1): 1 = the tiles whose k loop runs at
  // the full width numbered first, the shorter ones last (launch_moe_route_permute_wide_first), -1 = every tile in
  // expert order (the before, for benchmarks); 0 = kMoeWgmmaWideTilesFirst's choice (wide first).
  int wgmma_wide_first = 0;
  // The 96-token tiles' 64/96-column kernel (wgmma_mid_width): 1 = every k tile's loads by the copy engine from x
  // gathered tiled and h written tiled (launch_moe_wgmma_bulk_gemm, where the routing and that gather fit one
  // launch), -1 = by cp.async; 0 = kMoeWgmmaBulkMid's choice.
  int wgmma_bulk_mid = 0;
  // The 256-token tiles (a CTA per item): 1 = every k tile's loads by the copy engine, as wgmma_bulk_mid's (x gathered
  // tiled, h written tiled), -1 = by cp.async (the form before 2026-11-29's session 23); 0 = kMoeWgmmaBulkWide's choice
  // (the copy engine).
  int wgmma_bulk_wide = 0;
  // The 96-token tiles at 96/48 columns (32-48 and 80-512 tokens per expert): 1 = by the copy engine, as
  // wgmma_bulk_mid's, -1 = by cp.async; 0 = kMoeWgmmaBulkFull's choice.
  int wgmma_bulk_full = 0;
  // Those tiles' of at most 48 tokens on the copy engine: 1 = two strips a warp (the CTA of the odd column block
  // exits, as in the cp.async form), -1 = one strip a warp at 48 columns (the form before session 24); 0 =
  // kMoeWgmmaBulkTwoStrips's choice.
  int wgmma_bulk_two_strips = 0;
  // Benchmarks only (the wgmma path; the output is then garbage): 1 = just the routing and the tiled gather (or the
  // k permutation), 2 = those and the combine (through moe_experts_add_rms_norm: and the norm), the GEMMs skipped.
  int wgmma_glue_only = 0;
};

// Which dense linears take the skinny kernel (skinny_linear.cu) instead of cuBLASLt: max_rows -1 = up to
// kSkinnyLinearMaxRows rows where skinny_linear_by_default (kernel_configs.h); > 0 = every linear of up
// to that many rows (capped at kSkinnyLinearMaxRows); 0 = none (tests and benchmarks compare the two).
// `k_splits`, `chunks_in_flight` > 0 force those config fields (benchmarks).
struct CudaSkinnyLinearOptions {
  int max_rows = -1;
  int k_splits = 0;
  int chunks_in_flight = 0;
  int strip_rows = 0;  // 8 to 16 forces SkinnyLinearConfig::strip_rows (benchmarks); 0 = skinny_linear_strip_rows
                       // (on FP8 weights only with fp8_even_strips, else 16)
  // linear_qkv_rope at <= kSkinnyLinearMaxRows tokens without q/k norms: the RoPE and the KV write in the skinny
  // kernel's epilogue (SkinnyRope, one launch) on bf16 and FP8 weights (0, the default; 1 the same), on FP8 weights
  // only (2: bf16's qkv on cuBLASLt, then qkv_rope: the default before 2026-11-29), or never (-1: the linear, then
  // qkv_rope). bf16 20b on an H200 since the combine norm lets qkv launch early, with inputs_first, one process
  // (docs/PERF.md, session 22 W2): batch 1 TPOT 1.793 / 1.755 ms on cuBLASLt -> 1.690 / 1.689, batch 8 3.434 / 3.399
  // -> 3.377 / 3.398.
  int rope_epilogue = 0;
  int rope_strip_rows = 0;  // 8 to 16, even, forces the epilogue's strip rows (benchmarks); 0 = skinny_rope_strip_rows
  // bf16 weights at 1 to 8 tokens without k splits: each CTA's strip staged whole in shared memory before the PDL
  // wait (skinny_linear_staged.cu) where every strip's CTA fits at once (skinny_linear_staged_fits: Gemma-4's
  // sliding o_proj, gate|up and down, gpt-oss's o_proj), on sm_90 (not measured elsewhere); false: the skinny
  // kernel. H200, Gemma-4 batch-1 TPOT at 1K (bench latency --skinny-staged, one process): 3.059 -> 2.925 ms
  // (session 19), 3.065 / 3.088 -> 2.912 / 2.934 (session 20; gpt-oss-20b unchanged at batch 1 and 8).
  bool staged = true;
  // The staged form also where its strips take up to this many waves of resident CTAs, the last at least a third
  // full (the first wave's CTAs copy before the PDL wait, the others as CTAs leave), there in place of cuBLASLt too:
  // Gemma-4's q|k|v (1.94 and 2.42 waves) and full layers' o_proj (1.94); not gpt-oss's q|k|v (1.21: slower
  // staged). 1 = one wave only. H200, Gemma-4 batch-1 TPOT at 1K, one process: 2.932 / 2.927 / 2.958 -> 2.874 /
  // 2.873 / 2.911 ms at 3 (docs/PERF.md, session 20).
  int staged_waves = 3;
  // FP8 weights take skinny_linear_strip_rows too (where 16-row strips fit one wave: gpt-oss's o_proj on 11-row
  // strips, 262 CTAs on 132 SMs instead of 180); false: 16-row strips on FP8 weights.
  bool fp8_even_strips = true;
  // Each output value's epilogue inputs (scale, bias; qkv's cos / sin and destination) read before the PDL wait
  // (SkinnyLinearParams::inputs_first). H200, 20b FP8 TPOT, both off -> both on, one process (docs/PERF.md,
  // session 22 W2): batch 1 1.589 / 1.606 -> 1.542 / 1.536 ms, batch 8 3.271 / 3.245 -> 3.215 / 3.190 (even strips
  // alone within the spread, W1b).
  bool inputs_first = true;
  // Strips past one wave (the lm_head) on one wave of persistent CTAs (SkinnyLinearConfig::persistent): a
  // benchmark form; 20b FP8 not faster end to end (session 22 W2: batch 1 +0.010 / +0.023 ms, batch 8 -0.018 /
  // +0.008).
  bool persistent = false;
  // FP8 weights staged as bf16 ones are (`staged`'s rule at a byte a weight, k % 16 == 0: 20b's o_proj, 262 strips of
  // 11 rows x 4 KB, in flight during the attention). A measured option: slower in the chain (H200, 20b FP8 with the
  // lm_head staged, session 23 W1: batch 1 1.519 -> 1.537 / 1.553 ms, batch 8 3.197 -> 3.280 / 3.262).
  bool fp8_staged = false;
  // FP8 weights of strips past kSkinnyLinearManyWaves waves (the lm_head) at up to this many tokens (0: never) on the
  // staged kernel, a CTA a strip issuing its copies as it starts (skinny_linear_staged_head_ctas: 2880-byte rows, 4
  // CTAs an SM): ~190 KB an SM in flight where the skinny kernel's 3 CTAs keep 72 KB. H200, mx_kernel_bench
  // --lm-head-staged (session 23 W1b), skinny -> staged: 1 token 174.2 / 174.6 -> 142.7 / 142.7 us (97% of the copy
  // rate), 2 tokens 175.5 / 175.5 -> 144.8 / 144.7, 4 tokens 176.5 / 176.3 -> 177.4 / 177.8, 8 tokens 179.2 / 180.3 ->
  // 188.9 / 189.6 (the activation rows then miss the L1 the strips take); bf16's 2 CTAs an SM slower at 1 and 8 (W1:
  // 276-279 -> 298-317 us; the skinny kernel already reads it at the copy rate).
  int fp8_staged_head_rows = 2;
  // linear_qkv_rope's FP8 strips at one token tile (k % 16 == 0) staged whole in shared memory before the PDL wait
  // (SkinnyLinearConfig::staged, sm_90) instead of their first round of register loads: the strip in one round trip.
  // H200, 20b FP8 TPOT, one process, interleaved (session 23 W1b): with the lm_head staged, batch 1 1.529 / 1.512 ->
  // 1.501 / 1.502 ms, batch 8 3.169 / 3.197 -> 3.171 / 3.202 (no change).
  bool fp8_qkv_staged = true;
};

// Which prefill attention kernel runs: kAuto = on sm_90 at head dim 64, the sliding-window wgmma kernel
// (attention_wgmma_window.cu) for the window layers it takes and the warp-specialized wgmma kernel
// (attention_wgmma_ws.cu, 128-key tiles) for the others (each the fastest there, docs/PERF.md), else
// mma.sync (attention.cu); on sm_90 at head dims 256 and 512 (Gemma-4) the wide-head wgmma kernel
// (attention_wgmma_wide.cu). kWgmmaWs (the ws kernel's 128-key-tile shape), kWgmmaWs64 (its 64-key-tile
// shape), kWgmmaWindow (the window kernel; layers it does not take run as kAuto), kWgmmaWide (the wide-head
// kernel) and kMmaSync force one, for tests and benchmarks; kWgmmaWs*, kWgmmaWindow or kWgmmaWide where
// there is none is an error.
enum class CudaAttentionPath { kAuto, kWgmmaWs, kWgmmaWs64, kMmaSync, kWgmmaWindow, kWgmmaWide };
// Which decode attention kernel runs (one query per sequence, or verify rows): kAuto = the swap-AB one, its splits
// as CTA clusters where attention_decode_swap_cluster_by_default (cluster_configs.h) has that measured faster,
// else where attention_decode_swap_by_default (kernel_configs.h) has the swap-AB kernel measured faster, else
// attention.cu's split-KV kernel; kSwapAb = attention_decode_swap.cu (head dims 64, 256, 512, <= 8 q heads per kv
// head; else an error); kSwapAbCluster = the same with a token's 16 splits of a kv head as one CTA cluster merged in
// distributed shared memory (head dims 256 and 512 on sm_90+; else an error). kMmaSync = attention.cu's kernel (one
// token at head dim 64 on sm_90: its 2-16 splits as one CTA cluster, AttentionDecodeConfig::clusters); kMmaSyncMerge
// = the same with every split count through the merge kernel (the before of those clusters, for benchmarks).
enum class CudaAttentionDecode { kAuto, kMmaSync, kSwapAb, kSwapAbCluster, kMmaSyncMerge };
struct CudaAttentionOptions {
  CudaAttentionPath prefill = CudaAttentionPath::kAuto;
  CudaAttentionDecode decode = CudaAttentionDecode::kAuto;
  // The clustered swap-AB decode kernel's ring at one token where its splits are short
  // (attention_decode_swap_one_token_ring, cluster_configs.h: Gemma-4's sliding layers): 2 stages by default, so that
  // the staged o_proj's CTAs copy its whole weight beside the attention (H200, Gemma-4 batch 1: docs/PERF.md); 0 =
  // the cluster config's ring (4 stages), 3 for comparisons.
  int cluster_stages_one_token = 2;
  // At one query per sequence the 4-warp swap-AB decode kernels (head dims 256 and 512, clustered or not) copy the
  // keys of earlier steps before their PDL wait (AttentionKernelParams::keys_before_wait): only Q and the query's own
  // key wait for qkv_rope. false: every copy after the wait (the before, for comparisons).
  bool keys_before_wait = true;
  // Backend::qkv_rope_attention on Gemma-4's decode steps: true = the clustered decode attention norms and rotates q
  // and the new K/V itself (AttentionKernelParams::norm_rope), no qkv_rope launch; false (default) = qkv_rope, then
  // the attention. Off: on an H200 (session 23 W2, Gemma-4 batch 1 at 1K, one process, 3 interleaved rounds) it
  // measured 2.921 ms against 2.867 for the two launches, with the same bits (docs/PERF.md).
  bool norm_rope_in_attention = false;
};

// Which decode GEMMs Gemma-4's bf16 GeGLU experts run below 32 routed tokens per expert: kBulkCopies = one CTA
// per (8-token tile, strip) with weights by bulk copies (moe_bf16_bulk.cu, sm_90+); kRegisterLoads = the
// same by 16-byte loads into registers (moe_bf16.cu); kStreamed = where launch_moe_routing's metadata routes
// the tiles (> 32 slots), persistent CTAs stream (tile, strip) items through one ring (moe_bf16_stream.cu,
// sm_90+; tiles of stream_tile_tokens), and steps of <= 32 slots keep the bulk-copy kernels. kFused = steps
// of <= 32 slots run both GEMMs in one persistent launch (moe_bf16_fused.cu, sm_90+: the second GEMM's
// weights stream while the first finishes), larger ones as kStreamed. kAuto = on Hopper (sm_90, where each
// was measured faster: docs/PERF.md) kStreamed, but kFused for 2-4 tokens (<= 32 slots at top-8); else
// register loads. Tests and benchmarks force the others to compare them; kBulkCopies, kStreamed and kFused
// below sm_90 are errors.
enum class CudaBf16ExpertsDecode { kAuto, kRegisterLoads, kBulkCopies, kStreamed, kFused };
enum class CudaBf16ExpertsPrefill { kAuto, kMmaSync, kWgmma };
enum class CudaBulkCopyForm { kAuto, kRows, kBoxes };
struct CudaBf16ExpertsOptions {
  CudaBf16ExpertsDecode decode = CudaBf16ExpertsDecode::kAuto;
  // The bulk-copy kernels' second GEMM: tiles one CTA runs in turn (1 to 4); 0 = 1 where the experts route
  // themselves (<= 32 slots), else 3. H200 (mx_kernel_bench --gemma-experts-only, us per call at 1 / 2 / 3 / 4
  // tiles): 1 token 37.7 / 37.9 / 42.2 / 48.7, 64 tokens 515.7 / 511.2 / 510.1 / 509.2, 100 tokens 596.9 /
  // 589.6 / 587.6 / 590.7.
  int second_gemm_tiles_per_cta = 0;
  // kStreamed: tokens per routing tile (8, 16 or 32; 0 = 32 from 16 routed tokens per expert on average, else
  // 16) and ring slots per CTA (2 to 8; 0 = 4). H200, session 13 W2 (mx_kernel_bench --gemma-experts-only, us
  // per call of routing + GEMMs + combine; 8 / 16 / 32-token tiles at 4 slots, then 16 at 3; bulk copies):
  // 64 tokens 422.8 / 419.0 / 462.3, 439.2; 511.2. 100 tokens 491.6 / 432.3 / 484.4, 472.9; 592.8. 256 tokens
  // 966.7 / 634.1 / 588.9, 665.9; 1127.3. (Tiles of up to 16 tokens run a kernel that fits 5 CTAs per SM, 32
  // one that fits 4: W1's single 4-CTA kernel took 461.7 us at 64 tokens with 16-token tiles, 6 slots 530.1.)
  int stream_tile_tokens = 0;
  int stream_ring_slots = 0;
  // From 32 routed tokens per expert: kAuto = wgmma (moe_bf16_wgmma.cu) on Hopper (sm_90a), else mma.sync
  // (moe_bf16_grouped.cu); tests and benchmarks force either; kWgmma off sm_90 is an error. H200, session 15
  // W1c (mx_kernel_bench --gemma-experts-only, us per call): 1K tokens mma.sync 744.7, wgmma 665.7; 8K 4335.4,
  // 3174.9 (128-token tiles).
  CudaBf16ExpertsPrefill prefill = CudaBf16ExpertsPrefill::kAuto;
  // Tokens per routing tile there: 64 or 128 (wgmma only); 0 = moe_bf16_prefill_tile_tokens's choice.
  int prefill_tile_tokens = 0;
  // wgmma with 128-token tiles: weight rows a CTA and k tiles in its ring, of the first (gate|up: 128 at 4 or 6
  // stages, 176 at 5, 256 at 4) and the second GEMM (down: 128 at 3, 4 or 6, 256 at 4); 0 = 128 rows, 4 stages.
  int prefill_up_rows = 0, prefill_up_stages = 0, prefill_down_rows = 0, prefill_down_stages = 0;
  // ... on the warp-specialized persistent kernel (a copying warpgroup, two multiplying; gate|up 128 rows at 6
  // stages or 176 at 5, down 128 at 6 or 256 at 4; 0 rows and stages = 128 at 6) instead of a CTA per (tile,
  // weight tile): 1 forces it, -1 the CTA per item; 0 = the warp-specialized kernel. H200, session 24 W1
  // (mx_kernel_bench --gemma-experts-only=8192, us per call of routing + GEMMs + combine, median of 3 rounds): CTA
  // per item 128x4/128x4 3209.4, 176x5/256x4 2827.4, 256x4/256x4 2632.8; warp-specialized 128x6/128x6 2405.2,
  // 176x5/256x4 2474.9.
  int prefill_warp_specialized = 0;
  // kFused: ring slots per CTA (2 to 8; 0 = 6). H200, 4 tokens, us per call at 3 / 4 / 6 slots: 119.84 /
  // 115.74 / 113.18 (mx_kernel_bench --gemma-experts-only, session 15 W1).
  int fused_ring_slots = 0;
  // The bulk-copy kernels' k per ring stage (a copy per weight row and stage) in the first (up) and second (down)
  // GEMM: 256, 512 or 768; 0 = 512 (up, where the experts route themselves: <= 32 slots) and 256, else 256 and 256.
  // H200, session 17 W2b, one token, us per call at (up, down) 256/256, 512/768, 512/256: 34.91, 33.67, 32.48.
  int bulk_up_stage_k = 0;
  int bulk_down_stage_k = 0;
  // The bulk-copy kernels' stages as one TMA tensor box each (moe_bf16_bulk.cu; where k % 64 == 0, else the copies
  // per row) instead of a bulk copy per weight row and stage: kAuto = kBoxes. H200, session 18 W1, one token, us per
  // call (stages 512/256, routing ready): rows 32.36, boxes 31.22 (ncu alone: first GEMM 23.26 -> 21.18, second
  // 20.26 -> 19.10); W2, Gemma-4 batch-1 TPOT at 1K (bench latency, one process): 3.156 -> 3.053 ms. The streamed
  // kernel (batched decode) takes the same form: kAuto = kBoxes there too (session 23).
  CudaBulkCopyForm bulk_copy_form = CudaBulkCopyForm::kAuto;
};

// Which kernel runs Gemma-4's router: kAuto = up to kClusterMaxTokens tokens the cluster kernel on sm_90
// (where it was measured faster), else the ticket kernel; from there the split kernel wherever the device
// runs CTA clusters (gemma_router_split.cu: a cluster per token tile splitting the hidden dimension; H200,
// weights from HBM: 98.9 -> 7.0 us at 64 tokens, 94.0 -> 20.0 at 512, 358 -> 205 at 8192; slower than the
// cluster kernel up to 8 tokens: 5.0 vs 3.9 us at one); kTicket = the ticket kernel (4-token tiles; the last
// CTA to finish its experts picks the top-k) at every size, kCluster = a CTA cluster per token (up to
// kClusterMaxTokens), kSplit = the split kernel at every size. Tests and benchmarks force them; kCluster or
// kSplit without CTA clusters is an error. The cluster kernel runs clusters of 16 CTAs (where the device
// runs them) up to kLargeClusterMaxTokens tokens, else of 8: on an H100 eight clusters of 16 took 9.19 us
// (two waves, it seems), eight of 8 7.64 us, one of 16 5.47 us and one of 8 7.42 us (docs/PERF.md). The
// split kernel runs clusters of 16 up to kSplitLargeClusterMaxTokens, else of 8 (H200: 16 vs 8 CTAs 7.0 vs
// 8.2 us at 64 tokens, 9.25 vs 9.26 at 128, 13.4 vs 12.6 at 256, 25.6 vs 20.0 at 512).
enum class CudaGemmaRouterDecode { kAuto, kTicket, kCluster, kSplit };
struct CudaGemmaRouterOptions {
  static constexpr int64_t kClusterMaxTokens = 8;
  static constexpr int64_t kLargeClusterMaxTokens = 4;
  static constexpr int64_t kSplitLargeClusterMaxTokens = 128;
  CudaGemmaRouterDecode decode = CudaGemmaRouterDecode::kAuto;
  int cluster_ctas = 0;  // 8 or 16 forces the cluster's CTAs (both cluster kernels; tests, benchmarks)
  // The cluster kernel's weights: 0 = by cp.async.bulk into shared memory where a CTA's rows fit, else by
  // loads into registers (H100, one token: 4.51 against 5.47 us); 1 forces the copies (an error where the
  // rows do not fit), -1 the loads.
  int bulk_weights = 0;
};

// Kernel choices of one CUDA backend, fixed at creation; the defaults are what serving uses.
// Backend::begin_side on CUDA: the side group on a second stream for steps of 1 to max_tokens tokens; larger
// steps (and max_tokens 0) run it in order. Gemma-4's dense MLP beside its experts (H200, docs/PERF.md): 53.7 ->
// 48.0 us a layer at one token (`mx_kernel_bench --gemma-ffn-overlap`); TPOT 3.397 -> 3.222 ms at batch 1 and
// 8.440 -> 8.295 at batch 8 (bench latency --decode-overlap); not measured above 8 tokens.
struct CudaSideStreamOptions {
  int64_t max_tokens = 8;
};

// QkvRopeParams::prefetch on CUDA (the Gemma-4 form): steps of at most max_tokens tokens pull the first max_bytes
// of the weight into the L2 (H100/H200: 50 MB, shared with the attention's K/V; Gemma-4's o_proj is 23 MB on
// sliding layers, 46 MB on full ones). max_bytes 0: none, the default: at 24 MiB the o_proj GEMVs took 67 us less
// a batch-1 step, but qkv_rope's CTAs issuing the bulk prefetches took ~32 us more a layer (H200, docs/PERF.md).
struct CudaL2PrefetchOptions {
  int64_t max_bytes = 0;
  int64_t max_tokens = 16;
};

// qkv_rope on CUDA (the gpt-oss form, no per-head norms): steps of at least stream_min_tokens tokens run the
// many-token kernel (launch_qkv_rope_stream: CTAs of tokens_per_cta whole tokens, `items` 16-byte runs of 8 pairs
// per thread, every load issued before the cos/sin tables), smaller ones the per-(token, head group) CTAs tuned
// for decode. H200, gpt-oss heads (64 q / 8 kv, head dim 64), session 18 W2 (mx_kernel_bench --qkv-rope-only, us
// per call, decode form / 1 x 2 / 2 x 4): alone 256 tokens 4.01 / 3.06 / 3.53, 1K 8.28 / 6.75 / 7.73, 2K 15.41 /
// 12.56 / 12.38, 4K 30.01 / 28.42 / 26.36, 8K 60.17 (66% of the bytes floor) / 54.78 / 49.13 (81%); with the
// window attention behind (its programmatic dependent), the pair: 256 11.96 / 11.98 / 12.52, 1K 21.81 / 20.33 /
// 18.88, 2K 37.40 / 36.33 / 35.82, 4K 68.41 / 65.99 / 63.82, 8K 130.15 / 124.44 / 118.65. A persistent grid
// (the next token group's loads before the current one's stores) was slower at every size. Tests and benchmarks
// force either form (stream_min_tokens 1 or INT64_MAX) and the shape.
// q_in_attention: with QkvRopeParams::q_out empty (gpt-oss's prefill), RoPE for Q is the attention's
// (AttentionParams::q_inv_freq: the window and persistent kernels rotate Q in their Q load) and qkv_rope writes K
// and V alone. false, for comparison: qkv_rope still writes the rotated Q (into the backend's scratch) and the
// attention reads it back, the form before session 19.
struct CudaRopeOptions {
  int64_t stream_min_tokens = 1024;
  int tokens_per_cta = 2;
  int items = 4;
  bool q_in_attention = true;
};

// Gemma-4's fused row kernels between a layer's blocks (gemma_attention_end, gemma_layer_end; gemma_norms.cu), one
// CTA per row: kFourChunks = 8-value chunks a thread at most 4, the form before session 23 (190 / 138 registers:
// one 256-thread CTA an SM, at prefill's thousands of rows), kTwoChunks = 2 where the row fits (96 / 79),
// kTwoChunksBounded = 2 with register bounds for 3 / 4 CTAs an SM; kAuto = 4 below 1024 rows, 2 from there, 2 bounded
// from 4096 (H200, session 23: 8K rows 175.6 / 191.9 -> 97.8 / 116.0 us per call). The same bits in every form.
enum class CudaGemmaRowForm { kAuto, kFourChunks, kTwoChunks, kTwoChunksBounded };
struct CudaGemmaRowOptions {
  CudaGemmaRowForm form = CudaGemmaRowForm::kAuto;
};

struct CudaBackendOptions {
  CudaMoeOptions moe;
  CudaSkinnyLinearOptions skinny_linear;
  CudaAttentionOptions attention;
  CudaBf16ExpertsOptions bf16_experts;
  CudaGemmaRouterOptions gemma_router;
  CudaSideStreamOptions side_stream;
  CudaL2PrefetchOptions l2_prefetch;
  CudaRopeOptions rope;
  CudaGemmaRowOptions gemma_rows;
};

Result<std::unique_ptr<Backend>> make_cuda_backend(int device, const CudaBackendOptions& options = {});
// Replace a CUDA backend's choices between ops (tests and benchmarks compare paths on one backend).
// Not a CUDA backend: an error.
Status set_cuda_moe_options(Backend& backend, const CudaMoeOptions& moe);
Result<CudaMoeOptions> cuda_moe_options(Backend& backend);  // the current ones, to change one field
Status set_cuda_skinny_linear_options(Backend& backend, const CudaSkinnyLinearOptions& skinny);
Result<CudaSkinnyLinearOptions> cuda_skinny_linear_options(Backend& backend);
Status set_cuda_attention_options(Backend& backend, const CudaAttentionOptions& attention);
Status set_cuda_bf16_experts_options(Backend& backend, const CudaBf16ExpertsOptions& bf16_experts);
Status set_cuda_gemma_router_options(Backend& backend, const CudaGemmaRouterOptions& gemma_router);
Status set_cuda_side_stream_options(Backend& backend, const CudaSideStreamOptions& side_stream);
Status set_cuda_l2_prefetch_options(Backend& backend, const CudaL2PrefetchOptions& l2_prefetch);
Status set_cuda_rope_options(Backend& backend, const CudaRopeOptions& rope);
Status set_cuda_gemma_row_options(Backend& backend, const CudaGemmaRowOptions& gemma_rows);

// A CUDA backend's device ordinal and stream (cudaStream_t), for the collectives that run on its stream.
struct CudaPlacement {
  int device = 0;
  void* stream = nullptr;
};
Result<CudaPlacement> cuda_placement(Backend& backend);

}  // namespace mx
