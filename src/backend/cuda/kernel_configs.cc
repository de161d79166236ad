#include "backend/cuda/kernel_configs.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/attention_persist_config.h"
#include "backend/cuda/attention_wide_config.h"
#include "backend/cuda/cluster_configs.h"
#include "backend/cuda/moe_wgmma_narrow.h"

namespace mx::cuda {
namespace {

constexpr int kMaxStages = 2;  // the kernels' cp.async rings are written for 1 or 2 stages
constexpr int64_t kStaticSmemReserve = 1024;  // static __shared__ of the kernels (row bounds, reductions)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// Deepest ring (<= kMaxStages) whose stages fit next to `fixed` bytes; 0 when none fits.
int stages_that_fit(const DeviceInfo& dev, int64_t fixed, int64_t per_stage) {
  const int64_t room = dev.max_smem_per_block_optin - kStaticSmemReserve - fixed;
  if (room < per_stage) return 0;
  return static_cast<int>(std::min<int64_t>(kMaxStages, room / per_stage));
}

}  // namespace

bool fits(const DeviceInfo& dev, int64_t smem_bytes, int stages) {
  return stages >= 1 && smem_bytes + kStaticSmemReserve <= dev.max_smem_per_block_optin;
}

// Partial Q K^T scores exchanged between the warps of a row block: 16 rows x the warp's keys, fp32.
int64_t attention_score_exchange_bytes(int64_t head_dim, int warps, int keys_per_warp) {
  return attention_warps_per_rows(head_dim) > 1 ? static_cast<int64_t>(warps) * 16 * keys_per_warp * 4 : 0;
}

AttentionPrefillConfig choose_attention_prefill_config(const DeviceInfo& dev, int64_t head_dim) {
  AttentionPrefillConfig c;
  const int warps = attention_prefill_warps(head_dim);
  c.threads = 32 * warps;
  c.rows_per_cta = attention_prefill_rows(head_dim);
  c.keys_per_tile = attention_keys_per_tile(head_dim);
  const int64_t q_bytes = c.rows_per_cta * head_dim * 2;  // in the ring's first stage until it is in registers
  const int64_t kv_stage = 2 * c.keys_per_tile * head_dim * 2;  // K and V tiles, bf16
  const int64_t exchange = attention_score_exchange_bytes(head_dim, warps, c.keys_per_tile);
  c.stages = stages_that_fit(dev, exchange, std::max(kv_stage, q_bytes));  // Q never outgrows a stage
  c.smem_bytes = exchange + std::max<int64_t>(c.stages * kv_stage, q_bytes);
  return c;
}

AttentionPrefillWgmmaConfig choose_attention_prefill_wgmma_ws_config(const DeviceInfo& dev, int64_t head_dim,
                                                                     const AttnWsShape& shape) {
  AttentionPrefillWgmmaConfig c;
  c.threads = 128 * (1 + shape.consumers);
  c.rows_per_cta = 64 * shape.consumers;
  c.keys_per_tile = shape.keys_per_tile;
  c.stages = shape.stages;
  c.ctas_per_sm = shape.ctas_per_sm;
  // The in-turn (wide) shape runs as the persistent kernel (attention_persist_config.h).
  c.smem_bytes = shape.overlap ? attention_prefill_wgmma_ws_smem_bytes(head_dim, shape)
                               : attention_prefill_wgmma_persist_smem_bytes(head_dim, shape);
  c.enabled = dev.sm_major == 9 && head_dim == 64 && fits(dev, c.smem_bytes, c.stages);
  return c;
}

AttentionWindowWgmmaConfig choose_attention_window_wgmma_config(const DeviceInfo& dev, int64_t head_dim) {
  AttentionWindowWgmmaConfig c;
  c.threads = 384;
  c.sm_count = dev.sm_count;
  c.smem_bytes = attention_window_wgmma_smem_bytes();
  c.enabled = dev.sm_major == 9 && head_dim == 64 && fits(dev, c.smem_bytes, kAttnWindowStages);
  return c;
}

AttentionWideWgmmaConfig choose_attention_wide_wgmma_config(const DeviceInfo& dev, int64_t head_dim, bool kv_shared) {
  AttentionWideWgmmaConfig c;
  const AttnWideShape s = attention_wide_wgmma_shape(head_dim, kv_shared);
  c.threads = 128 * s.row_blocks * s.slices;
  c.rows_per_cta = 64 * s.row_blocks;
  c.keys_per_tile = s.keys_per_tile;
  c.kv_shared = kv_shared;
  c.smem_bytes = attention_wide_wgmma_smem_bytes(head_dim, kv_shared);
  c.enabled = dev.sm_major == 9 && (head_dim == 256 || head_dim == 512) && fits(dev, c.smem_bytes, kAttnWideStages);
  return c;
}

AttentionDecodeConfig choose_attention_decode_config(const DeviceInfo& dev, int64_t head_dim, int64_t num_tokens,
                                                     int64_t n_kv, int64_t head_blocks, int64_t max_keys) {
  AttentionDecodeConfig c;
  const int groups = attention_decode_key_groups(head_dim), warps = attention_decode_warps(head_dim);
  c.threads = 32 * warps;
  c.keys_per_tile = attention_keys_per_tile(head_dim);
  const int64_t q_bytes = 16 * head_dim * 2;
  const int64_t kv_stage = 2 * c.keys_per_tile * head_dim * 2;
  const int64_t exchange = attention_score_exchange_bytes(head_dim, warps, c.keys_per_tile / groups);
  // The key groups' partial states are merged after the last tile, in the ring's memory: m, l and
  // 16 x head_dim accumulators each.
  const int64_t merge_bytes = groups * 16 * (head_dim + 2) * 4;
  // (A stage counts as at least the merge, so that the merge fits whatever the ring's depth.)
  c.stages = stages_that_fit(dev, q_bytes + exchange, std::max(kv_stage, merge_bytes));
  c.smem_bytes = q_bytes + exchange + std::max(c.stages * kv_stage, merge_bytes);
  // Enough CTAs to cover the SMs about three times, with splits of at least 4 tiles of 64 keys at head dim
  // 64 so the merge stays cheap; caches of <= 2K keys may split down to 2 tiles, else most SMs idle
  // (measured on H200: 1K context at batch 1 13.4 -> 10.4 us; 2x SMs or 2-tile splits at 8K were slower).
  // Larger head dims keep the bytes of a split, not its keys (at least one tile). A 128-key window at head
  // dim 64 is one split.
  const int64_t ctas = std::max<int64_t>(1, num_tokens * n_kv * head_blocks);
  const int64_t want = ceil_div(3 * std::max(1, dev.sm_count), ctas);
  const int64_t min_keys = (max_keys <= 2048 ? 2 : 4) * 64 * 64 / std::max<int64_t>(head_dim, 64);
  const int64_t min_split = std::max<int64_t>(1, ceil_div(min_keys, c.keys_per_tile)) * c.keys_per_tile;
  const int64_t most = std::max<int64_t>(1, ceil_div(max_keys, min_split));
  c.num_splits = static_cast<int>(std::clamp<int64_t>(want, 1, std::min<int64_t>(most, 64)));
  // Measured on an H200 (session 17, bench latency 20b at 1K; bench/results/2026-11-28-h200-decode13-s17-w2.txt, one
  // process, against the merge kernel): at one token the clusters take the step's attention from 0.184 to 0.162 ms
  // (the full layers' 9 splits without the merge kernel's launch), TPOT 1.848 -> 1.840 ms; at 8 tokens (7 splits)
  // attention stayed at 0.241 / 0.242 and TPOT went 3.446 -> 3.462 (W1c, two processes: 3.422 -> 3.455), so only one
  // token takes them.
  c.clusters = dev.sm_major == 9 && head_dim == 64 && num_tokens == 1 && c.num_splits >= 2 &&
               c.num_splits <= kAttentionDecodeMaxClusterSplits;
  return c;
}

namespace {
// The 4-warp kernel's shared memory (head dims 256 and 512): Q (8 heads), the warps' partial scores twice, the ring.
int64_t attention_decode_swap_cta_smem_bytes(int64_t head_dim, bool kv_shared, int stages) {
  return 8 * head_dim * 2 + 2 * 4 * 4 * 32 * 4 + stages * (kv_shared ? 1 : 2) * 16 * head_dim * 2;
}
}  // namespace

AttentionDecodeSwapConfig choose_attention_decode_swap_config(const DeviceInfo& dev, int64_t head_dim, int64_t group,
                                                              bool kv_shared, int64_t num_tokens, int64_t n_kv,
                                                              int64_t max_keys) {
  AttentionDecodeSwapConfig c;
  if ((head_dim != 64 && head_dim != 256 && head_dim != 512) || group < 1 || group > kAttnSwapMaxGroup) return c;
  const int64_t q_bytes = 8 * head_dim * 2, stage_bytes = (kv_shared ? 1 : 2) * 16 * head_dim * 2;
  const int64_t sm_smem = dev.max_smem_per_block_optin + kStaticSmemReserve;
  int64_t best_ctas = 0;
  if (head_dim == 64) {
    // One-warp CTAs: the deepest ring that still lets 16 of them share an SM (3 stages), else the most CTAs. The
    // kernel is latency bound, not short of bytes in flight: ncu at 256 x 1.5K keys (H200, session 14 W1) found
    // the 4-stage ring's 12 CTAs per SM with 0.59 of 2.63 warps per scheduler eligible and DRAM at 65%; 16 CTAs
    // of 3 stages (of the registers' limit of 20) ran the step in 200.5 us instead of 238.7 (below).
    for (int stages = 4; stages >= 2; --stages) {
      const int64_t smem = q_bytes + stages * stage_bytes;
      if (!fits(dev, smem, stages)) continue;
      const int64_t ctas = std::min<int64_t>(32, sm_smem / (smem + kStaticSmemReserve));
      if (ctas > best_ctas) {
        best_ctas = ctas;
        c.stages = stages;
        c.smem_bytes = smem;
      }
      if (ctas >= 16) break;
    }
  } else {
    // 4-warp CTAs: the deepest ring that still lets 4 of them (16 warps) share an SM, whose warps hide each
    // other's latencies (at head dim 256: 3 stages, 128 KB in flight per SM); else the most CTAs. (An H200
    // window timed 3 stages and 128-key split floors on full layers: no faster.)
    for (int stages = 4; stages >= 2; --stages) {
      const int64_t smem = attention_decode_swap_cta_smem_bytes(head_dim, kv_shared, stages);
      if (!fits(dev, smem, stages)) continue;
      const int64_t ctas = std::min<int64_t>(8, sm_smem / (smem + kStaticSmemReserve));
      if (ctas > best_ctas) {
        best_ctas = ctas;
        c.stages = stages;
        c.smem_bytes = smem;
      }
      if (ctas >= 4) break;
    }
  }
  if (c.stages == 0) return c;
  c.enabled = true;
  // Head dims 256 and 512: two waves of CTAs over the SMs; head dim 64: one wave (as many splits as keep every
  // (token, kv head) in the CTAs resident at once; one split where the pairs fill them already), in splits of
  // at least 32 keys, or 32 per head of the group above 2 (a split writes group x (head_dim + 2) floats of
  // partial state, which the merge reads back: with 256 keys at group 8 that is 1/8 of the split's K bytes).
  // Splits past a short context are empty and cost little. Head dim 64 on an H200 (session 14 W1, one process,
  // mx_kernel_bench's grid of depths and splits, us per layer; two waves of 4-stage CTAs -> one wave of 3-stage
  // ones): 256 x 1.5K 238.7 -> 200.5, 256 x 2K 307.5 -> 266.5, 256 x window 128 27.9 -> 21.3, 128 x 1.5K 125.1
  // -> 115.2, 64 x 1K 56.1 -> 43.3; more splits at 3 stages were slower at each (e.g. 256 x 1.5K: 2 224.3, 3
  // 229.4); 4-stage rings at the same splits too (270.2 at one split: 1.29 waves of 12 CTAs per SM).
  c.min_split_keys = static_cast<int>(32 * std::max<int64_t>(1, group <= 2 ? 1 : group));
  const int64_t resident = std::max(1, dev.sm_count) * best_ctas;
  const int64_t pairs = std::max<int64_t>(1, num_tokens * n_kv);
  const int64_t most = std::max<int64_t>(1, ceil_div(max_keys, c.min_split_keys));
  // tokens x splits stays within tokens + 3 x SMs, the partials the backend's prepare() sizes for.
  const int64_t scratch_cap = 1 + 3 * std::max(1, dev.sm_count) / std::max<int64_t>(1, num_tokens);
  const int64_t want = head_dim == 64 ? resident / pairs : ceil_div(2 * resident, pairs);
  c.num_splits = static_cast<int>(std::clamp<int64_t>(want, 1, std::min<int64_t>({most, 64, scratch_cap})));
  return c;
}

AttentionDecodeSwapConfig attention_decode_swap_cluster_config(const DeviceInfo& dev, AttentionDecodeSwapConfig c,
                                                               int64_t head_dim, bool kv_shared) {
  if (!c.enabled || dev.sm_major < 9 || (head_dim != 256 && head_dim != 512)) return AttentionDecodeSwapConfig{};
  // The ring's full depth (3 stages in flight) where 2 CTAs still share an SM: at a few tokens a split of a 1K
  // context (64 keys) is then in flight at once. (Head dim 512 with V beside K would fit one CTA per SM, and a
  // cluster of 16 would then need 16 free SMs of one GPC: it keeps the unclustered config's depth.)
  const int64_t deepest = attention_decode_swap_cta_smem_bytes(head_dim, kv_shared, 4);
  const int64_t sm_smem = dev.max_smem_per_block_optin + kStaticSmemReserve;
  if (fits(dev, deepest, 4) && sm_smem / (deepest + kStaticSmemReserve) >= 2) {
    c.stages = 4;
    c.smem_bytes = deepest;
  }
  c.num_splits = kAttnSwapClusterSplits;
  c.min_split_keys = 16;  // no partials to write back: a split may be as short as one stage
  return c;
}

AttentionDecodeSwapConfig attention_decode_swap_one_token_ring(AttentionDecodeSwapConfig cc, int64_t head_dim,
                                                               bool kv_shared, int64_t max_keys, int stages) {
  if (!cc.enabled || stages < 2 || stages >= cc.stages || max_keys > kAttnSwapShortRingKeys * cc.num_splits) return cc;
  cc.stages = stages;
  cc.smem_bytes = attention_decode_swap_cta_smem_bytes(head_dim, kv_shared, stages);
  return cc;
}

// Measured on an H200 (session 14 W1b, one process, 1K context, us per call; bench/results/
// 2026-11-28-h200-gemma15-s14-w1-attention-cluster.txt): the clustered form against the unclustered swap-AB kernel
// and attention.cu's at 1 / 2 / 4 / 8 / 16 / 64 tokens, Gemma's sliding layers (8 kv heads): 7.39 / 9.29 / 17.64 /
// 31.23 / 55.52 / 204.3 vs swap AB 9.29 / 11.50 / 20.16 / 27.20 / 43.16 / 135.0; full layers (2 kv heads, group 8):
// 8.79 / 8.88 / 10.20 / 18.56 / 28.96 / 100.0 vs swap AB 21.83 / 23.51 / 22.50 / 22.67 / 23.50 / 45.78 and
// attention.cu 14.05 / 15.95 / 27.66 / 38.74 / 60.26 / 165.9 (those full layers with V aliasing K). The clusters win while their CTAs (16 per token and
// kv head) are at most ~4 per SM: every such row above beats what kAuto took before, every larger one loses to the
// unclustered swap-AB kernel. (Asking for over half an SM's shared memory, so that a cluster's CTAs spread one per
// SM, was slower: 13.03 us on sliding layers at one token, 17.25 on full layers at 4 tokens.)
// Head dim 512 with V beside K (Gemma-4's full layers as stored: K normed and rotated, V not), W2 of session 14
// (bench/results/2026-11-28-h200-gemma15-s14-w2.txt), 1 / 2 / 4 tokens: 8.89 / 9.17 / 12.18 us against
// attention.cu's 14.31 / 16.03 / 27.90 (kAuto before) and the unclustered swap-AB kernel's 23.01 / 24.09 / 23.94;
// its ring (3 stages, 110 KB) fits 2 CTAs per SM, so kAuto takes it while its CTAs fit the SMs once (measured
// up to there).
bool attention_decode_swap_cluster_by_default(const DeviceInfo& dev, const AttentionDecodeSwapConfig& c,
                                              int64_t head_dim, bool kv_shared, int64_t num_tokens, int64_t n_kv) {
  const int64_t ctas = num_tokens * n_kv * kAttnSwapClusterSplits;
  const int64_t most = head_dim == 512 && !kv_shared ? dev.sm_count : 4 * dev.sm_count;
  return c.enabled && dev.sm_major == 9 && ctas <= most;
}

// Measured on an H200 (bench/results/2026-11-28-h200-gemmab-w1-decode-attention.txt, one process, 1K context):
// the 4-warp form is faster than attention.cu's decode kernel for groups of up to 2 from one token (Gemma's
// sliding layers, head dim 256: 14.3 vs 15.9 us at batch 1, 16.6 vs 26.1 at 2, 28.2 vs 72.1 at 8, 134.2 vs
// 431.6 at 64) and for larger groups from 4 tokens (full layers, head dim 512, K = V: 22.5 vs 28.8 us at 4,
// 22.7 vs 39.2 at 8, 44.6 vs 165.7 at 64; slower at 1 and 2), but kAuto keeps those from 64 tokens, the
// rule gpt-oss's head dim 64 (groups of 8, the one-warp form) was measured by: on an H200
// (bench/results/2026-11-28-h200-serve12-w1-decode-attention.txt, one process) full layers 52.4 vs 55.4 us at
// 64 x 1K, 118.1 vs 135.9 at 128 x 1.5K, 228.7 vs 269.2 at 256 x 1.5K (83% of the bytes floor against 71%),
// window-128 layers 26.2 vs 35.8 at 256; at 32 x 1K 25.0 vs 33.0, at one token 20.2 vs 9.6. Not yet timed
// off sm_90.
bool attention_decode_swap_by_default(const DeviceInfo& dev, const AttentionDecodeSwapConfig& c, int64_t num_tokens) {
  if (!c.enabled || dev.sm_major != 9) return false;
  const bool group_of_two_or_less = c.min_split_keys <= 32;  // the config's split floor grows with the group
  return num_tokens >= (group_of_two_or_less ? 1 : 64);
}

MoeConfig choose_moe_config(const DeviceInfo& dev, int64_t num_slots, int64_t num_experts, int64_t rows) {
  MoeConfig c;
  c.tile_tokens = 8;
  // Tiles that will be busy: one per expert at decode, up to one per 8 routed tokens.
  const int64_t busy_tiles = std::max<int64_t>(1, std::min(num_slots, num_experts + num_slots / c.tile_tokens));
  const int64_t ctas = (rows / 16) * busy_tiles;
  // About 40 resident warps per SM keep enough 16-byte loads in flight (measured, ref-kernels.md 2.6).
  const int64_t want = next_pow2(ceil_div(40 * std::max(1, dev.sm_count), std::max<int64_t>(ctas, 1)));
  c.k_split = static_cast<int>(std::clamp<int64_t>(want, 2, 16));
  c.threads = 32 * c.k_split;
  c.smem_bytes = static_cast<int64_t>(c.k_split - 1) * 4 * 32 * 4 * (c.tile_tokens / 8);
  while (!fits(dev, c.smem_bytes, 1) && c.k_split > 1) {
    c.k_split /= 2;
    c.threads = 32 * c.k_split;
    c.smem_bytes = static_cast<int64_t>(c.k_split - 1) * 4 * 32 * 4 * (c.tile_tokens / 8);
  }
  return c;
}

MoeFusedConfig choose_moe_fused_config(const DeviceInfo& dev, int64_t k, int k_tiles_per_warp) {
  MoeFusedConfig c;
  c.k_tiles_per_warp = k_tiles_per_warp > 0 ? k_tiles_per_warp : 12;
  // 12 (4 warps at gpt-oss's k = 2880): on an H200 with the lean loop, the 20b layer at one token 25.26 us against
  // 26.13 for 2 warps of 23 (session 13 W1, docs/PERF.md); kAuto asks for 23 from two tokens on
  // (moe_fused_auto_k_tiles_per_warp: 41.18 against 43.25 at two). 8 warps of 6 were slower still (session 12).
  const int64_t k_tiles = std::max<int64_t>(1, k / 64);
  c.k_split = static_cast<int>(std::clamp<int64_t>(ceil_div(k_tiles, c.k_tiles_per_warp), 1,
                                                   std::min<int64_t>(kMoeFusedMaxKSplit, k_tiles)));
  c.threads = 32 * c.k_split;
  c.smem_bytes = moe_fused_smem_bytes(k, c.k_split);
  c.pdl = dev.sm_major >= 9;
  return c;
}

int64_t moe_fused_smem_bytes(int64_t k, int k_split) {
  return static_cast<int64_t>(k_split - 1) * 4 * 32 * 4 + k_split * ceil_div(std::max<int64_t>(1, k / 64), k_split) * 32;
}

int skinny_linear_strip_rows(const DeviceInfo& dev, int64_t n) {
  const int64_t sms = std::max(1, dev.sm_count), slots = sms * kSkinnyLinearCtasPerSm;
  auto busiest = [&](int rows) { return ceil_div(ceil_div(n, rows), sms) * rows; };  // rows on the busiest SM
  if (n <= 0 || ceil_div(n, 16) > slots) return 16;
  int best = 16;
  for (int rows = 15; rows >= 8; --rows)
    if (ceil_div(n, rows) <= slots && busiest(rows) < busiest(best)) best = rows;
  return 10 * busiest(best) <= 9 * busiest(16) ? best : 16;
}

int skinny_rope_strip_rows(const DeviceInfo& dev, int64_t n) {
  const int64_t sms = std::max(1, dev.sm_count);
  if (n <= 0 || ceil_div(n, 16) <= sms * kSkinnyLinearCtasPerSm) return 16;
  auto busiest = [&](int rows) { return ceil_div(ceil_div(n, rows), sms) * rows; };
  int best = 16;
  for (int rows = 14; rows >= 8; rows -= 2)
    if (ceil_div(n, rows) <= sms * kSkinnyLinearNarrowCtasPerSm && busiest(rows) < busiest(best)) best = rows;
  return 10 * busiest(best) <= 9 * busiest(16) ? best : 16;
}

SkinnyLinearConfig choose_skinny_linear_config(const DeviceInfo& dev, int64_t m, int64_t n, int64_t k,
                                               int k_splits, int chunks_in_flight, int strip_rows) {
  SkinnyLinearConfig c;
  c.n_tiles = m <= 8 ? 1 : 2;
  // Per chunk a lane holds two 16-byte weight loads (8 registers) and one activation load per token tile
  // (4). 4 chunks in flight: measured on an H100 at o's shape and one token 10.65 us against 12.45 with 8
  // (the 8-chunk variant stays for one tile, a benchmark knob).
  c.chunks_in_flight = c.n_tiles == 1 && chunks_in_flight == 8 ? 8 : 4;
  c.threads = 32 * kSkinnyLinearWarps;
  c.smem_bytes = static_cast<int64_t>(kSkinnyLinearWarps) * c.n_tiles * 4 * 32 * 4;
  c.pdl = dev.sm_major >= 9;
  // No k split by default: on an H100 the ticketed split (qkv in 4, o in 7, chosen to fill the resident
  // slots evenly) made every CTA one load round plus a fence and an atomic, and the 20b step's dense
  // GEMMs took 1.33 ms instead of 0.61 (docs/PERF.md). Kept as a benchmark variant.
  const int64_t strips = ceil_div(n, 16), chunks = ceil_div(k, 32);
  c.k_splits = 1;
  if (k_splits > 0 && (k_splits == 1 || strips <= kSkinnyLinearMaxSplitStrips))
    c.k_splits = std::min(k_splits, kSkinnyLinearMaxKSplits);
  c.chunks_per_split = ceil_div(chunks, c.k_splits);
  c.k_splits = static_cast<int>(ceil_div(chunks, c.chunks_per_split));  // no empty split
  c.strip_rows = strip_rows >= 8 && strip_rows <= 16 ? strip_rows : c.k_splits == 1 ? skinny_linear_strip_rows(dev, n) : 16;
  return c;
}

int64_t skinny_linear_staged_pitch(int64_t k, int elem_bytes) { return ceil_div(elem_bytes * k, 128) * 128 + 64; }

int64_t skinny_linear_staged_smem_bytes(int64_t k, int strip_rows, int elem_bytes) {
  return strip_rows * skinny_linear_staged_pitch(k, elem_bytes);
}

namespace {
constexpr int64_t kStagedStaticBytes = kSkinnyLinearWarps * 4 * 32 * 4 + 16, kStagedReservedBytes = 1024;
// A staged CTA's shared memory (dynamic + static), or -1 where the form does not take the shape.
int64_t staged_cta_bytes(const DeviceInfo& dev, int64_t m, int64_t k, int strip_rows, int elem_bytes) {
  if (dev.sm_major < 9 || m < 1 || m > 8 || k <= 0 || k % (16 / elem_bytes) != 0 || strip_rows < 8 || strip_rows > 16)
    return -1;
  const int64_t cta = skinny_linear_staged_smem_bytes(k, strip_rows, elem_bytes) + kStagedStaticBytes;
  return cta > dev.max_smem_per_block_optin ? -1 : cta;
}
}  // namespace

bool skinny_linear_staged_fits(const DeviceInfo& dev, int64_t m, int64_t n, int64_t k, int strip_rows, int elem_bytes) {
  const int64_t cta = staged_cta_bytes(dev, m, k, strip_rows, elem_bytes);
  if (cta < 0) return false;
  const int64_t per_sm = std::min<int64_t>(kSkinnyLinearCtasPerSm, (dev.max_smem_per_block_optin + kStagedReservedBytes) /
                                                                        (cta + kStagedReservedBytes));
  return ceil_div(n, strip_rows) <= per_sm * dev.sm_count;
}

int skinny_linear_staged_head_ctas(const DeviceInfo& dev, int64_t m, int64_t k, int strip_rows, int elem_bytes) {
  const int64_t cta = staged_cta_bytes(dev, m, k, strip_rows, elem_bytes);
  if (cta < 0) return 0;
  const int64_t per_sm = (dev.max_smem_per_block_optin + kStagedReservedBytes) / (cta + kStagedReservedBytes);
  return per_sm >= 4 ? 4 : per_sm >= 2 ? 2 : 0;
}

bool skinny_linear_by_default(const DeviceInfo& dev, int64_t n) {
  const int64_t strips = ceil_div(n, 16);
  const int64_t slots = static_cast<int64_t>(std::max(1, dev.sm_count)) * kSkinnyLinearCtasPerSm;
  return strips <= slots || strips >= kSkinnyLinearManyWaves * slots;
}

bool use_skinny_linear(int64_t m, int64_t k, int64_t max_rows) {
  const int64_t most = max_rows < 0 ? kSkinnyLinearMaxRows : std::min(max_rows, kSkinnyLinearMaxRows);
  return m >= 1 && m <= most && k % 8 == 0 && k > 0;
}

// kAuto's ring kernels up to this many routed tokens (16 tokens at top-4, the most measured), v1 (moe.cu)
// above (the split per GEMM and form: kernel_configs.h); 2 warps of ~23 k tiles above kMoeFusedAutoThreeWarpSlots
// (above kMoeFusedAutoFourWarpSlots with the scales in registers: more CTAs than SMs by far from two tokens on:
// longer runs per warp, fewer reductions). Measured on an H200 at the 20b shape, one process (docs/PERF.md,
// session 13 W1), us per layer, ring kt12 / ring kt23 / v1: one token 25.26 / 26.13 / 36.41, two 43.25 / 41.18 /
// 52.86, four 69.50 / 65.68 / 66.61, eight 116.03 / 99.99 / 101.61, sixteen 129.13 / 117.57 / 120.31.
// Up to kMoeFusedAutoFourWarpSlots (one token at top-4), with the scales staged in shared memory (56 registers):
// the first GEMM in 3 warps of 15 tiles (12 CTAs an SM: its 1,440 CTAs at gpt-oss's shape in one wave), the
// second in 6 of ~8 (6 CTAs an SM: its 720 in one wave, shorter chains); with the scales in registers (64-70
// registers) 4 warps of ~12 for both. Session 20 W1 (H200, one process, 20b layer at one token): 24.52 us
// (registers, 4 and 4 warps) against 22.66 (staged, 3 and 6 warps), 24.49 (staged, 3 and 4), 25.36 (staged,
// 4 and 4).
// From 5 to kMoeFusedAutoThreeWarpSlots (two tokens at top-4), staged: 3 warps of 15 tiles in both GEMMs (the
// second's 1,440 CTAs at gpt-oss's shape in one wave at 12 an SM; session 21 W1, H200, one process, 20b layer at two
// tokens: 37.60 us against 40.52 for 2 warps of 23; at four tokens 2 warps stay: 56.92 against 59.86).
constexpr int64_t kMoeFusedDecodeMaxSlots = 64;
constexpr int64_t kMoeFusedAutoFourWarpSlots = 4;

bool use_fused_moe_decode(int64_t num_slots) { return num_slots <= kMoeFusedDecodeMaxSlots; }

int moe_fused_auto_k_tiles_per_warp(int64_t num_slots) { return num_slots <= kMoeFusedAutoFourWarpSlots ? 12 : 23; }

int moe_fused_auto_k_tiles_per_warp(int64_t num_slots, bool first_gemm, bool scales_in_registers,
                                    int64_t three_warp_slots) {
  if (scales_in_registers || num_slots > std::max(three_warp_slots, kMoeFusedAutoFourWarpSlots))
    return moe_fused_auto_k_tiles_per_warp(num_slots);
  if (num_slots > kMoeFusedAutoFourWarpSlots) return 16;
  return first_gemm ? 16 : 8;
}

// The ring of 5 weight tiles and one activation tile ahead (the same 56 registers and bits) measured faster at one
// token with the shifts (session 24 W2, 20b layer, two processes: 21.13 / 20.90 -> 20.75 / 20.71 us; the first GEMM
// alone 12.99 -> 12.38) but ran on a GPU only at that shape (KernelTest.MoeExpertsDecodeShifts), so kAuto keeps the
// ring of 4 until its odd shapes have (docs/PERF.md, session 24).
int moe_fused_auto_ring(int64_t num_slots) {
  (void)num_slots;
  return 0;
}

bool use_fused_moe_routing(int64_t num_slots) { return num_slots >= 1 && num_slots <= kMoeFusedMaxSlots; }

int64_t moe_fused_max_tiles(int64_t num_slots, int64_t num_experts) {
  return (num_slots + (kMoeFusedTileTokens - 1) * std::min(num_experts, num_slots)) / kMoeFusedTileTokens;
}

MoeGroupedConfig choose_moe_grouped_config(const DeviceInfo& dev, int64_t num_slots, int64_t num_experts) {
  MoeGroupedConfig c;
  c.threads = kMoeGroupedThreads;
  const int64_t room = dev.max_smem_per_block_optin - kStaticSmemReserve - 2 * kMoeGroupedBf16Bytes;
  auto stages_for = [&](int tile) {
    const int64_t n = room < 0 ? 0 : room / moe_grouped_stage_bytes(tile);
    return n < kMoeGroupedMinStages ? 0 : static_cast<int>(std::min<int64_t>(kMoeGroupedMaxStages, n));
  };
  // 64-token tiles waste less on partly filled tiles and run 3 CTAs per SM; 128 halves the weight
  // re-reads and the dequantization per token, which pays only with many tokens per expert (measured),
  // and only where it fits (not in SM12x's 99 KB).
  const int64_t per_expert = num_slots / std::max<int64_t>(1, num_experts);
  c.tile_tokens = per_expert >= kMoeGroupedLargeTileTokensPerExpert && stages_for(128) > 0 ? 128 : 64;
  c.stages = stages_for(c.tile_tokens);
  c.smem_bytes =
      2 * kMoeGroupedBf16Bytes + std::max(c.stages, kMoeGroupedMinStages) * moe_grouped_stage_bytes(c.tile_tokens);
  return c;
}

// The 96-token tiles run on the deep ring, both GEMMs programmatic dependents (the five-stage ring it replaced
// was deleted in session 14): measured on an H200 (docs/PERF.md, session 12, one process) against the five-stage
// ring at 16, 32 and 64 tokens per expert: 213.2 / 220.3 / 294.2 us against 233.8 / 244.0 / 320.2 (the deep ring
// alone 214.3 / 227.4 / 320.4). PDL is the deep ring's only: the other kernels load in the order measured before,
// without waiting for a predecessor.

// auto's narrow tiles for batched decode (moe_wgmma.cu: every tile two strips a warp at 16 or 32 MMA columns,
// where the 96-token tiles' half width multiplies 48): 16-token tiles up to kMoeWgmmaNarrow16MaxTokensPerExpert
// routed tokens per expert, 32-token tiles up to kMoeWgmmaNarrow32MaxTokensPerExpert (an expert past its tile
// takes a second one, which streams its weights again: at a mean of 10 per expert ~3% of the experts have more
// than 16, at 20 ~0.4% more than 32), and the wgmma kernel instead of the decode ones from
// kMoeWgmmaNarrowMinTokensPerExpert (kernel_configs.h's kMoeWgmmaMinTokensPerExpert, 16, was measured against
// 64-token tiles). Measured on an H200 (docs/PERF.md, session 13 W1, us per MoE layer, one process):
//   gpt-oss-120b (128 experts), tokens per expert 4: decode v1 550, 16-token tiles 625, 32: 656, 96: 746;
//     8: v1 711, 16: 648, 32: 676, 96: 768;  16: 96 791, 16: 869, 32: 768;
//   gpt-oss-20b, 8: v1 182, 16: 176, 32: 189, 96: 212;  16: 96 217, 32: 191, 16: 242;  32: 96 227, 32: 285.
constexpr bool kMoeWgmmaNarrowTilesByDefault = true;
constexpr int64_t kMoeWgmmaNarrow16MaxTokensPerExpert = 10;
constexpr int64_t kMoeWgmmaNarrow32MaxTokensPerExpert = 20;
constexpr int64_t kMoeWgmmaNarrowMinTokensPerExpert = 8;

MoeWgmmaConfig choose_moe_wgmma_config(const DeviceInfo& dev, int64_t num_slots, int64_t num_experts,
                                       int tile_tokens, int persistent, int warp_specialized, int pdl) {
  MoeWgmmaConfig c;
  const int64_t per_expert = num_slots / std::max<int64_t>(1, num_experts);
  if (warp_specialized == 1 || (warp_specialized == 0 && kMoeWgmmaWarpSpecialized)) {
    c.warp_specialized = true;
    c.tile_tokens = tile_tokens == 128 || tile_tokens == 256 ? tile_tokens
                    : tile_tokens == 64                     ? 128
                    : per_expert >= kMoeWgmmaLargeTileTokensPerExpert ? 256
                                                                      : 128;
    c.warpgroups = 2;
    c.threads = kMoeWgmmaWsThreads;
    c.persistent = true;
    c.sms = dev.sm_count;
    // As deep a ring as fits next to the static set-aside and barriers (the 1 KB aligns the ring).
    const int64_t stage = moe_wgmma_stage_bytes(c.tile_tokens, 2);
    const int64_t room = dev.max_smem_per_block_optin - moe_wgmma_ws_static_bytes(c.tile_tokens) - 1024;
    c.stages = static_cast<int>(std::clamp<int64_t>(room / stage, 0, kMoeWgmmaWsMaxStages));
    c.smem_bytes = c.stages * stage + 1024;
    c.enabled = dev.sm_major == 9 && c.stages >= 3 &&
                c.smem_bytes + moe_wgmma_ws_static_bytes(c.tile_tokens) <= dev.max_smem_per_block_optin;
    return c;
  }
  if (tile_tokens == 64) return c;  // disabled: 64-token tiles are the mma.sync grouped kernel's
  const bool forced = tile_tokens == 16 || tile_tokens == 32 || tile_tokens == 96 || tile_tokens == 128 ||
                      tile_tokens == 256;
  const bool narrow_auto = kMoeWgmmaNarrowTilesByDefault && !forced;
  c.tile_tokens = forced                                                          ? tile_tokens
                  : per_expert >= kMoeWgmmaHugeTileTokensPerExpert                ? 256
                  : narrow_auto && per_expert <= kMoeWgmmaNarrow16MaxTokensPerExpert ? 16
                  : narrow_auto && per_expert <= kMoeWgmmaNarrow32MaxTokensPerExpert ? 32
                                                                                  : 96;
  c.warpgroups = kMoeWgmmaWarpgroups;
  c.threads = moe_wgmma_threads(c.warpgroups);
  c.persistent = c.tile_tokens == 256 && (persistent == 1 || (persistent == 0 && kMoeWgmmaPersistent));
  c.sms = dev.sm_count;
  // Tiles of 16 or 32 tokens (batched decode) are the deep ring's kernel with every tile two strips a warp at
  // that MMA width (moe_wgmma.cu).
  const bool narrow = c.tile_tokens == 16 || c.tile_tokens == 32;
  c.deep_ring = narrow || c.tile_tokens == 96;
  c.pdl = c.deep_ring && pdl != -1;
  // The narrow tiles' kernel has a ring of its own (moe_wgmma_narrow.h).
  c.stages = narrow ? moe_wgmma_narrow_stages(c.tile_tokens) : c.deep_ring ? kMoeWgmmaDeepStages : kMoeWgmmaStages;
  c.smem_bytes = narrow ? moe_wgmma_narrow_smem_bytes(c.tile_tokens, c.stages)
                        : c.stages * moe_wgmma_stage_bytes(c.tile_tokens, c.warpgroups) + 1024;
  // wgmma exists on sm_90a only (sm_100 has tcgen05 instead, sm_12x neither).
  c.enabled = dev.sm_major == 9 && fits(dev, c.smem_bytes, c.stages);
  return c;
}

bool use_grouped_moe(int64_t num_slots, int64_t num_experts, bool wgmma) {
  const int64_t min_per_expert = !wgmma                          ? kMoeGroupedMinTokensPerExpert
                                 : kMoeWgmmaNarrowTilesByDefault ? kMoeWgmmaNarrowMinTokensPerExpert
                                                                 : kMoeWgmmaMinTokensPerExpert;
  return num_slots >= min_per_expert * std::max<int64_t>(1, num_experts);
}

int64_t moe_max_tiles(int64_t num_slots, int64_t num_experts, int64_t tile_tokens) {
  // sum_e ceil(c_e / b) <= sum_e (c_e / b) + (experts with c_e > 0) <= slots / b + min(E, slots).
  return ceil_div(num_slots, tile_tokens) + std::min(num_experts, num_slots);
}

namespace {
DeviceInfo make_device(const char* name, int major, int minor, int sms, int64_t smem, int64_t l2) {
  DeviceInfo d;
  d.name = name;
  d.sm_major = major;
  d.sm_minor = minor;
  d.sm_count = sms;
  d.max_smem_per_block_optin = smem;
  d.l2_cache_bytes = l2;
  return d;
}
}  // namespace

DeviceInfo sm90_h100() { return make_device("H100 SXM", 9, 0, 132, 232448, 50 << 20); }
DeviceInfo sm90_h200() { return make_device("H200", 9, 0, 132, 232448, 60 << 20); }
DeviceInfo sm100_b200() { return make_device("B200", 10, 0, 148, 232448, 126 << 20); }
DeviceInfo sm120_rtx_pro_6000() { return make_device("RTX PRO 6000", 12, 0, 188, 101376, 128 << 20); }
DeviceInfo sm121_gb10() { return make_device("GB10", 12, 1, 48, 101376, 24 << 20); }

}  // namespace mx::cuda
