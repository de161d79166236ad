// Token sampling on host logits: greedy at temperature 0, else temperature with top-k, top-p and min-p
// filters, driven by a per-request seeded generator so a seed reproduces its output.
#pragma once

#include <cstdint>

namespace mx {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = no limit
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
};

// xoshiro256** seeded through splitmix64: the same seed gives the same stream on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1) with 53 random bits

 private:
  uint64_t s_[4];
};

// Greedy returns the first index of the maximum (as torch.argmax does).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng);

}  // namespace mx
