// Shared memory of the persistent form of the wide warp-specialized prefill shape (attention_wgmma_ws.cu's
// attention_prefill_wgmma_persist_kernel, which runs kAttnWsWide: full layers). Apart from kernel_configs.h,
// which every .cu file includes through kernels.h: a change here rebuilds only the files that use it.
#pragma once

#include <cstdint>

#include "backend/cuda/kernel_configs.h"

namespace mx::cuda {

// A CTA per SM walks units of 64 * consumers rows, so it holds two units' Q and token/pass tables (7 ints a
// row, 3 more: the next unit's are built and loaded under the current one's last tiles), a 16 x 64 block of
// bf16 ones (the B of the row sums' wgmma), the K/V ring with a full and an empty barrier a stage, a full and
// an empty barrier a Q buffer, and the slack that aligns the tiles to 1024 bytes.
constexpr int64_t attention_prefill_wgmma_persist_smem_bytes(int64_t head_dim, const AttnWsShape& s) {
  const int64_t rows = 64 * s.consumers;
  return 1024 + 2 * rows * head_dim * 2 + 2048 + s.stages * 2 * s.keys_per_tile * head_dim * 2 +
         (2 * s.stages + 4) * 8 + 2 * (7 * rows + 3) * 4;
}

}  // namespace mx::cuda
