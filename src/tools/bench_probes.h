// Device yardsticks measured by the benchmarks at start-up: device-to-device copy bandwidth (bytes read +
// written per second: the decode floor's divisor) and a large bf16 GEMM's rate through the backend's own
// linear op (the prefill floor's divisor). CUDA events where the backend has a timer, else wall clock.
#pragma once

#include <functional>
#include <string>

#include "backend/backend.h"

namespace mx {

struct DeviceProbes {
  double copy_bytes_per_s = 0;  // 2 x bytes / time of one copy (read + write)
  int64_t copy_bytes = 0;
  double gemm_flops_per_s = 0;  // 2 n^3 / time
  int64_t gemm_n = 0;
  std::string clock;            // "cuda events" or "wall clock"
};

Result<DeviceProbes> measure_device_probes(Backend& backend);

// Median milliseconds of `reps` runs of `op` (after one unmeasured run).
Result<double> median_op_ms(Backend& backend, const std::function<Status()>& op, int reps);

}  // namespace mx
