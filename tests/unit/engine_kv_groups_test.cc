// The engine with a KV pool per layer group on tiny-gpt-oss (even layers slide over a window of 16, odd layers
// attend fully): sequences of 1,000+ tokens (60+ windows) in a small pool (preemption included) keep only their
// window in the sliding group and decode exactly what the static generator (every page kept, one page table)
// decodes; prefix hits need the window before the cut; aborts and preemptions leave nothing behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine_test_util.h"
#include "runtime/static_generator.h"

namespace mx {
namespace {

using test::Arrival;
using test::drive;
using test::fixture_model;
using test::greedy_request;

constexpr int64_t kPage = 16;

std::vector<int32_t> random_tokens(uint32_t seed, int64_t n, int64_t vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = id(rng);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

EngineConfig small_config(int64_t full_pages) {
  EngineConfig c;
  c.page_size = kPage;
  c.num_kv_pages = full_pages;
  c.max_num_batched_tokens = 64;
  c.max_running_requests = 2;
  return c;
}

std::vector<int32_t> static_greedy(const Model& model, const std::vector<int32_t>& prompt, int64_t n) {
  GenerateRequest r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  auto out = generate_static(model, {r}, StaticGeneratorOptions{kPage, {}});
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? (*out)[0].output_ids : std::vector<int32_t>{};
}

TEST(EngineKvGroups, LongSequencesFarPastTheWindowMatchAnUnboundedRun) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const int64_t vocab = fx.model->dims().vocab_size, new_tokens = 200;
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(1, 900, vocab), random_tokens(2, 850, vocab)};
  // The full group holds one 1,100-token sequence and a page: the second one waits or is preempted.
  auto core = EngineCore::create(*fx.model, small_config(70));
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  const EngineConfig& c = (*core)->config();
  ASSERT_EQ(c.kv_group_windows, (std::vector<int64_t>{16, 0}));
  // Window group: 2 running x (ceil(15 / 16) + 2) pages + 64 / 16 pages of one step's tokens.
  EXPECT_EQ(c.kv_group_pages, (std::vector<int64_t>{10, 70}));

  int64_t max_window_used = 0, max_full_used = 0;
  std::vector<Arrival> arrivals;
  for (const auto& p : prompts) {
    RequestInput in = greedy_request(p, new_tokens);
    in.ignore_eos = true;
    arrivals.push_back({0, in});
  }
  const auto run = drive(**core, arrivals, [&](EngineCore& e, int64_t) {
    const EngineStats s = e.stats();
    max_window_used = std::max(max_window_used, s.group_pages_used[0]);
    max_full_used = std::max(max_full_used, s.group_pages_used[1]);
  });
  ASSERT_EQ(run.error, "");
  EXPECT_GT(run.stats.scheduler.preemptions, 0);
  EXPECT_GE(max_full_used, (900 + new_tokens - 1) / kPage);
  EXPECT_LE(max_window_used, 10);  // pages freed as the window moved: never more than the window pool
  EXPECT_EQ(run.stats.group_pages_used, (std::vector<int64_t>{0, 0}));
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(run.outputs[i].token_ids.size(), static_cast<size_t>(new_tokens));
    EXPECT_EQ(run.outputs[i].token_ids, static_greedy(*fx.model, prompts[i], new_tokens)) << "request " << i;
  }
}

TEST(EngineKvGroups, PrefixHitsNeedTheWindowBeforeTheCut) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const int64_t vocab = fx.model->dims().vocab_size;
  const auto prompt = random_tokens(3, 1200, vocab);
  EngineConfig config = small_config(400);
  config.max_running_requests = 1;
  auto core = EngineCore::create(*fx.model, config);
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  const auto first = drive(**core, {{0, greedy_request(prompt, 100)}});
  ASSERT_EQ(first.error, "");

  // The next turn continues where the first ended: its window pages were released last and are cached.
  const auto next = concat(concat(prompt, first.outputs[0].token_ids), random_tokens(4, 20, vocab));
  // A request sharing only the first 600 tokens: the window pages around 600 were evicted long ago by the
  // small window pool, so no cut has what the continuation needs: a miss, even though the full group has
  // every page.
  const auto branch = concat(std::vector<int32_t>(prompt.begin(), prompt.begin() + 600), random_tokens(5, 30, vocab));
  const auto second = drive(**core, {{0, greedy_request(next, 8)}, {3, greedy_request(branch, 8)}});
  ASSERT_EQ(second.error, "");
  EXPECT_EQ(second.outputs[0].usage.cached_prompt_tokens, (1200 + 100 - 1) / kPage * kPage);
  EXPECT_EQ(second.outputs[1].usage.cached_prompt_tokens, 0);
  EXPECT_EQ(second.outputs[0].token_ids, static_greedy(*fx.model, next, 8));
  EXPECT_EQ(second.outputs[1].token_ids, static_greedy(*fx.model, branch, 8));
}

TEST(EngineKvGroups, AbortsAndPreemptionsReleaseEveryGroup) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  const int64_t vocab = fx.model->dims().vocab_size;
  EngineConfig config = small_config(60);
  config.max_running_requests = 4;
  auto core = EngineCore::create(*fx.model, config);
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  std::vector<Arrival> arrivals;
  for (int i = 0; i < 8; ++i) arrivals.push_back({i * 5, greedy_request(random_tokens(10 + i, 200 + 37 * i, vocab), 150)});
  int64_t aborted = 0;
  const auto run = drive(**core, arrivals, [&](EngineCore& e, int64_t step) {
    if (step % 40 == 39) e.abort(1000 + step / 40), ++aborted;  // request ids start at 1000 (drive)
  });
  ASSERT_EQ(run.error, "");
  EXPECT_GT(aborted, 0);
  EXPECT_GT(run.stats.scheduler.preemptions, 0);
  EXPECT_EQ(run.stats.group_pages_used, (std::vector<int64_t>{0, 0}));
}

}  // namespace
}  // namespace mx
