// Picks a backend by name. The CUDA backend exists only in builds configured with nvcc.
#include "backend/backend.h"

#ifdef MX_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace mx {

Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  if (options.name == "cpu") return make_cpu_backend(CpuBackendOptions{options.num_threads});
  if (options.name == "cuda") {
#ifdef MX_HAVE_CUDA
    return make_cuda_backend(options.device);
#else
    return unimplemented("this mxserve was built without CUDA (no nvcc at configure time); use --backend cpu");
#endif
  }
  return invalid_argument("unknown backend '" + options.name + "' (cpu or cuda)");
}

}  // namespace mx
