// Sampling: greedy picks the first maximum; seeded sampling reproduces; filters cut the right tokens.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
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
