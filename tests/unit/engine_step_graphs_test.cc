// The model runner's step graphs on the CPU (replaying_backend.h: the body of a capture runs again at each
// replay, reading whatever stage() last wrote at the captured addresses). So the runner's graph logic (buckets,
// padding sequences and their rows, which steps replay, the view check) runs here as on a GPU: decode and
// verify steps replayed from graphs, which sample inside, give plain decoding's tokens and logprobs bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "engine_test_util.h"
#include "model/model_registry.h"
#include "replaying_backend.h"
#include "spec/reference_drafter.h"
#include "striped_constraint_util.h"
#include "test_util.h"

namespace mx::test {
namespace {

bool same_outputs(const RequestOutput& a, const RequestOutput& b) {
  if (a.token_ids != b.token_ids || a.logprobs.size() != b.logprobs.size()) return false;
  for (size_t t = 0; t < a.logprobs.size(); ++t)
    if (std::memcmp(&a.logprobs[t].logprob, &b.logprobs[t].logprob, sizeof(float)) != 0) return false;
  return true;
}

TEST(EngineStepGraphs, DecodeAndVerifyGraphsReplayLikeEagerSteps) {
  const Fixture& fx = fixture_model("tiny-gpt-oss");
  CpuBackendOptions options;
  options.num_threads = 2;  // as the fixture's backend, which the eager run uses
  auto cpu = make_cpu_backend(options);
  ReplayingBackend replaying(*cpu);
  auto model = load_model(std::string(MX_FIXTURES_DIR) + "/tiny-gpt-oss", replaying);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < fx.prompts.size(); ++i) {
    RequestInput in = greedy_request(fx.prompts[i], 31);  // k = 3: the last verify step has 1 draft
    in.sampling.logprobs = true;
    arrivals.push_back({static_cast<int64_t>(i), in});  // staggered: decode and verify batches of 1..3
  }
  EngineConfig c;
  c.page_size = 4;  // 4 verify rows span pages; padding sequences of 8 rows map two logical pages to the scratch page
  c.num_kv_pages = 128;
  c.max_running_requests = 4;
  c.cuda_graph_batch_sizes = {1, 2, 4};
  const DriveResult plain_eager = [&] {
    auto core = EngineCore::create(*fx.model, c);  // the plain CPU backend: no graphs
    EXPECT_TRUE(core.is_ok());
    return drive(**core, arrivals);
  }();
  std::vector<ReferenceDrafter::Reference> refs;
  for (size_t i = 0; i < fx.prompts.size(); ++i) refs.push_back({fx.prompts[i], plain_eager.outputs[i].token_ids});
  auto forced = std::make_shared<const ReferenceDrafter>(std::move(refs));
  for (const int64_t k : {0, 3, 7}) {
    EngineConfig sc = c;
    if (k > 0) {
      sc.speculative.algorithm = SpeculativeAlgorithm::kExternal;
      sc.speculative.num_draft_tokens = k;
      sc.speculative.external = forced;
    }
    replaying.captures = replaying.replays = 0;
    auto core = EngineCore::create(**model, sc);
    ASSERT_TRUE(core.is_ok()) << core.status().to_string();
    const RunnerStartup& s = (*core)->runner().startup();
    EXPECT_EQ(s.graph_batch_sizes, (std::vector<int64_t>{1, 2, 4}));
    // Verify graphs for every draft count 1..k, in the buckets whose rows fit a step.
    const std::vector<int64_t> verify_sizes = k == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{1, 2, 4};
    EXPECT_EQ(s.verify_graph_batch_sizes, verify_sizes) << k;
    EXPECT_EQ(s.verify_graphs, 3 * k);
    EXPECT_EQ(replaying.captures, 3 + 3 * k);
    // Steps whose entries all verify the same number of drafts replay a verify graph: fewer than k too
    // (the last drafts before max_tokens).
    int64_t uniform_verify_steps = 0, short_verify_steps = 0;
    (*core)->runner().set_step_observer([&](const ScheduledBatch& b) {
      const int64_t d = b.entries.front().num_draft;
      bool uniform = d > 0;
      for (const ScheduledEntry& e : b.entries) uniform = uniform && e.num_draft == d && e.num_tokens == 1 + d && !e.all_logits;
      uniform_verify_steps += uniform ? 1 : 0;
      short_verify_steps += uniform && d < k ? 1 : 0;
    });
    const DriveResult run = drive(**core, arrivals);
    EXPECT_EQ(run.error, "");
    for (size_t i = 0; i < arrivals.size(); ++i)
      EXPECT_TRUE(same_outputs(run.outputs[i], plain_eager.outputs[i])) << "k " << k << " prompt " << i;
    const ModelRunner& r = (*core)->runner();
    EXPECT_EQ(replaying.replays, r.num_graph_replays());
    EXPECT_EQ(r.graph_sampled_steps(), r.num_graph_replays());  // every replay sampled inside its graph
    EXPECT_EQ(r.num_verify_replays(), uniform_verify_steps) << k;
    if (k > 0) {
      EXPECT_GT(short_verify_steps, 0) << k;
      EXPECT_EQ(run.stats.scheduler.spec_accepted_tokens, run.stats.scheduler.spec_draft_tokens) << k;
    } else {
      EXPECT_GT(r.num_graph_replays(), 0);
      EXPECT_EQ(r.num_verify_replays(), 0);
    }
    EXPECT_EQ(run.stats.pages_used, 0);
  }
}

// Grammar masks with the sample op inside the decode graphs: uploaded before the replay (constrained and
// unconstrained requests share batches, and the device's mask flags must be cleared once no request is
// constrained any more), the same tokens and logprobs as the plain eager engine, none outside its mask.
TEST(EngineStepGraphs, MaskedDecodeSamplesInsideTheGraphsLikeEagerSteps) {
  const Fixture& fx = fixture_model("tiny-gpt-oss");
  CpuBackendOptions options;
  options.num_threads = 2;
  auto cpu = make_cpu_backend(options);
  ReplayingBackend replaying(*cpu);
  auto model = load_model(std::string(MX_FIXTURES_DIR) + "/tiny-gpt-oss", replaying);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EngineConfig c;
  c.page_size = 4;
  c.num_kv_pages = 128;
  c.max_running_requests = 4;
  c.cuda_graph_batch_sizes = {1, 2, 4};
  DriveResult runs[2];
  int64_t violations[2] = {0, 0};
  for (int graphs = 0; graphs < 2; ++graphs) {
    std::vector<std::shared_ptr<StripedConstraint>> constraints;
    std::vector<Arrival> arrivals;
    for (size_t i = 0; i < fx.prompts.size(); ++i) {
      // Constrained requests are shorter: the last steps run with no constraint left.
      RequestInput in = greedy_request(fx.prompts[i], i % 3 == 2 ? 24 : 12);
      in.sampling.logprobs = true;
      if (i % 3 != 2) in.constraint = constraints.emplace_back(std::make_shared<StripedConstraint>(static_cast<uint32_t>(i)));
      arrivals.push_back({static_cast<int64_t>(i), in});
    }
    auto core = EngineCore::create(graphs ? **model : *fx.model, c);
    ASSERT_TRUE(core.is_ok()) << core.status().to_string();
    runs[graphs] = drive(**core, arrivals);
    EXPECT_EQ(runs[graphs].error, "");
    for (const auto& k : constraints) violations[graphs] += k->violations;
    const ModelRunner& r = (*core)->runner();
    if (graphs) {
      EXPECT_GT(r.num_graph_replays(), 0);
      EXPECT_EQ(r.graph_sampled_steps(), r.num_graph_replays());
    }
  }
  ASSERT_EQ(runs[0].outputs.size(), runs[1].outputs.size());
  for (size_t i = 0; i < runs[0].outputs.size(); ++i) EXPECT_TRUE(same_outputs(runs[1].outputs[i], runs[0].outputs[i])) << i;
  EXPECT_EQ(violations[0], 0);
  EXPECT_EQ(violations[1], 0);
}

}  // namespace
}  // namespace mx::test
