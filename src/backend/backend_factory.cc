// Picks a backend by name. The CUDA backend exists only in builds configured with nvcc.
#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/cpu/cpu_communicator.h"

#ifdef MX_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_communicator.h"
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

Result<std::vector<std::unique_ptr<Communicator>>> make_communicators(const std::vector<Backend*>& ranks) {
  if (ranks.empty()) return invalid_argument("a communicator group needs at least one rank");
  const Device device = ranks[0]->device();
  for (const Backend* b : ranks)
    if (b->device() != device) return invalid_argument("the ranks of a tensor-parallel group must be on one kind of backend");
  std::vector<std::unique_ptr<Communicator>> comms;
  if (device == Device::kCpu) {
    auto group = CpuCommGroup::create(static_cast<int>(ranks.size()));
    for (size_t r = 0; r < ranks.size(); ++r) comms.push_back(group->communicator(static_cast<int>(r)));
    return comms;
  }
#ifdef MX_HAVE_CUDA
  return make_nccl_communicators(ranks);
#else
  return unimplemented("tensor parallel on " + ranks[0]->name() + " needs a CUDA build");
#endif
}

}  // namespace mx
