// The tiled input of the warp-specialized wgmma MoE GEMM (moe_wgmma_ws.cu; launch_moe_wgmma_gemm runs it for
// c.warp_specialized configs). Both of its GEMMs read their input tiled: routing tile i's row j is padded row
// i x tile_tokens + j of max_tiles x tile_tokens, stored k tile by k tile ([k / 64][padded rows][64] bf16, k in
// the wgmma order of launch_moe_permute_k, the eight 16-byte chunks of a row at chunk ^ (row % 8): the
// 128-byte-swizzled image wgmma reads from shared memory), so that one bulk copy brings a tile's k tile. The
// first GEMM's epilogue writes h so for the second; its x comes from launch_moe_gather_tiled.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/kernels.h"
#include "core/status.h"

namespace mx::cuda {

// out = x tiled: each routing tile's rows gathered by token (sorted_slots / top_k). Padded rows past a tile's
// tokens are not written (the GEMM never stores their results).
// The 16-token tiles' GEMMs (moe_wgmma.cu) with every k tile by the copy engine: both read their input tiled (x
// from launch_moe_gather_tiled at 16 tokens a tile; the first writes h so), as the warp-specialized kernel does.
// Otherwise as launch_moe_wgmma_gemm with the same config. `warp_release`: each warp frees a ring slot on an
// mbarrier instead of a CTA barrier per k tile. `pairs`: an expert's 16-token tiles 2i and 2i + 1 run as a pair of
// CTAs that each decode one strip group's fp4 once for both tiles' rows (moe_wgmma_bulk_kernel's kPairs).
// `trim_rows`: a tile's rows copied up to its routed tokens' 8-row blocks instead of the whole padded tile.
// Whether the 16-token tiles run on the copy engine by default (CudaMoeOptions::wgmma_bulk 0). On an H200 (session
// 17, docs/PERF.md) gpt-oss-120b's MoE layer at 8 tokens per expert measured 560.6 us against 570.4 by cp.async.
inline constexpr bool kMoeWgmmaBulk = true;
// And with an expert's tiles paired by default (CudaMoeOptions::wgmma_bulk 0 = 3). H200, session 18 (docs/PERF.md):
// 120b's layer at T = 256 536.2 -> 519.3 us at a uniform routing, 616.6 -> 586.8 at a skewed one; 20b's at T = 64
// 142.0 -> 135.0 and 170.7 -> 166.0.
inline constexpr bool kMoeWgmmaBulkPairs = true;
Status launch_moe_wgmma_bulk_gemm(const MoeGemmParams& p, const MoeWgmmaConfig& c, bool warp_release, bool pairs,
                                  bool trim_rows, cudaStream_t stream);

Status launch_moe_gather_tiled(const uint16_t* x, const MoeRouting& r, uint16_t* out, int64_t max_tiles,
                               int tile_tokens, int64_t k, int64_t top_k, cudaStream_t stream);

// launch_moe_routing and then launch_moe_gather_tiled (p.tile_tokens, p.max_tiles) in one launch of many CTAs, the
// same routing metadata and tiled rows (x has k columns, a row per token), for steps where
// moe_route_gather_fits (every CTA counts all the step's ids: at most 4,096 slots, 256 experts).
// The tiled path's glue by default (CudaMoeOptions::wgmma_glue 0): 1 = the routing and the gather in one launch, the
// combine kernel, add_rms_norm; 2 = the combine in the norm's kernel too. H200, session 19 (docs/PERF.md), 120b's
// 256 tokens, one process, 5 rounds: the glue alone (GEMMs skipped) routing + gather 11.7 -> 5.3 us, with the combine
// and the norm 16.1 -> 14.7 (1) or 14.0 (2); the layer and the norm 558.6 -> 555.3 (1) or 550.1 (2) at a uniform
// routing, 605.1 -> 597.2 or 592.8 at skew 1.
inline constexpr int kMoeWgmmaGlue = 2;
bool moe_route_gather_fits(int64_t slots, int64_t experts);
Status launch_moe_route_gather_tiled(const MoeRoutingParams& p, const uint16_t* x, uint16_t* out, int64_t k,
                                     int64_t top_k, cudaStream_t stream);
// launch_moe_routing and then launch_moe_permute_k (x has `rows` rows of k columns, a row per token, rows x top_k =
// p.slots) in one launch of many CTAs, the same routing metadata and permuted x: the 96-, 128- and 256-token
// kernels' glue (CudaMoeOptions::wgmma_glue >= 1; -1 the two kernels), for steps where moe_route_permute_fits (every
// CTA counts all the step's ids: at most 65,536 slots, 256 experts).
bool moe_route_permute_fits(int64_t slots, int64_t experts);
Status launch_moe_route_permute(const MoeRoutingParams& p, const uint16_t* x, uint16_t* out, int64_t rows, int64_t k,
                                int64_t top_k, cudaStream_t stream);

}  // namespace mx::cuda
