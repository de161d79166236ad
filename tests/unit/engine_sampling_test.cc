// The runner samples a step's rows with the backend's sample op, and on the host the rows of the entries that need
// it (penalties, top logprobs; every row of a step with prompt logits). Both paths run the same algorithm: a
// request draws the same tokens whichever path its steps took.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "engine_test_util.h"
#include "model/model_registry.h"
#include "replaying_backend.h"
#include "spec/reference_drafter.h"
#include "striped_constraint_util.h"

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
  const DriveResult mixed = run({{0, plain}, {0, penalised}});       // split steps while both run
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
  // The first request of `late` ran op, split and op steps in turn: still its own tokens.
  EXPECT_EQ(late.outputs[0].token_ids, run({{0, hot}}).outputs[0].token_ids);
}

// Rows the sample op can draw stay on it while other rows of the step need the host (top logprobs, penalties), in
// steps run eagerly (mixed prefill and decode too) and replayed from graphs (replaying_backend.h), plain and
// verifying forced drafts, constrained rows on either side: every request draws the tokens, logprobs and top
// logprobs it draws alone, and what the same steps drew with every row on the host (the form before).
TEST(EngineSampling, SplitStepsDrawEachRowAsAloneAndAsWholeHostSteps) {
  const Fixture& fx = fixture_model("tiny-gpt-oss");
  CpuBackendOptions options;
  options.num_threads = 2;  // as the fixture's backend
  auto cpu = make_cpu_backend(options);
  ReplayingBackend replaying(*cpu);
  auto graph_model = load_model(std::string(MX_FIXTURES_DIR) + "/tiny-gpt-oss", replaying);
  ASSERT_TRUE(graph_model.is_ok()) << graph_model.status().to_string();
  constexpr int kRequests = 6;
  // Made afresh for each run (a constraint keeps its step): 2, 3 and 5 need the host; 4 and 5 are constrained.
  auto request = [&](int i) {
    RequestInput in = greedy_request(fx.prompts[static_cast<size_t>(i) % fx.prompts.size()], 12);
    in.sampling.temperature = i % 2 == 0 ? 0.9f : 0.0f;
    in.sampling.top_p = i == 0 ? 0.9f : 1.0f;
    in.sampling.seed = 30 + static_cast<uint64_t>(i);
    in.sampling.logprobs = i != 1;
    if (i == 2) in.sampling.top_logprobs = 3;
    if (i == 3) in.sampling.presence_penalty = 0.5f;
    if (i == 5) in.sampling.repetition_penalty = 1.3f;
    if (i >= 4) in.constraint = std::make_shared<StripedConstraint>(static_cast<uint32_t>(i));
    return in;
  };
  auto run = [&](const Model& model, const EngineConfig& c, const std::vector<Arrival>& arrivals, bool whole_host,
                 int64_t* split_steps) {
    auto core = EngineCore::create(model, c);
    EXPECT_TRUE(core.is_ok()) << core.status().to_string();
    (*core)->runner().set_whole_batch_host_sampling(whole_host);
    DriveResult r = drive(**core, arrivals);
    EXPECT_EQ(r.error, "");
    *split_steps = (*core)->runner().split_sample_steps();
    return r;
  };
  EngineConfig c;
  c.page_size = 4;
  c.num_kv_pages = 256;
  c.max_running_requests = 8;
  c.cuda_graph_batch_sizes = {1, 2, 4, 8};
  std::vector<DriveResult> alone;
  int64_t unused = 0;
  for (int i = 0; i < kRequests; ++i) alone.push_back(run(*fx.model, c, {{0, request(i)}}, false, &unused));
  std::vector<ReferenceDrafter::Reference> refs;
  for (int i = 0; i < kRequests; ++i) refs.push_back({request(i).prompt, alone[static_cast<size_t>(i)].outputs[0].token_ids});
  EngineConfig verify = c;
  verify.speculative.algorithm = SpeculativeAlgorithm::kExternal;
  verify.speculative.num_draft_tokens = 2;
  verify.speculative.external = std::make_shared<const ReferenceDrafter>(std::move(refs));
  const struct {
    const char* name;
    const Model& model;
    const EngineConfig& config;
  } forms[] = {{"eager", *fx.model, c}, {"graphs", **graph_model, c}, {"graphs, verifying 2 drafts", **graph_model, verify}};
  for (const auto& form : forms) {
    DriveResult both[2];
    int64_t split_steps[2] = {0, 0};
    for (int whole = 0; whole < 2; ++whole) {
      std::vector<Arrival> arrivals;
      for (int i = 0; i < kRequests; ++i) arrivals.push_back({i < 3 ? 0 : i - 2, request(i)});  // mixed steps too
      both[whole] = run(form.model, form.config, arrivals, whole == 1, &split_steps[whole]);
    }
    EXPECT_GT(split_steps[0], 0) << form.name;
    EXPECT_EQ(split_steps[1], 0) << form.name;
    for (int i = 0; i < kRequests; ++i) {
      const RequestOutput& a = alone[static_cast<size_t>(i)].outputs[0];
      for (const DriveResult& r : both) {
        const RequestOutput& b = r.outputs[static_cast<size_t>(i)];
        const std::string where = std::string(form.name) + (&r == &both[0] ? " split" : " whole host") + ", request " +
                                  std::to_string(i);
        EXPECT_EQ(b.token_ids, a.token_ids) << where;
        ASSERT_EQ(b.logprobs.size(), a.logprobs.size()) << where;
        for (size_t t = 0; t < a.logprobs.size(); ++t) {
          EXPECT_NEAR(b.logprobs[t].logprob, a.logprobs[t].logprob, 1e-5) << where << " token " << t;
          ASSERT_EQ(b.logprobs[t].top.size(), a.logprobs[t].top.size()) << where << " token " << t;
          for (size_t k = 0; k < a.logprobs[t].top.size(); ++k) {
            EXPECT_EQ(b.logprobs[t].top[k].token, a.logprobs[t].top[k].token) << where << " token " << t;
            EXPECT_NEAR(b.logprobs[t].top[k].logprob, a.logprobs[t].top[k].logprob, 1e-5) << where << " token " << t;
          }
        }
      }
    }
  }
}

// A step whose rows all need the host (penalties, and top logprobs here) draws or ranks them on several threads, a
// Sampler each: every request still draws its own tokens and logprobs, as it does alone.
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
    in.sampling.top_logprobs = i == 0 ? 2 : 0;  // the host ranks them; the sample op draws its token
    inputs.push_back(in);
  }
  std::vector<Arrival> together;
  for (const RequestInput& in : inputs) together.push_back({0, in});
  auto core = EngineCore::create(*fx.model, EngineConfig{});
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  const DriveResult all = drive(**core, together);
  ASSERT_EQ(all.error, "");
  EXPECT_EQ((*core)->runner().sample_op_steps(), (*core)->runner().split_sample_steps());  // request 0's draws
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
