// The geometry of the narrow MoE wgmma tiles (moe_wgmma.cu's 16- and 32-token tiles for batched decode, every
// tile two 16-row strips a warp, 256 weight rows a CTA), shared by the config that sizes their shared memory
// (kernel_configs.cc), the kernel's ring and launch bounds, and the CPU test that proves they fit.
#pragma once

#include <cstdint>

#include "backend/cuda/kernel_configs.h"

namespace mx::cuda {

// One stage: the tile's activations (128 bytes of k a token), two strips' packed fp4 (32 B a weight row) and
// scales (2 B a row), rounded up to the 1024 bytes at which the next stage's swizzled activations must start.
constexpr int64_t moe_wgmma_narrow_stage_bytes(int tile_tokens) {
  return (int64_t{tile_tokens} * 128 + 2 * moe_wgmma_weight_rows(kMoeWgmmaWarpgroups) * 34 + 1023) / 1024 * 1024;
}
// Ring stages. The 16-token kernel: six of 11 KB, so that three CTAs fit an SM (it compiles to 80 registers a
// thread; more warps hide the fp4 decode's dependent chains: on an H200 4-7% faster than the same kernel at two
// CTAs on nine stages, session 14 W1). The 32-token one (104 registers: two CTAs): seven of 13 KB.
constexpr int moe_wgmma_narrow_stages(int tile_tokens) { return tile_tokens == 16 ? 6 : 7; }
constexpr int64_t moe_wgmma_narrow_smem_bytes(int tile_tokens, int stages) {
  return stages * moe_wgmma_narrow_stage_bytes(tile_tokens) + 1024;  // + 1 KB to align the ring
}
// The CTAs per SM a ring's shared memory allows (228 KB an SM, 1 KB of it reserved per CTA), at most three:
// what the kernel's __launch_bounds__ promise, which caps its registers (65,536 / (256 threads x CTAs)).
constexpr int moe_wgmma_narrow_ctas_per_sm(int tile_tokens, int stages) {
  const int64_t ctas = 233472 / (moe_wgmma_narrow_smem_bytes(tile_tokens, stages) + 1024);
  return ctas > 3 ? 3 : static_cast<int>(ctas);
}

}  // namespace mx::cuda
