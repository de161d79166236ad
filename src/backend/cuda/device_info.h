// What the kernel config functions need to know about a GPU, read once from the driver.
// Kept free of CUDA headers so that CPU code and CPU tests can build DeviceInfo values for any chip.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace mx::cuda {

struct DeviceInfo {
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  int sm_count = 0;
  int64_t max_smem_per_block_optin = 0;  // bytes; cudaDevAttrMaxSharedMemoryPerBlockOptin
  int64_t global_memory_bytes = 0;
  int64_t l2_cache_bytes = 0;
};

Result<DeviceInfo> query_device_info(int device);

}  // namespace mx::cuda
