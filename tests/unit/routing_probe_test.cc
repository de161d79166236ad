// RoutingProbe on the CPU twin: replaying a run's own routing changes nothing, and a forced choice far from a
// tie is caught as such (the GPU fixture test relies on both).
#include <gtest/gtest.h>

#include <cstring>

#include "fixture_reference_util.h"
#include "model/gpt_oss/gpt_oss_model.h"
#include "routing_probe_util.h"
#include "test_util.h"

namespace mx::test {
namespace {

const std::vector<std::vector<int32_t>> kPrompts = {{1, 5, 9, 200, 7, 3, 11}, {42, 17, 99, 3}};

std::unique_ptr<GptOssModel> load_with(Backend& backend) {
  auto model = GptOssModel::load(std::string(MX_FIXTURES_DIR) + "/tiny-gpt-oss", backend);
  MX_CHECK(model.is_ok()) << model.status().to_string();
  return std::move(*model);
}

TEST(RoutingProbe, ReplayingOwnRouteIsBitIdentical) {
  auto cpu = make_cpu_backend();
  RoutingProbe recorder = RoutingProbe::recorder(*cpu);
  auto recorded_model = load_with(recorder);
  auto want = prefill_logits(*recorded_model, kPrompts);
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  ASSERT_EQ(static_cast<int64_t>(recorder.route().size()), recorded_model->config().num_layers);

  RoutingProbe forcer = RoutingProbe::forcer(*cpu, recorder.route());
  auto forced_model = load_with(forcer);
  auto got = prefill_logits(*forced_model, kPrompts);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_TRUE(forcer.flips().empty()) << forcer.describe_flips();
  ASSERT_EQ(got->size(), want->size());
  EXPECT_EQ(std::memcmp(got->data(), want->data(), want->size() * sizeof(float)), 0);
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

}  // namespace
}  // namespace mx::test
