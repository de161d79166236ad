// Helpers of the GPU tests: both backends side by side, random bf16 data, poisoned device outputs, error
// measures, and the pass/fail table printed at the end (and written to $MX_GPU_REPORT when set).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace mx::gpu_test {

struct Row {
  std::string test, detail;
  double rel_l2 = 0, max_abs = 0, tol = 0;
  bool pass = false;
};
void record(const std::string& test, const std::string& detail, double rel_l2, double max_abs, double tol, bool pass);
std::vector<Row>& rows();

struct Errors {
  double rel_l2 = 0, max_abs = 0;
  int64_t non_finite = 0;
};
Errors compare(const std::vector<float>& got, const std::vector<float>& want);
// Records a row and fails the current test when rel-L2 > tol or any value is not finite.
void check(const std::string& test, const std::string& detail, const std::vector<float>& got,
           const std::vector<float>& want, double tol);

// bf16-representable random values: `bits` are what the device gets, `values` the CPU twin's f32 copy.
struct Bf16Data {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
Bf16Data random_bf16(std::mt19937& rng, int64_t n, float stddev);
// ~N(0, stddev) as the sum of four 16-bit uniforms per 64-bit draw (tails cut at 3.46 stddev): for tables of
// hundreds of millions of values (26B-A4B's experts, long KV caches), which normal_distribution on mt19937
// takes seconds to draw; blocks of 2^20 values drawn on all host cores, each from its own generator seeded by
// one draw of `rng`. The bits alone, or both copies (`rng` seeds a 64-bit generator).
std::vector<uint16_t> quick_random_bf16_bits(std::mt19937_64& rng, int64_t n, float stddev);
Bf16Data quick_random_bf16(std::mt19937& rng, int64_t n, float stddev);

// Owns device (or host) buffers of one backend and copies data in and out.
class Arena {
 public:
  explicit Arena(Backend& b) : b_(b) {}
  TensorView make(DType dtype, Shape shape);          // poisoned (all bytes 0xff: NaN in bf16/f32)
  TensorView upload(DType dtype, Shape shape, const void* host);
  std::vector<float> download_f32(const TensorView& t);  // bf16 or f32 -> f32
  std::vector<uint8_t> download_bytes(const TensorView& t);
  Backend& backend() { return b_; }

 private:
  TensorView allocate(DType dtype, Shape shape);  // not initialized

  Backend& b_;
  std::vector<Buffer> buffers_;
};

// A tensor of activations for both backends: bf16 on CUDA, f32 (same values) on the CPU.
struct Pair {
  TensorView cpu, cuda;
};
Pair upload_activation(Arena& cpu, Arena& cuda, const Bf16Data& d, Shape shape);

// Fresh inputs every run; the seed is printed so a failure can be replayed with MX_GPU_TEST_SEED=<seed>.
uint32_t test_seed();

Backend& cuda_backend();
Backend& cpu_backend();

// Runs `op` on `b` eagerly, or (replay) captures it into a graph and replays that once: the status of the call, the
// capture or the replay, whichever failed.
Status run_eager_or_replayed(Backend& b, bool replay, const std::function<Status()>& op);

}  // namespace mx::gpu_test
