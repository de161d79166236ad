// The device wait behind DeviceTimer::hold (profiling only).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {
namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void device_wait_kernel(uint64_t nanoseconds) {
  const uint64_t start = global_ns();
  while (global_ns() - start < nanoseconds) __nanosleep(1000);
}

}  // namespace

Status launch_device_wait(uint64_t nanoseconds, cudaStream_t stream) {
  device_wait_kernel<<<1, 1, 0, stream>>>(nanoseconds);
  return launch_status("device_wait_kernel");
}

}  // namespace mx::cuda
