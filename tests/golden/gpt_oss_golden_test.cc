// The CPU backend against Hugging Face transformers (float32, eager) on the tiny gpt-oss fixtures:
// logits and every hidden state within rel-L2 1e-4, greedy tokens identical, decoded incrementally with
// the KV cache. All prompts of a fixture are prefilled together in one batch.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "io/safetensors.h"
#include "model/gpt_oss.h"
#include "runtime/batch_staging.h"
#include "runtime/static_generator.h"

namespace mx {
namespace {

double rel_l2(const float* got, const float* want, int64_t n) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

std::vector<int32_t> as_ids(const TensorView& t) {
  return std::vector<int32_t>(t.ptr<const int32_t>(), t.ptr<const int32_t>() + t.numel());
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = std::string(MX_FIXTURES_DIR) + "/" + GetParam();
    backend_ = make_cpu_backend();
    auto model = GptOssModel::load(dir_, *backend_);
    ASSERT_TRUE(model.is_ok()) << model.status().to_string();
    model_ = std::move(*model);
    auto ref = Checkpoint::open_file(dir_ + "/reference.safetensors");
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    ref_ = std::make_unique<Checkpoint>(std::move(*ref));
    for (int i = 0; ref_->has("prompt_" + std::to_string(i) + "_ids"); ++i)
      prompts_.push_back(as_ids(*ref_->get("prompt_" + std::to_string(i) + "_ids")));
    ASSERT_FALSE(prompts_.empty());
  }

  TensorView ref(const std::string& name) {
    auto t = ref_->get(name);
    EXPECT_TRUE(t.is_ok()) << name;
    return *t;
  }

  std::string dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<GptOssModel> model_;
  std::unique_ptr<Checkpoint> ref_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_P(GoldenTest, BatchedPrefillMatchesLogitsAndHiddenStates) {
  const GptOssConfig& c = model_->config();
  const int64_t page_size = 16;
  int64_t total = 0, max_pages = 0;
  for (const auto& p : prompts_) {
    total += static_cast<int64_t>(p.size());
    max_pages = std::max<int64_t>(max_pages, (static_cast<int64_t>(p.size()) + page_size - 1) / page_size);
  }
  const auto n = static_cast<int64_t>(prompts_.size());
  auto kv = KvCache::allocate(*backend_, model_->kv_cache_shape(n * max_pages, page_size));
  ASSERT_TRUE(kv.is_ok());
  // Pages handed out in reverse so that logical and physical page numbers differ.
  std::vector<std::vector<int32_t>> pages(prompts_.size());
  int32_t next_page = static_cast<int32_t>(n * max_pages) - 1;
  std::vector<BatchSequence> seqs;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    for (int64_t j = 0; j < max_pages; ++j) pages[i].push_back(next_page--);
    seqs.push_back({prompts_[i], 0, pages[i], /*all_logits=*/true, false});
  }
  auto staging = BatchStaging::create(*backend_, {total, n, max_pages, total});
  ASSERT_TRUE(staging.is_ok());
  auto batch = staging->stage(seqs);
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  auto ws = model_->make_workspace(total, total);
  ASSERT_TRUE(ws.is_ok());
  std::vector<float> logits(static_cast<size_t>(total * c.vocab_size));
  std::map<int64_t, std::vector<float>> hidden;
  HiddenObserver observer = [&](int64_t index, const TensorView& h) {
    hidden[index].assign(h.ptr<const float>(), h.ptr<const float>() + h.numel());
  };
  ASSERT_TRUE(model_->forward(*batch, *kv, *ws, TensorView(logits.data(), DType::kF32, {total, c.vocab_size}), &observer)
                  .is_ok());
  ASSERT_EQ(static_cast<int64_t>(hidden.size()), c.num_layers + 1);

  int64_t row = 0;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const auto len = static_cast<int64_t>(prompts_[i].size());
    const std::string p = "prompt_" + std::to_string(i);
    const TensorView want = ref(p + "_logits");
    ASSERT_EQ(want.numel(), len * c.vocab_size);
    const double err = rel_l2(logits.data() + row * c.vocab_size, want.ptr<const float>(), want.numel());
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
  std::vector<GenerateRequest> requests;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    GenerateRequest r;
    r.prompt = prompts_[i];
    r.max_new_tokens = ref("prompt_" + std::to_string(i) + "_greedy").numel();
    requests.push_back(r);
  }
  // A small page size makes decoding cross many page boundaries.
  auto results = generate_static(*model_, requests, StaticGeneratorOptions{4, {}});
  ASSERT_TRUE(results.is_ok()) << results.status().to_string();
  for (size_t i = 0; i < prompts_.size(); ++i) {
    EXPECT_EQ((*results)[i].output_ids, as_ids(ref("prompt_" + std::to_string(i) + "_greedy"))) << "prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::Values("tiny-gpt-oss", "tiny-gpt-oss-b"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (auto& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace mx
