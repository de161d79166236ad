// Launches of the residual add + RMSNorm fused with a neighbour op at decode, apart from kernels.h (which every
// kernel file includes: a change here rebuilds only the files that use these).
#pragma once

#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {

// router.cu: add_rms_norm (`norm`: residual += delta, out = rms_norm(residual) * weight) and then the router of its
// out (route.x == norm.out) in one launch, each of the token's expert blocks computing the normed row (the same bits
// as launch_rms_norm, then launch_router_topk): as one CTA cluster per token, or (more blocks than a cluster takes:
// 120b's 16) with route.tickets set, the last CTA of the token storing the residual and selecting the top-k. Where
// can_fuse_add_rms_norm_route says.
Result<bool> can_fuse_add_rms_norm_route(const RmsNormParams& norm, const RouterKernelParams& route);
Status launch_add_rms_norm_route(const RmsNormParams& norm, const RouterKernelParams& route, cudaStream_t stream);

// norm_embed.cu: an MoE layer's combine as add_rms_norm's delta: delta[t] = the sum over j in router order of
// y[pos(t, j)] (bf16 y rows in the experts' sorted order, fp32 sum, rounded to bf16: launch_moe_combine's and the
// decode GEMM's fused combine's arithmetic), so residual, out are launch_rms_norm's bits after that combine.
// pos from slot_pos (a routing kernel's metadata, any slot count) or, without it, computed from topk_ids as the
// self-routed decode GEMMs do (<= kMoeFusedMaxSlots routed slots). norm.delta unused.
struct MoeCombineNormParams {
  const uint16_t* y = nullptr;         // bf16 [slots, hidden], rows in the sorted order
  const int32_t* topk_ids = nullptr;   // [tokens, top_k] (without slot_pos)
  const int32_t* slot_pos = nullptr;   // [tokens * top_k] y's row of slot t * top_k + j, or null
  int slots = 0, experts = 0, top_k = 0;
  // Let the programmatic dependent launch before this kernel's wait (a dependent's pre-wait part may then run beside
  // this kernel's predecessors, so it must read only what the step did not write: the skinny linears' weights).
  bool dependents_first = false;
};
Status launch_moe_combine_add_rms_norm(const RmsNormParams& norm, const MoeCombineNormParams& moe, cudaStream_t stream);

}  // namespace mx::cuda
