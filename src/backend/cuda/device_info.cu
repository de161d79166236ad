#include "backend/cuda/device_info.h"

#include <cuda_runtime.h>

namespace mx::cuda {

Result<DeviceInfo> query_device_info(int device) {
  cudaDeviceProp prop{};
  if (cudaError_t err = cudaGetDeviceProperties(&prop, device); err != cudaSuccess)
    return internal_error(std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(err));
  int smem_optin = 0;
  if (cudaError_t err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      err != cudaSuccess)
    return internal_error(std::string("cudaDeviceGetAttribute: ") + cudaGetErrorString(err));
  DeviceInfo info;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.max_smem_per_block_optin = smem_optin;
  info.global_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.l2_cache_bytes = prop.l2CacheSize;
  return info;
}

}  // namespace mx::cuda
