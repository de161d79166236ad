// EngineConfig resolution (auto KV pool on the CPU, context capped by the pool, eos ids without <|end|>),
// the KV memory plan's arithmetic, and `mxserve generate` driving the engine with its flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "engine_test_util.h"
#include "runtime/engine_config.h"
#include "test_util.h"

namespace mx {
namespace {

TEST(EngineConfig, ResolvesAutoValuesAndRejectsBadRanges) {
  const auto& fx = test::fixture_model("tiny-gpt-oss");
  EngineConfig c;
  c.page_size = 16;
  c.cpu_kv_cache_bytes = 1 << 20;  // tiny: 4 layers x K,V x 2 kv heads x 64 x f32 = 4 KiB per token
  auto r = resolve_engine_config(c, *fx.model);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->num_kv_pages, 16);       // 256 tokens
  EXPECT_EQ(r->max_model_len, 256);     // a request must fit the pool alone
  EXPECT_EQ(r->model_context_len, 131072);
  EXPECT_EQ(*r->eos_token_ids, (std::vector<int32_t>{200002, 199999, 200012}));
  EXPECT_FALSE(describe_engine_config(*r).empty());

  c.max_model_len = 100;
  EXPECT_EQ(resolve_engine_config(c, *fx.model)->max_model_len, 100);
  using Edit = void (*)(EngineConfig&);
  for (Edit bad : {Edit([](EngineConfig& e) { e.page_size = 0; }), Edit([](EngineConfig& e) { e.max_num_batched_tokens = -1; }),
                   Edit([](EngineConfig& e) { e.max_running_requests = -1; }), Edit([](EngineConfig& e) { e.mem_fraction = 1.5; }),
                   Edit([](EngineConfig& e) { e.num_kv_pages = -1; })}) {
    EngineConfig e;
    bad(e);
    EXPECT_EQ(resolve_engine_config(e, *fx.model).status().code(), StatusCode::kInvalidArgument);
  }
  // 0 = auto: on the CPU a 2048-token step and 64 running requests, fixed (no memory plan to size them).
  c.max_num_batched_tokens = 0;
  c.max_running_requests = 0;
  auto autos = resolve_engine_config(c, *fx.model);
  ASSERT_TRUE(autos.is_ok()) << autos.status().to_string();
  EXPECT_EQ(autos->max_num_batched_tokens, kAutoBatchedTokensSmall);
  EXPECT_EQ(autos->max_running_requests, kAutoRunningRequestsCpu);
  EXPECT_FALSE(autos->auto_max_running_requests);
  // Both auto values are named so in the start-up line.
  EXPECT_TRUE(autos->auto_max_num_batched_tokens);
  EXPECT_NE(describe_engine_config(*autos).find("max-num-batched-tokens 2048 (auto: 16384 where"), std::string::npos)
      << describe_engine_config(*autos);
  EXPECT_EQ(describe_engine_config(*r).find("(auto: 16384"), std::string::npos);
}

// Tensor parallel on N devices: each holds 1/N of every layer group's KV, so the per-device plan sees 1/N
// of the bytes per token.
TEST(EngineConfig, KvInputsPerDeviceDivideEveryGroup) {
  EngineConfig c;
  const KvLayout layout = KvLayout::from_layers({{8, 64, 128, false}, {8, 64, 0, false}, {8, 64, 128, false}, {8, 64, 0, false}});
  const KvMemoryInputs one = kv_memory_inputs(c, layout, DType::kBF16), two = kv_memory_inputs(c, layout, DType::kBF16, 2);
  EXPECT_EQ(two.bytes_per_token * 2, one.bytes_per_token);
  ASSERT_EQ(two.group_bytes_per_token.size(), 2u);
  for (size_t g = 0; g < 2; ++g) EXPECT_EQ(two.group_bytes_per_token[g] * 2, one.group_bytes_per_token[g]);
  EXPECT_EQ(two.group_window_pages, one.group_window_pages);
}

// The auto step: largest where the weights leave room (gpt-oss-20b on an 80 GB GPU: ~58 GiB; 120b on an H200:
// ~65 GiB), large where they leave some (Gemma-4 26B-A4B on an 80 GB GPU: ~25 GiB), small where the KV pool is
// tight (120b on an 80 GB GPU: ~10 GiB) and on the CPU.
TEST(EngineConfig, AutoStepBudgetFollowsTheRoomForKv) {
  EXPECT_EQ(auto_max_num_batched_tokens(58ll << 30), 16384);
  EXPECT_EQ(auto_max_num_batched_tokens(25ll << 30), 8192);
  EXPECT_EQ(auto_max_num_batched_tokens(10ll << 30), 2048);
  EXPECT_EQ(auto_max_num_batched_tokens(-1), 2048);
}

// Auto max-running-requests: the largest default graph bucket (at most 256) whose requests the pool holds at
// 2048 tokens each.
TEST(EngineConfig, AutoRunningRequestsFollowTheKvPool) {
  EXPECT_EQ(auto_max_running_requests(1'250'000 / 16, 16), 256);  // 20b on an H100: capped
  EXPECT_EQ(auto_max_running_requests(133'936 / 16, 16), 64);     // 120b on an H100: 65 requests fit
  EXPECT_EQ(auto_max_running_requests(2048 * 40 / 16, 16), 40);
  EXPECT_EQ(auto_max_running_requests(2048 * 39 / 16, 16), 32);
  EXPECT_EQ(auto_max_running_requests(2048 * 3 / 16, 16), 2);
  EXPECT_EQ(auto_max_running_requests(10, 16), 1);  // less than one request's worth still runs one

  // From a memory plan: window groups' pages grow with the batch, so the plan is redone per candidate and
  // the chosen batch fits the pool it leaves. gpt-oss-120b-like on an 80 GB GPU.
  EngineConfig c;
  c.max_num_batched_tokens = 8192;
  const int64_t per_group = 18 * 2 * 8 * 64 * 2;
  KvMemoryInputs in;
  in.device_bytes = 81559ll << 20;
  in.weights_bytes = 61ll << 30;
  in.activation_bytes = 2ll << 30;
  in.other_bytes = 1ll << 29;
  in.bytes_per_token = 2 * per_group;
  in.page_size = 16;
  in.max_model_len = 131072;
  in.group_bytes_per_token = {per_group, per_group};
  in.group_windows = {128, 0};
  in.group_window_pages = {0, 0};  // stale on purpose: recomputed per candidate
  const int64_t n = auto_max_running_requests(in, c);
  c.max_running_requests = n;
  in.group_window_pages = {window_group_pages(128, c), 0};
  auto plan = plan_kv_memory(in);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_GE(plan->kv_tokens, n * kAutoTokensPerRequest);
  EXPECT_GT(n, 8);
  EXPECT_LT(n, 256);
  // The next larger bucket would not fit (its bigger window pools leave fewer full tokens).
  const int64_t next = n + (n < 64 ? 8 : (n < 128 ? 16 : 32));
  c.max_running_requests = next;
  in.group_window_pages = {window_group_pages(128, c), 0};
  EXPECT_LT(plan_kv_memory(in)->kv_tokens, next * kAutoTokensPerRequest);
}

TEST(EngineConfig, MemoryPlan) {
  KvMemoryInputs in;
  in.device_bytes = 80ll << 30;
  in.weights_bytes = 13ll << 30;
  in.activation_bytes = 3ll << 30;
  in.mem_fraction = 0.9;
  in.bytes_per_token = 24 * 2 * 8 * 64 * 2;  // gpt-oss-20b, bf16: 48 KiB
  in.page_size = 16;
  in.max_model_len = 131072;
  auto plan = plan_kv_memory(in);
  ASSERT_TRUE(plan.is_ok());
  const int64_t kv = static_cast<int64_t>(0.9 * (80ll << 30)) - (16ll << 30);
  EXPECT_EQ(plan->num_pages, kv / (in.bytes_per_token * 16));
  EXPECT_EQ(plan->kv_tokens, plan->num_pages * 16);
  EXPECT_EQ(plan->full_context_requests, plan->num_pages / (131072 / 16));
  EXPECT_NE(describe_kv_memory_plan(in, *plan).find("requests at full context"), std::string::npos);
  in.weights_bytes = 80ll << 30;
  EXPECT_EQ(plan_kv_memory(in).status().code(), StatusCode::kResourceExhausted);
}

// gpt-oss-120b on an 80 GB H100: 18 sliding layers (window 128) and 18 full layers. Pools per layer group give
// the full layers nearly all the KV memory: about twice the tokens of one pool for all 36 layers.
TEST(EngineConfig, MemoryPlanGivesWindowGroupsOnlyTheirWindows) {
  EngineConfig c;
  c.max_running_requests = 64;
  c.max_num_batched_tokens = 2048;
  const int64_t per_group = 18 * 2 * 8 * 64 * 2;
  KvMemoryInputs in;
  in.device_bytes = 81559ll << 20;
  in.weights_bytes = 61ll << 30;
  in.activation_bytes = 1ll << 30;
  in.other_bytes = 1ll << 29;
  in.bytes_per_token = 2 * per_group;
  in.page_size = 16;
  in.max_model_len = 131072;
  auto one_pool = plan_kv_memory(in);
  ASSERT_TRUE(one_pool.is_ok());
  in.group_bytes_per_token = {per_group, per_group};
  in.group_windows = {128, 0};
  in.group_window_pages = {window_group_pages(128, c), 0};
  EXPECT_EQ(in.group_window_pages[0], 64 * (8 + 2) + 128);
  in.scratch_pages = 1;
  auto grouped = plan_kv_memory(in);
  ASSERT_TRUE(grouped.is_ok());
  EXPECT_EQ(grouped->group_pages, (std::vector<int64_t>{768, grouped->num_pages}));
  EXPECT_GT(grouped->kv_tokens, 19 * one_pool->kv_tokens / 10);
  // Within the budget, and one more full page would not fit.
  const int64_t kv = static_cast<int64_t>(0.9 * static_cast<double>(in.device_bytes)) - in.weights_bytes -
                     in.activation_bytes - in.other_bytes;
  EXPECT_LE(per_group * 16 * (769 + grouped->num_pages + 1), kv);
  EXPECT_GT(per_group * 16 * (769 + grouped->num_pages + 2), kv);
  const std::string text = describe_kv_memory_plan(in, *grouped);
  EXPECT_NE(text.find("window 128 layers 12288 tokens"), std::string::npos) << text;
  EXPECT_NE(text.find("full layers " + std::to_string(grouped->kv_tokens) + " tokens"), std::string::npos) << text;
  // A context pool smaller than a window's need gives the window group no more than the context.
  EXPECT_EQ(kv_group_pages([&] { EngineConfig e = c; e.kv_group_windows = {128, 0}; return e; }(), 100),
            (std::vector<int64_t>{100, 100}));
}

TEST(GenerateCliEngine, EngineFlagsKeepTheGreedyTokens) {
  const auto& fx = test::fixture_model("tiny-gpt-oss");
  test::TempDir dir;
  std::string jsonl;
  for (const auto& p : fx.prompts) jsonl += nlohmann::json(p).dump() + "\n";
  test::write_file(dir.file("prompts.jsonl"), jsonl);
  // 5-token chunks, pages of 4 and a pool for one request and a page: chunking and preemption.
  const auto r = test::run_mxserve("generate --model " + test::fixture("tiny-gpt-oss") + " --prompt-ids-file " +
                                   dir.file("prompts.jsonl") + " --max-new-tokens 24 --page-size 4 --num-kv-pages 17" +
                                   " --max-num-batched-tokens 5 --max-running-requests 3 --stats");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  std::istringstream lines(r.stdout_text);
  std::string line;
  size_t i = 0;
  for (; std::getline(lines, line); ++i) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["prompt_index"], i);
    EXPECT_EQ(j["output_ids"].get<std::vector<int32_t>>(), fx.greedy[i]) << "prompt " << i;
  }
  EXPECT_EQ(i, fx.prompts.size());
  EXPECT_NE(r.stderr_text.find("preemptions"), std::string::npos);
  EXPECT_EQ(r.stderr_text.find(" 0 preemptions"), std::string::npos) << r.stderr_text;

  const auto bad = test::run_mxserve("generate --model " + test::fixture("tiny-gpt-oss") +
                                     " --prompt-ids 1,2 --max-num-batched-tokens 0");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.stderr_text.find("--max-num-batched-tokens must be at least 1"), std::string::npos) << bad.stderr_text;
  const auto too_long = test::run_mxserve("generate --model " + test::fixture("tiny-gpt-oss") +
                                          " --prompt-ids 1,2 --num-kv-pages 2 --max-new-tokens 40");
  EXPECT_EQ(too_long.exit_code, 1);
  EXPECT_NE(too_long.stderr_text.find("prompt 0: 2 prompt tokens + 40 new tokens exceed this engine's limit of 32"),
            std::string::npos)
      << too_long.stderr_text;
}

}  // namespace
}  // namespace mx
