// RoutingProbe on the CPU twin: replaying a run's own routing changes nothing (gpt-oss and Gemma-4), a forced
// choice far from a tie is caught as such (the GPU fixture test relies on both), and a forced route keeps
// Gemma-4's per-expert scales.
#include <gtest/gtest.h>

#include <cstring>

#include "fixture_reference_util.h"
#include "model/gpt_oss/gpt_oss_model.h"
#include "model/model_registry.h"
#include "routing_probe_util.h"
#include "test_util.h"

namespace mx::test {
namespace {

const std::vector<std::vector<int32_t>> kPrompts = {{1, 5, 9, 200, 7, 3, 11}, {42, 17, 99, 3}};  // < 256 (both vocabularies)

std::unique_ptr<GptOssModel> load_with(Backend& backend) {
  auto model = GptOssModel::load(std::string(MX_FIXTURES_DIR) + "/tiny-gpt-oss", backend);
  MX_CHECK(model.is_ok()) << model.status().to_string();
  return std::move(*model);
}

TEST(RoutingProbe, ReplayingOwnRouteIsBitIdentical) {
  for (const char* fixture : {"tiny-gpt-oss", "tiny-gemma4-text"}) {
    auto cpu = make_cpu_backend();
    const std::string dir = std::string(MX_FIXTURES_DIR) + "/" + fixture;
    RoutingProbe recorder = RoutingProbe::recorder(*cpu);
    auto recorded_model = load_model(dir, recorder);
    ASSERT_TRUE(recorded_model.is_ok()) << recorded_model.status().to_string();
    auto want = prefill_logits(**recorded_model, kPrompts);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();
    ASSERT_EQ(static_cast<int64_t>(recorder.route().size()), (*recorded_model)->dims().num_layers) << fixture;

    RoutingProbe forcer = RoutingProbe::forcer(*cpu, recorder.route());
    auto forced_model = load_model(dir, forcer);
    ASSERT_TRUE(forced_model.is_ok());
    auto got = prefill_logits(**forced_model, kPrompts);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    EXPECT_TRUE(forcer.flips().empty()) << forcer.describe_flips();
    ASSERT_EQ(got->size(), want->size());
    EXPECT_EQ(std::memcmp(got->data(), want->data(), want->size() * sizeof(float)), 0) << fixture;
  }
}

TEST(RoutingProbe, ForcedFarChoiceIsAFlipButNotANearTie) {
  auto cpu = make_cpu_backend();
  RoutingProbe recorder = RoutingProbe::recorder(*cpu);
  auto model = load_with(recorder);
  auto want = prefill_logits(*model, kPrompts);
  ASSERT_TRUE(want.is_ok());
  const int64_t k = model->config().experts_per_token, experts = model->config().num_experts;
  // Token 2 of layer 0: replace its strongest expert with one it did not choose.
  std::vector<std::vector<int32_t>> route = recorder.route();
  int32_t* row = route[0].data() + 2 * k;
  for (int32_t e = 0; e < experts; ++e) {
    if (std::find(row, row + k, e) == row + k) {
      row[0] = e;
      break;
    }
  }
  RoutingProbe forcer = RoutingProbe::forcer(*cpu, route);
  auto forced_model = load_with(forcer);
  auto got = prefill_logits(*forced_model, kPrompts);
  ASSERT_TRUE(got.is_ok());
  ASSERT_GE(forcer.flips().size(), 1u);
  EXPECT_EQ(forcer.flips()[0].call, 0);
  EXPECT_EQ(forcer.flips()[0].token, 2);
  EXPECT_GT(forcer.flips()[0].gap, 0.0);
  EXPECT_FALSE(forcer.all_flips_near_ties()) << forcer.describe_flips();
  EXPECT_NE(std::memcmp(got->data(), want->data(), want->size() * sizeof(float)), 0);
}

// Gemma-4's router multiplies the kept weights by per-expert scales; a forced route keeps them.
TEST(RoutingProbe, ForcedRouteKeepsPerExpertScales) {
  auto cpu = make_cpu_backend(CpuBackendOptions{1});
  std::vector<float> x = {1.0f, 0.0f};
  const std::vector<uint16_t> weight = {f32_to_bf16(3.0f), 0, f32_to_bf16(2.0f), 0, f32_to_bf16(1.0f), 0};  // [3, 2]
  const std::vector<float> expert_scale = {1.0f, 1.0f, 0.5f};
  std::vector<float> logits(3);
  int32_t id = -1;
  float w = 0;
  RouterParams p;
  p.x = TensorView(x.data(), DType::kF32, {1, 2});
  p.weight = TensorView(const_cast<uint16_t*>(weight.data()), DType::kBF16, {3, 2});
  p.logits = TensorView(logits.data(), DType::kF32, {1, 3});
  p.topk_ids = TensorView(&id, DType::kI32, {1, 1});
  p.topk_weights = TensorView(&w, DType::kF32, {1, 1});
  p.top_k = 1;
  p.expert_scale = TensorView(const_cast<float*>(expert_scale.data()), DType::kF32, {3});
  RoutingProbe forcer = RoutingProbe::forcer(*cpu, {{2}});
  ASSERT_TRUE(forcer.router_topk(p).is_ok());
  EXPECT_EQ(id, 2);
  EXPECT_FLOAT_EQ(w, 0.5f);  // softmax over the one kept expert (1) times its scale
  ASSERT_EQ(forcer.flips().size(), 1u);
}

}  // namespace
}  // namespace mx::test
