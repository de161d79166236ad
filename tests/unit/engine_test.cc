// EngineCore on the tiny fixtures (gpt-oss and Gemma-4): continuous batching gives exactly the tokens each prompt gives alone
// (transformers' greedy tokens) whatever the batch: all together, chunked prefill mixed with decode,
// staggered arrivals, a KV pool far too small (preemption), one request at a time. Scheduler invariants
// are checked after every step (engine_test_util.cc).
#include <gtest/gtest.h>

#include <numeric>

#include "engine_test_util.h"
#include "runtime/static_generator.h"

namespace mx {
namespace {

using test::Arrival;
using test::drive;
using test::DriveResult;
using test::fixture_model;
using test::greedy_request;

struct Case {
  std::string name;
  std::string fixture;
  int64_t page_size = 16;
  int64_t budget = 2048;        // max_num_batched_tokens
  int64_t max_running = 64;
  int64_t num_pages = 0;        // 0 = default; < 0 = one request's worst case plus -num_pages pages
  int64_t stagger = 0;          // prompt i arrives before step i * stagger
  bool expect_preemption = false;
  bool prefix_cache = true;
};

class BatchingEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(BatchingEquivalence, GreedyTokensEqualEachPromptAlone) {
  const Case& c = GetParam();
  const auto& fx = fixture_model(c.fixture);
  EngineConfig config;
  config.page_size = c.page_size;
  config.max_num_batched_tokens = c.budget;
  config.max_running_requests = c.max_running;
  config.enable_prefix_cache = c.prefix_cache;
  int64_t longest = 0;
  for (size_t i = 0; i < fx.prompts.size(); ++i)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(fx.prompts[i].size() + fx.greedy[i].size()));
  config.num_kv_pages = c.num_pages >= 0 ? c.num_pages : (longest + c.page_size - 1) / c.page_size - c.num_pages;
  auto core = EngineCore::create(*fx.model, config);
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();

  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < fx.prompts.size(); ++i)
    arrivals.push_back({static_cast<int64_t>(i) * c.stagger,
                        greedy_request(fx.prompts[i], static_cast<int64_t>(fx.greedy[i].size()))});
  const auto result = drive(**core, arrivals);
  ASSERT_EQ(result.error, "");
  int64_t preemptions = 0;
  for (size_t i = 0; i < fx.prompts.size(); ++i) {
    const RequestOutput& out = result.outputs[i];
    EXPECT_EQ(out.token_ids, fx.greedy[i]) << "prompt " << i;
    EXPECT_EQ(out.finish, FinishReason::kLength);
    EXPECT_EQ(out.usage.prompt_tokens, static_cast<int64_t>(fx.prompts[i].size()));
    EXPECT_EQ(out.usage.completion_tokens, static_cast<int64_t>(fx.greedy[i].size()));
    preemptions += out.num_preemptions;
  }
  EXPECT_EQ(preemptions, result.stats.scheduler.preemptions);
  if (c.expect_preemption) {
    EXPECT_GT(result.stats.scheduler.preemptions, 0);
  }
  EXPECT_EQ(result.stats.pages_used, 0);
  EXPECT_EQ(result.stats.num_running + result.stats.num_waiting, 0);
  std::printf("[engine] %s: %lld steps, %lld tokens computed, %lld preemptions\n", c.name.c_str(),
              static_cast<long long>(result.steps), static_cast<long long>(result.stats.scheduler.computed_tokens),
              static_cast<long long>(result.stats.scheduler.preemptions));
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::pair<const char*, const char*> fixtures[] = {
      {"tiny-gpt-oss", "a_"}, {"tiny-gpt-oss-b", "b_"}, {"tiny-gemma4", "gemma_"}, {"tiny-gemma4-text", "gemma_text_"}};
  for (const auto& [fx, tag_text] : fixtures) {
    const std::string tag = tag_text;
    out.push_back({tag + "together", fx});
    out.push_back({tag + "chunked", fx, 4, 5});                       // prompts split into 5-token chunks
    out.push_back({tag + "staggered", fx, 4, 7, 64, 0, 3});           // a new prompt every 3 steps
    out.push_back({tag + "tiny_pool", fx, 4, 16, 64, -1, 0, true});   // room for one request and a page
    out.push_back({tag + "tiny_pool_staggered", fx, 4, 6, 64, -2, 2, true});
    out.push_back({tag + "tiny_pool_no_prefix_cache", fx, 4, 16, 64, -1, 1, true, false});
    out.push_back({tag + "one_at_a_time", fx, 8, 2048, 1});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchingEquivalence, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(Engine, EachPromptAloneMatchesTransformers) {
  for (std::string name : {"tiny-gpt-oss", "tiny-gpt-oss-b", "tiny-gemma4", "tiny-gemma4-text"}) {
    const auto& fx = fixture_model(name);
    for (size_t i = 0; i < fx.prompts.size(); ++i) {
      auto core = EngineCore::create(*fx.model, EngineConfig{});
      ASSERT_TRUE(core.is_ok());
      const auto r = drive(**core, {{0, greedy_request(fx.prompts[i], static_cast<int64_t>(fx.greedy[i].size()))}});
      ASSERT_EQ(r.error, "");
      EXPECT_EQ(r.outputs[0].token_ids, fx.greedy[i]) << name << " prompt " << i;
    }
  }
}

// Sampled tokens depend only on the request's own seed: batching, chunking and preemption change nothing,
// penalties and logprobs included.
TEST(Engine, SeededSamplingIsIndependentOfTheBatch) {
  const auto& fx = fixture_model("tiny-gpt-oss-b");
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < fx.prompts.size(); ++i) {
    RequestInput r = greedy_request(fx.prompts[i], 16);
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.top_k = i % 2 ? 50 : 0;
    r.sampling.min_p = 0.01f;
    r.sampling.seed = 100 + i;
    r.sampling.presence_penalty = 0.3f;
    r.sampling.frequency_penalty = 0.2f;
    r.sampling.repetition_penalty = 1.1f;
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = 3;
    arrivals.push_back({static_cast<int64_t>(i), r});
  }
  EngineConfig batched;
  batched.page_size = 4;
  batched.max_num_batched_tokens = 6;
  batched.num_kv_pages = 14;  // 37 + 16 tokens need 14 pages: the others get preempted
  auto core = EngineCore::create(*fx.model, batched);
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  const auto together = drive(**core, arrivals);
  ASSERT_EQ(together.error, "");
  EXPECT_GT(together.stats.scheduler.preemptions, 0);
  for (size_t i = 0; i < arrivals.size(); ++i) {
    auto alone_core = EngineCore::create(*fx.model, EngineConfig{});
    ASSERT_TRUE(alone_core.is_ok());
    const auto alone = drive(**alone_core, {{0, arrivals[i].input}});
    ASSERT_EQ(alone.error, "");
    const auto& a = together.outputs[i];
    const auto& b = alone.outputs[0];
    EXPECT_EQ(a.token_ids, b.token_ids) << "prompt " << i;
    ASSERT_EQ(a.logprobs.size(), a.token_ids.size());
    ASSERT_EQ(b.logprobs.size(), b.token_ids.size());
    for (size_t t = 0; t < a.logprobs.size() && t < b.logprobs.size(); ++t) {
      EXPECT_EQ(a.logprobs[t].token, a.token_ids[t]);
      EXPECT_NEAR(a.logprobs[t].logprob, b.logprobs[t].logprob, 1e-5);
      EXPECT_LE(a.logprobs[t].logprob, 0.0f);
      ASSERT_EQ(a.logprobs[t].top.size(), 3u);
      EXPECT_GE(a.logprobs[t].top[0].logprob, a.logprobs[t].top[1].logprob);
      EXPECT_GE(a.logprobs[t].top[0].logprob, a.logprobs[t].logprob);
    }
  }
}

// Overlapped steps (the next decode step scheduled and launched before the running one's samples are
// applied, its tokens copied on the device) give the serial steps' outputs: seeded sampling with logprobs,
// finishes by length at different steps, a stop token and an abort (each request computes one step more,
// unseen), a request arriving mid-decode (admission waits for the update).
TEST(Engine, OverlappedStepsGiveTheSerialStepsOutputs) {
  const auto& fx = fixture_model("tiny-gpt-oss-b");
  auto prompt = [&](size_t i) { return fx.prompts[i % fx.prompts.size()]; };
  auto run = [&](bool overlap, const std::vector<Arrival>& arrivals) {
    EngineConfig c;
    c.page_size = 4;
    c.overlap_steps = overlap;
    auto core = EngineCore::create(*fx.model, c);
    EXPECT_TRUE(core.is_ok()) << core.status().to_string();
    return drive(**core, arrivals, [](EngineCore& core, int64_t step) {
      if (step == 6) core.abort(1001);  // the second arrival, mid-decode
    });
  };
  std::vector<Arrival> arrivals;
  RequestInput sampled = greedy_request(prompt(0), 16);
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.top_p = 0.9f;
  sampled.sampling.seed = 7;
  sampled.sampling.logprobs = true;
  arrivals.push_back({0, sampled});
  arrivals.push_back({0, greedy_request(prompt(1), 20)});
  arrivals.push_back({0, greedy_request(prompt(2), 5)});
  arrivals.push_back({0, greedy_request(prompt(3), 12)});
  sampled.prompt = prompt(4);
  sampled.sampling.seed = 9;
  arrivals.push_back({9, sampled});  // after the stop and the abort, so that both happen in overlapped steps
  // The fourth request stops at its fifth token (as the serial steps generate it).
  const DriveResult probe = run(false, arrivals);
  ASSERT_EQ(probe.error, "");
  ASSERT_GE(probe.outputs[3].token_ids.size(), 5u);
  arrivals[3].input.stop_token_ids = {probe.outputs[3].token_ids[4]};

  const DriveResult serial = run(false, arrivals), overlapped = run(true, arrivals);
  ASSERT_EQ(serial.error, "");
  ASSERT_EQ(overlapped.error, "");
  EXPECT_EQ(serial.outputs[1].finish, FinishReason::kAbort);
  EXPECT_EQ(serial.outputs[3].finish, FinishReason::kStop);
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const RequestOutput& a = serial.outputs[i];
    const RequestOutput& b = overlapped.outputs[i];
    EXPECT_EQ(a.token_ids, b.token_ids) << "request " << i;
    EXPECT_EQ(a.finish, b.finish) << "request " << i;
    EXPECT_EQ(a.stop_token, b.stop_token) << "request " << i;
    EXPECT_EQ(a.usage.completion_tokens, b.usage.completion_tokens) << "request " << i;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << "request " << i;
    for (size_t t = 0; t < a.logprobs.size(); ++t) EXPECT_NEAR(a.logprobs[t].logprob, b.logprobs[t].logprob, 1e-5);
  }
  EXPECT_EQ(serial.stats.scheduler.overlapped_steps, 0);
  EXPECT_GT(overlapped.stats.scheduler.overlapped_steps, 10);
  EXPECT_EQ(serial.stats.scheduler.generated_tokens, overlapped.stats.scheduler.generated_tokens);
  // The stopped and the aborted request each computed one row more.
  EXPECT_EQ(overlapped.stats.scheduler.computed_tokens, serial.stats.scheduler.computed_tokens + 2);
  EXPECT_EQ(overlapped.stats.pages_used, 0);
}

// Prompt logits (what --logits-out writes) survive chunking and equal the static generator's.
TEST(Engine, PromptLogitsEqualTheStaticGenerator) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  EngineConfig config;
  config.page_size = 4;
  config.max_num_batched_tokens = 9;
  config.max_prompt_logit_rows = 6;  // fewer rows than the token budget: chunks shrink to fit
  auto core = EngineCore::create(*fx.model, config);
  ASSERT_TRUE(core.is_ok());
  std::vector<Arrival> arrivals;
  std::vector<GenerateRequest> reference;
  for (const auto& p : fx.prompts) {
    RequestInput r = greedy_request(p, 3);
    r.want_prompt_logits = true;
    arrivals.push_back({0, r});
    GenerateRequest g;
    g.prompt = p;
    g.max_new_tokens = 3;
    g.want_prompt_logits = true;
    reference.push_back(g);
  }
  const auto result = drive(**core, arrivals);
  ASSERT_EQ(result.error, "");
  auto want = generate_static(*fx.model, reference, StaticGeneratorOptions{});
  ASSERT_TRUE(want.is_ok());
  for (size_t i = 0; i < fx.prompts.size(); ++i) {
    const auto& got = result.outputs[i].prompt_logits;
    const auto& exp = (*want)[i].prompt_logits;
    ASSERT_EQ(got.size(), exp.size());
    float max_diff = 0;
    for (size_t j = 0; j < got.size(); ++j) max_diff = std::max(max_diff, std::abs(got[j] - exp[j]));
    EXPECT_LE(max_diff, 1e-5f) << "prompt " << i;
    EXPECT_EQ(result.outputs[i].token_ids, (*want)[i].output_ids);
  }
}

TEST(Engine, RejectsBadRequestsAtTheDoor) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  EngineConfig config;
  config.num_kv_pages = 8;  // 128 tokens per request at most
  auto core = EngineCore::create(*fx.model, config);
  ASSERT_TRUE(core.is_ok());
  auto expect_error = [&](RequestInput r, const std::string& text) {
    const Status s = (*core)->validate(r);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
  };
  RequestInput ok = greedy_request({1, 2, 3}, 4);
  EXPECT_TRUE((*core)->validate(ok).is_ok());
  expect_error(greedy_request({}, 4), "prompt is empty");
  expect_error(greedy_request({1, 1024}, 4), "token id 1024 is outside the vocabulary [0, 1024)");
  expect_error(greedy_request({1, -3}, 4), "token id -3 is outside");
  expect_error(greedy_request({1}, 200000), "exceed the context length 131072");
  expect_error(greedy_request({1}, 128), "exceed this engine's limit of 128 tokens");
  RequestInput r = ok;
  r.stop = {"x"};
  expect_error(r, "need a tokenizer");
  r = ok;
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 21;
  expect_error(r, "top_logprobs must be in [0, 20]");
  r = ok;
  r.sampling.top_p = 0;
  expect_error(r, "top_p");
  r = ok;
  r.sampling.temperature = -1;
  expect_error(r, "temperature");
  r = ok;
  r.want_prompt_logits = true;
  expect_error(r, "prompt logits are not enabled");
  r = ok;
  r.max_tokens = -1;
  expect_error(r, "max_tokens must be >= 0");
  // Nothing was queued by the rejected requests.
  EXPECT_EQ((*core)->num_live(), 0);
}

}  // namespace
}  // namespace mx
