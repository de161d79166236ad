// Sampling order: penalties -> (greedy | temperature -> top-k -> softmax -> min-p -> top-p -> draw).
// The filters' semantics match the static generator this replaced: probabilities are normalised over the
// top-k set, min-p compares against the most likely token, top-p keeps the smallest prefix reaching p.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace mx {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

Sampler::Sampler(int64_t vocab)
    : vocab_(vocab),
      work_(static_cast<size_t>(vocab)),
      ids_(static_cast<size_t>(vocab)),
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

void Sampler::fill_logprobs(const float* logits, const SamplingParams& params, SampledToken* out) {
  const float max = *std::max_element(logits, logits + vocab_);
  double sum = 0;
  for (int64_t i = 0; i < vocab_; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const float log_z = max + static_cast<float>(std::log(sum));
  out->logprob = logits[out->token] - log_z;
  out->top.clear();
  const int64_t n = std::min(params.top_logprobs, vocab_);
  if (n <= 0) return;
  std::iota(ids_.begin(), ids_.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids_.begin(), ids_.begin() + n, ids_.end(), by_logit);
  for (int64_t i = 0; i < n; ++i) out->top.push_back({ids_[static_cast<size_t>(i)], logits[ids_[static_cast<size_t>(i)]] - log_z});
}

void Sampler::sample(const float* logits, const SamplingParams& params, const PenaltyContext& penalties, Rng& rng,
                     SampledToken* out) {
  const float* scores = logits;
  if (params.has_penalties()) {
    std::copy(logits, logits + vocab_, work_.begin());
    apply_penalties(params, penalties);
    scores = work_.data();
  }
  if (params.temperature <= 0.0f) {
    out->token = static_cast<int32_t>(std::max_element(scores, scores + vocab_) - scores);
  } else {
    // Candidates: all ids in id order, or sorted by score (highest first, ties lower id first) when a
    // filter needs the order.
    auto by_score = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
    std::iota(ids_.begin(), ids_.end(), 0);
    int64_t n = vocab_;
    const bool sorted = (params.top_k > 0 && params.top_k < vocab_) || params.top_p < 1.0f;
    if (params.top_k > 0 && params.top_k < vocab_) {
      n = params.top_k;
      std::nth_element(ids_.begin(), ids_.begin() + (n - 1), ids_.end(), by_score);
      std::sort(ids_.begin(), ids_.begin() + n, by_score);
    } else if (sorted) {
      std::sort(ids_.begin(), ids_.end(), by_score);
    }
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) top = std::max(top, scores[ids_[static_cast<size_t>(i)]]);
    // Unnormalised probabilities exp((s - top) / T) in [0, 1]; the most likely token has 1.
    std::vector<float>& prob = work_;  // indexed by id; safe to overwrite scores now
    const float* s = scores;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t id = ids_[static_cast<size_t>(i)];
      const float p = static_cast<float>(std::exp((static_cast<double>(s[id]) - top) / params.temperature));
      prob[static_cast<size_t>(id)] = p;
      sum += p;
    }
    // min-p: drop tokens below min_p times the most likely one (keeps order).
    if (params.min_p > 0.0f) {
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int32_t id = ids_[static_cast<size_t>(i)];
        if (prob[static_cast<size_t>(id)] >= params.min_p) ids_[static_cast<size_t>(kept++)] = id;
      }
      n = std::max<int64_t>(kept, 1);
    }
    // top-p: the smallest prefix (in descending order) whose mass, normalised over the top-k set, reaches p.
    if (params.top_p < 1.0f) {
      double mass = 0;
      for (int64_t i = 0; i < n; ++i) {
        mass += prob[static_cast<size_t>(ids_[static_cast<size_t>(i)])] / sum;
        if (mass >= params.top_p) {
          n = i + 1;
          break;
        }
      }
    }
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += prob[static_cast<size_t>(ids_[static_cast<size_t>(i)])];
    double u = rng.uniform() * total;
    out->token = ids_[static_cast<size_t>(n - 1)];
    for (int64_t i = 0; i < n; ++i) {
      u -= prob[static_cast<size_t>(ids_[static_cast<size_t>(i)])];
      if (u < 0) {
        out->token = ids_[static_cast<size_t>(i)];
        break;
      }
    }
  }
  if (params.logprobs) fill_logprobs(logits, params, out);
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng) {
  Sampler sampler(vocab);
  SampledToken out;
  sampler.sample(logits, params, PenaltyContext{}, rng, &out);
  return out.token;
}

}  // namespace mx
