// Penalties and logprobs on the host; the draw itself is the backends' algorithm (cpu::sample_row).
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/thread_pool.h"

namespace mx {

SampleRowParams sample_row_params(const SamplingParams& params, const Rng& rng) {
  SampleRowParams row;
  row.temperature = params.temperature;
  row.top_p = params.top_p;
  row.min_p = params.min_p;
  row.top_k = params.top_k > 0 && params.top_k < std::numeric_limits<int32_t>::max()
                  ? static_cast<int32_t>(params.top_k)
                  : 0;
  row.seed = rng.seed();
  row.step = rng.step();
  return row;
}

Sampler::Sampler(int64_t vocab)
    : vocab_(vocab),
      work_(static_cast<size_t>(vocab)),
      slice_max_(static_cast<size_t>(kLogprobSlices)),
      slice_sum_(static_cast<size_t>(kLogprobSlices)),
      counts_(static_cast<size_t>(vocab), 0),
      stamp_(static_cast<size_t>(vocab), 0) {}

void Sampler::apply_penalties(const SamplingParams& params, const PenaltyContext& penalties) {
  float* w = work_.data();
  if (params.repetition_penalty != 1.0f) {
    // Each distinct token once, whether it appears in the prompt, the output or both.
    if (++stamp_value_ == 0) {
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      stamp_value_ = 1;
    }
    const float rp = params.repetition_penalty;
    for (auto tokens : {penalties.prompt, penalties.output}) {
      for (int32_t t : tokens) {
        if (t < 0 || t >= vocab_ || stamp_[static_cast<size_t>(t)] == stamp_value_) continue;
        stamp_[static_cast<size_t>(t)] = stamp_value_;
        w[t] = w[t] > 0 ? w[t] / rp : w[t] * rp;
      }
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    for (int32_t t : penalties.output)
      if (t >= 0 && t < vocab_) ++counts_[static_cast<size_t>(t)];
    for (int32_t t : penalties.output) {
      if (t < 0 || t >= vocab_) continue;
      int32_t& c = counts_[static_cast<size_t>(t)];
      if (c == 0) continue;  // already applied for an earlier occurrence
      w[t] -= params.presence_penalty + params.frequency_penalty * static_cast<float>(c);
      c = 0;  // leaves the scratch zeroed for the next call
    }
  }
}

void Sampler::fill_logprobs(const float* logits, const SamplingParams& params, cpu::ThreadPool* pool,
                            SampledToken* out) {
  const int64_t n = std::clamp<int64_t>(params.top_logprobs, 0, vocab_);
  const int64_t slice = (vocab_ + kLogprobSlices - 1) / kLogprobSlices;
  ids_.resize(static_cast<size_t>(kLogprobSlices * n));
  auto over_slices = [&](const auto& fn) {
    auto run = [&](int64_t first, int64_t last) {
      for (int64_t s = first; s < last; ++s) fn(s, s * slice, std::min(vocab_, (s + 1) * slice));
    };
    if (pool) pool->parallel_for(kLogprobSlices, 1, run);
    else run(0, kLogprobSlices);
  };
  // Most likely first: the larger logit, then the smaller id.
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  over_slices([&](int64_t s, int64_t begin, int64_t end) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = begin; i < end; ++i) m = logits[i] > m ? logits[i] : m;  // vectorizes
    slice_max_[static_cast<size_t>(s)] = m;
    // The slice's n best, in order, by insertion: most logits fall below the n-th best so far at one comparison.
    int32_t* best = ids_.data() + s * n;
    int64_t have = 0;
    for (int64_t i = begin; i < end && n > 0; ++i) {
      if (have == n && !before(static_cast<int32_t>(i), best[n - 1])) continue;
      int64_t at = have < n ? have++ : n - 1;
      for (; at > 0 && before(static_cast<int32_t>(i), best[at - 1]); --at) best[at] = best[at - 1];
      best[at] = static_cast<int32_t>(i);
    }
    for (int64_t k = have; k < n; ++k) best[k] = -1;  // a slice shorter than n
  });
  const float max = *std::max_element(slice_max_.begin(), slice_max_.end());
  over_slices([&](int64_t s, int64_t begin, int64_t end) {
    double sum = 0;
    for (int64_t i = begin; i < end; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
    slice_sum_[static_cast<size_t>(s)] = sum;
  });
  double sum = 0;
  for (double s : slice_sum_) sum += s;
  const float log_z = max + static_cast<float>(std::log(sum));
  out->logprob = logits[out->token] - log_z;
  out->top.clear();
  if (n <= 0) return;
  std::erase(ids_, -1);
  std::partial_sort(ids_.begin(), ids_.begin() + n, ids_.end(), before);
  for (int64_t i = 0; i < n; ++i) out->top.push_back({ids_[static_cast<size_t>(i)], logits[ids_[static_cast<size_t>(i)]] - log_z});
}

void Sampler::sample(const float* logits, const SamplingParams& params, const PenaltyContext& penalties, Rng& rng,
                     SampledToken* out, cpu::ThreadPool* pool) {
  const float* scores = logits;
  if (params.has_penalties()) {
    std::copy(logits, logits + vocab_, work_.begin());
    apply_penalties(params, penalties);
    scores = work_.data();
  }
  out->token = cpu::sample_row(scores, vocab_, sample_row_params(params, rng), &scratch_, false).token;
  rng.advance();
  if (params.logprobs) fill_logprobs(logits, params, pool, out);
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng) {
  Sampler sampler(vocab);
  SampledToken out;
  sampler.sample(logits, params, PenaltyContext{}, rng, &out);
  return out.token;
}

}  // namespace mx
