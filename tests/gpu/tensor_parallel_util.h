// What the GPU tests of tensor parallel share: whether this machine can run a case of
// test::kTensorParallelCases, and the load options that ask for its MoE split.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "fixture_reference_util.h"
#include "model/load_options.h"

namespace mx::gpu_test {

// Why case `c` cannot run here (fewer visible GPUs than ranks, or c.not_on_cuda), or empty: the tests skip
// with it.
inline std::string tensor_parallel_skip_reason(const test::TensorParallelCase& c) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  const std::string tp = std::to_string(c.tp);
  if (devices < c.tp) return "TP " + tp + " on CUDA needs " + tp + " GPUs; " + std::to_string(devices) + " visible";
  if (c.not_on_cuda) return c.fixture + " at TP " + tp + ": " + c.not_on_cuda;
  return {};
}

inline ModelLoadOptions tensor_parallel_load_options(const test::TensorParallelCase& c) {
  ModelLoadOptions options;
  options.moe_split = c.moe_split;
  return options;
}

}  // namespace mx::gpu_test
