#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

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

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, Rng& rng) {
  if (params.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  // Candidates sorted by logit, highest first (ties: lower id first), cut by top-k.
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = (params.top_k > 0 && params.top_k < vocab) ? params.top_k : vocab;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_logit);
  ids.resize(static_cast<size_t>(k));
  std::vector<double> probs(ids.size());
  const double top = logits[ids[0]];
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    probs[i] = std::exp((logits[ids[i]] - top) / params.temperature);
    sum += probs[i];
  }
  for (auto& p : probs) p /= sum;
  // min-p: drop tokens below min_p times the most likely one.
  size_t keep = probs.size();
  if (params.min_p > 0.0f) {
    while (keep > 1 && probs[keep - 1] < params.min_p * probs[0]) --keep;
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (params.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += probs[i];
      if (mass >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double total = std::accumulate(probs.begin(), probs.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  double u = rng.uniform() * total;
  for (size_t i = 0; i < keep; ++i) {
    u -= probs[i];
    if (u < 0) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace mx
