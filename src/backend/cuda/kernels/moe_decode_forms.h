// launch_moe_fused_gemm (kernels.h) in either form of the MXFP4 decode GEMMs (moe_decode_config.h): the scales
// staged in shared memory (what kernels.h's launcher runs) or in the ring's registers (the form before).
#pragma once

#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/moe_decode_config.h"

namespace mx::cuda {

Status launch_moe_fused_gemm(const MoeFusedParams& p, const MoeFusedConfig& c, bool scales_in_registers,
                             cudaStream_t stream);

}  // namespace mx::cuda
