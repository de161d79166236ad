// EAGLE-3 speculation through the engine on the gpt-oss fixtures (CPU): temperature 0 with drafts equals
// plain decoding token for token, and seeded sampling too (drafts are point masses: the acceptance rule is
// exact), with random-weight drafts of the fixtures' shapes (tiny-gpt-oss(-b)-eagle3 presets, written by our
// own synthetic writer): they are rarely accepted, so the draft's KV rollback is what is exercised; small
// pages put its chain on scratch pages and across page boundaries; preemption and prefix-cache hits. Also:
// the flag's refusals.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "engine_test_util.h"
#include "model/synthetic_model.h"
#include "test_util.h"

namespace mx::test {
namespace {

TEST(EngineEagle3, GreedyAndSeededTokensEqualPlainDecodingOnEveryGptOssFixture) {
  // k = 1 (no chain pass), 3 and 4 (chains that spill onto the scratch page and across pages of 4).
  for (const auto& [name, preset, ks] :
       {std::tuple<const char*, const char*, std::vector<int64_t>>{"tiny-gpt-oss", "tiny-gpt-oss-eagle3", {1, 4}},
        {"tiny-gpt-oss-b", "tiny-gpt-oss-b-eagle3", {3}}}) {
    TempDir draft;
    ASSERT_TRUE(write_synthetic_model(preset, draft.path(), SyntheticOptions{}).is_ok());
    const auto& fx = fixture_model(name);
    std::vector<Arrival> arrivals;
    for (size_t i = 0; i < fx.prompts.size(); ++i)
      arrivals.push_back({static_cast<int64_t>(i), greedy_request(fx.prompts[i], static_cast<int64_t>(fx.greedy[i].size()))});
    RequestInput hot = greedy_request(fx.prompts[0], 24);
    hot.sampling.temperature = 0.8f;
    hot.sampling.top_k = 30;
    hot.sampling.seed = 5;
    arrivals.push_back({1, hot});
    const DriveResult plain = run_engine(fx, draft_model_config(SpeculativeAlgorithm::kEagle3, 0, ""), arrivals);
    for (int64_t k : ks) {
      const DriveResult spec =
          run_engine(fx, draft_model_config(SpeculativeAlgorithm::kEagle3, k, draft.path()), arrivals);
      ASSERT_EQ(spec.outputs.size(), arrivals.size());
      for (size_t i = 0; i < arrivals.size(); ++i)
        EXPECT_EQ(spec.outputs[i].token_ids, plain.outputs[i].token_ids) << name << " k=" << k << " request " << i;
      for (size_t i = 0; i < fx.prompts.size(); ++i) EXPECT_EQ(spec.outputs[i].token_ids, fx.greedy[i]) << name;
      EXPECT_EQ(spec.stats.pages_used, 0);
      const SchedulerStats& s = spec.stats.scheduler;
      EXPECT_GT(s.spec_drafts, 0) << name << " k=" << k;  // the drafts were verified (and rolled back)
      std::printf("[eagle3] %s k=%lld: %lld steps (plain %lld), %lld drafts, %lld/%lld draft tokens accepted\n", name,
                  static_cast<long long>(k), static_cast<long long>(spec.steps), static_cast<long long>(plain.steps),
                  static_cast<long long>(s.spec_drafts), static_cast<long long>(s.spec_accepted_tokens),
                  static_cast<long long>(s.spec_draft_tokens));
    }
  }
}

// A pool too small for every request at once (preemption: the draft's KV of a recomputed request is written
// again by its recompute's prompt chunks) and repeated prompts (prefix-cache hits: the shared pages carry
// the draft KV their first owner wrote), with chunked prefill (prompt chunks that draft nothing).
TEST(EngineEagle3, PreemptionAndPrefixHitsKeepPlainOutputs) {
  TempDir draft;
  ASSERT_TRUE(write_synthetic_model("tiny-gpt-oss-eagle3", draft.path(), SyntheticOptions{}).is_ok());
  expect_speculation_survives_preemption_and_prefix_hits(
      fixture_model("tiny-gpt-oss"), draft_model_config(SpeculativeAlgorithm::kEagle3, 0, ""),
      draft_model_config(SpeculativeAlgorithm::kEagle3, 3, draft.path()), 16);
}

TEST(EngineEagle3, RefusesADraftForAnotherTarget) {
  TempDir draft;
  ASSERT_TRUE(write_synthetic_model("tiny-gpt-oss-b-eagle3", draft.path(), SyntheticOptions{}).is_ok());
  auto core = EngineCore::create(*fixture_model("tiny-gpt-oss").model,
                                 draft_model_config(SpeculativeAlgorithm::kEagle3, 3, draft.path()));
  ASSERT_FALSE(core.is_ok());
  EXPECT_NE(core.status().message().find("EAGLE-3"), std::string::npos) << core.status().to_string();
}

}  // namespace
}  // namespace mx::test
