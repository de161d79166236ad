// The CPU twin of the sample op (backend/sampling_math.h defines the algorithm). It finds the top-k and
// top-p cuts by one radix pass (counts or masses per bucket of the order key's top 16 bits) and a sort of the one
// bucket the cut falls in, where the CUDA kernels use full radix selects, and must land on the same cuts. The
// runtime's host Sampler calls sample_row directly (after penalties) so that CPU and CUDA engines sample
// alike.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "backend/sampling_math.h"

namespace mx::cpu {

// Reused between calls so that sampling a row allocates nothing once warm.
struct SampleScratch {
  std::vector<int32_t> ids;
  std::vector<uint64_t> mass;         // by id
  std::vector<uint32_t> counts;       // top-k: tokens per bucket
  std::vector<uint64_t> bucket_mass;  // top-p: mass per bucket
  int64_t ranked = 0;  // the last row's cuts: tokens they sorted or selected among (their work beyond passes over the row)
};

struct SampledRow {
  int32_t token = 0;
  float logprob = 0.0f;  // log-softmax of the raw logits at `token`; -inf when no logit is finite
};

// Upper bounds of the Gumbel variate gumbel_key(0, word) over the 256 ranges of `word >> 24`, for the CPU
// draw's exact shortcut (a token whose scaled logit plus its bound is below the best key cannot win).
const std::array<float, 256>& gumbel_bounds();

// Sets the logits of the tokens `mask_row` disallows to -inf (sampling_math.h token_allowed).
void apply_token_mask(float* logits, int64_t vocab, const uint32_t* mask_row);

// Without `with_logprob` the row's log-sum-exp pass is skipped and `logprob` is left at 0.
SampledRow sample_row(const float* logits, int64_t vocab, const SampleRowParams& params, SampleScratch* scratch,
                      bool with_logprob = true);

}  // namespace mx::cpu
