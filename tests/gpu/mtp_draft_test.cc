// Gemma-4's MTP assistant on CUDA against transformers' drafts (tests/fixtures/tiny-gemma4-text-assistant): one
// draft round per prompt (target prefill in bf16, then 4 greedy draft steps), logits within twice the worst
// error of transformers' own bf16 run of the same round (its reference.json: 0.010-0.026 rel-L2), tokens reported
// against the fp32 drafts, the first draft of every prompt required to match.
#include <cstdlib>

#include "assistant_reference_util.h"
#include "fixture_reference_util.h"
#include "gpu_test_util.h"
#include "model/draft_model.h"
#include "model/model_registry.h"

namespace mx::gpu_test {
namespace {

TEST(MtpDraft, DraftRoundsMatchTransformersOnCuda) {
  const char* env = std::getenv("MX_FIXTURES_DIR");
  const std::string fixtures = env ? env : MX_FIXTURES_DIR;
  auto target = load_model(fixtures + "/tiny-gemma4-text", cuda_backend());
  ASSERT_TRUE(target.is_ok()) << target.status().to_string();
  auto loaded = load_draft_model(fixtures + "/tiny-gemma4-text-assistant", **target);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const auto& assistant = dynamic_cast<const Gemma4AssistantModel&>(**loaded);
  auto ref = Checkpoint::open_file(fixtures + "/tiny-gemma4-text-assistant/reference.safetensors");
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  constexpr double kTolerance = 0.052;  // 2x transformers' worst bf16-vs-fp32 draft error on this fixture
  for (int i = 0; ref->has("prompt_" + std::to_string(i) + "_ids"); ++i) {
    const std::string p = "prompt_" + std::to_string(i) + "_";
    const std::vector<int32_t> ids = test::ids_of(*ref->get(p + "ids"));
    const std::vector<int32_t> want = test::ids_of(*ref->get(p + "drafts"));
    const TensorView logits = *ref->get(p + "draft_logits");
    auto round = test::run_draft_round(**target, assistant, ids, static_cast<int64_t>(want.size()));
    ASSERT_TRUE(round.is_ok()) << round.status().to_string();
    const int64_t V = logits.dim(1);
    std::string tokens;
    for (size_t j = 0; j < want.size(); ++j) tokens += std::to_string(round->tokens[j]) + (round->tokens[j] == want[j] ? " " : "* ");
    for (size_t j = 0; j < want.size(); ++j) {
      const std::vector<float> expected(logits.ptr<const float>() + static_cast<int64_t>(j) * V,
                                        logits.ptr<const float>() + static_cast<int64_t>(j + 1) * V);
      check("mtp draft logits vs transformers fp32",
            "prompt " + std::to_string(i) + " (" + std::to_string(ids.size() - 1) + " tokens) draft " + std::to_string(j) +
                ", drafts " + tokens + "(* = differs from fp32)",
            round->logits[j], expected, kTolerance);
    }
    EXPECT_EQ(round->tokens[0], want[0]) << "prompt " << i;
  }
}

}  // namespace
}  // namespace mx::gpu_test
