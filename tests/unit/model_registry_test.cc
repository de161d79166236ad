// The model registry: config.json's model_type (or architectures) picks the family; unknown or missing
// names are one clear error; the gpt-oss model's KV layout groups its layers by window; synthetic presets
// built in memory load through the same registry.
#include "model/model_registry.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/synthetic_model.h"
#include "test_util.h"

namespace mx {
namespace {

std::string fixture_config() { return test::read_file(test::fixture("tiny-gpt-oss") + "/config.json"); }

TEST(ModelRegistry, PicksTheFamilyByModelTypeOrArchitectures) {
  EXPECT_EQ(*model_family(fixture_config(), "config.json"), "gpt_oss");
  auto config = nlohmann::json::parse(fixture_config());
  config.erase("model_type");
  EXPECT_EQ(*model_family(config.dump(), "config.json"), "gpt_oss");  // architectures: GptOssForCausalLM
  for (const char* gemma : {"tiny-gemma4", "tiny-gemma4-text"}) {
    auto c = nlohmann::json::parse(test::read_file(test::fixture(gemma) + "/config.json"));
    const std::string type = c["model_type"];
    EXPECT_EQ(*model_family(c.dump(), "config.json"), type);  // gemma4, gemma4_text
    c.erase("model_type");
    EXPECT_EQ(*model_family(c.dump(), "config.json"), type) << c["architectures"];
  }
}

TEST(ModelRegistry, UnknownOrMissingNamesAreOneClearError) {
  auto config = nlohmann::json::parse(fixture_config());
  config["model_type"] = "llama";
  auto unknown = model_family(config.dump(), "x/config.json");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().message(),
            "x/config.json: model_type 'llama' is not supported (supported: gpt_oss, gemma4, gemma4_text)");
  config["model_type"] = 7;
  EXPECT_NE(model_family(config.dump(), "c").status().message().find("'model_type' must be a string"), std::string::npos);
  config.erase("model_type");
  config["architectures"] = {"LlamaForCausalLM"};
  EXPECT_NE(model_family(config.dump(), "c").status().message().find("are not supported"), std::string::npos);
  config.erase("architectures");
  EXPECT_EQ(model_family(config.dump(), "c").status().message(),
            "c: missing field 'model_type' (supported: gpt_oss, gemma4, gemma4_text)");
  EXPECT_NE(model_family("[1]", "c").status().message().find("not a JSON object"), std::string::npos);
}

TEST(ModelRegistry, UnknownModelTypeFailsTheCliWithOneLine) {
  test::TempDir dir;
  for (const char* f : {"generation_config.json", "model.safetensors"})
    test::copy_file(test::fixture("tiny-gpt-oss") + "/" + f, dir.file(f));
  auto config = nlohmann::json::parse(fixture_config());
  config["model_type"] = "mamba";
  test::write_file(dir.file("config.json"), config.dump());
  const auto r = test::run_mxserve("generate --model " + dir.path() + " --prompt-ids 1,2 --max-new-tokens 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("model_type 'mamba' is not supported"), std::string::npos) << r.stderr_text;
}

TEST(ModelRegistry, GptOssKvLayoutGroupsSlidingAndFullLayers) {
  auto backend = make_cpu_backend(CpuBackendOptions{1});
  auto model = load_model(test::fixture("tiny-gpt-oss"), *backend);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const Model& m = **model;
  EXPECT_EQ(m.family(), "gpt_oss");
  const KvLayout& kv = m.kv_layout();
  ASSERT_EQ(kv.num_layers(), m.dims().num_layers);
  ASSERT_EQ(kv.num_groups(), 2);  // even layers slide, odd layers attend fully
  for (int64_t l = 0; l < kv.num_layers(); ++l) {
    const KvLayerSpec& s = kv.layers[static_cast<size_t>(l)];
    EXPECT_EQ(kv.layer_group[static_cast<size_t>(l)], l % 2);
    EXPECT_EQ(s.window > 0, l % 2 == 0);
    EXPECT_FALSE(s.shared_kv);
    EXPECT_EQ(kv.groups[static_cast<size_t>(l % 2)], s);
  }
  EXPECT_EQ(kv.bytes_per_token(DType::kF32),
            kv.group_bytes_per_token(0, DType::kF32) + kv.group_bytes_per_token(1, DType::kF32));
}

TEST(KvLayout, GroupsByGeometryWindowAndSharing) {
  // Gemma-4's shape: five sliding layers (8 KV heads x 256, window 1024) to one full layer (2 x 512, K = V).
  std::vector<KvLayerSpec> layers;
  for (int l = 0; l < 12; ++l) layers.push_back(l % 6 == 5 ? KvLayerSpec{2, 512, 0, true} : KvLayerSpec{8, 256, 1024, false});
  const KvLayout kv = KvLayout::from_layers(layers);
  ASSERT_EQ(kv.num_groups(), 2);
  EXPECT_EQ(kv.group_num_layers(0), 10);
  EXPECT_EQ(kv.group_num_layers(1), 2);
  EXPECT_EQ(kv.group_bytes_per_token(0, DType::kBF16), 10 * 2 * 8 * 256 * 2);
  EXPECT_EQ(kv.group_bytes_per_token(1, DType::kBF16), 2 * 1 * 2 * 512 * 2);  // K only: V is K

  auto backend = make_cpu_backend(CpuBackendOptions{1});
  KvCacheShape shape{kv, 4, {3, 5}};
  auto cache = KvCache::allocate(*backend, shape);
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  EXPECT_EQ(cache->layer(0).k.dim(0), 3);
  EXPECT_EQ(cache->layer(5).k.dim(0), 5);
  EXPECT_EQ(cache->layer(5).group, 1);
  EXPECT_EQ(cache->layer(5).v.data(), cache->layer(5).k.data());
  EXPECT_NE(cache->layer(0).v.data(), cache->layer(0).k.data());
  EXPECT_EQ(shape.bytes(DType::kF32), 4 * (3 * kv.group_bytes_per_token(0, DType::kF32) + 5 * kv.group_bytes_per_token(1, DType::kF32)));
}

TEST(SyntheticModel, InMemoryPresetLoadsThroughTheRegistry) {
  SyntheticOptions options;
  options.threads = 1;
  auto synthetic = synthetic_checkpoint_in_memory("tiny", options);
  ASSERT_TRUE(synthetic.is_ok()) << synthetic.status().to_string();
  auto backend = make_cpu_backend(CpuBackendOptions{1});
  auto model = model_from_checkpoint(synthetic->config_json, "preset tiny", synthetic->generation_config,
                                     std::move(synthetic->checkpoint), *backend);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_EQ((*model)->dims().vocab_size, 1024);
  EXPECT_GT((*model)->cost().prefill_flops(16, 1), 0);
  EXPECT_FALSE(synthetic_checkpoint_in_memory("nosuch", options).is_ok());
  EXPECT_NE(synthetic_preset_list().find(" or "), std::string::npos);
}

}  // namespace
}  // namespace mx
