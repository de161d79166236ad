// RouteTrace on the CPU twin: an engine run is recorded at every (request, position, layer), speculative
// verification (forced drafts) routes exactly as plain decoding does in fp32, and compare_routes judges
// differences by their roots (the GPU speculation test relies on all three).
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "model/model_registry.h"
#include "route_trace_util.h"
#include "spec/reference_drafter.h"
#include "test_util.h"

namespace mx::test {
namespace {

RouteLog run_traced(RouteTrace& trace, const Model& model, const EngineConfig& config, const std::vector<Arrival>& arrivals,
                    DriveResult* result) {
  auto core = EngineCore::create(model, config);
  MX_CHECK(core.is_ok()) << core.status().to_string();
  (*core)->runner().set_step_observer([&](const ScheduledBatch& b) { trace.begin_step(b); });
  *result = drive(**core, arrivals);
  EXPECT_EQ(result->error, "");
  return trace.take();
}

TEST(RouteTrace, SpeculationRoutesEveryPositionAsPlainDecodingOnCpu) {
  const Fixture& fx = fixture_model("tiny-gpt-oss");
  auto cpu = make_cpu_backend();
  RouteTrace trace(*cpu);
  auto model = load_model(std::string(MX_FIXTURES_DIR) + "/tiny-gpt-oss", trace);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const int64_t n = 12;
  std::vector<Arrival> arrivals;
  for (const auto& p : fx.prompts) arrivals.push_back({0, greedy_request(p, n)});
  EngineConfig c;
  c.page_size = 4;
  DriveResult plain, spec;
  const RouteLog plain_log = run_traced(trace, **model, c, arrivals, &plain);
  std::vector<ReferenceDrafter::Reference> refs;
  for (size_t i = 0; i < fx.prompts.size(); ++i) refs.push_back({fx.prompts[i], plain.outputs[i].token_ids});
  c.speculative.algorithm = SpeculativeAlgorithm::kExternal;
  c.speculative.num_draft_tokens = 3;
  c.speculative.external = std::make_shared<const ReferenceDrafter>(std::move(refs));
  const RouteLog spec_log = run_traced(trace, **model, c, arrivals, &spec);
  EXPECT_GT(spec.stats.scheduler.spec_accepted_tokens, 0);
  const int64_t layers = (*model)->dims().num_layers;
  for (size_t i = 0; i < fx.prompts.size(); ++i) {
    const auto id = static_cast<RequestId>(1000 + i);  // drive() numbers requests from 1000 in arrival order
    ASSERT_EQ(spec.outputs[i].token_ids, plain.outputs[i].token_ids);
    // The last sampled token's position is never computed: positions 0 .. prompt + n - 2.
    const auto last = static_cast<int64_t>(fx.prompts[i].size()) + n - 2;
    for (const RouteLog* log : {&plain_log, &spec_log}) {
      for (int64_t pos = 0; pos <= last; ++pos) {
        const auto it = log->find({id, pos});
        ASSERT_NE(it, log->end()) << "prompt " << i << " position " << pos;
        ASSERT_EQ(static_cast<int64_t>(it->second.size()), layers);
        EXPECT_EQ(it->second[0].ids.size(), 4u);
        EXPECT_EQ(it->second[0].logits.size(), 8u);
      }
    }
    const RouteComparison cmp = compare_routes(plain_log, spec_log, id, last);
    EXPECT_TRUE(cmp.differences.empty()) << cmp.describe();
    EXPECT_EQ(cmp.missing, 0);
    EXPECT_FALSE(cmp.explains_divergence());  // identical routes explain no token difference
  }
}

// One request, 3 experts, top 1: a row that picks `id` with logits {l0, l1, l2}, scale 1 for every expert.
RouteRow row(int32_t id, std::vector<float> logits) { return {{id}, std::move(logits), {1.0, 1.0, 1.0}}; }

TEST(RouteTrace, DifferencesAreJudgedByTheirRoots) {
  RouteLog a, b;
  for (int64_t pos = 0; pos < 4; ++pos) {
    a[{7, pos}] = {row(0, {1, 0, 0}), row(0, {1, 0, 0})};
    b[{7, pos}] = a[{7, pos}];
  }
  EXPECT_EQ(compare_routes(a, b, 7, 3).describe(), "routes identical");
  EXPECT_FALSE(compare_routes(a, b, 7, 3).explains_divergence());
  // Layer 0, position 1: a near tie (0.004 + 0.004 <= 1% of 1) flips; downstream flips far from ties follow.
  a[{7, 1}][0] = row(0, {0.502f, 0.498f, 0});
  b[{7, 1}][0] = row(1, {0.498f, 0.502f, 0});
  b[{7, 1}][1] = row(2, {0, 0, 1});
  b[{7, 3}][1] = row(2, {0, 0, 1});
  RouteComparison c = compare_routes(a, b, 7, 3);
  ASSERT_EQ(c.differences.size(), 3u);
  EXPECT_TRUE(c.differences[0].root);
  EXPECT_NEAR(c.differences[0].gap, 0.008, 1e-5);
  EXPECT_FALSE(c.differences[1].root);  // layer 1 at position 1 sits below layer 0's flip at position 1
  EXPECT_FALSE(c.differences[2].root);  // so does position 3
  EXPECT_TRUE(c.explains_divergence()) << c.describe();
  // Up to position 0 nothing differs.
  EXPECT_FALSE(compare_routes(a, b, 7, 0).explains_divergence());
  // A flip in layer 1 at position 0, before the near tie: a root of its own, and far from a tie.
  b[{7, 0}][1] = row(1, {0, 1, 0});
  c = compare_routes(a, b, 7, 3);
  EXPECT_TRUE(c.differences[0].root);
  EXPECT_FALSE(c.differences[0].near_tie());
  EXPECT_FALSE(c.explains_divergence()) << c.describe();
  // A position one log lacks makes no explanation.
  b[{7, 0}][1] = a[{7, 0}][1];
  b.erase({7, 2});
  c = compare_routes(a, b, 7, 3);
  EXPECT_EQ(c.missing, 2);
  EXPECT_FALSE(c.explains_divergence());
}

}  // namespace
}  // namespace mx::test
