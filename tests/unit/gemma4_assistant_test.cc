// Gemma-4's MTP assistant as the engine's draft model, on the CPU: config checks with clear errors, and
// temperature-0 and seeded outputs with MTP speculation equal to plain decoding's, token for token, on both
// tiny Gemma-4 fixtures (random assistants: drafts are mostly rejected, so the rollback of verify steps over
// sliding-window pages is what this exercises), with the drafts actually verified.
#include <gtest/gtest.h>

#include "assistant_reference_util.h"
#include "engine_test_util.h"
#include "fixture_reference_util.h"
#include "model/draft_model.h"
#include "model/gemma4/gemma4_assistant_synthetic.h"
#include "model/gemma4/gemma4_model.h"
#include "test_util.h"

namespace mx::test {
namespace {

const Gemma4Config& target_config(const Fixture& fx) { return dynamic_cast<const Gemma4Model&>(*fx.model).config(); }

// A random assistant fitted to the fixture's target, in `dir`.
void write_assistant(const Fixture& fx, const std::string& dir, int64_t layers = 3) {
  const Gemma4AssistantConfig c = gemma4_assistant_for(target_config(fx), layers, 48, 40);
  SyntheticOptions options;
  options.seed = 5;
  options.threads = 1;
  ASSERT_TRUE(write_gemma4_assistant_checkpoint(c, dir, options).is_ok());
}

TEST(Gemma4Assistant, ConfigRoundTripsAndRefusesWhatItCannotRun) {
  const auto& fx = fixture_model("tiny-gemma4-text");
  const Gemma4AssistantConfig c = gemma4_assistant_for(target_config(fx), 3, 48, 40);
  const std::string text = gemma4_assistant_config_to_json(c);
  auto parsed = parse_gemma4_assistant_config(text, "config.json");
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->layer_head_dim, c.layer_head_dim);
  EXPECT_EQ(parsed->layer_is_sliding, c.layer_is_sliding);
  EXPECT_EQ(parsed->backbone_hidden_size, target_config(fx).hidden_size);
  EXPECT_TRUE(check_assistant_fits_target(*parsed, target_config(fx), "config.json").is_ok());

  auto refused = [&](const std::string& from, const std::string& to, const std::string& message) {
    std::string bad = text;
    const size_t at = bad.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    bad.replace(at, from.size(), to);
    auto r = parse_gemma4_assistant_config(bad, "config.json");
    ASSERT_FALSE(r.is_ok()) << to;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
  };
  refused("\"use_ordered_embeddings\": false", "\"use_ordered_embeddings\": true", "use_ordered_embeddings");
  refused("\"num_kv_shared_layers\": 3", "\"num_kv_shared_layers\": 1", "num_kv_shared_layers");
  refused("\"enable_moe_block\": false", "\"enable_moe_block\": true", "enable_moe_block");
  refused("\"model_type\": \"gemma4_assistant\"", "\"model_type\": \"gemma4_text\"", "gemma4_assistant");

  Gemma4AssistantConfig wide = c;
  wide.backbone_hidden_size += 1;
  EXPECT_NE(check_assistant_fits_target(wide, target_config(fx), "a").message().find("backbone_hidden_size"), std::string::npos);
  Gemma4AssistantConfig odd = c;
  odd.layer_head_dim[0] *= 2;
  EXPECT_NE(check_assistant_fits_target(odd, target_config(fx), "a").message().find("head_dim"), std::string::npos);
}

TEST(Gemma4Assistant, LoadNamesMissingTensorsAndWrongTargets) {
  const auto& fx = fixture_model("tiny-gemma4-text");
  TempDir dir;
  write_assistant(fx, dir.path());
  auto ok = load_draft_model(dir.path(), *fx.model);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ((*ok)->window_slack(), 2);
  // Another target's hidden size: refused before any tensor is read.
  const auto& other = fixture_model("tiny-gemma4");
  auto mismatched = load_draft_model(dir.path(), *other.model);
  ASSERT_FALSE(mismatched.is_ok());
  EXPECT_NE(mismatched.status().message().find("cannot draft for the target"), std::string::npos) << mismatched.status().message();
  // A gpt-oss target.
  auto gpt = load_draft_model(dir.path(), *fixture_model("tiny-gpt-oss").model);
  ASSERT_FALSE(gpt.is_ok());
  EXPECT_NE(gpt.status().message().find("Gemma-4"), std::string::npos);
  // The 3-layer checkpoint under a config with a fourth (full) layer: its missing tensors are named.
  TempDir four;
  write_assistant(fx, four.path());
  Gemma4AssistantConfig c = gemma4_assistant_for(target_config(fx), 3, 48, 40);
  c.num_layers = 4;
  c.layer_is_sliding.push_back(false);
  c.layer_head_dim.push_back(c.layer_head_dim.back());
  write_file(four.file("config.json"), gemma4_assistant_config_to_json(c));
  auto missing = load_draft_model(four.path(), *fx.model);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("model.layers.3."), std::string::npos) << missing.status().message();
}

TEST(Gemma4Assistant, SpeculativeOutputsEqualPlainDecoding) {
  for (const char* name : {"tiny-gemma4-text", "tiny-gemma4"}) {
    const auto& fx = fixture_model(name);
    TempDir dir;
    write_assistant(fx, dir.path());
    std::vector<Arrival> arrivals;
    for (size_t i = 0; i < fx.prompts.size(); ++i)
      arrivals.push_back({static_cast<int64_t>(i), greedy_request(fx.prompts[i], 30)});
    RequestInput hot = greedy_request(fx.prompts[0], 30);
    hot.sampling.temperature = 0.8f;
    hot.sampling.top_k = 30;
    hot.sampling.seed = 17;
    arrivals.push_back({1, hot});
    const DriveResult plain = run_engine(fx, draft_model_config(SpeculativeAlgorithm::kMtp, 0, dir.path()), arrivals);
    for (int64_t k : {1, 2, 4}) {
      const DriveResult spec = run_engine(fx, draft_model_config(SpeculativeAlgorithm::kMtp, k, dir.path()), arrivals);
      ASSERT_EQ(spec.outputs.size(), plain.outputs.size());
      for (size_t i = 0; i < arrivals.size(); ++i) {
        EXPECT_EQ(spec.outputs[i].token_ids, plain.outputs[i].token_ids) << name << " k=" << k << " request " << i;
        EXPECT_EQ(spec.outputs[i].finish, plain.outputs[i].finish);
      }
      const SchedulerStats& s = spec.stats.scheduler;
      EXPECT_GT(s.spec_drafts, 0) << name << " k=" << k;
      EXPECT_LE(s.spec_accepted_tokens, s.spec_draft_tokens);
      EXPECT_EQ(spec.stats.pages_used, 0);
      std::printf("[mtp] %s k=%lld: %lld steps (plain %lld), %lld verify steps, %lld/%lld draft tokens accepted\n", name,
                  static_cast<long long>(k), static_cast<long long>(spec.steps), static_cast<long long>(plain.steps),
                  static_cast<long long>(s.spec_drafts), static_cast<long long>(s.spec_accepted_tokens),
                  static_cast<long long>(s.spec_draft_tokens));
    }
  }
}

// A pool too small for every request at once (preemption and recomputation: drafts made before a
// preemption must not be verified against a recomputed state they were not made for) and repeated prompts
// (prefix-cache hits: the first computed row still yields the hidden state the drafts start from).
TEST(Gemma4Assistant, PreemptionAndPrefixHitsKeepPlainOutputs) {
  const auto& fx = fixture_model("tiny-gemma4-text");
  TempDir dir;
  write_assistant(fx, dir.path());
  // 48 pages: 192 tokens of context, the eight requests need ~560.
  expect_speculation_survives_preemption_and_prefix_hits(
      fx, draft_model_config(SpeculativeAlgorithm::kMtp, 0, dir.path()),
      draft_model_config(SpeculativeAlgorithm::kMtp, 3, dir.path()), 64);
}

// transformers' drafts (float32) for every prompt of the fixture: the same tokens, logits within float32
// rounding of the fp32 twin (the fixture's weights are bf16 values, so both sides compute on the same numbers).
TEST(Gemma4Assistant, DraftsMatchTransformers) {
  const auto& fx = fixture_model("tiny-gemma4-text");
  auto loaded = load_draft_model(fixture("tiny-gemma4-text-assistant"), *fx.model);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const auto& assistant = dynamic_cast<const Gemma4AssistantModel&>(**loaded);
  auto ref = Checkpoint::open_file(fixture("tiny-gemma4-text-assistant") + "/reference.safetensors");
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  int prompts = 0;
  for (int i = 0; ref->has("prompt_" + std::to_string(i) + "_ids"); ++i, ++prompts) {
    const std::string p = "prompt_" + std::to_string(i) + "_";
    const std::vector<int32_t> ids = ids_of(*ref->get(p + "ids"));
    const std::vector<int32_t> want = ids_of(*ref->get(p + "drafts"));
    const TensorView logits = *ref->get(p + "draft_logits");
    auto round = run_draft_round(*fx.model, assistant, ids, static_cast<int64_t>(want.size()));
    ASSERT_TRUE(round.is_ok()) << round.status().to_string();
    EXPECT_EQ(round->tokens, want) << "prompt " << i << " (" << ids.size() - 1 << " tokens)";
    const int64_t V = logits.dim(1);
    for (size_t j = 0; j < want.size(); ++j) {
      const double err = rel_l2(round->logits[j].data(), logits.ptr<const float>() + static_cast<int64_t>(j) * V, V);
      EXPECT_LT(err, 1e-4) << "prompt " << i << " draft " << j;
    }
  }
  EXPECT_EQ(prompts, 4);
}

// The engine's draft call (ModelRunner::draft: the query row at the new token's position p, the context row
// at p - 1, the target's hidden row of p - 1) gives transformers' drafts for each reference prompt whose
// next token the engine's target samples as the reference has it.
TEST(Gemma4Assistant, EngineDraftsMatchTransformers) {
  const auto& fx = fixture_model("tiny-gemma4-text");
  const std::string assistant = fixture("tiny-gemma4-text-assistant");
  auto ref = Checkpoint::open_file(assistant + "/reference.safetensors");
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  int checked = 0;
  for (int i = 0; ref->has("prompt_" + std::to_string(i) + "_ids"); ++i) {
    const std::string p = "prompt_" + std::to_string(i) + "_";
    const std::vector<int32_t> ids = ids_of(*ref->get(p + "ids"));
    const std::vector<int32_t> want = ids_of(*ref->get(p + "drafts"));
    auto core = EngineCore::create(
        *fx.model, draft_model_config(SpeculativeAlgorithm::kMtp, static_cast<int64_t>(want.size()), assistant));
    ASSERT_TRUE(core.is_ok()) << core.status().to_string();
    ASSERT_TRUE((*core)->add_request(1, greedy_request(std::vector<int32_t>(ids.begin(), ids.end() - 1), 4)).is_ok());
    std::vector<RequestOutput> outputs;
    while ((*core)->runner().num_draft_calls() == 0 && (*core)->has_work()) (*core)->step(&outputs);
    ASSERT_EQ(outputs.size(), 1u);
    ASSERT_EQ(outputs[0].token_ids.size(), 1u);
    if (outputs[0].token_ids[0] != ids.back()) continue;
    const std::span<const int32_t> drafts = (*core)->runner().last_drafts();  // [k, 1]
    EXPECT_EQ(std::vector<int32_t>(drafts.begin(), drafts.end()), want) << "prompt " << i;
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(Gemma4Assistant, FlagsNeedADraftModel) {
  SpeculativeConfig s;
  s.algorithm = SpeculativeAlgorithm::kMtp;
  s.num_draft_tokens = 2;
  EXPECT_NE(validate_speculative_config(s).message().find("draft model"), std::string::npos);
  s.draft_model = "/x";
  EXPECT_TRUE(validate_speculative_config(s).is_ok());
  s.algorithm = SpeculativeAlgorithm::kNgram;
  EXPECT_FALSE(validate_speculative_config(s).is_ok());
  EXPECT_TRUE(parse_speculative_algorithm("mtp").is_ok());
  EXPECT_TRUE(parse_speculative_algorithm("eagle3").is_ok());
  EXPECT_FALSE(parse_speculative_algorithm("medusa").is_ok());
}

}  // namespace
}  // namespace mx::test
