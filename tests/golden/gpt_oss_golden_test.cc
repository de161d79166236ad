// The CPU backend against Hugging Face transformers (float32, eager) on the tiny gpt-oss fixtures:
// logits and every hidden state within rel-L2 1e-4, greedy tokens identical, decoded incrementally with
// the KV cache. All prompts of a fixture are prefilled together in one batch.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "fixture_reference_util.h"
#include "model/gpt_oss/gpt_oss_model.h"

namespace mx {
namespace {

using test::rel_l2;

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = std::string(MX_FIXTURES_DIR) + "/" + GetParam();
    backend_ = make_cpu_backend();
    auto model = GptOssModel::load(dir_, *backend_);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    model_ = std::move(*model);
    auto ref = test::load_fixture_reference(dir_);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    ref_ = std::move(*ref);
  }

  TensorView ref(const std::string& name) {
    auto t = ref_.file->get(name);
    EXPECT_TRUE(t.is_ok()) << name;
    return *t;
  }

  std::string dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<GptOssModel> model_;
  test::FixtureReference ref_;
};

TEST_P(GoldenTest, BatchedPrefillMatchesLogitsAndHiddenStates) {
  const GptOssConfig& c = model_->config();
  std::map<int64_t, std::vector<float>> hidden;
  HiddenObserver observer = [&](int64_t index, const TensorView& h) {
    hidden[index].assign(h.ptr<const float>(), h.ptr<const float>() + h.numel());
  };
  auto logits = test::prefill_logits(*model_, ref_.prompts, &observer);
  ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
  ASSERT_EQ(static_cast<int64_t>(hidden.size()), c.num_layers + 1);

  int64_t row = 0;
  for (size_t i = 0; i < ref_.prompts.size(); ++i) {
    const auto len = static_cast<int64_t>(ref_.prompts[i].size());
    const std::string p = "prompt_" + std::to_string(i);
    const TensorView want = ref(p + "_logits");
    ASSERT_EQ(want.numel(), len * c.vocab_size);
    const double err = rel_l2(logits->data() + row * c.vocab_size, want.ptr<const float>(), want.numel());
    EXPECT_LE(err, 1e-4) << p << " logits";
    for (int64_t l = 0; l <= c.num_layers; ++l) {
      const TensorView want_h = ref(p + "_hidden_" + std::to_string(l));
      ASSERT_EQ(want_h.numel(), len * c.hidden_size);
      const double err_h = rel_l2(hidden[l].data() + row * c.hidden_size, want_h.ptr<const float>(), want_h.numel());
      EXPECT_LE(err_h, 1e-4) << p << " hidden " << l;
    }
    std::printf("[golden] %s %s: %lld tokens, logits rel-L2 %.3g\n", GetParam().c_str(), p.c_str(),
                static_cast<long long>(len), err);
    row += len;
  }
}

TEST_P(GoldenTest, IncrementalGreedyDecodeMatchesTransformers) {
  // A small page size makes decoding cross many page boundaries.
  auto results = generate_static(*model_, test::reference_greedy_requests(ref_), StaticGeneratorOptions{4, {}});
  ASSERT_TRUE(results.is_ok()) << results.status().to_string();
  for (size_t i = 0; i < ref_.prompts.size(); ++i) {
    EXPECT_EQ((*results)[i].output_ids, ref_.greedy[i]) << "prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(test::kTinyFixtures), test::FixtureParamName());

}  // namespace
}  // namespace mx
