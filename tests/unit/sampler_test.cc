// Sampling: greedy picks the first maximum; seeded sampling reproduces; filters cut the right tokens.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace mx {
namespace {

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  Rng rng(1);
  EXPECT_EQ(sample_token(logits.data(), 4, SamplingParams{}, rng), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits = {1.0f, 1.1f, 0.9f, 1.05f, 0.5f};
  SamplingParams p;
  p.temperature = 1.0f;
  Rng a(42), b(42), c(43);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 50; ++i) {
    sa.push_back(sample_token(logits.data(), 5, p, a));
    sb.push_back(sample_token(logits.data(), 5, p, b));
    sc.push_back(sample_token(logits.data(), 5, p, c));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // probabilities 1/4, 3/4
  SamplingParams p;
  p.temperature = 1.0f;
  Rng rng(7);
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += sample_token(logits.data(), 2, p, rng);
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.015);
}

TEST(Sampler, TopKTopPMinPFilters) {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  auto support = [&](SamplingParams p) {
    p.temperature = 1.0f;
    Rng rng(3);
    std::map<int32_t, int> seen;
    for (int i = 0; i < 3000; ++i) ++seen[sample_token(logits.data(), 4, p, rng)];
    return seen.size();
  };
  SamplingParams k;
  k.top_k = 2;
  EXPECT_EQ(support(k), 2u);
  SamplingParams tp;
  tp.top_p = 0.75f;  // 0.5 + 0.3 reaches it
  EXPECT_EQ(support(tp), 2u);
  SamplingParams mp;
  mp.min_p = 0.2f;  // keeps p >= 0.1
  EXPECT_EQ(support(mp), 3u);
}

TEST(ThreadPool, EveryIndexOnceInContiguousChunks) {
  cpu::ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<int> hits(static_cast<size_t>(n), 0);
    pool.parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
    });
    for (int h : hits) ASSERT_EQ(h, 1);
  }
}

}  // namespace
}  // namespace mx

namespace mx {
namespace {

TEST(Sampler, PenaltiesFollowTheirDefinitions) {
  // Logits 2, 1, -1, 0.5 over 4 tokens; the output so far is [0, 0, 2], the prompt [3].
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f, 0.5f};
  const std::vector<int32_t> prompt = {3}, output = {0, 0, 2};
  Sampler sampler(4);
  Rng rng(0);
  SampledToken out;
  SamplingParams p;
  // Frequency 0.8 per occurrence: token 0 drops to 2 - 1.6 = 0.4, so token 1 (1.0) wins greedily.
  p.frequency_penalty = 0.8f;
  sampler.sample(logits.data(), p, {prompt, output}, rng, &out);
  EXPECT_EQ(out.token, 1);
  // Presence 0.9 once: token 0 at 1.1 still beats 1.0.
  p = SamplingParams{};
  p.presence_penalty = 0.9f;
  sampler.sample(logits.data(), p, {prompt, output}, rng, &out);
  EXPECT_EQ(out.token, 0);
  p.presence_penalty = 1.1f;
  sampler.sample(logits.data(), p, {prompt, output}, rng, &out);
  EXPECT_EQ(out.token, 1);
  // Repetition 3 divides positive logits of seen tokens (prompt included): 2/3 and 0.5/3; token 1 wins.
  p = SamplingParams{};
  p.repetition_penalty = 3.0f;
  sampler.sample(logits.data(), p, {prompt, output}, rng, &out);
  EXPECT_EQ(out.token, 1);
  // Negative penalties reward repeats.
  p = SamplingParams{};
  p.presence_penalty = -2.0f;
  const std::vector<int32_t> out2 = {2};
  sampler.sample(logits.data(), p, {prompt, out2}, rng, &out);
  EXPECT_EQ(out.token, 0);  // -1 + 2 = 1 < 2
  // Scratch counts are left clean: a penalty-free call after penalised ones is plain greedy.
  sampler.sample(logits.data(), SamplingParams{}, {prompt, output}, rng, &out);
  EXPECT_EQ(out.token, 0);
}

TEST(Sampler, LogprobsAreTheRawLogSoftmaxWithTopN) {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.6f), std::log(0.3f)};
  Sampler sampler(3);
  Rng rng(5);
  SamplingParams p;
  p.logprobs = true;
  p.top_logprobs = 2;
  p.frequency_penalty = 2.0f;  // penalties change the choice, not the reported distribution
  const std::vector<int32_t> output = {1};
  SampledToken out;
  sampler.sample(logits.data(), p, {{}, output}, rng, &out);
  EXPECT_EQ(out.token, 2);
  EXPECT_NEAR(out.logprob, std::log(0.3), 1e-5);
  ASSERT_EQ(out.top.size(), 2u);
  EXPECT_EQ(out.top[0].token, 1);
  EXPECT_NEAR(out.top[0].logprob, std::log(0.6), 1e-5);
  EXPECT_EQ(out.top[1].token, 2);
}

// fill_logprobs over fixed slices of the vocabulary, with and without a pool: the same bits either way, and what
// one pass and one sort over the whole vocabulary give (ties broken by the smaller id; vocabularies shorter than
// the slices, slices shorter than n).
TEST(Sampler, LogprobsOverSlicesMatchOneSortOnAnyThreads) {
  cpu::ThreadPool pool(3);
  std::mt19937 gen(11);
  for (const int64_t vocab : {3, 17, 1000, 201088}) {
    std::vector<float> logits(static_cast<size_t>(vocab));
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (float& x : logits) x = std::round(d(gen) * 8) / 8;  // many ties
    for (const int64_t n : {0, 1, 5, 20}) {
      SamplingParams p;
      p.logprobs = true;
      p.top_logprobs = n;
      SampledToken alone, pooled;
      Sampler a(vocab), b(vocab);
      Rng ra(3), rb(3);
      a.sample(logits.data(), p, {}, ra, &alone);
      b.sample(logits.data(), p, {}, rb, &pooled, &pool);
      ASSERT_EQ(alone.token, pooled.token);
      EXPECT_EQ(std::memcmp(&alone.logprob, &pooled.logprob, sizeof(float)), 0) << vocab << " " << n;
      ASSERT_EQ(alone.top.size(), pooled.top.size());
      for (size_t k = 0; k < alone.top.size(); ++k) {
        EXPECT_EQ(alone.top[k].token, pooled.top[k].token);
        EXPECT_EQ(std::memcmp(&alone.top[k].logprob, &pooled.top[k].logprob, sizeof(float)), 0);
      }
      // One pass and one sort.
      const float max = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
      const double log_z = max + std::log(sum);
      std::vector<int32_t> ids(static_cast<size_t>(vocab));
      std::iota(ids.begin(), ids.end(), 0);
      std::stable_sort(ids.begin(), ids.end(), [&](int32_t x, int32_t y) { return logits[x] > logits[y]; });
      EXPECT_NEAR(alone.logprob, logits[static_cast<size_t>(alone.token)] - log_z, 1e-5);
      ASSERT_EQ(alone.top.size(), static_cast<size_t>(std::min(n, vocab)));
      for (size_t k = 0; k < alone.top.size(); ++k) {
        EXPECT_EQ(alone.top[k].token, ids[k]) << vocab << " " << n << " " << k;
        EXPECT_NEAR(alone.top[k].logprob, logits[static_cast<size_t>(ids[k])] - log_z, 1e-5);
      }
    }
  }
}

TEST(Sampler, MinPAndTopKTogether) {
  std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 3;
  p.min_p = 0.6f;  // of the top 3, keeps p >= 0.24: tokens 0 and 1
  Rng rng(9);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[sample_token(logits.data(), 4, p, rng)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(0) && seen.count(1));
}

}  // namespace
}  // namespace mx
