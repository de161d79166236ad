// EngineCore features on the tiny fixtures: prefix reuse (identical outputs, computed tokens cut by the
// expected amount, a full hit recomputing the last page), stop conditions (eos ids, stop ids, stop strings
// over a fake detokenizer, max_tokens, the context length), and an abort storm of 1,000 requests.
#include <gtest/gtest.h>

#include <random>

#include "engine_test_util.h"

namespace mx {
namespace {

using test::Arrival;
using test::drive;
using test::fixture_model;
using test::greedy_request;

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct PrefixRun {
  test::DriveResult result;
};

test::DriveResult run_with_cache(bool cache, const std::vector<Arrival>& arrivals, int64_t page_size) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  EngineConfig config;
  config.page_size = page_size;
  config.enable_prefix_cache = cache;
  auto core = EngineCore::create(*fx.model, config);
  EXPECT_TRUE(core.is_ok());
  return drive(**core, arrivals);
}

TEST(EnginePrefix, SharedPrefixIsComputedOnceWithIdenticalOutputs) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const auto& base = fx.prompts[0];  // 40 tokens = 5 pages of 8
  std::vector<Arrival> arrivals;
  // The first request runs alone; three more sharing its 40-token prefix arrive after it finished.
  arrivals.push_back({0, greedy_request(concat(base, fx.prompts[1]), 4)});
  for (int k = 0; k < 3; ++k) {
    auto suffix = fx.prompts[2];
    suffix.resize(static_cast<size_t>(5 + 3 * k));
    suffix[0] = static_cast<int32_t>(900 + k);  // distinct right after the shared prefix
    arrivals.push_back({10, greedy_request(concat(base, suffix), 6)});
  }
  const auto with = run_with_cache(true, arrivals, 8);
  const auto without = run_with_cache(false, arrivals, 8);
  ASSERT_EQ(with.error, "");
  ASSERT_EQ(without.error, "");
  for (size_t i = 0; i < arrivals.size(); ++i) {
    EXPECT_EQ(with.outputs[i].token_ids, without.outputs[i].token_ids) << "request " << i;
    EXPECT_EQ(with.outputs[i].usage.cached_prompt_tokens, i == 0 ? 0 : 40) << "request " << i;
    EXPECT_EQ(without.outputs[i].usage.cached_prompt_tokens, 0);
  }
  EXPECT_EQ(with.stats.scheduler.prefix_hit_tokens, 3 * 40);
  EXPECT_EQ(without.stats.scheduler.computed_tokens - with.stats.scheduler.computed_tokens, 3 * 40);
  EXPECT_GT(with.stats.pages_cached, 0);
  EXPECT_EQ(with.stats.pages_used, 0);
}

TEST(EnginePrefix, FullHitRecomputesTheLastPage) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  auto prompt = concat(fx.prompts[0], std::vector<int32_t>(fx.prompts[2].begin(), fx.prompts[2].begin() + 8));  // 48 = 6 pages
  const std::vector<Arrival> arrivals = {{0, greedy_request(prompt, 5)}, {10, greedy_request(prompt, 5)}};
  const auto with = run_with_cache(true, arrivals, 8);
  const auto without = run_with_cache(false, arrivals, 8);
  ASSERT_EQ(with.error, "");
  EXPECT_EQ(with.outputs[1].token_ids, without.outputs[1].token_ids);
  EXPECT_EQ(with.outputs[0].token_ids, with.outputs[1].token_ids);
  // Every page is cached, but the last token needs logits: its page (8 tokens) is computed again.
  EXPECT_EQ(with.outputs[1].usage.cached_prompt_tokens, 40);
  EXPECT_EQ(without.stats.scheduler.computed_tokens - with.stats.scheduler.computed_tokens, 40);
}

TEST(EnginePrefix, GeneratedTokensAreCachedForTheNextTurn) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const auto first = run_with_cache(true, {{0, greedy_request(fx.prompts[0], 20)}}, 8);
  ASSERT_EQ(first.error, "");
  // Turn two: prompt + answer + a new message. 40 + 20 - 1 computed tokens = 7 full pages are cached.
  const auto next = concat(concat(fx.prompts[0], first.outputs[0].token_ids), fx.prompts[1]);
  const std::vector<Arrival> arrivals = {{0, greedy_request(fx.prompts[0], 20)}, {30, greedy_request(next, 4)}};
  const auto with = run_with_cache(true, arrivals, 8);
  const auto without = run_with_cache(false, arrivals, 8);
  ASSERT_EQ(with.error, "");
  EXPECT_EQ(with.outputs[1].token_ids, without.outputs[1].token_ids);
  EXPECT_EQ(with.outputs[1].usage.cached_prompt_tokens, 56);
}

// A detokenizer for tests: token t is the text "t " (decimal).
DetokenizeFn numbers_detokenizer() {
  return [](std::span<const int32_t> ids) {
    std::string s;
    for (int32_t id : ids) s += std::to_string(id) + " ";
    return s;
  };
}

TEST(EngineStops, StopStringsEosIdsAndLengths) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const auto& prompt = fx.prompts[0];
  const auto& greedy = fx.greedy[0];  // 24 tokens, no eos inside the tiny vocabulary
  const DetokenizeFn detok = numbers_detokenizer();
  const std::string full = detok(greedy);

  // The stop string is the text of tokens 5 and 6 from the middle of token 5's text on (and must not
  // appear earlier).
  const std::string stop = std::to_string(greedy[5]).substr(1) + " " + std::to_string(greedy[6]);
  const size_t pos = full.find(stop);
  ASSERT_NE(pos, std::string::npos);
  size_t stop_token = 0;  // the token that completes the stop string
  while (detok(std::span<const int32_t>(greedy).first(stop_token + 1)).size() < pos + stop.size()) ++stop_token;

  EngineConfig config;
  config.page_size = 4;
  config.max_num_batched_tokens = 8;
  config.eos_token_ids = std::vector<int32_t>{greedy[9]};
  auto core = EngineCore::create(*fx.model, config, detok);
  ASSERT_TRUE(core.is_ok());

  std::vector<Arrival> arrivals;
  RequestInput with_stop = greedy_request(prompt, 24);
  with_stop.stop = {"no such text", stop};
  with_stop.ignore_eos = true;
  arrivals.push_back({0, with_stop});                           // 0: stop string
  arrivals.push_back({0, greedy_request(prompt, 24)});          // 1: eos id from the config
  RequestInput ignore = greedy_request(prompt, 24);
  ignore.ignore_eos = true;
  ignore.stop_token_ids = {greedy[12]};
  arrivals.push_back({0, ignore});                              // 2: request stop id, eos ignored
  RequestInput text = greedy_request(prompt, 7);
  text.return_text = true;
  text.ignore_eos = true;
  arrivals.push_back({0, text});                                // 3: max_tokens with text
  arrivals.push_back({0, greedy_request(prompt, 0)});           // 4: max_tokens 0
  const auto r = drive(**core, arrivals);
  ASSERT_EQ(r.error, "");

  const auto first = [&](int32_t t) { return std::find(greedy.begin(), greedy.end(), t) - greedy.begin(); };
  EXPECT_EQ(r.outputs[0].finish, FinishReason::kStop);
  EXPECT_EQ(r.outputs[0].stop_string, stop);
  EXPECT_EQ(r.outputs[0].text, full.substr(0, pos));
  EXPECT_EQ(r.outputs[0].token_ids, std::vector<int32_t>(greedy.begin(), greedy.begin() + static_cast<long>(stop_token) + 1));

  const auto eos_at = first(greedy[9]);
  EXPECT_EQ(r.outputs[1].finish, FinishReason::kStop);
  EXPECT_EQ(r.outputs[1].stop_token, greedy[9]);
  EXPECT_EQ(r.outputs[1].token_ids, std::vector<int32_t>(greedy.begin(), greedy.begin() + eos_at + 1));  // eos kept

  EXPECT_EQ(r.outputs[2].finish, FinishReason::kStop);
  EXPECT_EQ(r.outputs[2].stop_token, greedy[12]);
  EXPECT_EQ(r.outputs[2].token_ids.size(), static_cast<size_t>(first(greedy[12]) + 1));

  EXPECT_EQ(r.outputs[3].finish, FinishReason::kLength);
  EXPECT_EQ(r.outputs[3].text, detok(std::span<const int32_t>(greedy).first(7)));

  EXPECT_EQ(r.outputs[4].finish, FinishReason::kLength);
  EXPECT_TRUE(r.outputs[4].token_ids.empty());
}

TEST(EngineStops, StreamHoldsBackAPossibleStopString) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const auto& greedy = fx.greedy[0];
  const DetokenizeFn detok = numbers_detokenizer();
  auto core = EngineCore::create(*fx.model, EngineConfig{}, detok);
  ASSERT_TRUE(core.is_ok());
  // "<token 3> <token 4> X" never completes; while tokens 3 and 4 are the tail they must be held back.
  const std::string stop = std::to_string(greedy[3]) + " " + std::to_string(greedy[4]) + " X";
  RequestInput in = greedy_request(fx.prompts[0], 8);
  in.stop = {stop};
  ASSERT_TRUE((*core)->add_request(1, in).is_ok());
  std::vector<RequestOutput> deltas;
  std::vector<std::vector<int32_t>> released;
  std::string text;
  while ((*core)->has_work()) {
    (*core)->step(&deltas);
    for (auto& d : deltas) {
      released.push_back(d.token_ids);
      text += d.text;
    }
  }
  // Step k samples token k; tokens 3 and 4 come out together with token 5, when "... X" can no longer match.
  ASSERT_GE(released.size(), 6u);
  EXPECT_EQ(released[3], (std::vector<int32_t>{greedy[3], greedy[4], greedy[5]}));
  EXPECT_EQ(text, detok(std::span<const int32_t>(greedy).first(8)));
}

TEST(EngineStops, ContextLengthEndsGeneration) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  EngineConfig config;
  config.max_model_len = 45;
  auto core = EngineCore::create(*fx.model, config);
  ASSERT_TRUE(core.is_ok());
  RequestInput in = greedy_request(fx.prompts[0], 0);
  in.max_tokens.reset();  // as many as the context allows: 45 - 40
  const auto r = drive(**core, {{0, in}});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.outputs[0].finish, FinishReason::kLength);
  EXPECT_EQ(r.outputs[0].token_ids, std::vector<int32_t>(fx.greedy[0].begin(), fx.greedy[0].begin() + 5));
}

// 1,000 requests with shared prefixes arrive over time in a small pool (so preemption and prefix sharing
// happen too) and are aborted at random moments: queued, mid-prefill, mid-decode, right after arriving.
// Every step keeps the invariants; at the end no page is used and nothing runs.
TEST(EngineAbort, AbortStormLeavesNothingBehind) {
  const auto& fx = fixture_model("tiny-gpt-oss-b");
  EngineConfig config;
  config.page_size = 4;
  config.num_kv_pages = 16;
  config.max_num_batched_tokens = 32;
  config.max_running_requests = 16;
  auto core_or = EngineCore::create(*fx.model, config);
  ASSERT_TRUE(core_or.is_ok());
  EngineCore& core = **core_or;
  std::mt19937 rng(1234);
  const int kRequests = 1000;
  std::vector<RequestId> live;
  std::map<RequestId, FinishReason> finish;
  RequestId next = 1;
  int64_t aborts_sent = 0;
  std::vector<RequestOutput> deltas;
  auto collect = [&] {
    for (auto& d : deltas) {
      if (!d.finished()) continue;
      EXPECT_EQ(finish.count(d.id), 0u) << "request " << d.id << " finished twice";
      finish[d.id] = d.finish;
      live.erase(std::find(live.begin(), live.end(), d.id));
    }
  };
  for (int64_t step = 0; next <= kRequests || core.has_work(); ++step) {
    for (int k = 0; k < 10 && next <= kRequests; ++k) {
      // Short prompts cut from the fixture prompts: many share their first pages.
      const auto& base = fx.prompts[static_cast<size_t>(rng() % fx.prompts.size())];
      const size_t len = 1 + rng() % std::min<size_t>(base.size(), 14);
      std::vector<int32_t> prompt(base.begin(), base.begin() + static_cast<long>(len));
      RequestInput in = greedy_request(prompt, 1 + static_cast<int64_t>(rng() % 8));
      ASSERT_TRUE(core.add_request(next, in).is_ok());
      live.push_back(next++);
      if (rng() % 8 == 0) {  // aborted before it ever runs
        core.abort(live.back());
        ++aborts_sent;
      }
    }
    for (size_t i = 0; i < live.size(); ++i) {
      if (rng() % 5 == 0) {
        core.abort(live[i]);
        ++aborts_sent;
      }
    }
    ASSERT_TRUE(core.check_invariants().is_ok()) << core.check_invariants().to_string();
    core.step(&deltas);
    collect();
    ASSERT_TRUE(core.check_invariants().is_ok()) << "step " << step << ": " << core.check_invariants().to_string();
  }
  EXPECT_EQ(static_cast<int64_t>(finish.size()), kRequests);
  int64_t aborted = 0;
  for (const auto& [id, reason] : finish) aborted += reason == FinishReason::kAbort;
  const EngineStats s = core.stats();
  EXPECT_GT(aborted, kRequests / 2);
  EXPECT_LT(aborted, kRequests);  // some finished normally too
  EXPECT_EQ(s.scheduler.aborted, aborted);
  EXPECT_EQ(s.pages_used, 0);
  EXPECT_EQ(s.pages_free, s.num_pages);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_waiting, 0);
  EXPECT_EQ(core.num_live(), 0);
  std::printf("[engine] abort storm: %lld steps, %lld tokens computed, %lld aborted, %lld finished, %lld preemptions, %lld prefix-hit tokens\n", static_cast<long long>(s.scheduler.steps), static_cast<long long>(s.scheduler.computed_tokens),
              static_cast<long long>(aborted), static_cast<long long>(kRequests - aborted),
              static_cast<long long>(s.scheduler.preemptions), static_cast<long long>(s.scheduler.prefix_hit_tokens));
}

}  // namespace
}  // namespace mx
