// Token sampling on host logits: penalties (repetition, presence, frequency), then the backends' sampling
// algorithm (backend/sampling_math.h: greedy, or temperature with top-k, top-p and min-p and a Gumbel-max
// draw from a counter-based generator), so a seed reproduces its output whatever else is in the batch and
// the CPU engine picks what the CUDA sample op picks. Logprobs come from the raw model distribution
// (log-softmax of the logits before penalties and temperature), as vLLM reports them by default.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/sampling.h"

namespace mx::cpu {
class ThreadPool;
}  // namespace mx::cpu

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

// A request's random stream: draw n uses Philox keyed by (seed, n), so the n-th sampled token depends only
// on the seed and n, never on the batch or on which backend sampled it.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t step() const { return step_; }  // draws taken so far
  void advance() { ++step_; }
  // The stream `n` draws ahead, leaving this one where it is: a verify step samples row i with the draw its
  // token will have if the rows before it are accepted.
  Rng ahead(uint64_t n) const {
    Rng r = *this;
    r.step_ += n;
    return r;
  }

 private:
  uint64_t seed_ = 0;
  uint64_t step_ = 0;
};

// The sample op's row parameters for a request's next draw (penalties are not part of them).
SampleRowParams sample_row_params(const SamplingParams& params, const Rng& rng);

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
  // Greedy returns the first index of the maximum (as torch.argmax does). Takes one draw from `rng`. `pool` (may be
  // null; not one whose parallel_for this call runs inside) spreads the logprobs' passes over its threads.
  void sample(const float* logits, const SamplingParams& params, const PenaltyContext& penalties, Rng& rng,
              SampledToken* out, cpu::ThreadPool* pool = nullptr);
  // What sample() reports beside out->token (drawn already by the sample op from the same logits, or a forced test output): the
  // log-softmax of the raw logits at it and the top n, over kLogprobSlices fixed slices of the vocabulary (on
  // `pool`'s threads where given): each slice's largest logit and n best ids, then its sum of exponentials, the
  // sums added in slice order, so that a row's logprobs are the same on any number of threads.
  void fill_logprobs(const float* logits, const SamplingParams& params, cpu::ThreadPool* pool, SampledToken* out);

 private:
  void apply_penalties(const SamplingParams& params, const PenaltyContext& penalties);

  static constexpr int64_t kLogprobSlices = 16;
  int64_t vocab_;
  std::vector<float> work_;       // [vocab] logits after penalties
  std::vector<int32_t> ids_;      // [kLogprobSlices, top n] each slice's best ids, then the merged candidates
  std::vector<float> slice_max_;  // [kLogprobSlices]
  std::vector<double> slice_sum_; // [kLogprobSlices]
  cpu::SampleScratch scratch_;
  std::vector<int32_t> counts_;   // [vocab] occurrences in the output (zero between calls)
  std::vector<uint32_t> stamp_;   // [vocab] "seen in this call" marks for the repetition penalty
  uint32_t stamp_value_ = 0;
};

// One-shot convenience over a temporary Sampler (allocates; tests and the static generator use it).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng);

}  // namespace mx
