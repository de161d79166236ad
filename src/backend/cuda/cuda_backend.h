// The CUDA backend: bf16 activations and paged KV cache, fp32 accumulation, MXFP4 experts repacked at
// upload into the swap-AB fragment layout. Everything runs on one stream owned by the backend; scratch is
// sized by prepare() so that forward passes allocate nothing and can be captured as CUDA graphs.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cuda/device_info.h"

namespace mx {

Result<std::unique_ptr<Backend>> make_cuda_backend(int device);

// Which MXFP4 expert GEMMs moe_experts runs: by tokens per expert (kAuto, kernel_configs.h), or forced
// (tests and benchmarks compare both paths on the same shapes); `grouped_tile_tokens` (64 or 128, 0 =
// by tokens per expert) forces the grouped kernel's tile. Process-wide.
enum class CudaMoePath { kAuto, kDecode, kGrouped };
void set_cuda_moe_path(CudaMoePath path, int grouped_tile_tokens = 0);

}  // namespace mx
