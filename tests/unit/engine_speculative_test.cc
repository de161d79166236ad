// Speculative decoding with the n-gram drafter on the tiny fixtures: the same tokens as plain decoding
// (greedy, and seeded sampling with filters and penalties: a verify row takes the draw its token would have
// had, so sample-and-compare acceptance reproduces plain decoding exactly), the acceptance counters move (so
// the equality is not vacuous), aborts leave no page used, stop strings and max_tokens cut an accepted run.
// Forced acceptance (spec/reference_drafter.h: the drafts are plain decoding's own outputs) makes every
// draft accepted: the all-accepted path, with eos, stop ids, stop strings, max_tokens and logprobs landing
// inside accepted runs.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "spec/ngram_drafter.h"
#include "spec/reference_drafter.h"

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

// Speculation whose drafts are the outputs of `plain` for the same arrivals: every draft is accepted.
EngineConfig forced_config(const std::vector<Arrival>& arrivals, const DriveResult& plain, int64_t k) {
  std::vector<ReferenceDrafter::Reference> refs;
  for (size_t i = 0; i < arrivals.size(); ++i) refs.push_back({arrivals[i].input.prompt, plain.outputs[i].token_ids});
  EngineConfig c = spec_config(0);
  c.speculative.algorithm = SpeculativeAlgorithm::kExternal;
  c.speculative.num_draft_tokens = k;
  c.speculative.external = std::make_shared<const ReferenceDrafter>(std::move(refs));
  return c;
}

void expect_same_outputs(const DriveResult& spec, const DriveResult& plain, const std::string& what) {
  ASSERT_EQ(spec.outputs.size(), plain.outputs.size());
  for (size_t i = 0; i < plain.outputs.size(); ++i) {
    const RequestOutput& a = spec.outputs[i];
    const RequestOutput& b = plain.outputs[i];
    EXPECT_EQ(a.token_ids, b.token_ids) << what << " request " << i;
    EXPECT_EQ(a.finish, b.finish) << what << " request " << i;
    EXPECT_EQ(a.stop_string, b.stop_string) << what << " request " << i;
    EXPECT_EQ(a.stop_token, b.stop_token) << what << " request " << i;
    EXPECT_EQ(a.text, b.text) << what << " request " << i;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what << " request " << i;
    for (size_t t = 0; t < a.logprobs.size(); ++t) {
      EXPECT_EQ(a.logprobs[t].token, b.logprobs[t].token);
      EXPECT_NEAR(a.logprobs[t].logprob, b.logprobs[t].logprob, 1e-4);
      ASSERT_EQ(a.logprobs[t].top.size(), b.logprobs[t].top.size());
      for (size_t j = 0; j < a.logprobs[t].top.size(); ++j) EXPECT_EQ(a.logprobs[t].top[j].token, b.logprobs[t].top[j].token);
    }
  }
}

TEST(ReferenceDrafter, ProposesTheContinuationAtTheSequencesPosition) {
  const ReferenceDrafter d({{{1, 2, 3}, {7, 8, 9, 10}}, {{1, 2}, {5, 6}}});
  std::vector<int32_t> out;
  d.propose(std::vector<int32_t>{1, 2, 3, 7}, 2, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{8, 9}));
  d.propose(std::vector<int32_t>{1, 2, 3, 4, 4}, 5, &out);  // diverged: still the reference's next tokens
  EXPECT_EQ(out, (std::vector<int32_t>{9, 10}));
  d.propose(std::vector<int32_t>{1, 2, 5}, 3, &out);  // only the shorter prompt matches
  EXPECT_EQ(out, (std::vector<int32_t>{6}));
  d.propose(std::vector<int32_t>{1, 2, 3, 7, 8, 9, 10}, 3, &out);  // past the end
  EXPECT_TRUE(out.empty());
  d.propose(std::vector<int32_t>{4, 4, 4, 4}, 3, &out);
  EXPECT_TRUE(out.empty());
}

TEST(EngineSpeculative, ForcedAcceptanceAcceptsEveryDraftAndEqualsPlainDecoding) {
  for (const char* name : {"tiny-gpt-oss", "tiny-gpt-oss-b"}) {
    const auto& fx = fixture_model(name);
    std::vector<Arrival> arrivals;
    for (size_t i = 0; i < fx.prompts.size(); ++i)
      arrivals.push_back({static_cast<int64_t>(i), greedy_request(fx.prompts[i], static_cast<int64_t>(fx.greedy[i].size()))});
    // Sampled, with its own prompt (the drafter finds references by prompt).
    RequestInput hot = greedy_request(std::vector<int32_t>(fx.prompts[0].rbegin(), fx.prompts[0].rend()), 30);
    hot.sampling.temperature = 0.8f;
    hot.sampling.top_k = 10;
    hot.sampling.top_p = 0.9f;
    hot.sampling.min_p = 0.02f;
    hot.sampling.seed = 5;
    hot.sampling.logprobs = true;
    hot.sampling.top_logprobs = 3;
    arrivals.push_back({0, hot});
    const DriveResult plain = run(fx, spec_config(0), arrivals);
    for (int64_t k : {1, 4, 7}) {
      const DriveResult spec = run(fx, forced_config(arrivals, plain, k), arrivals);
      expect_same_outputs(spec, plain, std::string(name) + " k=" + std::to_string(k));
      const SchedulerStats& s = spec.stats.scheduler;
      EXPECT_GT(s.spec_drafts, 0);
      EXPECT_EQ(s.spec_accepted_tokens, s.spec_draft_tokens) << name << " k=" << k;
      EXPECT_EQ(s.spec_accepted_per_pos[0], s.spec_drafts);
      EXPECT_LT(spec.steps, plain.steps);
      EXPECT_EQ(spec.stats.pages_used, 0);
    }
  }
}

TEST(EngineSpeculative, AcceptAllAppendsTheDraftsWhateverTheTargetSamples) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const int32_t vocab = static_cast<int32_t>(fx.model->dims().vocab_size);
  std::vector<int32_t> script;  // not what the model would say
  for (int32_t i = 0; i < 20; ++i) script.push_back((i * 7 + 3) % vocab);
  EngineConfig c = spec_config(0);
  c.speculative.algorithm = SpeculativeAlgorithm::kExternal;
  c.speculative.num_draft_tokens = 3;
  c.speculative.external = std::make_shared<const ReferenceDrafter>(std::vector<ReferenceDrafter::Reference>{{fx.prompts[0], script}});
  c.speculative.accept_all = true;
  const DriveResult r = run(fx, c, {{0, greedy_request(fx.prompts[0], 21)}});
  const auto& out = r.outputs[0].token_ids;
  ASSERT_EQ(out.size(), 21u);
  // Token 0 comes from the prefill; every verify step after it keeps its 3 drafts and the bonus sample.
  for (size_t i = 1; i < out.size(); ++i) {
    if (i % 4 != 0) {
      EXPECT_EQ(out[i], script[i]) << i;
    }
  }
  EXPECT_EQ(r.stats.scheduler.spec_accepted_tokens, r.stats.scheduler.spec_draft_tokens);
  EXPECT_EQ(r.stats.pages_used, 0);
  EngineConfig bad = spec_config(3);
  bad.speculative.accept_all = true;
  EXPECT_FALSE(EngineCore::create(*fx.model, bad).is_ok());  // only for external (benchmark) drafters
}

TEST(EngineSpeculative, StopsEosLengthsAndLogprobsInsideAcceptedRuns) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const auto& prompt = fx.prompts[0];
  const auto& greedy = fx.greedy[0];  // 24 tokens
  const DetokenizeFn detok = [](std::span<const int32_t> ids) {  // token t is the text "t "
    std::string s;
    for (int32_t id : ids) s += std::to_string(id) + " ";
    return s;
  };
  std::vector<Arrival> arrivals;
  for (size_t at : {size_t{2}, size_t{6}, size_t{11}}) {  // a stop string ending inside token `at`
    RequestInput in = greedy_request(prompt, 24);
    in.stop = {std::to_string(greedy[at - 1]) + " " + std::to_string(greedy[at]).substr(0, 1)};
    in.ignore_eos = true;
    in.return_text = true;
    arrivals.push_back({0, in});
  }
  for (size_t at : {size_t{3}, size_t{9}}) {
    RequestInput in = greedy_request(prompt, 24);
    in.stop_token_ids = {greedy[at]};
    in.ignore_eos = true;
    in.sampling.logprobs = true;
    in.sampling.top_logprobs = 2;
    arrivals.push_back({0, in});
  }
  for (int64_t n : {1, 5, 13}) {
    RequestInput in = greedy_request(prompt, n);
    in.ignore_eos = true;
    in.return_text = true;
    arrivals.push_back({0, in});
  }
  arrivals.push_back({0, greedy_request(prompt, 24)});  // eos from the config
  EngineConfig plain_config = spec_config(0);
  plain_config.eos_token_ids = std::vector<int32_t>{greedy[14]};
  auto run_with = [&](const EngineConfig& config) {
    auto core = EngineCore::create(*fx.model, config, detok);
    EXPECT_TRUE(core.is_ok()) << core.status().to_string();
    DriveResult r = drive(**core, arrivals);
    EXPECT_EQ(r.error, "");
    return r;
  };
  const DriveResult plain = run_with(plain_config);
  EXPECT_EQ(plain.outputs.back().finish, FinishReason::kStop);
  // The references run to 24 tokens (no stops): drafts cross every stop point.
  std::vector<Arrival> full = arrivals;
  for (Arrival& a : full) a.input = greedy_request(prompt, 24);
  const DriveResult uncut = run(fx, spec_config(0), full);
  for (int64_t k : {3, 6}) {
    EngineConfig config = forced_config(full, uncut, k);
    config.eos_token_ids = plain_config.eos_token_ids;
    const DriveResult spec = run_with(config);
    expect_same_outputs(spec, plain, "k=" + std::to_string(k));
    EXPECT_GT(spec.stats.scheduler.spec_accepted_tokens, 0);
    EXPECT_EQ(spec.stats.pages_used, 0);
  }
}

TEST(EngineSpeculative, AbortAtEveryStepOfAVerifyingRequestLeavesNoPageUsed) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const RequestInput rep = greedy_request(repetitive_prompt(fx.model->dims().vocab_size), 30);
  const std::vector<Arrival> arrivals = {{0, rep}, {0, rep}};
  const DriveResult plain = run(fx, spec_config(0), arrivals);
  const EngineConfig config = forced_config(arrivals, plain, 3);
  for (int64_t at = 0; at < 8; ++at) {
    const DriveResult r = run(fx, config, arrivals, [at](EngineCore& core, int64_t step) {
      if (step == at) core.abort(1001);  // the second request (drive numbers them from 1000)
    });
    EXPECT_EQ(r.outputs[0].token_ids, plain.outputs[0].token_ids) << "abort after step " << at;
    EXPECT_EQ(r.outputs[1].finish, FinishReason::kAbort) << "abort after step " << at;
    EXPECT_EQ(r.stats.pages_used, 0) << "abort after step " << at;
  }
}

}  // namespace
}  // namespace mx::test
