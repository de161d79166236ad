// Launch configuration of the wide-head wgmma prefill attention (attention_wgmma_wide.cu). Apart from
// kernel_configs.h, which every .cu file includes through kernels.h: a change here rebuilds only the files
// that use it. Plain C++ (the CPU tests check it on every chip).
#pragma once

#include <cstdint>

#include "backend/cuda/kernel_configs.h"

namespace mx::cuda {

// Prefill attention on wgmma for the wide heads (sm_90a, attention_wgmma_wide.cu: Gemma-4's 256 and 512):
// two warpgroups, every thread loads K/V tiles by cp.async into a 2-stage ring and computes. A warpgroup
// owns 64 query rows and `head_dim / slices` output columns (64 x 256 fp32 = 128 registers a thread): at
// 256 the two warpgroups take 128 rows; at 512 they share 64 rows, each computes Q K^T over its half of
// the head dims and the partial scores are summed through shared memory (both then hold the same scores
// and run the same softmax). Tiles: [head_dim / 64 panels][rows][64] bf16 with the 128-byte swizzle.
// Where V is K's storage (`kv_shared`: Gemma-4's full layers) the stages at 512 hold K alone, read as V too,
// and take 64 keys (a 2-stage ring of 64-key K and V tiles at 512 would not fit): half the tiles of 32 keys,
// and Q K^T's shared-memory reads per FLOP cut by a third (its B tile twice as wide for the same A).
struct AttnWideShape {
  int keys_per_tile, row_blocks, slices;  // keys a K/V tile, 64-row blocks a CTA, warpgroups a row block
  bool k_only;                            // a stage holds K alone (V is K's storage)
};
constexpr AttnWideShape attention_wide_wgmma_shape(int64_t head_dim, bool kv_shared) {
  if (head_dim < 512) return AttnWideShape{64, 2, 1, false};
  return kv_shared ? AttnWideShape{64, 1, 2, true} : AttnWideShape{32, 1, 2, false};
}
inline constexpr int kAttnWideStages = 2;
// The 1024-byte alignment slack, Q, the ring (K and V a stage, or K alone), the partial scores (slices > 1:
// each warpgroup's 64 x keys fp32), and each row's first and last visible key.
constexpr int64_t attention_wide_wgmma_smem_bytes(int64_t head_dim, bool kv_shared) {
  const AttnWideShape s = attention_wide_wgmma_shape(head_dim, kv_shared);
  const int64_t rows = 64 * s.row_blocks;
  return 1024 + rows * head_dim * 2 + kAttnWideStages * (s.k_only ? 1 : 2) * s.keys_per_tile * head_dim * 2 +
         (s.slices > 1 ? s.slices * 64 * s.keys_per_tile * 4 : 0) + 2 * rows * 4;
}
struct AttentionWideWgmmaConfig {
  bool enabled = false;  // sm_90, head dim 256 or 512, and it fits
  int threads = 0;
  int rows_per_cta = 0;
  int keys_per_tile = 0;
  int64_t smem_bytes = 0;
  bool kv_shared = false;  // the shape for V in K's storage (the launch must have p.kv.k == p.kv.v)
};
AttentionWideWgmmaConfig choose_attention_wide_wgmma_config(const DeviceInfo& dev, int64_t head_dim, bool kv_shared);

}  // namespace mx::cuda
