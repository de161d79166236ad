// The CUDA kernels' launch configurations, checked on the CPU for every chip we target: each must fit the
// chip's opt-in shared memory and have at least one pipeline stage (SM120/SM121 have 99 KB per block).
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "backend/cuda/attention_wide_config.h"
#include "backend/cuda/cluster_configs.h"
#include "backend/cuda/kernel_configs.h"
#include "backend/cuda/moe_wgmma_narrow.h"

namespace mx::cuda {
namespace {

std::vector<DeviceInfo> chips() {
  return {sm90_h100(), sm90_h200(), sm100_b200(), sm120_rtx_pro_6000(), sm121_gb10()};
}

TEST(CudaKernelConfigs, AttentionPrefillFitsEveryChip) {
  for (const DeviceInfo& d : chips())
    for (int64_t hd : {32, 64, 256, 512}) {
      const AttentionPrefillConfig c = choose_attention_prefill_config(d, hd);
      EXPECT_TRUE(fits(d, c.smem_bytes, c.stages)) << d.name << " hd " << hd << " smem " << c.smem_bytes;
      EXPECT_GE(c.stages, 1) << d.name;
      EXPECT_EQ(c.threads, 32 * attention_prefill_warps(hd));
      // Q waits in the ring, the partial-score exchange sits beside it.
      const int64_t exchange = hd > 128 ? c.threads / 32 * 16 * c.keys_per_tile * 4 : 0;
      EXPECT_GE(c.smem_bytes, exchange + std::max<int64_t>(c.rows_per_cta * hd * 2, c.stages * 4 * c.keys_per_tile * hd));
    }
}

// Gemma-4's geometry (issue 15): hd 256 sliding layers (group 2) and hd 512 full layers (group 8) run on
// every chip, two stages where the memory allows (SM90/SM100), one on SM12x's 99 KB.
TEST(CudaKernelConfigs, AttentionGemmaHeadDims) {
  for (const DeviceInfo& d : chips()) {
    const bool big = d.max_smem_per_block_optin > 200 * 1024;
    for (int64_t hd : {256, 512}) {
      const AttentionPrefillConfig p = choose_attention_prefill_config(d, hd);
      EXPECT_EQ(p.stages, big ? 2 : 1) << d.name << " hd " << hd;
      EXPECT_GE(p.rows_per_cta, 32) << "a CTA holds the 8 q heads of a full layer's kv head several times";
      EXPECT_EQ(p.rows_per_cta % 16, 0);
      const AttentionDecodeConfig c = choose_attention_decode_config(d, hd, 1, hd == 256 ? 8 : 2, 1, 1024);
      EXPECT_TRUE(fits(d, c.smem_bytes, c.stages)) << d.name << " hd " << hd << " smem " << c.smem_bytes;
      EXPECT_EQ(c.stages, big ? 2 : 1) << d.name << " hd " << hd;
      EXPECT_EQ(c.threads, 32 * attention_decode_warps(hd));
      // The key groups' merge reuses the ring: it must fit there.
      EXPECT_GE(c.smem_bytes - 16 * hd * 2, attention_decode_key_groups(hd) * 16 * (hd + 2) * 4);
    }
    EXPECT_FALSE(choose_attention_prefill_wgmma_ws_config(d, 256, kAttnWsWide).enabled);
    EXPECT_FALSE(choose_attention_prefill_wgmma_ws_config(d, 512, kAttnWsWide).enabled);
  }
  // A 1024-key window at batch 1 spreads over the SMs: 8 kv heads x 16 one-tile splits on an H200.
  EXPECT_EQ(choose_attention_decode_config(sm90_h200(), 256, 1, 8, 1, 1024).num_splits, 16);
  EXPECT_EQ(choose_attention_decode_config(sm90_h200(), 512, 1, 2, 1, 1024).num_splits, 32);
  // gpt-oss's full layers at one token (head dim 64, 8 kv heads, 1K keys): 9 splits as one CTA cluster on sm_90,
  // through the merge kernel at 8 tokens, at a 128-key window (one split) and off sm_90 (not measured there).
  for (const DeviceInfo& d : chips()) {
    const AttentionDecodeConfig one = choose_attention_decode_config(d, 64, 1, 8, 1, 1088);
    EXPECT_EQ(one.clusters, d.sm_major == 9 && one.num_splits >= 2 && one.num_splits <= 16) << d.name;
    EXPECT_FALSE(choose_attention_decode_config(d, 64, 8, 8, 1, 1088).clusters) << d.name;
    EXPECT_FALSE(choose_attention_decode_config(d, 64, 1, 8, 1, 128).clusters) << d.name;
    EXPECT_FALSE(choose_attention_decode_config(d, 256, 1, 8, 1, 1024).clusters) << d.name;
  }
  EXPECT_TRUE(choose_attention_decode_config(sm90_h200(), 64, 1, 8, 1, 1088).clusters);
  EXPECT_TRUE(attention_head_dim_supported(128));
  EXPECT_FALSE(attention_head_dim_supported(96));
  EXPECT_TRUE(attention_head_dim_supported(512));
}

// The warp-specialized wgmma prefill kernel, both shapes: on every sm_90 chip for head dim 64 (and fitting),
// nowhere else; one producer warpgroup next to the consumers, the shared memory the kernel lays out (Q, the
// ring, 2 barriers a stage, the token and pass tables, alignment slack; the wide shape's persistent kernel
// two units' Q and tables, a block of ones and 2 barriers a Q buffer), and as many CTAs per SM as the shape
// is built for within an sm_90 SM's 228 KB (1 KB reserved per CTA).
TEST(CudaKernelConfigs, AttentionPrefillWgmmaWsOnlyOnHopper) {
  for (const AttnWsShape* shape : {&kAttnWsWide, &kAttnWsNarrow})
    for (const DeviceInfo& d : chips())
      for (int64_t hd : {32, 64, 128}) {
        const AttentionPrefillWgmmaConfig c = choose_attention_prefill_wgmma_ws_config(d, hd, *shape);
        EXPECT_EQ(c.enabled, d.sm_major == 9 && hd == 64) << d.name << " hd " << hd;
        if (!c.enabled) continue;
        EXPECT_TRUE(fits(d, c.smem_bytes, c.stages)) << d.name << " smem " << c.smem_bytes;
        EXPECT_EQ(c.threads, 128 + 2 * c.rows_per_cta);
        EXPECT_EQ(c.keys_per_tile, shape->keys_per_tile);
        EXPECT_EQ(c.ctas_per_sm, shape->ctas_per_sm);
        // The in-turn (wide) shape runs persistent: two units' Q and tables, a block of ones, 4 more barriers.
        const int64_t units = shape->overlap ? 1 : 2;
        EXPECT_EQ(c.smem_bytes, 1024 + units * c.rows_per_cta * hd * 2 + (shape->overlap ? 0 : 2048) +
                                    c.stages * (4 * c.keys_per_tile * hd + 16) + (shape->overlap ? 0 : 32) +
                                    units * (7 * c.rows_per_cta + 3) * 4);
        EXPECT_LE(c.ctas_per_sm * (c.smem_bytes + 1024), 228 * 1024);
      }
}

// The sliding-window wgmma kernel: sm_90 and head dim 64 only, the shared memory it lays out, two CTAs per
// SM; it takes gpt-oss's layers (window 128, 8 q heads a kv head) and not those whose block's keys outgrow
// the ring.
TEST(CudaKernelConfigs, AttentionWindowWgmmaOnlyOnHopper) {
  for (const DeviceInfo& d : chips())
    for (int64_t hd : {32, 64, 128}) {
      const AttentionWindowWgmmaConfig c = choose_attention_window_wgmma_config(d, hd);
      EXPECT_EQ(c.enabled, d.sm_major == 9 && hd == 64) << d.name << " hd " << hd;
      if (!c.enabled) continue;
      EXPECT_EQ(c.threads, 384);
      EXPECT_EQ(c.sm_count, d.sm_count);
      EXPECT_EQ(c.smem_bytes, 1024 + 2 * 128 * 128 + kAttnWindowStages * (16384 + 16) + 32 +
                                  (11 * kAttnWindowMaxTokens + 4) * 4);
      EXPECT_LE(2 * (c.smem_bytes + 1024), 228 * 1024);
    }
  EXPECT_TRUE(attention_window_wgmma_takes(128, 8));
  EXPECT_TRUE(attention_window_wgmma_takes(128, 4));
  EXPECT_TRUE(attention_window_wgmma_takes(64, 2));
  EXPECT_FALSE(attention_window_wgmma_takes(0, 8));     // full layers
  EXPECT_FALSE(attention_window_wgmma_takes(1024, 8));  // Gemma-4's windows
  EXPECT_FALSE(attention_window_wgmma_takes(128, 1));   // 128 tokens + 127 keys: 5 tiles
}

// The wide-head wgmma prefill kernel (attention_wgmma_wide.cu): sm_90 and head dims 256 and 512 only; its shared
// memory (Q, a 2-stage ring of K and V tiles, or K alone where V is K's storage at 512, the two warpgroups'
// partial scores at 512, the row bounds) fits one CTA an SM.
TEST(CudaKernelConfigs, AttentionWideWgmmaOnlyOnHopperAndFits) {
  for (const DeviceInfo& d : chips())
    for (int64_t hd : {64, 128, 256, 512})
      for (bool shared : {false, true}) {
        const AttentionWideWgmmaConfig c = choose_attention_wide_wgmma_config(d, hd, shared);
        EXPECT_EQ(c.enabled, d.sm_major == 9 && hd >= 256) << d.name << " hd " << hd;
        if (!c.enabled) continue;
        EXPECT_EQ(c.threads, 256);
        EXPECT_EQ(c.kv_shared, shared);
        EXPECT_EQ(c.rows_per_cta, hd == 256 ? 128 : 64);
        const int64_t keys = hd == 512 && !shared ? 32 : 64;
        EXPECT_EQ(c.keys_per_tile, keys);
        // 1024 alignment + Q + 2 stages of {K, V} (K at 512 shared) + partial scores (512) + row bounds.
        const int64_t ring = 2 * (hd == 512 && shared ? 1 : 2) * keys * hd * 2;
        const int64_t expect = hd == 256 ? 1024 + 128 * 256 * 2 + ring + 2 * 128 * 4
                                         : 1024 + 64 * 512 * 2 + ring + 2 * 64 * keys * 4 + 2 * 64 * 4;
        EXPECT_EQ(c.smem_bytes, expect);
        EXPECT_TRUE(fits(d, c.smem_bytes, kAttnWideStages)) << d.name << " hd " << hd;
        EXPECT_LE(c.smem_bytes + 1024, 227 * 1024);
      }
}

TEST(CudaKernelConfigs, AttentionDecodeFitsEveryChipAndSplitsSensibly) {
  for (const DeviceInfo& d : chips())
    for (int64_t hd : {32, 64, 128, 256, 512})
      for (int64_t tokens : {1, 8, 256})
        for (int64_t max_keys : {128, 1024, 131072}) {
          const AttentionDecodeConfig c = choose_attention_decode_config(d, hd, tokens, 8, 1, max_keys);
          EXPECT_TRUE(fits(d, c.smem_bytes, c.stages)) << d.name << " smem " << c.smem_bytes;
          EXPECT_GE(c.num_splits, 1);
          EXPECT_LE(c.num_splits, 64);
          // No split shorter than two tiles of 64 keys at head dim <= 64 (the same bytes above), or one tile.
          const int64_t min_keys = std::max<int64_t>(c.keys_per_tile, hd <= 64 ? 128 : 0);
          EXPECT_LE((c.num_splits - 1) * min_keys, max_keys) << d.name << " splits " << c.num_splits;
          // The split scratch bound prepare() allocates: tokens * splits <= tokens + 3 * SMs.
          EXPECT_LE(tokens * c.num_splits, tokens + 3 * d.sm_count) << d.name;
        }
}

TEST(CudaKernelConfigs, AttentionDecodeSplitsLongContextAtBatchOne) {
  const AttentionDecodeConfig c = choose_attention_decode_config(sm90_h200(), 64, 1, 8, 1, 32768);
  EXPECT_GE(c.num_splits, 16);  // 8 kv heads alone would leave most of 132 SMs idle
  const AttentionDecodeConfig w = choose_attention_decode_config(sm90_h200(), 64, 1, 8, 1, 128);
  EXPECT_EQ(w.num_splits, 1);  // a 128-key window is one CTA's work
}

// The swap-AB decode kernel: only head dims 64, 256 and 512 with groups of up to 8; a ring of 2-4 stages
// that fits every chip (K and V stages, or K alone where V aliases it); splits within the scratch prepare()
// sizes.
TEST(CudaKernelConfigs, AttentionDecodeSwapShapesAndSplits) {
  for (const DeviceInfo& d : chips()) {
    EXPECT_FALSE(choose_attention_decode_swap_config(d, 32, 8, false, 1, 8, 1024).enabled);
    EXPECT_FALSE(choose_attention_decode_swap_config(d, 128, 2, false, 1, 8, 1024).enabled);
    EXPECT_FALSE(choose_attention_decode_swap_config(d, 256, 16, false, 1, 8, 1024).enabled);
    EXPECT_FALSE(choose_attention_decode_swap_config(d, 64, 16, false, 1, 8, 1024).enabled);
    for (int64_t hd : {64, 256, 512})
      for (int64_t group : {1, 2, 3, 8})
        for (bool shared : {false, true})
          for (int64_t tokens : {1, 8, 80, 512})
            for (int64_t max_keys : {16, 1024, 131072}) {
              const AttentionDecodeSwapConfig c = choose_attention_decode_swap_config(d, hd, group, shared, tokens, 8, max_keys);
              ASSERT_TRUE(c.enabled) << d.name << " hd " << hd;
              EXPECT_TRUE(fits(d, c.smem_bytes, c.stages)) << d.name << " smem " << c.smem_bytes;
              EXPECT_GE(c.stages, 2);
              EXPECT_LE(c.stages, 4);
              // Q, the 4-warp form's exchange of partial scores (head dims 256 and 512), the ring.
              EXPECT_EQ(c.smem_bytes, 8 * hd * 2 + (hd == 64 ? 0 : 4096) + c.stages * (shared ? 1 : 2) * 16 * hd * 2);
              EXPECT_EQ(c.min_split_keys % 16, 0);
              EXPECT_GE(c.num_splits, 1);
              EXPECT_LE(c.num_splits, 64);
              EXPECT_LE((c.num_splits - 1) * c.min_split_keys, max_keys) << d.name << " splits " << c.num_splits;
              EXPECT_LE(tokens * c.num_splits, tokens + 3 * d.sm_count) << d.name;
            }
  }
  // gpt-oss on an H200 (16 one-warp CTAs of 3 stages per SM, one wave wanted: 2112 CTAs): 256 tokens x 8 kv heads
  // fill it unsplit, 128 tokens split in 2, 64 in 4; a 128-key window is one split.
  struct Case {
    int64_t tokens, max_keys, splits;
  };
  for (const Case& k : {Case{256, 131072, 1}, Case{128, 131072, 2}, Case{64, 131072, 4}, Case{256, 128, 1}}) {
    const AttentionDecodeSwapConfig c = choose_attention_decode_swap_config(sm90_h200(), 64, 8, false, k.tokens, 8, k.max_keys);
    EXPECT_EQ(c.stages, 3);
    EXPECT_EQ(c.num_splits, k.splits) << k.tokens << " tokens";
  }
  // Gemma-4 on an H100 (4 CTAs of 4 warps and 3 stages per SM, two waves wanted): 1024-key windows at batch 8
  // split 17 ways, at batch 80 two.
  EXPECT_EQ(choose_attention_decode_swap_config(sm90_h100(), 256, 2, false, 8, 8, 1024).stages, 3);
  EXPECT_EQ(choose_attention_decode_swap_config(sm90_h100(), 256, 2, false, 8, 8, 1024).num_splits, 17);
  EXPECT_EQ(choose_attention_decode_swap_config(sm90_h100(), 256, 2, false, 80, 8, 1024).num_splits, 2);
}

// The clustered form: 16 splits of at least one stage on sm_90 and later at head dims 256 and 512 only, a ring of
// 2-4 stages that fits every such chip (4 where it fits: every H100/H200 shape here).
TEST(CudaKernelConfigs, AttentionDecodeSwapClusterConfig) {
  for (const DeviceInfo& d : chips())
    for (int64_t hd : {64, 256, 512})
      for (int64_t group : {1, 2, 8})
        for (bool shared : {false, true}) {
          const AttentionDecodeSwapConfig c = choose_attention_decode_swap_config(d, hd, group, shared, 1, 8, 1024);
          const AttentionDecodeSwapConfig cc = attention_decode_swap_cluster_config(d, c, hd, shared);
          ASSERT_EQ(cc.enabled, hd != 64 && d.sm_major >= 9) << d.name << " hd " << hd;
          if (!cc.enabled) continue;
          EXPECT_EQ(cc.num_splits, kAttnSwapClusterSplits);
          EXPECT_EQ(cc.min_split_keys, 16);
          EXPECT_GE(cc.stages, 2);
          EXPECT_LE(cc.stages, 4);
          EXPECT_TRUE(fits(d, cc.smem_bytes, cc.stages)) << d.name << " smem " << cc.smem_bytes;
          EXPECT_EQ(cc.smem_bytes, 8 * hd * 2 + 4096 + cc.stages * (shared ? 1 : 2) * 16 * hd * 2);
          if (d.sm_major == 9) {
            EXPECT_EQ(cc.stages, hd == 512 && !shared ? c.stages : 4);
          }
        }
  // At one token with short splits (at most 64 keys each: Gemma-4's sliding layers) the ring is cut to the stages
  // asked for, never deepened; longer splits (full layers) keep it.
  for (const DeviceInfo& d : {sm90_h100(), sm90_h200()}) {
    const AttentionDecodeSwapConfig c = choose_attention_decode_swap_config(d, 256, 2, false, 1, 8, 1024);
    const AttentionDecodeSwapConfig cc = attention_decode_swap_cluster_config(d, c, 256, false);
    ASSERT_EQ(cc.stages, 4);
    const AttentionDecodeSwapConfig two = attention_decode_swap_one_token_ring(cc, 256, false, 1024, 2);
    EXPECT_EQ(two.stages, 2);
    EXPECT_EQ(two.smem_bytes, 8 * 256 * 2 + 4096 + 2 * 2 * 16 * 256 * 2);
    EXPECT_EQ(two.num_splits, cc.num_splits);
    EXPECT_EQ(attention_decode_swap_one_token_ring(cc, 256, false, 1024, 3).stages, 3);
    EXPECT_EQ(attention_decode_swap_one_token_ring(cc, 256, false, 1024, 0).stages, 4);
    EXPECT_EQ(attention_decode_swap_one_token_ring(cc, 256, false, 1024, 5).stages, 4);
    EXPECT_EQ(attention_decode_swap_one_token_ring(cc, 256, false, 1025, 2).stages, 4);
    EXPECT_EQ(attention_decode_swap_one_token_ring(cc, 256, false, 262144, 2).smem_bytes, cc.smem_bytes);
    EXPECT_FALSE(attention_decode_swap_one_token_ring(AttentionDecodeSwapConfig{}, 256, false, 1024, 2).enabled);
  }
  // kAuto takes it where measured (an H200) while its CTAs are at most ~4 per SM: Gemma's sliding layers (8 kv
  // heads) up to 4 tokens, head dim 512 with V aliasing K (2 kv heads) up to 16; with V beside K (Gemma's full
  // layers as stored; 2 CTAs per SM) while they fit the SMs once: up to 4 tokens; nowhere off sm_90 yet.
  auto by_default = [](const DeviceInfo& d, int64_t hd, int64_t group, bool shared, int64_t n_kv, int64_t tokens) {
    const AttentionDecodeSwapConfig c = choose_attention_decode_swap_config(d, hd, group, shared, tokens, n_kv, 1024);
    return attention_decode_swap_cluster_by_default(d, attention_decode_swap_cluster_config(d, c, hd, shared), hd, shared,
                                                    tokens, n_kv);
  };
  for (const DeviceInfo& d : {sm90_h100(), sm90_h200()}) {
    EXPECT_TRUE(by_default(d, 256, 2, false, 8, 1));
    EXPECT_TRUE(by_default(d, 256, 2, false, 8, 4));
    EXPECT_FALSE(by_default(d, 256, 2, false, 8, 5));
    EXPECT_TRUE(by_default(d, 512, 8, true, 2, 16));
    EXPECT_FALSE(by_default(d, 512, 8, true, 2, 17));
    EXPECT_TRUE(by_default(d, 512, 8, false, 2, 1));
    EXPECT_TRUE(by_default(d, 512, 8, false, 2, 4));
    EXPECT_FALSE(by_default(d, 512, 8, false, 2, 5));
    EXPECT_FALSE(by_default(d, 64, 8, false, 8, 1));  // gpt-oss: no clustered form at head dim 64
  }
  for (const DeviceInfo& d : {sm100_b200(), sm120_rtx_pro_6000(), sm121_gb10()})
    EXPECT_FALSE(by_default(d, 256, 2, false, 8, 1));
}

// kAuto takes the swap-AB kernel where it was measured faster (an H200): Gemma's sliding layers (head dim 256,
// group 2) from one token, its full layers (head dim 512, group 8, K = V) and gpt-oss's layers (head dim 64,
// group 8) from 64; nowhere off sm_90 yet.
TEST(CudaKernelConfigs, AttentionDecodeSwapByDefaultWhereMeasuredFaster) {
  auto by_default = [](const DeviceInfo& d, int64_t hd, int64_t group, bool shared, int64_t n_kv, int64_t tokens) {
    const AttentionDecodeSwapConfig c = choose_attention_decode_swap_config(d, hd, group, shared, tokens, n_kv, 1024);
    return attention_decode_swap_by_default(d, c, tokens);
  };
  for (const DeviceInfo& d : {sm90_h100(), sm90_h200()}) {
    EXPECT_TRUE(by_default(d, 256, 2, false, 8, 1));
    EXPECT_TRUE(by_default(d, 256, 2, false, 8, 8));
    EXPECT_TRUE(by_default(d, 256, 2, false, 8, 80));
    EXPECT_FALSE(by_default(d, 512, 8, true, 2, 8));
    EXPECT_FALSE(by_default(d, 512, 8, true, 2, 63));
    EXPECT_TRUE(by_default(d, 512, 8, true, 2, 64));
    EXPECT_FALSE(by_default(d, 64, 8, false, 8, 63));  // gpt-oss: as Gemma's groups of 8
    EXPECT_TRUE(by_default(d, 64, 8, false, 8, 64));
  }
  for (const DeviceInfo& d : {sm100_b200(), sm120_rtx_pro_6000(), sm121_gb10()}) EXPECT_FALSE(by_default(d, 256, 2, false, 8, 80));
}

TEST(CudaKernelConfigs, MoeFitsEveryChip) {
  for (const DeviceInfo& d : chips())
    for (int64_t slots : {4, 32, 256, 32768})
      for (int64_t rows : {2880, 5760}) {
        const MoeConfig c = choose_moe_config(d, slots, 32, rows);
        EXPECT_TRUE(fits(d, c.smem_bytes, 1)) << d.name;
        EXPECT_GE(c.k_split, 1);
        EXPECT_LE(c.k_split, 16);
        EXPECT_EQ(c.threads, 32 * c.k_split);
        EXPECT_EQ(c.tile_tokens, 8);
      }
}

TEST(CudaKernelConfigs, MoeTileBoundCoversWorstRouting) {
  // Every expert gets one token more than a multiple of the tile: the worst case of sum ceil(c_e / 8).
  const int64_t experts = 32, tile = 8;
  for (int64_t slots : {1, 4, 31, 32, 33, 288, 4096}) {
    int64_t worst = 0;
    const int64_t used = std::min(experts, slots);
    const int64_t base = slots / used, extra = slots % used;
    for (int64_t e = 0; e < used; ++e) worst += (base + (e < extra ? 1 : 0) + tile - 1) / tile;
    EXPECT_GE(moe_max_tiles(slots, experts, tile), worst) << slots;
  }
}

TEST(CudaKernelConfigs, SkinnyLinearFitsEveryChipAndCoversItsRows) {
  for (const DeviceInfo& d : chips())
    for (int64_t m = 1; m <= kSkinnyLinearMaxRows; ++m)
      for (auto [n, k] : {std::pair<int64_t, int64_t>{5120, 2880}, {2880, 4096}, {201088, 2880}, {77, 328}, {35, 24},
                          {4096, 65536}, {32768, 8}}) {
        const SkinnyLinearConfig c = choose_skinny_linear_config(d, m, n, k);
        EXPECT_TRUE(fits(d, c.smem_bytes, 1)) << d.name;
        EXPECT_LE(c.smem_bytes, 48 * 1024);  // static shared memory: no opt-in
        EXPECT_GE(8 * c.n_tiles, m);
        EXPECT_EQ(c.n_tiles, m <= 8 ? 1 : 2);
        EXPECT_EQ(c.threads, 32 * kSkinnyLinearWarps);
        EXPECT_EQ(c.chunks_in_flight, 4);  // the default variant
        EXPECT_TRUE(c.pdl) << d.name;
        // The splits cover k without an empty split and stay within the scratch.
        const int64_t chunks = (k + 31) / 32;
        EXPECT_GE(c.k_splits, 1);
        EXPECT_LE(c.k_splits, kSkinnyLinearMaxKSplits);
        EXPECT_GE(c.k_splits * c.chunks_per_split, chunks);
        EXPECT_LT((c.k_splits - 1) * c.chunks_per_split, chunks);
        if (c.k_splits > 1) {
          EXPECT_LE((n + 15) / 16, kSkinnyLinearMaxSplitStrips);
        }
        // The same split and strips at every batch size: a token's sums do not depend on the batch.
        EXPECT_EQ(c.k_splits, choose_skinny_linear_config(d, 1, n, k).k_splits);
        EXPECT_EQ(c.strip_rows, choose_skinny_linear_config(d, 1, n, k).strip_rows);
        // Strips of 8 to 16 rows; fewer than 16 only where their CTAs fit one wave.
        EXPECT_GE(c.strip_rows, 8);
        EXPECT_LE(c.strip_rows, 16);
        if (c.strip_rows < 16) {
          EXPECT_LE((n + c.strip_rows - 1) / c.strip_rows, static_cast<int64_t>(d.sm_count) * kSkinnyLinearCtasPerSm);
        }
      }
  // No k split unless forced; a forced one covers k and is capped.
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 1, 5120, 2880).k_splits, 1);
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 1, 5120, 2880, 4).k_splits, 4);
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 1, 5120, 2880, 4).chunks_per_split, 23);
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 1, 5120, 24, 8).k_splits, 1);  // one chunk of k
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 1, 5120, 2880, 99).k_splits, kSkinnyLinearMaxKSplits);
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 1, 5120, 2880, 0, 8).chunks_in_flight, 8);
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 12, 5120, 2880, 0, 8).chunks_in_flight, 4);  // two tiles
  // Strips: 2816 and 2880 rows (176 and 180 16-row strips on 132 SMs) in strips of 11 (at most 22 rows per SM
  // instead of 32); balanced shapes (4224 rows: 264 strips) and more than one wave (5120) keep 16; forced 8 to 16.
  EXPECT_EQ(skinny_linear_strip_rows(sm90_h200(), 2816), 11);
  EXPECT_EQ(skinny_linear_strip_rows(sm90_h200(), 2880), 11);
  EXPECT_EQ(skinny_linear_strip_rows(sm90_h200(), 4224), 16);
  EXPECT_EQ(skinny_linear_strip_rows(sm90_h200(), 5120), 16);
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 1, 2816, 4096).strip_rows, 11);
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 1, 2816, 4096, 0, 0, 16).strip_rows, 16);
  EXPECT_EQ(choose_skinny_linear_config(sm90_h200(), 1, 2816, 4096, 4).strip_rows, 16);  // k splits: 16
  // The RoPE epilogue's strips (whole pairs): gpt-oss's qkv (5120 rows, 320 16-row strips: the 3-CTA forms) in
  // 14-row strips (366, at most 42 rows an SM against 48); one wave at 2 CTAs per SM keeps 16 (a rank's half of it
  // at tensor parallelism 2, 2560 rows), as does a shape past the 3-CTA wave.
  EXPECT_EQ(skinny_rope_strip_rows(sm90_h200(), 5120), 14);
  EXPECT_EQ(skinny_rope_strip_rows(sm90_h200(), 2560), 16);
  EXPECT_EQ(skinny_rope_strip_rows(sm90_h200(), 1280), 16);
  EXPECT_EQ(skinny_rope_strip_rows(sm90_h200(), 16 * 396 + 16), 16);
  // The staged form: every strip's CTA resident at once (2 an SM at ~95 KB) on sm_90+ at 1 to 8 tokens: Gemma-4's
  // sliding o_proj (256 strips of 11 x 4096), gate|up (264 of 16 x 2816), down, gpt-oss's o_proj (262 of 11); not
  // the full layers' o_proj (181 KB: 1 an SM), more strips than the SMs hold, 9 tokens, Ampere, or a 99 KB SM.
  EXPECT_EQ(skinny_linear_staged_pitch(4096), 8256);
  EXPECT_EQ(skinny_linear_staged_pitch(328), 832);  // 656 bytes -> 768 + 64
  EXPECT_EQ(skinny_linear_staged_smem_bytes(4096, 11), 11 * 8256);
  EXPECT_TRUE(skinny_linear_staged_fits(sm90_h200(), 1, 2816, 4096, 11));
  EXPECT_TRUE(skinny_linear_staged_fits(sm90_h200(), 8, 4224, 2816, 16));
  EXPECT_TRUE(skinny_linear_staged_fits(sm90_h200(), 1, 2816, 2112, 11));
  EXPECT_TRUE(skinny_linear_staged_fits(sm90_h200(), 1, 2880, 4096, 11));
  EXPECT_FALSE(skinny_linear_staged_fits(sm90_h200(), 1, 2816, 8192, 11));
  EXPECT_FALSE(skinny_linear_staged_fits(sm90_h200(), 1, 5120, 2880, 16));
  EXPECT_FALSE(skinny_linear_staged_fits(sm90_h200(), 9, 2816, 4096, 11));
  EXPECT_FALSE(skinny_linear_staged_fits(sm90_h200(), 1, 2816, 4100, 11));
  EXPECT_FALSE(skinny_linear_staged_fits(sm120_rtx_pro_6000(), 1, 2816, 4096, 11));
  DeviceInfo ampere = sm90_h200();
  ampere.sm_major = 8;
  EXPECT_FALSE(skinny_linear_staged_fits(ampere, 1, 2816, 4096, 11));
  // FP8 rows (a byte a weight, k % 16 == 0): gpt-oss's o_proj (262 strips of 11 x 4096 bytes) fits one wave; the
  // lm_head's 2880-byte rows past many waves hold 4 CTAs an SM (16 x 3008 + 4 KB), bf16's 5760-byte ones 2.
  EXPECT_EQ(skinny_linear_staged_pitch(2880, 1), 3008);
  EXPECT_EQ(skinny_linear_staged_smem_bytes(2880, 16, 1), 16 * 3008);
  EXPECT_TRUE(skinny_linear_staged_fits(sm90_h200(), 1, 2880, 4096, 11, 1));
  EXPECT_FALSE(skinny_linear_staged_fits(sm90_h200(), 1, 2880, 4104, 11, 1));  // k % 16 == 8
  EXPECT_EQ(skinny_linear_staged_head_ctas(sm90_h200(), 1, 2880, 16, 1), 4);
  EXPECT_EQ(skinny_linear_staged_head_ctas(sm90_h200(), 1, 2880, 16, 2), 2);
  EXPECT_EQ(skinny_linear_staged_head_ctas(sm90_h200(), 9, 2880, 16, 1), 0);
  EXPECT_EQ(skinny_linear_staged_head_ctas(ampere, 1, 2880, 16, 1), 0);
  // gpt-oss on an H100/H200 (132 SMs, 264 slots): o (180 strips, one wave) and the lm_head (12,568, 48
  // waves) take the skinny kernel; qkv (320 strips, 1.2 waves) stays on cuBLASLt.
  EXPECT_TRUE(skinny_linear_by_default(sm90_h200(), 2880));
  EXPECT_TRUE(skinny_linear_by_default(sm90_h200(), 201088));
  EXPECT_FALSE(skinny_linear_by_default(sm90_h200(), 5120));
  EXPECT_TRUE(skinny_linear_by_default(sm90_h200(), 16 * 264 * 16));      // exactly 16 waves
  EXPECT_FALSE(skinny_linear_by_default(sm90_h200(), 16 * 264 * 16 - 16));
  EXPECT_TRUE(use_skinny_linear(1, 2880));
  EXPECT_TRUE(use_skinny_linear(16, 4096));
  EXPECT_FALSE(use_skinny_linear(17, 4096));
  EXPECT_FALSE(use_skinny_linear(0, 4096));
  EXPECT_FALSE(use_skinny_linear(4, 2884));  // rows not 16-byte aligned
  EXPECT_FALSE(use_skinny_linear(4, 2880, 0));
  EXPECT_TRUE(use_skinny_linear(8, 2880, 8));
  EXPECT_FALSE(use_skinny_linear(32, 2880, 32));  // the kernel has two token tiles at most
}

TEST(CudaKernelConfigs, MoeFusedFitsEveryChipAndSplitsByKAlone) {
  for (const DeviceInfo& d : chips())
    for (int64_t k : {64, 256, 2880, 4160, 65536})
      for (int kt : {0, 6, 12, 23}) {
        const MoeFusedConfig c = choose_moe_fused_config(d, k, kt);
        EXPECT_TRUE(fits(d, c.smem_bytes, 1)) << d.name;
        EXPECT_GE(c.k_split, 1);
        EXPECT_LE(c.k_split, kMoeFusedMaxKSplit);
        EXPECT_LE(c.k_split, k / 64);  // every warp has at least one k tile
        EXPECT_EQ(c.threads, 32 * c.k_split);
        EXPECT_EQ(c.smem_bytes, (c.k_split - 1) * 4 * 32 * 4 + c.k_split * ((k / 64 + c.k_split - 1) / c.k_split) * 32);
        EXPECT_EQ(c.smem_bytes, moe_fused_smem_bytes(k, c.k_split));
        EXPECT_TRUE(c.pdl) << d.name;  // every chip we target is SM90+
        // Warps get about k_tiles_per_warp tiles each unless the split is capped.
        if (c.k_split < kMoeFusedMaxKSplit) {
          EXPECT_LE((k / 64 + c.k_split - 1) / c.k_split, c.k_tiles_per_warp);
        }
      }
  // gpt-oss (k = 2880, 45 tiles): the same split on every chip and for every batch (no batch input).
  for (const DeviceInfo& d : chips()) EXPECT_EQ(choose_moe_fused_config(d, 2880).k_split, 4) << d.name;
  EXPECT_EQ(choose_moe_fused_config(sm90_h200(), 2880, 23).k_split, 2);
}

TEST(CudaKernelConfigs, MoeFusedRoutingAndTileBound) {
  EXPECT_FALSE(use_fused_moe_routing(0));
  EXPECT_TRUE(use_fused_moe_routing(4));    // one token, top-4
  EXPECT_TRUE(use_fused_moe_routing(32));   // 8 tokens: one slot per lane
  EXPECT_FALSE(use_fused_moe_routing(33));
  // kAuto: the ring kernels up to 16 tokens (top-4), the first decode kernels above (measured); at one token 3
  // warps per CTA in the first GEMM and 6 in the second (4 and 4 with the scales in registers), 3 in both at two
  // tokens (2 with the scales in registers), 2 from three tokens on (gpt-oss, k = 2880: 45 k tiles).
  EXPECT_TRUE(use_fused_moe_decode(4));
  EXPECT_TRUE(use_fused_moe_decode(64));
  EXPECT_FALSE(use_fused_moe_decode(65));
  const DeviceInfo h200 = sm90_h200();
  EXPECT_EQ(choose_moe_fused_config(h200, 2880, moe_fused_auto_k_tiles_per_warp(4, true, false)).k_split, 3);
  EXPECT_EQ(choose_moe_fused_config(h200, 2880, moe_fused_auto_k_tiles_per_warp(4, false, false)).k_split, 6);
  EXPECT_EQ(choose_moe_fused_config(h200, 2880, moe_fused_auto_k_tiles_per_warp(4, true, true)).k_split, 4);
  EXPECT_EQ(choose_moe_fused_config(h200, 2880, moe_fused_auto_k_tiles_per_warp(4, false, true)).k_split, 4);
  for (bool first : {true, false}) {
    for (int64_t slots : {5, 8}) {
      EXPECT_EQ(choose_moe_fused_config(h200, 2880, moe_fused_auto_k_tiles_per_warp(slots, first, false)).k_split, 3);
      EXPECT_EQ(choose_moe_fused_config(h200, 2880, moe_fused_auto_k_tiles_per_warp(slots, first, true)).k_split, 2);
    }
    for (bool in_registers : {true, false}) {
      EXPECT_EQ(choose_moe_fused_config(h200, 2880, moe_fused_auto_k_tiles_per_warp(9, first, in_registers)).k_split, 2);
      EXPECT_EQ(choose_moe_fused_config(h200, 2880, moe_fused_auto_k_tiles_per_warp(64, first, in_registers)).k_split, 2);
    }
  }
  // Worst routing by dynamic programming: the most tiles sum ceil(c_e / 8) over <= E experts with sum c_e = s.
  for (int64_t experts : {1, 4, 32, 128}) {
    const int64_t max_slots = 300;
    std::vector<int64_t> best(max_slots + 1, 0);  // over the experts seen so far
    for (int64_t e = 0; e < experts; ++e) {
      std::vector<int64_t> next(best);
      for (int64_t s = 0; s <= max_slots; ++s)
        for (int64_t c = 1; c <= s; ++c) next[s] = std::max(next[s], best[s - c] + (c + 7) / 8);
      best = next;
    }
    for (int64_t s = 1; s <= max_slots; ++s) {
      EXPECT_GE(moe_fused_max_tiles(s, experts), best[s]) << experts << " experts, " << s << " slots";
      EXPECT_LE(moe_fused_max_tiles(s, experts), moe_max_tiles(s, experts, 8));
    }
  }
  EXPECT_EQ(moe_fused_max_tiles(4, 32), 4);    // one token: its 4 experts
  EXPECT_EQ(moe_fused_max_tiles(32, 32), 32);  // 8 tokens
}

TEST(CudaKernelConfigs, MoeGroupedFitsEveryChip) {
  for (const DeviceInfo& d : chips())
    for (int64_t slots : {256, 2048, 8192, 32768})
      for (int64_t experts : {32, 128}) {
        const MoeGroupedConfig c = choose_moe_grouped_config(d, slots, experts);
        EXPECT_TRUE(fits(d, c.smem_bytes, c.stages)) << d.name << " smem " << c.smem_bytes;
        // The ring holds the tile being multiplied, the next one (dequantized now) and one in flight.
        EXPECT_GE(c.stages, 3) << d.name;
        EXPECT_LE(c.stages, kMoeGroupedMaxStages);
        EXPECT_EQ(c.smem_bytes, 2 * kMoeGroupedBf16Bytes + c.stages * moe_grouped_stage_bytes(c.tile_tokens));
        EXPECT_EQ(c.threads, kMoeGroupedThreads);
        EXPECT_TRUE(c.tile_tokens == 64 || c.tile_tokens == 128);
      }
  // SM12x's 99 KB holds 3 stages of 64-token tiles, not of 128; SM90 runs 128 with two CTAs per SM.
  EXPECT_EQ(choose_moe_grouped_config(sm120_rtx_pro_6000(), 32768, 32).tile_tokens, 64);
  EXPECT_EQ(choose_moe_grouped_config(sm121_gb10(), 32768, 32).tile_tokens, 64);
  const MoeGroupedConfig h200 = choose_moe_grouped_config(sm90_h200(), 8192 * 4, 32);
  EXPECT_EQ(h200.tile_tokens, 128);
  EXPECT_LE(2 * (h200.smem_bytes + 2048), 233472);  // 228 KB of shared memory per SM
}

TEST(CudaKernelConfigs, MoeGroupedTilesFollowTokensPerExpert) {
  EXPECT_EQ(choose_moe_grouped_config(sm90_h200(), 512 * 4, 32).tile_tokens, 64);    // 64 per expert
  EXPECT_EQ(choose_moe_grouped_config(sm90_h200(), 2048 * 4, 32).tile_tokens, 64);   // 256 per expert
  EXPECT_EQ(choose_moe_grouped_config(sm90_h200(), 8192 * 4, 32).tile_tokens, 128);  // 1024 per expert
  EXPECT_FALSE(use_grouped_moe(64 * 4, 32, false));   // decode batches stay on the swap-AB kernels
  EXPECT_FALSE(use_grouped_moe(256 * 4, 32, false));  // 32 per expert: the two paths tie, keep decode
  EXPECT_TRUE(use_grouped_moe(384 * 4, 32, false));
  EXPECT_TRUE(use_grouped_moe(2048 * 4, 32, false));
  EXPECT_TRUE(use_grouped_moe(2048 * 4, 128, false));
  // The wgmma kernel takes over from 8 per expert (its 16-token tiles; batched decode at 8-64 tokens per expert).
  EXPECT_FALSE(use_grouped_moe(32 * 4, 32, true));    // 4 per expert: decode is faster
  EXPECT_FALSE(use_grouped_moe(128 * 4, 128, true));  // gpt-oss-120b at 128 sequences, 4 per expert
  EXPECT_TRUE(use_grouped_moe(64 * 4, 32, true));
  EXPECT_TRUE(use_grouped_moe(256 * 4, 128, true));   // gpt-oss-120b at 256 sequences, 8 per expert
  EXPECT_TRUE(use_grouped_moe(128 * 4, 32, true));
  EXPECT_TRUE(use_grouped_moe(256 * 4, 32, true));
}

// The wgmma grouped GEMM: only on sm_90 (no wgmma on SM100/SM12x: those keep the mma.sync kernel); its
// ring (plus the kernel's static table of tile rows, 8 bytes each) fits there with as many CTAs per SM as its
// __launch_bounds__ promise: two with two warpgroups and tiles of <= 128 tokens (the 128-register cap assumes
// it), else one. Every tile runs two warpgroups (the only count compiled); 96-token tiles the deep ring (six
// stages); 16- and 32-token tiles (narrow) the deep ring's kernel with its ring. A forced 64 is disabled (64-token
// tiles are the mma.sync grouped kernel's).
TEST(CudaKernelConfigs, MoeWgmmaOnlyOnSm90AndFits) {
  for (const DeviceInfo& d : chips())
    for (int64_t slots : {256, 2048, 8192, 32768})
      for (int tile : {0, 16, 32, 96, 128, 256}) {
        const MoeWgmmaConfig c = choose_moe_wgmma_config(d, slots, 32, tile);
        EXPECT_EQ(c.enabled, d.sm_major == 9) << d.name;
        const bool narrow = c.tile_tokens == 16 || c.tile_tokens == 32;
        EXPECT_TRUE(narrow || c.tile_tokens == 96 || c.tile_tokens == 128 || c.tile_tokens == 256);
        if (tile != 0) {
          EXPECT_EQ(c.tile_tokens, tile);
        }
        EXPECT_EQ(c.warpgroups, kMoeWgmmaWarpgroups);
        EXPECT_EQ(c.deep_ring, narrow || c.tile_tokens == 96);
        const int kernel_tile = narrow ? 96 : c.tile_tokens;  // the narrow kernels have the 96-token geometry
        if (narrow) {  // a ring of their own (moe_wgmma_narrow.h)
          EXPECT_EQ(c.stages, moe_wgmma_narrow_stages(c.tile_tokens));
          EXPECT_EQ(c.smem_bytes, moe_wgmma_narrow_smem_bytes(c.tile_tokens, c.stages));
        } else {
          EXPECT_EQ(c.stages, c.deep_ring ? kMoeWgmmaDeepStages : kMoeWgmmaStages);
          EXPECT_EQ(c.smem_bytes, c.stages * moe_wgmma_stage_bytes(kernel_tile, c.warpgroups) + 1024);
        }
        EXPECT_EQ(c.threads, 128 * c.warpgroups);
        if (!c.enabled) continue;
        const int64_t tables = (c.persistent ? 16 : 8) * kernel_tile;
        EXPECT_TRUE(fits(d, c.smem_bytes + tables, c.stages)) << d.name;
        const int ctas_per_sm = narrow ? moe_wgmma_narrow_ctas_per_sm(c.tile_tokens, c.stages)
                                       : moe_wgmma_ctas_per_sm(kernel_tile, c.warpgroups);
        EXPECT_LE(ctas_per_sm * (c.smem_bytes + tables + 1024), 233472) << d.name;  // 228 KB per SM
        EXPECT_EQ(c.persistent, c.tile_tokens == 256 && kMoeWgmmaPersistent);
        EXPECT_EQ(c.sms, d.sm_count);
      }
  EXPECT_EQ(kMoeWgmmaWarpgroups, 2);
  EXPECT_FALSE(choose_moe_wgmma_config(sm90_h100(), 2048, 32, 64).enabled);
  for (int tile : {96, 128, 256}) EXPECT_EQ(moe_wgmma_stage_bytes(tile, 2) % 1024, 0);
  EXPECT_GE(moe_wgmma_stage_bytes(128, 2), 128 * 128 + 128 * 34);
  EXPECT_EQ(moe_wgmma_ctas_per_sm(128, 2), 2);
  EXPECT_EQ(moe_wgmma_ctas_per_sm(256, 2), 1);
  // The narrow kernels: three CTAs per SM of the 16-token one on its six stages, two of the 32-token one; a stage
  // holds the tile's activations and two strips' fp4 and scales.
  EXPECT_EQ(moe_wgmma_narrow_ctas_per_sm(16, moe_wgmma_narrow_stages(16)), 3);
  EXPECT_EQ(moe_wgmma_narrow_ctas_per_sm(32, moe_wgmma_narrow_stages(32)), 2);
  for (int tile : {16, 32}) {
    EXPECT_EQ(moe_wgmma_narrow_stage_bytes(tile) % 1024, 0);
    EXPECT_GE(moe_wgmma_narrow_stage_bytes(tile), tile * 128 + 256 * 34);
    EXPECT_GE(moe_wgmma_narrow_stages(tile), 3);  // tile t - 1 in the MMAs, tile t decoded, one loading
  }
  // auto: 16-token tiles up to 10 tokens per expert, 32 up to 20 (both on the deep ring's kernel), 96-token
  // tiles below 512, 256 from there.
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 8 * 32, 32).tile_tokens, 16);
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 8 * 128, 128).tile_tokens, 16);
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 11 * 32, 32).tile_tokens, 32);
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 16 * 32, 32).tile_tokens, 32);
  EXPECT_TRUE(choose_moe_wgmma_config(sm90_h100(), 16 * 32, 32).deep_ring);
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 21 * 32, 32).tile_tokens, 96);
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 511 * 32, 32).tile_tokens, 96);
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 512 * 32, 32).tile_tokens, 256);
  // The deep ring: 96-token tiles (auto's below 512 tokens per expert) and the narrow ones, and two CTAs of it
  // fit an SM.
  EXPECT_TRUE(choose_moe_wgmma_config(sm90_h100(), 32 * 32, 32).deep_ring);  // auto: 96-token tiles
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 32 * 32, 32, 96).stages, 6);
  EXPECT_FALSE(choose_moe_wgmma_config(sm90_h100(), 32 * 32, 32, 128).deep_ring);
  EXPECT_FALSE(choose_moe_wgmma_config(sm90_h100(), 1024 * 32, 32).deep_ring);  // 256-token tiles
  EXPECT_EQ(moe_wgmma_ctas_per_sm(96, 2), 2);
  // Programmatic dependent launches with the deep ring only (its kernel waits for the predecessor), unless -1.
  EXPECT_TRUE(choose_moe_wgmma_config(sm90_h100(), 32 * 32, 32).pdl);
  EXPECT_FALSE(choose_moe_wgmma_config(sm90_h100(), 1024 * 32, 32, 256, -1).pdl);
  EXPECT_TRUE(choose_moe_wgmma_config(sm90_h100(), 32 * 32, 32, 96, 0, 0, 1).pdl);
  EXPECT_FALSE(choose_moe_wgmma_config(sm90_h100(), 32 * 32, 32, 96, 0, 0, -1).pdl);
  EXPECT_FALSE(choose_moe_wgmma_config(sm90_h100(), 1024 * 32, 32, 256, 1, 0, 1).pdl);
  // A persistent grid only with 256-token tiles, on request or by default.
  EXPECT_TRUE(choose_moe_wgmma_config(sm90_h100(), 1024 * 32, 32, 256, 1).persistent);
  EXPECT_FALSE(choose_moe_wgmma_config(sm90_h100(), 1024 * 32, 32, 256, -1).persistent);
  EXPECT_FALSE(choose_moe_wgmma_config(sm90_h100(), 1024 * 32, 32, 128, 1).persistent);
  DeviceInfo tiny = sm90_h100();
  tiny.max_smem_per_block_optin = 48 * 1024;
  EXPECT_FALSE(choose_moe_wgmma_config(tiny, 32768, 32).enabled);  // falls back to the mma.sync kernel
}

// The warp-specialized wgmma kernel: sm_90 only, 384 threads (a producer and two MMA warpgroups), a
// persistent grid of one CTA per SM, tiles of 128 or 256 tokens (a forced 64 runs as 128), and as deep a ring
// as fits next to its static row table and barriers; the other knobs do not apply to it.
TEST(CudaKernelConfigs, MoeWgmmaWarpSpecialized) {
  for (const DeviceInfo& d : chips())
    for (int64_t slots : {256, 2048, 8192, 32768})
      for (int tile : {0, 64, 128, 256}) {
        const MoeWgmmaConfig c = choose_moe_wgmma_config(d, slots, 32, tile, -1, 1);
        EXPECT_EQ(c.enabled, d.sm_major == 9) << d.name;
        EXPECT_TRUE(c.warp_specialized);
        EXPECT_EQ(c.tile_tokens, tile == 0 ? (slots / 32 >= kMoeWgmmaLargeTileTokensPerExpert ? 256 : 128)
                                 : tile == 64 ? 128 : tile);
        EXPECT_EQ(c.threads, kMoeWgmmaWsThreads);
        EXPECT_EQ(c.warpgroups, 2);
        EXPECT_TRUE(c.persistent);
        EXPECT_EQ(c.sms, d.sm_count);
        if (!c.enabled) continue;
        EXPECT_GE(c.stages, 3);
        EXPECT_LE(c.stages, kMoeWgmmaWsMaxStages);
        EXPECT_EQ(c.smem_bytes, c.stages * moe_wgmma_stage_bytes(c.tile_tokens, 2) + 1024);
        EXPECT_LE(c.smem_bytes + moe_wgmma_ws_static_bytes(c.tile_tokens), d.max_smem_per_block_optin) << d.name;
        // One more stage would not fit.
        EXPECT_TRUE(c.stages == kMoeWgmmaWsMaxStages ||
                    c.smem_bytes + moe_wgmma_stage_bytes(c.tile_tokens, 2) + moe_wgmma_ws_static_bytes(c.tile_tokens) >
                        d.max_smem_per_block_optin);
      }
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 1024 * 32, 32, 256, 0, 1).stages, 6);
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 1024 * 32, 32, 0, 0, -1).warp_specialized, false);
  EXPECT_EQ(choose_moe_wgmma_config(sm90_h100(), 1024 * 32, 32).warp_specialized, kMoeWgmmaWarpSpecialized);
  DeviceInfo tiny = sm90_h100();
  tiny.max_smem_per_block_optin = 64 * 1024;  // two stages of 128-token tiles: too shallow a ring
  EXPECT_FALSE(choose_moe_wgmma_config(tiny, 32768, 32, 128, 0, 1).enabled);
}

TEST(CudaKernelConfigs, MoeGroupedRefusesTooLittleSharedMemory) {
  DeviceInfo tiny = sm120_rtx_pro_6000();
  tiny.max_smem_per_block_optin = 48 * 1024;
  const MoeGroupedConfig c = choose_moe_grouped_config(tiny, 32768, 32);
  EXPECT_FALSE(fits(tiny, c.smem_bytes, c.stages));  // moe_experts returns an error instead of launching
}

TEST(CudaKernelConfigs, NothingFitsWithoutSharedMemory) {
  DeviceInfo tiny = sm120_rtx_pro_6000();
  tiny.max_smem_per_block_optin = 8 * 1024;
  const AttentionPrefillConfig c = choose_attention_prefill_config(tiny, 64);
  EXPECT_FALSE(fits(tiny, c.smem_bytes, c.stages));  // the backend returns an error instead of launching
}

}  // namespace
}  // namespace mx::cuda
