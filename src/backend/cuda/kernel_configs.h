// Launch configurations of the CUDA kernels, chosen at run time from the device's shared-memory limit
// (opt-in per block) and SM count, never fixed at compile time for one chip. Plain C++ without CUDA
// headers: CPU unit tests check every config for SM90, SM100 and SM120/121 (a pipeline that does not fit
// the 99 KB of SM12x is the bug that crashed SGLang on RTX PRO 6000, ref-kernels.md 2.1).
#pragma once

#include <cstdint>

#include "backend/cuda/device_info.h"

namespace mx::cuda {

// Tile shapes of the mma.sync attention kernels (attention.cu) per head dim; the kernels and the configs
// below share them. Head dims 32, 64, 256 and 512 are instantiated. A warp owns 16 query rows and a slice
// of at most 128 output columns: above 128 a row block spreads over head_dim / 128 warps, which sum their
// partial Q K^T scores through shared memory (a 16 x 512 fp32 accumulator per warp would not fit the
// register file). Head dim 512 takes 32-key tiles so that one K/V stage (64 KB) fits SM12x's 99 KB.
constexpr bool attention_head_dim_supported(int64_t hd) {
  return hd == 32 || hd == 64 || hd == 128 || hd == 256 || hd == 512;
}
constexpr int attention_d_slice(int64_t hd) { return hd > 128 ? 128 : static_cast<int>(hd); }
constexpr int attention_warps_per_rows(int64_t hd) { return static_cast<int>(hd / attention_d_slice(hd)); }
constexpr int attention_keys_per_tile(int64_t hd) { return hd >= 512 ? 32 : 64; }
// Head dim 512 prefill: 16 warps of 64 rows (4 row blocks of 4 d slices; 128 registers, a few spilled)
// measured 84 TFLOP/s at 8K causal on an H100 against 55 with 8 warps of 32 rows (twice the K/V reads).
constexpr int attention_prefill_warps(int64_t hd) { return hd >= 512 ? 16 : hd > 64 ? 8 : 4; }
constexpr int attention_prefill_rows(int64_t hd) {
  return 16 * attention_prefill_warps(hd) / attention_warps_per_rows(hd);
}
// Decode: the warps of a CTA split each key tile into this many groups (each group all d slices).
constexpr int attention_decode_key_groups(int64_t hd) { return hd > 64 ? 2 : 4; }
constexpr int attention_decode_warps(int64_t hd) {
  return attention_decode_key_groups(hd) * attention_warps_per_rows(hd);
}

// Prefill attention (FlashAttention-2 on mma.sync): warps of 16 query rows (and one d slice), the rows
// packing the (token, q head) pairs of one kv head; K/V tiles of `keys_per_tile` keys in a cp.async ring
// whose first stage holds Q until it is in registers.
struct AttentionPrefillConfig {
  int threads = 0;
  int rows_per_cta = 0;
  int keys_per_tile = 0;
  int stages = 0;           // K/V ring depth (1 or 2)
  int64_t smem_bytes = 0;   // dynamic shared memory per block
};
AttentionPrefillConfig choose_attention_prefill_config(const DeviceInfo& dev, int64_t head_dim);

// Prefill attention on wgmma, warp-specialized (sm_90a only, attention_wgmma_ws.cu): one producer warpgroup
// fills a ring of K/V stages (mbarriers), warpgroups of 64 query rows consume it. Head dim 64 only for now
// (the P.V wgmma is written for n = 64). Two shapes (docs/PERF.md has the measurements behind them):
struct AttnWsShape {
  int keys_per_tile, consumers, stages, ctas_per_sm;
  // The consumer loop issues QK(i) and P V(i - 1) together and runs softmax(i) under the P V (FA3's
  // intra-warpgroup overlap, Q read from shared memory); else QK, softmax and P V of a tile run in turn.
  bool overlap;
};
// Full layers: 128-key tiles, three consumer warpgroups (192 rows), one CTA per SM, in turn (the
// overlapped loop was not faster at 8K causal on an H100: 1574 us vs 1441).
inline constexpr AttnWsShape kAttnWsWide{128, 3, 4, 1, false};
// Short windows: 64-key tiles, two consumer warpgroups (128 rows), two CTAs per SM, overlapped. 16 tokens
// of 8 heads see 143 keys of a 128-key window: 3 tiles of 64 keys, 2/3 of them visible, where the wide
// shape's 24 tokens see 151 keys in 2 tiles of 128, half visible; and one CTA's prologue and first loads
// run under the other's math (a window CTA runs only 2-3 tiles). Its in-turn form gave wrong results.
inline constexpr AttnWsShape kAttnWsNarrow{64, 2, 4, 2, true};
struct AttentionPrefillWgmmaConfig {
  bool enabled = false;     // the device has wgmma, the head dim has an instantiation, and it fits
  int threads = 0;
  int rows_per_cta = 0;
  int keys_per_tile = 0;
  int stages = 0;
  int ctas_per_sm = 0;      // what the kernel's launch bounds and register split are built for
  int64_t smem_bytes = 0;   // dynamic shared memory per block (1024-byte alignment slack included)
};
// Q, the ring, its full and empty barriers, per-token and per-pass tables (7 ints a row, 3 more), and the
// slack that aligns the tiles to 1024 bytes.
constexpr int64_t attention_prefill_wgmma_ws_smem_bytes(int64_t head_dim, const AttnWsShape& s) {
  const int64_t rows = 64 * s.consumers;
  return 1024 + rows * head_dim * 2 + s.stages * 2 * s.keys_per_tile * head_dim * 2 + 2 * s.stages * 8 +
         (7 * rows + 3) * 4;
}
AttentionPrefillWgmmaConfig choose_attention_prefill_wgmma_ws_config(const DeviceInfo& dev, int64_t head_dim,
                                                                     const AttnWsShape& shape);

// Sliding-window prefill on wgmma (sm_90a, attention_wgmma_window.cu): a persistent CTA walks consecutive
// 128-row blocks of one kv head with 64-key tiles at fixed key boundaries, kept in the ring while later
// blocks need them, Q double-buffered; a producer warpgroup and two consumer warpgroups, two CTAs per SM,
// the grid one wave. (Three consumer warpgroups at one CTA per SM were no faster per token on an H100:
// docs/PERF.md.)
inline constexpr int kAttnWindowKeys = 64, kAttnWindowStages = 4;
inline constexpr int kAttnWindowMaxTokens = 256;  // tokens one CTA walks at most (its tables): 16 blocks at g8
struct AttentionWindowWgmmaConfig {
  bool enabled = false;  // sm_90, head dim 64, and it fits
  int threads = 0;
  int sm_count = 0;      // the grid's size: two CTAs per SM
  int64_t smem_bytes = 0;
};
// Two Q buffers, the ring, its barriers and the Q buffers' (2 a stage, 4), the token tables (3 ints a
// token), the pass and block tables (8 ints a token and 2 more), 2 counts, and the 1024-byte alignment slack.
constexpr int64_t attention_window_wgmma_smem_bytes() {
  return 1024 + 2 * 128 * 64 * 2 + kAttnWindowStages * 2 * kAttnWindowKeys * 64 * 2 + (2 * kAttnWindowStages + 4) * 8 +
         (11 * kAttnWindowMaxTokens + 4) * 4;
}
// Whether the window kernel takes a layer: a block's pass (at most 128 / group tokens at consecutive
// positions) sees at most window + tokens - 1 keys, and their tiles must fit the ring at once (gpt-oss:
// window 128, 16 tokens: 4 tiles at most).
constexpr bool attention_window_wgmma_takes(int64_t window, int64_t group) {
  const int64_t tokens = group >= 128 ? 1 : 128 / group;
  return window > 0 && group >= 1 && (window + tokens + 61) / kAttnWindowKeys + 1 <= kAttnWindowStages;
}
AttentionWindowWgmmaConfig choose_attention_window_wgmma_config(const DeviceInfo& dev, int64_t head_dim);

// Decode attention: one CTA per (token, kv head, head block, KV split); the warps split each key tile
// into attention_decode_key_groups groups, merged through shared memory that aliases the K/V ring.
constexpr int kAttentionDecodeMaxClusterSplits = 16;  // a non-portable cluster size on sm_90
struct AttentionDecodeConfig {
  int threads = 0;
  int keys_per_tile = 0;
  int stages = 0;
  int num_splits = 0;       // KV splits per (token, head); > 1 adds the merge kernel, unless `clusters`
  int64_t smem_bytes = 0;
  bool clusters = false;    // one token, head dim 64, 2-16 splits, sm_90: the splits as one CTA cluster
};
// `max_keys`: the most keys a query can see (window, or the page table's capacity): a static bound, so
// the split count is the same for every replay of a captured graph.
AttentionDecodeConfig choose_attention_decode_config(const DeviceInfo& dev, int64_t head_dim, int64_t num_tokens,
                                                     int64_t n_kv, int64_t head_blocks, int64_t max_keys);

// Decode attention with the keys as the mma's M side and a kv head's q heads as its 8-wide N side
// (attention_decode_swap.cu): head dims 64, 256 and 512, groups of up to 8. A CTA is one warp with its own ring
// (head dim 64), or 4 warps splitting the head dims and sharing one ring (256, 512), of `stages` 16-key stages
// (K, and V unless it aliases K) after the group's Q; splits of at least `min_split_keys` keys.
inline constexpr int64_t kAttnSwapMaxGroup = 8;
struct AttentionDecodeSwapConfig {
  bool enabled = false;  // the shape has the kernel and a ring of 2+ stages fits
  int stages = 0;
  int num_splits = 0;
  int min_split_keys = 0;
  int64_t smem_bytes = 0;
};
// `max_keys` as for choose_attention_decode_config (a static bound: graphs stay valid).
AttentionDecodeSwapConfig choose_attention_decode_swap_config(const DeviceInfo& dev, int64_t head_dim, int64_t group,
                                                              bool kv_shared, int64_t num_tokens, int64_t n_kv,
                                                              int64_t max_keys);
// Whether kAuto takes the swap-AB kernel for this enabled config (where it was measured faster).
bool attention_decode_swap_by_default(const DeviceInfo& dev, const AttentionDecodeSwapConfig& c, int64_t num_tokens);

// MXFP4 experts, "swap AB" (weights as the mma A operand, routed tokens as the 8-wide N side).
struct MoeConfig {
  int tile_tokens = 0;      // routed tokens per tile (8 * n_tiles)
  int k_split = 0;          // warps per CTA, each taking a share of K; reduced in shared memory
  int threads = 0;
  int64_t smem_bytes = 0;   // dynamic: the cross-warp reduction buffer
};
// `rows`: output rows of the GEMM (2I for the first, H for the second); `num_slots` = tokens * top_k.
MoeConfig choose_moe_config(const DeviceInfo& dev, int64_t num_slots, int64_t num_experts, int64_t rows);
// Upper bound of the tiles of a routing with this tile size: sizes the grid for graphs.
int64_t moe_max_tiles(int64_t num_slots, int64_t num_experts, int64_t tile_tokens);

// MXFP4 experts at decode, second generation ("fused", moe_decode.cu): the same swap-AB fragments, but
// every warp keeps a ring of 4 k tiles of weights and scales (64 k each; activations: two) in flight
// instead of one 512-byte load (the first kernel reached 31% of HBM at one token; rings of 6 and 8 measured
// slower, docs/PERF.md, and are gone). The k split depends on k only,
// never on the batch, so a token's sums run in the same order in any batch. Up to kMoeFusedMaxSlots
// routed tokens, every CTA derives its tile's routing from the top-k ids itself (no routing kernel) and
// the second GEMM's last CTA of each 16-row strip sums the top-k rows in router order (no combine
// kernel); above that the routing kernel's metadata and the combine kernel are used. The second GEMM is a
// programmatic dependent of the first on SM90+: it routes and loads its first weights while the first
// one finishes.
inline constexpr int64_t kMoeFusedMaxSlots = 32;  // the routing is computed by one warp, a slot per lane
inline constexpr int kMoeFusedTileTokens = 8;
inline constexpr int kMoeFusedMaxKSplit = 16;
struct MoeFusedConfig {
  int k_tiles_per_warp = 0;  // target k tiles per warp: sets k_split = ceil(k tiles / this); default 12
  int k_split = 0;           // warps per CTA
  int threads = 0;
  int64_t smem_bytes = 0;    // the k split's reduction and the staged scales (moe_fused_smem_bytes)
  bool pdl = false;          // programmatic dependent launch of the second GEMM (SM90+)
};
// `k`: the GEMM's reduction length (H for the first, I for the second). 0 = default for the knobs: about 12 k
// tiles per warp whatever the batch, so that a token's sums are bitwise the same in any batch (kDecode).
MoeFusedConfig choose_moe_fused_config(const DeviceInfo& dev, int64_t k, int k_tiles_per_warp = 0);
// Below the grouped GEMM's threshold, whether kAuto runs these kernels for this many routed tokens (else the
// first decode kernels, moe.cu), and the k tiles per warp it asks for there (measured: kernel_configs.cc).
// kAuto's split follows the batch, so its sums are not bitwise batch independent (nor were they when it
// switched kernels by batch); kDecode's default split is.
bool use_fused_moe_decode(int64_t num_slots);
int moe_fused_auto_k_tiles_per_warp(int64_t num_slots);
// Each CTA routes itself (and the combine is fused) up to this many routed tokens.
bool use_fused_moe_routing(int64_t num_slots);
// Busy tiles of 8 tokens over at most min(E, slots) experts: sum ceil(c_e / 8) <= (slots + 7 * experts) / 8.
int64_t moe_fused_max_tiles(int64_t num_slots, int64_t num_experts);

// The MXFP4 decode GEMMs' (moe_decode.cu) shared-memory size and kAuto's k split per GEMM and form, shared by the
// config (kernel_configs.cc: choose_moe_fused_config), the launcher's check and the CPU tests.
//
// Staged scales (the default since session 20): each warp's scale bytes (32 a k tile: 16 rows x 2 blocks of 32 k)
// are copied into shared memory with its first weights, so the ring holds only weights and activations (56
// registers), and kAuto runs the first GEMM at one token in 3 warps a CTA and the second in 6. Scales in registers
// (the form before, a measured option: kernels.h's launch_moe_fused_gemm with scales_in_registers): each ring
// slot keeps its tile's two scale bytes (64-70 registers), 4 warps a CTA at one token. Both give the same bits at
// the same k split.

// A CTA of k_split warps' dynamic shared memory (MoeFusedConfig::smem_bytes): the (k_split - 1) x 512 bytes of the
// k split's reduction, then each warp's staged scales, ceil(k tiles / k_split) blocks of 32.
int64_t moe_fused_smem_bytes(int64_t k, int k_split);

// kAuto's k tiles per warp for this many routed slots in the first GEMM or the second (staged: 16 and 8 up to 4
// slots, 16 in both up to `three_warp_slots`: 3 warps at gpt-oss's k); with the scales in registers the form
// before's choice, moe_fused_auto_k_tiles_per_warp(num_slots) above. Session 20's kAuto: 4 three-warp
// slots (2 warps from 5 slots on).
inline constexpr int64_t kMoeFusedAutoThreeWarpSlots = 8;
int moe_fused_auto_k_tiles_per_warp(int64_t num_slots, bool first_gemm, bool scales_in_registers,
                                    int64_t three_warp_slots = kMoeFusedAutoThreeWarpSlots);
// Up to this many routed slots kAuto's staged GEMMs decode each fp4 word with two of its rotations as left shifts
// (swap_ab_decode_word<true>: the same bits), which issue on the FMA pipe beside the ALU pipe's masks. One H200,
// session 24 (20b layer, us): one token 22.44 -> 21.05 (the first GEMM alone 13.86 -> 12.90), two 37.07 -> 35.68,
// four 56.91 -> 56.15; eight and sixteen within their spread (88.9 / 90.8, 109.6 / 110.8), so above 16 the rotations.
inline constexpr int64_t kMoeFusedShiftSlots = 16;
// kAuto's ring for the staged first GEMM at this many routed slots (launch_moe_fused_gemm's `ring`: 5 or 0 = the ring of
// 4 weight and 2 activation tiles); the rule and its measurements are in kernel_configs.cc.
int moe_fused_auto_ring(int64_t num_slots);

// MXFP4 experts for many tokens per expert (prefill): grouped GEMM with the expert-sorted tokens as the
// mma M side in tiles of 64 or 128 rows, 128 weight rows per CTA, 4 warps, k in tiles of 64 through a
// cp.async ring; the MXFP4 tile is dequantized once per CTA into one of two bf16 buffers in fragment
// order. The shared-memory layout lives here so the kernel and the config agree on it.
inline constexpr int kMoeGroupedThreads = 128;
inline constexpr int kMoeGroupedWeightRows = 128;                           // N per CTA: 8 strips of 16
inline constexpr int kMoeGroupedRowPitch = 64 * 2 + 16;                     // bytes per token row of a k tile
inline constexpr int64_t kMoeGroupedBf16Bytes = kMoeGroupedWeightRows * 64 * 2;  // one dequantized buffer
// The ring keeps tile t + 1 landed while t is multiplied and t + 2 is in flight: 3 stages, which also
// keeps two 128-token CTAs per SM on SM90/SM100 (2 x 101 KB).
inline constexpr int kMoeGroupedMinStages = 3;
inline constexpr int kMoeGroupedMaxStages = 3;
inline constexpr int64_t moe_grouped_stage_bytes(int tile_tokens) {
  return static_cast<int64_t>(tile_tokens) * kMoeGroupedRowPitch + kMoeGroupedWeightRows * 32  // fp4 values
         + kMoeGroupedWeightRows * 2;                                                          // e8m0 scales
}
struct MoeGroupedConfig {
  int tile_tokens = 0;      // 64 or 128 expert-sorted tokens per tile
  int threads = 0;
  int stages = 0;           // cp.async ring depth (0: does not fit this GPU)
  int64_t smem_bytes = 0;   // dynamic: two dequantized buffers + stages
};
MoeGroupedConfig choose_moe_grouped_config(const DeviceInfo& dev, int64_t num_slots, int64_t num_experts);
// Decode (swap-AB, 8-token tiles re-reading the weights) below this many routed tokens per expert,
// grouped GEMM from there on. Measured on H200 at the 20b shape (docs/PERF.md): equal at 32 tokens per
// expert (604 vs 623 us), grouped 28% faster at 48.
inline constexpr int64_t kMoeGroupedMinTokensPerExpert = 40;
// With the wgmma grouped GEMM (sm_90) the crossover is lower. Measured on H100 at the 20b shape (docs/PERF.md,
// 64-token tiles vs the decode path auto picked): 8 per expert 331 vs 216 us, 16: 338 vs 354, 24: 347 vs 498,
// 32: 355 vs 636.
inline constexpr int64_t kMoeWgmmaMinTokensPerExpert = 16;
// 128-token tiles from this many tokens per expert (5% faster at 1024, tied at 256, slower below).
inline constexpr int64_t kMoeGroupedLargeTileTokensPerExpert = 512;
// `wgmma`: the wgmma grouped GEMM is the one that would run (choose_moe_wgmma_config(...).enabled).
bool use_grouped_moe(int64_t num_slots, int64_t num_experts, bool wgmma);

// Dense linears at decode (skinny_linear.cu): out[M, N] = x W^T + bias for M <= kSkinnyLinearMaxRows.
// Weights as the mma.sync A operand (a strip of up to 16 output channels per CTA), the M tokens as the 8-wide
// N side (one or two n tiles); each lane streams 16-byte weight loads straight into its fragments, the CTA's warps
// split their K range in 32-element chunks round-robin and reduce in shared memory. A benchmark variant
// also splits K over `k_splits` CTAs whose fp32 partials the last CTA of the strip sums in split order (a
// ticket per strip); it measured slower (kernel_configs.cc). Nothing depends on M but the token tiles,
// so a token's sums run in the same order at any M <= the threshold. cuBLASLt above it, and for shapes
// whose strips neither fit one wave nor fill many (skinny_linear_by_default).
inline constexpr int64_t kSkinnyLinearMaxRows = 16;
inline constexpr int kSkinnyLinearWarps = 8;
inline constexpr int kSkinnyLinearMaxKSplits = 8;
inline constexpr int kSkinnyLinearCtasPerSm = 2;  // 256 threads of <= 128 registers
inline constexpr int kSkinnyLinearNarrowCtasPerSm = 3;  // the forms of <= 80 registers (FP8, the RoPE epilogue)
// Strips up to this count may be k-split: bounds the partials and tickets scratch.
inline constexpr int64_t kSkinnyLinearMaxSplitStrips = 2048;
inline constexpr int64_t kSkinnyLinearPartialFloats = kSkinnyLinearMaxSplitStrips * kSkinnyLinearMaxKSplits * 16 * 16;
struct SkinnyLinearConfig {
  int n_tiles = 0;          // 8-token mma tiles: 1 (M <= 8) or 2
  int chunks_in_flight = 0; // 32-k chunks each warp loads before its first mma: 4, or 8 with one tile
  int k_splits = 0;         // CTAs per strip
  int strip_rows = 16;      // output channels per strip (8 to 16: the mma's 16 rows, the rest masked)
  int64_t chunks_per_split = 0;
  int threads = 0;
  int64_t smem_bytes = 0;   // static: the cross-warp reduction (per warp: 4 floats per tile per lane)
  bool pdl = false;         // launched as a programmatic dependent: weights load before the wait (SM90+)
  // Strips past one wave of resident CTAs (no k split, no RoPE epilogue): one wave of CTAs, each looping over its
  // strips with the next strip's first chunks in flight during a strip's sums (the lm_head); false: a CTA a strip.
  bool persistent = false;
  // The RoPE epilogue's FP8 strips (one token tile, k % 16 == 0) staged whole in shared memory by bulk copies before
  // the PDL wait (CudaSkinnyLinearOptions::fp8_qkv_staged); false: the first round of register loads.
  bool staged = false;
};
// `k_splits` > 0 forces a k split (benchmarks; default none), capped so that no split is empty;
// `chunks_in_flight` 8 picks the 8-chunk variant for one token tile (benchmarks; 0 = default, 4);
// `strip_rows` 8 to 16 forces the strips' rows (benchmarks; 0 = skinny_linear_strip_rows).
SkinnyLinearConfig choose_skinny_linear_config(const DeviceInfo& dev, int64_t m, int64_t n, int64_t k,
                                               int k_splits = 0, int chunks_in_flight = 0, int strip_rows = 0);
// Rows per strip without a k split: where 16-row strips fit one wave of resident CTAs (2 per SM) but leave
// some SMs two strips and others one (26B-A4B's o_proj and down, 2816 rows: 176 strips on 132 SMs, so 44 SMs
// stream 32 rows while 88 stream 16), the rows (8 to 16) whose strips still fit one wave with the fewest rows
// on the busiest SM (2816 rows: 11, 256 strips, at most 22 rows per SM), if that is at least 10% fewer; else 16.
// H200, one token, us (session 16 W1, mx_kernel_bench --gemma-dense-only, 16-row strips -> these): o_proj
// sliding (2816 x 4096) 9.11 -> 7.99, o_proj full (2816 x 8192) 16.40 -> 13.82, down (2816 x 2112) 6.16 ->
// 5.61, gpt-oss's o_proj (2880 x 4096) 9.20 -> 8.17; 12-row strips within 1% of 11. (bf16 weights; the backend
// keeps FP8 weights on 16-row strips: on an H200, session 18 W2, FP8 o_proj took 6.40 / 6.63 / 9.86 us at 1 / 8 /
// 16 tokens on 11-row strips against 6.31 / 6.52 / 9.27 on 16-row ones.)
int skinny_linear_strip_rows(const DeviceInfo& dev, int64_t n);
// Rows per strip of the RoPE epilogue (linear_qkv_rope; even: whole pairs): 16 where those strips fit one wave at 2
// CTAs per SM; else the even rows (8 to 16) that fit the 3-CTA forms' one wave with the fewest rows on the busiest
// SM, if at least 10% fewer than 16's (gpt-oss's 5120 rows on 132 SMs: 14, 366 strips, at most 42 rows an SM
// against 48; on an H200, session 18 W2, the input norm + FP8 qkv + RoPE chain 10.24 / 10.30 us at 1 / 8 tokens
// against 10.42 / 10.43 on 16-row strips).
int skinny_rope_strip_rows(const DeviceInfo& dev, int64_t n);
// The staged form (skinny_linear_staged.cu: a CTA's whole strip in shared memory before its PDL wait): bytes per
// staged row (64 past a multiple of 128: a quarter warp's two rows in different bank halves), a CTA's dynamic
// shared memory, and whether it runs: sm_90+, bf16, 1 to 8 tokens, k % 8 == 0, and every strip's CTA resident
// at once (one wave at up to 2 CTAs an SM, with the reduction's 4 KB beside the strip). `elem_bytes`: 2 for bf16
// weights, 1 for FP8 (CudaSkinnyLinearOptions::fp8_staged; k % 16 == 0 there, for the rows' 16-byte copies).
int64_t skinny_linear_staged_pitch(int64_t k, int elem_bytes = 2);
int64_t skinny_linear_staged_smem_bytes(int64_t k, int strip_rows, int elem_bytes = 2);
bool skinny_linear_staged_fits(const DeviceInfo& dev, int64_t m, int64_t n, int64_t k, int strip_rows, int elem_bytes = 2);
// The staged form past one wave (CudaSkinnyLinearOptions::fp8_staged_head_rows: the lm_head's strips, a CTA each): how
// many CTAs an SM hold, by shared memory: 4 where four fit (FP8's 2880-byte rows), else 2 where two do; 0: not staged.
int skinny_linear_staged_head_ctas(const DeviceInfo& dev, int64_t m, int64_t k, int strip_rows, int elem_bytes);
// Whether linear() takes the skinny kernel for n output channels when not forced: the 16-row strips fit
// one wave of resident CTAs, or fill at least kSkinnyLinearManyWaves waves (the last wave's tail is then
// small); in between (a wave and a fraction) cuBLASLt. Measured on an H100 (docs/PERF.md,
// bench/results/2026-11-24-h100-skinny-linear-*): o's 180 strips on 264 slots 10.7-12.4 us against
// cuBLASLt's 13.0-13.4 at 1-16 tokens; qkv's 320 strips (1.2 waves) 13.7-16.4 against 12.8-13.5; the
// lm_head's 12,568 strips (48 waves) 388-413 us against 408-418 (5% less at 1-8 tokens).
inline constexpr int64_t kSkinnyLinearManyWaves = 16;
bool skinny_linear_by_default(const DeviceInfo& dev, int64_t n);
// Whether linear() takes the skinny kernel: 1 <= m <= min(max_rows, kSkinnyLinearMaxRows) (max_rows < 0:
// no further limit) and k a multiple of 8 (16-byte rows).
bool use_skinny_linear(int64_t m, int64_t k, int64_t max_rows = -1);

// MXFP4 experts for many tokens per expert on Hopper (sm_90a only: wgmma, moe_wgmma.cu): weights as the
// wgmma M side decoded from the swap-AB layout into registers, 16, 32, 96, 128 or 256 expert-sorted tokens as
// N in shared memory, two warpgroups of 64 weight rows per CTA sharing each token tile (kMoeWgmmaWarpgroups), a
// cp.async ring of kMoeWgmmaStages k tiles (kMoeWgmmaDeepStages on the 96-token tiles' deep ring, below; the
// narrow tiles' rings are moe_wgmma_narrow.h's).
// 5: with tile t - 1 still in the MMAs, three tiles load ahead; two CTAs of 128-token tiles (2 x 107 KB) fit an
// SM, one of 256-token tiles (186 KB).
inline constexpr int kMoeWgmmaStages = 5;
// The 96-token kernel's deep ring: six stages (two CTAs of 2 x 104 KB fit an SM); a tile of at most 48 tokens
// (batched decode, 16-48 tokens per expert) has each warp multiply two 16-row strips, 256 weight rows a CTA, on
// stages of its own size (six of 15 KB): the loads, barrier and bookkeeping of a k tile, which with the fp4
// decode bound the kernel there (ncu: issue-bound, DRAM 40%), are paid once per two strips (docs/PERF.md).
inline constexpr int kMoeWgmmaDeepStages = 6;
inline constexpr int moe_wgmma_threads(int warpgroups) { return 128 * warpgroups; }
// Resident CTAs per SM that the kernel's __launch_bounds__ promise: two with two warpgroups and tiles of <= 128
// tokens (<= 128 registers a thread), else one (256-token tiles hold 128 fp32 accumulators a thread).
inline constexpr int moe_wgmma_ctas_per_sm(int tile_tokens, int warpgroups) {
  return warpgroups == 2 && tile_tokens <= 128 ? 2 : 1;
}
inline constexpr int moe_wgmma_weight_rows(int warpgroups) { return 64 * warpgroups; }
// One ring stage: the tile's activations (128 bytes of k per token), packed fp4 (32 B per weight row) and
// e8m0 scales (2 B per row), rounded up to the 1024 bytes at which the next stage's swizzled activation tile
// must start.
inline constexpr int64_t moe_wgmma_stage_bytes(int tile_tokens, int warpgroups) {
  return (static_cast<int64_t>(tile_tokens) * 128 + moe_wgmma_weight_rows(warpgroups) * 34 + 1023) / 1024 * 1024;
}
// The warp-specialized form (moe_wgmma_ws.cu): one warp of warpgroup 0 only loads, by copy-engine bulk copies
// from inputs tiled per routing tile (moe_wgmma_ws.h) into an mbarrier full/empty ring (24 registers a thread),
// warpgroups 1 and 2 decode the fp4 in registers and issue the MMAs (240 registers: 256-token tiles fit), with
// no CTA barrier in the k loop. One CTA per SM on a persistent grid over the work items; an item's MMAs run at
// half the tile's token columns when its tokens fit. Tiles of 128 or 256 tokens.
inline constexpr int kMoeWgmmaWsThreads = 384;
inline constexpr int kMoeWgmmaWsMaxStages = 12;
// Static shared memory set aside for the warp-specialized kernel: 8 bytes per tile row (its old row table; the
// ring depth is the same without it) and the full and empty barriers (8 bytes each per stage).
inline constexpr int64_t moe_wgmma_ws_static_bytes(int tile_tokens) {
  return static_cast<int64_t>(tile_tokens) * 8 + 2 * kMoeWgmmaWsMaxStages * 8;
}
struct MoeWgmmaConfig {
  bool enabled = false;     // sm_90 with the ring in shared memory
  int tile_tokens = 0;      // 16, 32, 96, 128 or 256 expert-sorted tokens per tile
  int warpgroups = 0;       // warpgroups of 64 weight rows per CTA: kMoeWgmmaWarpgroups (MMA warpgroups if ws)
  int threads = 0;          // 128 per warpgroup (plus the producer's 128 when warp-specialized)
  int stages = 0;
  int64_t smem_bytes = 0;   // dynamic: the ring + 1 KB to align it
  bool persistent = false;  // a grid of one wave looping over the work items (256-token tiles, or warp-specialized)
  bool deep_ring = false;   // 96-token and narrow tiles: the deep ring's kernel (two strips a warp at half width)
  bool pdl = false;         // launched as programmatic dependents: the first k tiles' weights load before the wait
  bool warp_specialized = false;  // moe_wgmma_ws.cu (tiles of 128 or 256 tokens, two MMA warpgroups)
  int sms = 0;              // the device's SMs, which size a persistent grid
};
// `tile_tokens` 0 picks from the tokens per expert; 16, 32, 96, 128 or 256 forces that tile (64 gives a
// disabled config: 64-token tiles are the mma.sync grouped kernel's; the wgmma one and the five-stage 96-token
// ring, no configuration's choice since sessions 11-12, were deleted in session 14). 96-token and narrow tiles
// run the deep ring's kernel, whose GEMMs are programmatic dependents unless `pdl` is -1. `persistent` 0 picks
// kMoeWgmmaPersistent, 1 forces a persistent grid and -1 a grid of one CTA per item (tiles of 16 to 128 tokens
// always have the latter). `warp_specialized` 0 picks kMoeWgmmaWarpSpecialized, 1 forces the warp-specialized
// kernel (tiles of 128 or 256 tokens: a forced 64 becomes 128), -1 the other one; it runs two MMA warpgroups on a
// persistent grid whatever the other knobs say.
MoeWgmmaConfig choose_moe_wgmma_config(const DeviceInfo& dev, int64_t num_slots, int64_t num_experts,
                                       int tile_tokens = 0, int persistent = 0, int warp_specialized = 0,
                                       int pdl = 0);
// Warpgroups per CTA, the only count compiled. Measured on an H100 (docs/PERF.md, 2026-11-24): 4 halve the L2
// traffic of the bf16 activations (ncu: L2 throughput 42% -> 25%) but run no faster (the kernel is not
// L2-bound; one CTA per SM, and 2880 rows leave a CTA of 256 half idle), 3 are slower at T <= 2048; 2 was
// within 1% of the best everywhere. The 3- and 4-warpgroup kernels were deleted in session 12 (CI time).
inline constexpr int kMoeWgmmaWarpgroups = 2;
// `auto`'s tiles: 96 tokens below kMoeWgmmaHugeTileTokensPerExpert routed tokens per expert (tiles of at most
// 48 at half MMA width), 256 from there. 96 keeps the ~64 +- 8 tokens per expert of a 512-token step in one
// tile where 64-token tiles split about half the experts in two and 128-token ones multiply 64 empty columns;
// 128 is no longer `auto`'s (slower than 96 at every size measured), nor is 64 (slower than 96 from 32 tokens
// per expert on, where a 96-token tile runs at 48 columns). Measured on an H100 (docs/PERF.md, session 11,
// 20b layer, us): tokens per expert 32: 96 262, 64 262 (48-token tiles, not compiled: 253); 64: 96 327, 64 398,
// 128 397; 128: 96 595, 128 673 (auto 611); 256: 96 977, 128 1115, 256 1011; 1024: 96 3529, 128 3546, 256 3313.
// The warp-specialized kernel keeps 128-token tiles below kMoeWgmmaLargeTileTokensPerExpert, 256 above.
inline constexpr int64_t kMoeWgmmaLargeTileTokensPerExpert = 128;
// Whether 96-token tiles run the kernel whose tiles of at most 64 tokens multiply 64 token columns (one strip a
// warp) instead of 96, by default (CudaMoeOptions::wgmma_mid_width 0), where the experts average more than 48 and
// at most 80 tokens: at ~64 (20b's 512-token step) a third of the full-width MMAs' columns hold no token. Below,
// most tiles hold at most 48 and run two strips a warp at 48 columns in the other kernel (one kernel with the
// three widths made ptxas serialize every wgmma, C7511). Above, the other kernel on the copy engine (two strips a
// warp for an expert's last tile of <= 48 tokens) measured faster at 96 per expert (H200, session 24 W2, one process,
// 5 rounds: 20b's layer at T = 768 432.6 -> 414.3 us, 120b's at T = 3072 1652.0 -> 1608.8); at 64 per expert slower
// (session 24 W1, one strip a warp: 20b T = 512 281.2 -> 301.4 us, 120b T = 2048 1167.3 -> 1204.7); 80 not measured.
inline constexpr bool kMoeWgmmaMidWidth = true;
inline constexpr int64_t kMoeWgmmaMidWidthMinTokensPerExpert = 48, kMoeWgmmaMidWidthMaxTokensPerExpert = 80;
// 256-token tiles from this many: the fp4 decode, the B-tile barrier and the weight loads of a k tile are
// paid once per 256 tokens instead of 96 (one CTA per SM). An expert's last tile of <= 128 tokens runs
// its MMAs and loads at half width, so the partly filled tile costs about what a 128-token tile does.
// Measured on an H100 (docs/PERF.md, 2026-11-24, 20b layer, 256 vs 128-token tiles): 1024 tokens per expert
// 3860 vs 3881 us (a tie within the 2% run-to-run spread), 512 per expert 2046 vs 1978, 256 per expert
// 1131 vs 1077: 256 only from 1024 on, where it is not slower (and 6% faster than 96 in session 11). On an H200
// (session 20, one process, 5 rounds) at 512 per expert 1712.9 us against 1760.2-1808.3 for the 96-token tiles
// (whose rounds spread 1744-1823), at 80 per expert 471.5 against 335.3: from 512 on.
inline constexpr int64_t kMoeWgmmaHugeTileTokensPerExpert = 512;
// 256-token tiles on a persistent grid by default? Not yet: it measured 8-16% slower than a CTA per item on
// an H100 (4220 vs 3860 us at 1024 tokens per expert, 1311 vs 1131 at 256; docs/PERF.md), likely the item
// switches, where every warp waits on the next item's metadata and row table and the epilogue still stalls
// the tensor cores. Kept, tested, as the base of a warp-specialized version.
inline constexpr bool kMoeWgmmaPersistent = false;
// The warp-specialized kernel by default? No: its copy-engine form measured 8-13% slower than the best other
// kernel at 256-1024 tokens per expert with 256-token tiles, 1.5x with 128 (H100, docs/PERF.md, session 10).
inline constexpr bool kMoeWgmmaWarpSpecialized = false;

// True when a config's shared memory fits the device and its pipeline has at least one stage.
bool fits(const DeviceInfo& dev, int64_t smem_bytes, int stages);

// Known chips for tests and offline planning.
DeviceInfo sm90_h100();
DeviceInfo sm90_h200();
DeviceInfo sm100_b200();
DeviceInfo sm120_rtx_pro_6000();
DeviceInfo sm121_gb10();

}  // namespace mx::cuda
