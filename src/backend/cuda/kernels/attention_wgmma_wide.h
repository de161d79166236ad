// The wide-head wgmma prefill attention's launcher (attention_wgmma_wide.cu), apart from kernels.h so that
// adding it rebuilt no other kernel.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/attention_wide_config.h"
#include "backend/cuda/kernels/kernels.h"
#include "core/status.h"

namespace mx::cuda {

// Head dims 256 and 512 on wgmma for sm_90a; the config says whether the device and head dim have it.
Status launch_attention_prefill_wgmma_wide(const AttentionKernelParams& p, const AttentionWideWgmmaConfig& c,
                                           cudaStream_t stream);

}  // namespace mx::cuda
