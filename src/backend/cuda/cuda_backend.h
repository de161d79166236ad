// The CUDA backend: bf16 activations and paged KV cache, fp32 accumulation, MXFP4 experts repacked at
// upload into the swap-AB fragment layout. Everything runs on one stream owned by the backend; scratch is
// sized by prepare() so that forward passes allocate nothing and can be captured as CUDA graphs.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/cuda/device_info.h"

namespace mx {

Result<std::unique_ptr<Backend>> make_cuda_backend(int device);

}  // namespace mx
