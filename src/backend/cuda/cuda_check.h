// Error plumbing and RAII owners for CUDA runtime resources. Every CUDA call's result becomes a Status;
// every resource is released by a destructor (DESIGN.md 8.4). cuBLASLt's are in cublaslt_linear.h: every
// .cu includes this header, and nvcc parses it once per architecture.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "core/status.h"

namespace mx::cuda {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return internal_error(std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// The launch error of the kernel just issued (configuration, resources); execution errors surface at the
// next synchronizing call.
inline Status launch_status(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

}  // namespace mx::cuda

#define MX_CUDA_RETURN_IF_ERROR(expr) MX_RETURN_IF_ERROR(::mx::cuda::cuda_status((expr), #expr))

namespace mx::cuda {

// A move-only owner of one handle with a release function.
template <typename T, void (*Release)(T)>
class Owned {
 public:
  Owned() = default;
  explicit Owned(T h) : h_(h) {}
  ~Owned() { reset(); }
  Owned(Owned&& o) noexcept : h_(std::exchange(o.h_, T{})) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, T{});
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  T get() const { return h_; }
  explicit operator bool() const { return h_ != T{}; }
  void reset() {
    if (h_ != T{}) Release(h_);
    h_ = T{};
  }

 private:
  T h_{};
};

inline void release_stream(cudaStream_t s) { cudaStreamDestroy(s); }
inline void release_event(cudaEvent_t e) { cudaEventDestroy(e); }
inline void release_graph(cudaGraph_t g) { cudaGraphDestroy(g); }
inline void release_graph_exec(cudaGraphExec_t g) { cudaGraphExecDestroy(g); }
inline void release_device_memory(void* p) { cudaFree(p); }

using CudaStream = Owned<cudaStream_t, release_stream>;
using CudaEvent = Owned<cudaEvent_t, release_event>;
using CudaGraph = Owned<cudaGraph_t, release_graph>;
using CudaGraphExec = Owned<cudaGraphExec_t, release_graph_exec>;

}  // namespace mx::cuda
