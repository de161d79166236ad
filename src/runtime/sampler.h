// Token sampling on host logits: penalties (repetition, presence, frequency), then greedy at temperature 0
// or temperature with top-k, top-p and min-p filters, driven by a per-request seeded generator so a seed
// reproduces its output whatever else is in the batch. Logprobs come from the raw model distribution
// (log-softmax of the logits before penalties and temperature), as vLLM reports them by default.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mx {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int64_t top_k = 0;         // 0 = no limit
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  float presence_penalty = 0.0f;    // OpenAI: subtracted once from every token already generated
  float frequency_penalty = 0.0f;   // OpenAI: subtracted per occurrence in the generated tokens
  float repetition_penalty = 1.0f;  // HF/CTRL: divides positive (multiplies negative) logits of any token
                                    // seen in the prompt or the output; 1 = off
  int64_t top_logprobs = 0;         // with `logprobs`: also the n most likely tokens (n <= the engine's cap)
  bool logprobs = false;            // report the sampled token's logprob

  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
};

// xoshiro256** seeded through splitmix64: the same seed gives the same stream on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next();
  double uniform();  // [0, 1) with 53 random bits

 private:
  uint64_t s_[4];
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// One sampled token and, when asked for, its logprob and the top-n alternatives (most likely first).
struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

// The tokens penalties look at: the prompt (repetition only) and what has been generated so far.
struct PenaltyContext {
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
};

// Owns vocab-sized scratch so that sampling allocates nothing after construction (the `top` list of a
// SampledToken reuses its capacity). One per engine thread; not thread-safe.
class Sampler {
 public:
  explicit Sampler(int64_t vocab);

  int64_t vocab() const { return vocab_; }
  // Greedy returns the first index of the maximum (as torch.argmax does). Without top-k and top-p the
  // draw walks the kept tokens in id order (no sort); with them, in descending probability.
  void sample(const float* logits, const SamplingParams& params, const PenaltyContext& penalties, Rng& rng,
              SampledToken* out);

 private:
  void apply_penalties(const SamplingParams& params, const PenaltyContext& penalties);
  void fill_logprobs(const float* logits, const SamplingParams& params, SampledToken* out);

  int64_t vocab_;
  std::vector<float> work_;       // [vocab] logits after penalties, then probabilities
  std::vector<int32_t> ids_;      // [vocab] candidate ids
  std::vector<int32_t> counts_;   // [vocab] occurrences in the output (zero between calls)
  std::vector<uint32_t> stamp_;   // [vocab] "seen in this call" marks for the repetition penalty
  uint32_t stamp_value_ = 0;
};

// One-shot convenience over a temporary Sampler (allocates; tests and the static generator use it).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng);

}  // namespace mx
