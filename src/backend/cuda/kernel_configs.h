// Launch configurations of the CUDA kernels, chosen at run time from the device's shared-memory limit
// (opt-in per block) and SM count, never fixed at compile time for one chip. Plain C++ without CUDA
// headers: CPU unit tests check every config for SM90, SM100 and SM120/121 (a pipeline that does not fit
// the 99 KB of SM12x is the bug that crashed SGLang on RTX PRO 6000, ref-kernels.md 2.1).
#pragma once

#include <cstdint>

#include "backend/cuda/device_info.h"

namespace mx::cuda {

// Prefill attention (FlashAttention-2 on mma.sync): 4 warps of 16 query rows, the rows packing the
// (token, q head) pairs of one kv head; K/V tiles of `keys_per_tile` keys in a cp.async ring.
struct AttentionPrefillConfig {
  int threads = 0;
  int rows_per_cta = 0;
  int keys_per_tile = 0;
  int stages = 0;           // K/V ring depth (1 or 2)
  int64_t smem_bytes = 0;   // dynamic shared memory per block
};
AttentionPrefillConfig choose_attention_prefill_config(const DeviceInfo& dev, int64_t head_dim);

// Decode attention: one CTA per (token, kv head, head block, KV split); the 4 warps split each key tile.
struct AttentionDecodeConfig {
  int threads = 0;
  int keys_per_tile = 0;
  int stages = 0;
  int num_splits = 0;       // KV splits per (token, head); > 1 adds the merge kernel
  int64_t smem_bytes = 0;
};
// `max_keys`: the most keys a query can see (window, or the page table's capacity): a static bound, so
// the split count is the same for every replay of a captured graph.
AttentionDecodeConfig choose_attention_decode_config(const DeviceInfo& dev, int64_t head_dim, int64_t num_tokens,
                                                     int64_t n_kv, int64_t head_blocks, int64_t max_keys);

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
// every warp keeps a ring of `depth` k tiles of weights and scales (64 k each; activations: two) in flight
// instead of one 512-byte load (the first kernel reached 31% of HBM at one token; deeper rings measured
// slower, docs/PERF.md). The k split depends on k only,
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
  int depth = 0;             // ring depth: 4 (default, fastest measured), 6 or 8 (compiled variants)
  int k_split = 0;           // warps per CTA
  int threads = 0;
  int64_t smem_bytes = 0;    // cross-warp reduction
  bool pdl = false;          // programmatic dependent launch of the second GEMM (SM90+)
};
// `k`: the GEMM's reduction length (H for the first, I for the second). 0 = default for the knobs.
MoeFusedConfig choose_moe_fused_config(const DeviceInfo& dev, int64_t k, int k_tiles_per_warp = 0, int depth = 0);
// Below the grouped GEMM's threshold, kAuto runs these kernels up to this many routed tokens and the
// first decode kernels (moe.cu) above. Measured on H200 at the 20b shape (docs/PERF.md): 33.6 vs 37.6 us
// at one token, but slower from two tokens on (60 vs 55 us at 2, 169 vs 110 us at 8).
inline constexpr int64_t kMoeFusedDecodeMaxSlots = 4;
bool use_fused_moe_decode(int64_t num_slots);
// Each CTA routes itself (and the combine is fused) up to this many routed tokens.
bool use_fused_moe_routing(int64_t num_slots);
// Busy tiles of 8 tokens over at most min(E, slots) experts: sum ceil(c_e / 8) <= (slots + 7 * experts) / 8.
int64_t moe_fused_max_tiles(int64_t num_slots, int64_t num_experts);

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
// 128-token tiles from this many tokens per expert (5% faster at 1024, tied at 256, slower below).
inline constexpr int64_t kMoeGroupedLargeTileTokensPerExpert = 512;
bool use_grouped_moe(int64_t num_slots, int64_t num_experts);

// True when a config's shared memory fits the device and its pipeline has at least one stage.
bool fits(const DeviceInfo& dev, int64_t smem_bytes, int stages);

// Known chips for tests and offline planning.
DeviceInfo sm90_h100();
DeviceInfo sm90_h200();
DeviceInfo sm100_b200();
DeviceInfo sm120_rtx_pro_6000();
DeviceInfo sm121_gb10();

}  // namespace mx::cuda
