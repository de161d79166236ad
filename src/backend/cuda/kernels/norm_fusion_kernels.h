// Launches of the residual add + RMSNorm fused with a neighbour op at decode, apart from kernels.h (which every
// kernel file includes: a change here rebuilds only the files that use these).
#pragma once

#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {

// router.cu: add_rms_norm (`norm`: residual += delta, out = rms_norm(residual) * weight) and then the router of its
// out (route.x == norm.out) in one launch, one CTA cluster of the token's expert blocks per token, each computing the
// normed row (the same bits as launch_rms_norm, then launch_router_topk). Where can_fuse_add_rms_norm_route says.
Result<bool> can_fuse_add_rms_norm_route(const RmsNormParams& norm, const RouterKernelParams& route);
Status launch_add_rms_norm_route(const RmsNormParams& norm, const RouterKernelParams& route, cudaStream_t stream);

}  // namespace mx::cuda
