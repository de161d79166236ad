// The runner samples a step with the backend's sample op unless a row needs the host (penalties, top
// logprobs, prompt logits). Both paths run the same algorithm: a request draws the same tokens whichever
// path its steps took.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "engine_test_util.h"

namespace mx::test {
namespace {

TEST(EngineSampling, SampleOpAndHostSamplerDrawTheSameTokens) {
  const auto& fx = fixture_model("tiny-gpt-oss-b");
  RequestInput plain = greedy_request(fx.prompts[0], 14);
  plain.sampling.temperature = 0.8f;
  plain.sampling.top_p = 0.9f;
  plain.sampling.top_k = 40;
  plain.sampling.min_p = 0.02f;
  plain.sampling.seed = 7;
  plain.sampling.logprobs = true;
  RequestInput hot = greedy_request(fx.prompts[2], 14);
  hot.sampling.temperature = 1.5f;
  hot.sampling.seed = 8;
  RequestInput penalised = hot;
  penalised.sampling.frequency_penalty = 0.5f;  // host path for every step it shares

  auto run = [&](const std::vector<Arrival>& arrivals) {
    auto core = EngineCore::create(*fx.model, EngineConfig{});
    EXPECT_TRUE(core.is_ok()) << core.status().to_string();
    DriveResult r = drive(**core, arrivals);
    EXPECT_EQ(r.error, "");
    return r;
  };
  const DriveResult alone = run({{0, plain}});                       // op path throughout
  const DriveResult mixed = run({{0, plain}, {0, penalised}});       // host path while both run
  const DriveResult late = run({{0, hot}, {5, plain}, {9, penalised}});  // paths change mid-request
  ASSERT_EQ(alone.outputs[0].token_ids.size(), 14u);
  EXPECT_EQ(mixed.outputs[0].token_ids, alone.outputs[0].token_ids);
  EXPECT_EQ(late.outputs[1].token_ids, alone.outputs[0].token_ids);
  for (const DriveResult* r : {&mixed, &late}) {
    const auto& a = alone.outputs[0];
    const auto& b = r == &mixed ? r->outputs[0] : r->outputs[1];
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    for (size_t t = 0; t < a.logprobs.size(); ++t) EXPECT_NEAR(a.logprobs[t].logprob, b.logprobs[t].logprob, 1e-5);
  }
  // The first request of `late` ran op, host and op steps in turn: still its own tokens.
  EXPECT_EQ(late.outputs[0].token_ids, run({{0, hot}}).outputs[0].token_ids);
}

// A step whose rows all need the host (penalties and top logprobs here) draws them on several threads, a Sampler
// each: every request still draws its own tokens and logprobs, as it does alone.
TEST(EngineSampling, HostRowsDrawnOnSeveralThreadsAsAlone) {
  const auto& fx = fixture_model("tiny-gpt-oss-b");
  std::vector<RequestInput> inputs;
  for (int i = 0; i < 5; ++i) {
    RequestInput in = greedy_request(fx.prompts[static_cast<size_t>(i) % fx.prompts.size()], 10);
    in.sampling.temperature = 0.7f + 0.2f * static_cast<float>(i);
    in.sampling.top_p = i % 2 == 0 ? 0.9f : 1.0f;
    in.sampling.seed = 20 + static_cast<uint64_t>(i);
    in.sampling.presence_penalty = i == 0 ? 0.0f : 0.4f;
    in.sampling.logprobs = true;
    in.sampling.top_logprobs = i == 0 ? 2 : 0;  // the host path for every step, whoever else runs
    inputs.push_back(in);
  }
  std::vector<Arrival> together;
  for (const RequestInput& in : inputs) together.push_back({0, in});
  auto core = EngineCore::create(*fx.model, EngineConfig{});
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  const DriveResult all = drive(**core, together);
  ASSERT_EQ(all.error, "");
  EXPECT_EQ((*core)->runner().sample_op_steps(), 0);
  const int64_t threads = std::min<int64_t>({5, 8, std::max(1u, std::thread::hardware_concurrency())});
  EXPECT_EQ((*core)->runner().host_sample_threads(), threads);
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto alone_core = EngineCore::create(*fx.model, EngineConfig{});
    ASSERT_TRUE(alone_core.is_ok());
    const DriveResult alone = drive(**alone_core, {{0, inputs[i]}});
    EXPECT_EQ(all.outputs[i].token_ids, alone.outputs[0].token_ids) << "request " << i;
    ASSERT_EQ(all.outputs[i].logprobs.size(), alone.outputs[0].logprobs.size());
    for (size_t t = 0; t < alone.outputs[0].logprobs.size(); ++t)
      EXPECT_NEAR(all.outputs[i].logprobs[t].logprob, alone.outputs[0].logprobs[t].logprob, 1e-5) << i << " " << t;
  }
}

}  // namespace
}  // namespace mx::test
