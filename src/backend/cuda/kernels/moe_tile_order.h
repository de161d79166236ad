// The order of the 96-, 128- and 256-token wgmma kernels' routing tiles (moe_wgmma.cu reads each CTA's tile by its
// index): a grid of several waves ends as its last CTAs end, so the tiles whose k loops are the shorter ones (an
// expert's last tile at the kernel's half or 64-column width, where that order pays: moe_wide_tile_tokens) go last.
// Its own header: kernel_configs.h includes moe_wgmma_ws.h, so a declaration there rebuilds every kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/kernels.h"
#include "core/status.h"

namespace mx::cuda {

// Whether the GEMMs' tiles go wide first by default (CudaMoeOptions::wgmma_wide_first 0). H200, session 21
// (docs/PERF.md), gpt-oss-20b's layer, one process each, 7 rounds: T = 512 (64/96 columns) 301.7 -> 295.2 and
// 306.1 -> 299.3 us, T = 4096 (256-token tiles) 1710.4 -> 1700.5 and 1755.2 -> 1744.7.
inline constexpr bool kMoeWgmmaWideTilesFirst = true;

// launch_moe_route_permute with the tiles of more than wide_over tokens numbered first, then the others, each class
// in expert order (0: every tile in expert order, launch_moe_route_permute's metadata). The tiles, their rows and
// every output bit are the same; only which CTA row of the GEMMs' grids multiplies which tile changes.
Status launch_moe_route_permute_wide_first(const MoeRoutingParams& p, const uint16_t* x, uint16_t* out, int64_t rows,
                                           int64_t k, int64_t top_k, int wide_over, cudaStream_t stream);

// launch_moe_route_gather_tiled (moe_wgmma_ws.h) with the tiles numbered as launch_moe_route_permute_wide_first's,
// each slot's row gathered into its tile's numbered place (the copy engine's 96-token tiles).
Status launch_moe_route_gather_tiled_wide_first(const MoeRoutingParams& p, const uint16_t* x, uint16_t* out, int64_t k,
                                                int64_t top_k, int wide_over, cudaStream_t stream);

// Whether the 96-token tiles' 64/96-column kernel (MoeGemmParams::mid_width) runs on the copy engine by default
// (CudaMoeOptions::wgmma_bulk_mid 0): its k tiles' rows, fp4 and scales as bulk copies on the stages' mbarriers, from
// x gathered tiled by the routing launch and h written tiled by the first GEMM (launch_moe_wgmma_bulk_gemm). H200,
// session 22 W1 (docs/PERF.md), gpt-oss-20b's layer, one process, 7 rounds: T = 512 298.5 -> 287.0 us, T = 640
// 346.1 -> 332.1.
inline constexpr bool kMoeWgmmaBulkMid = true;
// And the 256-token tiles (CudaMoeOptions::wgmma_bulk_wide 0): session 23 W1 (docs/PERF.md), gpt-oss-20b's layer, one
// process, 5 rounds: T = 4096 1711.6 -> 1543.0 us, T = 8192 3161.8 -> 2865.5; bench latency 20b 8K 73.5-74.1k ->
// 79.1k tok/s, 8 x 1K 83.1-85.3k -> 94.3-94.6k.
inline constexpr bool kMoeWgmmaBulkWide = true;
// And the 96-token tiles at 96/48 columns (CudaMoeOptions::wgmma_bulk_full 0) from kMoeWgmmaBulkFullMinTokensPerExpert
// tokens per expert: session 23 W2, gpt-oss-20b's layer, one process, 5 rounds: T = 1024 556.3 -> 534.7 us, T = 2048
// 950.7 -> 899.2. At 32 per expert (120b's T = 1024: tiles of ~32 tokens padded to 96) one strip a warp was slower
// (847.2 -> 900.3), two strips a warp faster (session 24 W2: 832.1 -> 819.6).
inline constexpr bool kMoeWgmmaBulkFull = true;
inline constexpr int64_t kMoeWgmmaBulkFullMinTokensPerExpert = 32;
// And their tiles of at most 48 tokens two strips a warp (CudaMoeOptions::wgmma_bulk_two_strips 0; MoeGemmParams::
// two_strips), as the cp.async form's: each k tile's stage the tile's 48 rows and 16 strips of fp4 and scales, for
// half the CTAs. Session 24 W2, one process, 5 rounds: 20b's layer at T = 1024 (an expert's ~32-token last tile)
// 539.9 -> 518.2 us.
inline constexpr bool kMoeWgmmaBulkTwoStrips = true;

// The wide tiles' threshold for a kernel of tile_tokens-token tiles: the tokens above which its k loop runs at the
// full width (64 with mid_width, else half the tile at 256 tokens), or 0 where every tile runs at one width (128-token
// tiles) or the 96-token tiles at 96/48 columns keep the expert order: by cp.async and on the copy engine (two strips
// a warp, MoeGemmParams::two_strips) a tile of <= 48 tokens runs two strips a warp, twice the decode of a full one's
// CTA; one strip a warp on the copy engine (the form before session 24) it is the shorter CTA, but numbered last it
// measured slower (H200, session 24 W1, gpt-oss-20b's layer at T = 1024, one process, 5 rounds: expert order 533.2 us,
// wide first 549.7; at T = 2048 911.2 / 891.0): an expert's short tile then runs long after its full one, its weights
// no longer in L2.
inline int moe_wide_tile_tokens(int64_t tile_tokens, bool mid_width) {
  if (tile_tokens == 96) return mid_width ? 64 : 0;
  return tile_tokens == 256 ? 128 : 0;
}

}  // namespace mx::cuda
