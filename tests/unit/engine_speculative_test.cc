// Speculative decoding with the n-gram drafter on the tiny fixtures: the same tokens as plain decoding
// (greedy, and seeded sampling with filters and penalties: a verify row takes the draw its token would have
// had, so sample-and-compare acceptance reproduces plain decoding exactly), the acceptance counters move (so
// the equality is not vacuous), aborts leave no page used, stop strings and max_tokens cut an accepted run.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "spec/ngram_drafter.h"

namespace mx::test {
namespace {

EngineConfig spec_config(int64_t k) {
  EngineConfig c;
  c.page_size = 4;  // small pages: rollback crosses page boundaries
  if (k > 0) {
    c.speculative.algorithm = SpeculativeAlgorithm::kNgram;
    c.speculative.num_draft_tokens = k;
    c.speculative.ngram_min = 1;
    c.speculative.ngram_max = 3;
  }
  return c;
}

DriveResult run(const Fixture& fx, const EngineConfig& config, const std::vector<Arrival>& arrivals,
                const StepHook& hook = {}) {
  auto core = EngineCore::create(*fx.model, config);
  EXPECT_TRUE(core.is_ok()) << core.status().to_string();
  DriveResult r = drive(**core, arrivals, hook);
  EXPECT_EQ(r.error, "");
  return r;
}

std::vector<int32_t> repetitive_prompt(int64_t vocab) {
  std::vector<int32_t> p;
  for (int rep = 0; rep < 6; ++rep)
    for (int32_t t : {3, 17, 42, 9, 25}) p.push_back(t % static_cast<int32_t>(vocab));
  return p;
}

TEST(NgramDrafter, ProposesWhatFollowedTheLongestEarliestSuffixMatch) {
  NgramDrafter d(1, 3);
  std::vector<int32_t> out;
  d.propose(std::vector<int32_t>{1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3}, 3, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 1, 2}));  // "1 2 3" first occurs at 0
  d.propose(std::vector<int32_t>{7, 8, 9}, 3, &out);
  EXPECT_TRUE(out.empty());
  d.propose(std::vector<int32_t>{5, 6, 5}, 4, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{6, 5}));  // only what exists after the match
  NgramDrafter two(2, 2);
  two.propose(std::vector<int32_t>{5, 6, 9, 6}, 4, &out);
  EXPECT_TRUE(out.empty());  // a 1-token match is below the minimum
}

TEST(EngineSpeculative, GreedyAndSeededTokensEqualPlainDecoding) {
  int64_t accepted = 0, drafts = 0;
  for (const char* name : {"tiny-gpt-oss", "tiny-gpt-oss-b"}) {
    const auto& fx = fixture_model(name);
    std::vector<Arrival> arrivals;
    for (size_t i = 0; i < fx.prompts.size(); ++i)
      arrivals.push_back({static_cast<int64_t>(i), greedy_request(fx.prompts[i], static_cast<int64_t>(fx.greedy[i].size()))});
    RequestInput rep = greedy_request(repetitive_prompt(fx.model->dims().vocab_size), 40);
    arrivals.push_back({0, rep});
    RequestInput hot = rep;
    hot.sampling.temperature = 0.9f;
    hot.sampling.top_k = 20;
    hot.sampling.top_p = 0.95f;
    hot.sampling.min_p = 0.01f;
    hot.sampling.seed = 11;
    hot.sampling.logprobs = true;
    arrivals.push_back({1, hot});
    RequestInput penalised = hot;
    penalised.sampling.seed = 12;
    penalised.sampling.frequency_penalty = 0.3f;  // host sampler path
    arrivals.push_back({2, penalised});
    const DriveResult plain = run(fx, spec_config(0), arrivals);
    for (int64_t k : {1, 3, 5}) {
      const DriveResult spec = run(fx, spec_config(k), arrivals);
      for (size_t i = 0; i < arrivals.size(); ++i) {
        EXPECT_EQ(spec.outputs[i].token_ids, plain.outputs[i].token_ids) << name << " k=" << k << " request " << i;
        EXPECT_EQ(spec.outputs[i].finish, plain.outputs[i].finish);
        ASSERT_EQ(spec.outputs[i].logprobs.size(), plain.outputs[i].logprobs.size());
        for (size_t t = 0; t < spec.outputs[i].logprobs.size(); ++t)
          EXPECT_NEAR(spec.outputs[i].logprobs[t].logprob, plain.outputs[i].logprobs[t].logprob, 1e-4);
      }
      for (size_t i = 0; i < fx.prompts.size(); ++i) EXPECT_EQ(spec.outputs[i].token_ids, fx.greedy[i]);
      EXPECT_EQ(spec.stats.pages_used, 0);
      const SchedulerStats& s = spec.stats.scheduler;
      int64_t per_pos = 0;
      for (int64_t n : s.spec_accepted_per_pos) per_pos += n;
      EXPECT_EQ(per_pos, s.spec_accepted_tokens);
      EXPECT_LE(s.spec_accepted_tokens, s.spec_draft_tokens);
      EXPECT_LT(spec.steps, plain.steps + 1);
      accepted += s.spec_accepted_tokens;
      drafts += s.spec_drafts;
      std::printf("[spec] %s k=%lld: %lld steps (plain %lld), %lld drafts, %lld/%lld draft tokens accepted\n", name,
                  static_cast<long long>(k), static_cast<long long>(spec.steps), static_cast<long long>(plain.steps),
                  static_cast<long long>(s.spec_drafts), static_cast<long long>(s.spec_accepted_tokens),
                  static_cast<long long>(s.spec_draft_tokens));
    }
  }
  EXPECT_GT(drafts, 0);
  EXPECT_GT(accepted, 0);  // the equality above covered accepted runs, not only rollbacks
}

TEST(EngineSpeculative, AbortAfterVerifyStepsLeavesNoPageUsed) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const RequestInput rep = greedy_request(repetitive_prompt(fx.model->dims().vocab_size), 60);
  std::vector<Arrival> arrivals = {{0, rep}, {0, rep}, {1, rep}};
  const DriveResult r = run(fx, spec_config(4), arrivals, [](EngineCore& core, int64_t step) {
    if (step == 3) core.abort(1000);  // drive numbers requests from 1000
    if (step == 6) core.abort(1002);
  });
  EXPECT_EQ(r.outputs[0].finish, FinishReason::kAbort);
  EXPECT_EQ(r.outputs[2].finish, FinishReason::kAbort);
  EXPECT_EQ(r.stats.pages_used, 0);
  EXPECT_GT(r.stats.scheduler.spec_drafts, 0);
}

TEST(EngineSpeculative, MaxTokensAndStopIdsCutAnAcceptedRun) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const RequestInput base = greedy_request(repetitive_prompt(fx.model->dims().vocab_size), 40);
  const DriveResult plain = run(fx, spec_config(0), {{0, base}});
  const auto& full = plain.outputs[0].token_ids;
  ASSERT_EQ(full.size(), 40u);
  for (int64_t n : {1, 2, 5, 7}) {
    RequestInput short_run = base;
    short_run.max_tokens = n;
    const DriveResult r = run(fx, spec_config(4), {{0, short_run}});
    EXPECT_EQ(r.outputs[0].token_ids, std::vector<int32_t>(full.begin(), full.begin() + n));
    EXPECT_EQ(r.outputs[0].finish, FinishReason::kLength);
  }
  // A stop id that first appears inside the output: the output ends with it, as without speculation.
  for (size_t at : {size_t{3}, size_t{10}, size_t{25}}) {
    RequestInput stop = base;
    stop.stop_token_ids = {full[at]};
    const DriveResult spec = run(fx, spec_config(4), {{0, stop}});
    const DriveResult ref = run(fx, spec_config(0), {{0, stop}});
    EXPECT_EQ(spec.outputs[0].token_ids, ref.outputs[0].token_ids);
    EXPECT_EQ(spec.outputs[0].finish, FinishReason::kStop);
    EXPECT_EQ(spec.stats.pages_used, 0);
  }
}

}  // namespace
}  // namespace mx::test
