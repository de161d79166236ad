// launch_moe_fused_gemm (kernels.h) in either form of the MXFP4 decode GEMMs (moe_decode_config.h): the scales
// staged in shared memory (what kernels.h's launcher runs) or in the ring's registers (the form before).
#pragma once

#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/moe_decode_config.h"

namespace mx::cuda {

// `mask_route`: the staged first GEMM, self-routed at <= 8 slots (one tile an expert) and <= 128 experts, finds its
// tile's expert in a mask of the busy experts instead of route_tile's pass over the slots (the same tiles and bits).
Status launch_moe_fused_gemm(const MoeFusedParams& p, const MoeFusedConfig& c, bool scales_in_registers,
                             cudaStream_t stream, bool mask_route = true);

}  // namespace mx::cuda
