// The CUDA backend: bf16 activations and KV cache, fp32 accumulation, MXFP4 experts.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace mx {

Result<std::unique_ptr<Backend>> make_cuda_backend(int device);

}  // namespace mx
