// Synthetic Gemma-4 checkpoints: the 26B-A4B preset has the released tensor list and sizes (text model exact
// per ref-gemma4-mtp-spec.md 1.2/1.7, 25.2 B parameters as the model card says; a ~550 M vision tower beside
// it); its config.json round-trips through the parser; `make-model --preset gemma-demo` writes a sharded
// checkpoint with its tokenizer that loads, generates and tokenizes; presets also build in memory.
#include "model/gemma4/gemma4_synthetic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "model/model_registry.h"
#include "model/synthetic_writer.h"
#include "runtime/static_generator.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace mx {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

TEST(Gemma4Synthetic, ReleasedPresetHasTheReleasedTensorsAndSizes) {
  const Gemma4Preset p = *gemma4_preset("gemma-4-26b-a4b");
  const auto specs = gemma4_checkpoint_specs(p);
  int64_t text_params = 0, vision_params = 0, text_tensors = 0;
  std::set<std::string> names;
  for (const auto& s : specs) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_EQ(s.dtype, DType::kBF16) << s.name;
    if (starts_with(s.name, "model.language_model.")) {
      text_params += s.shape.numel();
      ++text_tensors;
    } else {
      EXPECT_TRUE(starts_with(s.name, "model.vision_tower.") || starts_with(s.name, "model.embed_vision.")) << s.name;
      vision_params += s.shape.numel();
    }
  }
  // 25 sliding layers of 22 tensors (with v_proj), 5 full layers of 21 (K = V), the embedding and final norm.
  EXPECT_EQ(text_tensors, 25 * 22 + 5 * 21 + 2);
  EXPECT_NEAR(static_cast<double>(text_params), 25.2e9, 0.05e9);  // 25.2 B total (model card)
  EXPECT_NEAR(static_cast<double>(vision_params), 0.55e9, 0.03e9);
  EXPECT_EQ(synthetic_total_bytes(specs), 2 * (text_params + vision_params));
  std::printf("[synthetic] gemma-4-26b-a4b: %zu tensors, text %lld + vision %lld parameters, %lld bytes\n",
              specs.size(), static_cast<long long>(text_params), static_cast<long long>(vision_params),
              static_cast<long long>(synthetic_total_bytes(specs)));
  // Spot checks against the released names and shapes.
  auto shape_of = [&](const std::string& name) {
    for (const auto& s : specs)
      if (s.name == name) return s.shape.to_string();
    return std::string("absent");
  };
  EXPECT_EQ(shape_of("model.language_model.embed_tokens.weight"), "[262144, 2816]");
  EXPECT_EQ(shape_of("model.language_model.layers.0.self_attn.q_proj.weight"), "[4096, 2816]");
  EXPECT_EQ(shape_of("model.language_model.layers.5.self_attn.q_proj.weight"), "[8192, 2816]");
  EXPECT_EQ(shape_of("model.language_model.layers.5.self_attn.k_proj.weight"), "[1024, 2816]");
  EXPECT_EQ(shape_of("model.language_model.layers.5.self_attn.v_proj.weight"), "absent");
  EXPECT_EQ(shape_of("model.language_model.layers.29.experts.gate_up_proj"), "[128, 1408, 2816]");
  EXPECT_EQ(shape_of("model.language_model.layers.29.experts.down_proj"), "[128, 2816, 704]");
  EXPECT_EQ(shape_of("model.language_model.layers.29.router.per_expert_scale"), "[128]");
  EXPECT_EQ(shape_of("model.embed_vision.embedding_projection.weight"), "[2816, 1152]");
}

TEST(Gemma4Synthetic, ConfigRoundTripsThroughTheParser) {
  for (const auto& name : gemma4_preset_names()) {
    const Gemma4Preset p = *gemma4_preset(name);
    const std::string text = gemma4_config_to_json(p);
    EXPECT_EQ(*model_family(text, name), "gemma4");
    auto back = parse_gemma4_config(text, name);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_TRUE(back->multimodal);
    EXPECT_EQ(back->layer_is_sliding, p.text.layer_is_sliding);
    EXPECT_EQ(back->layer_head_dim, p.text.layer_head_dim);
    EXPECT_EQ(back->layer_kv_heads, p.text.layer_kv_heads);
    EXPECT_EQ(back->num_experts, p.text.num_experts);
    EXPECT_EQ(back->experts_per_token, p.text.experts_per_token);
    EXPECT_EQ(back->full_rope.partial_rotary_factor, p.text.full_rope.partial_rotary_factor);
    EXPECT_EQ(back->sliding_window, p.text.sliding_window);
    // The released spelling: no per_layer_config.
    EXPECT_FALSE(nlohmann::json::parse(text)["text_config"].contains("per_layer_config"));
  }
  const Gemma4Config big = gemma4_preset("gemma-4-26b-a4b")->text;
  EXPECT_EQ(std::count(big.layer_is_sliding.begin(), big.layer_is_sliding.end(), false), 5);
  EXPECT_FALSE(big.layer_is_sliding[5]);
  EXPECT_FALSE(big.layer_is_sliding[29]);
  EXPECT_FALSE(gemma4_preset("gemma-4-31b").is_ok());
}

TEST(Gemma4Synthetic, DemoFromTheCliLoadsGeneratesAndTokenizes) {
  test::TempDir dir;
  const std::string out = dir.file("gemma-demo");
  const auto r = test::run_mxserve("make-model --preset gemma-demo --out " + out + " --max-shard-mb 8 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const auto index = nlohmann::json::parse(test::read_file(out + "/model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) shards.insert(shard.get<std::string>());
  EXPECT_EQ(shards.size(), 2u);  // the 33.5 MB embedding alone, then the rest
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;

  auto backend = make_cpu_backend(CpuBackendOptions{2});
  auto model = load_model(out, *backend);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_EQ((*model)->family(), "gemma4");
  EXPECT_EQ((*model)->dims().vocab_size, 262144);
  EXPECT_EQ((*model)->generation_config().eos_token_ids, (std::vector<int64_t>{1, 106}));

  auto tokenizer = Tokenizer::load(out);
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().to_string();
  const Tokenizer& tok = **tokenizer;
  EXPECT_EQ(tok.bos_id(), 2);
  EXPECT_EQ(tok.special_id("<|turn>"), 105);
  EXPECT_EQ(tok.special_id("<turn|>"), 106);
  EXPECT_EQ(tok.special_id("<|channel>"), 100);
  EXPECT_TRUE(tok.special_id("<|think|>").has_value());
  EXPECT_TRUE(tok.special_id("<|tool_call>").has_value());
  const std::string text = "Hello, wörld! <|turn>user";
  const auto ids = tok.encode(text, SpecialTokens::kAllow);
  EXPECT_EQ(*tok.decode(ids), text);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 105), ids.end());

  GenerateRequest request;
  request.prompt = tok.encode("<|turn>user\nHi<turn|>\n<|turn>model\n", SpecialTokens::kAllow);
  request.prompt.insert(request.prompt.begin(), 2);
  request.max_new_tokens = 4;
  request.want_prompt_logits = true;
  auto results = generate_static(**model, {request}, StaticGeneratorOptions{});
  ASSERT_TRUE(results.is_ok()) << results.status().to_string();
  ASSERT_EQ((*results)[0].output_ids.size(), 4u);
  for (int32_t id : (*results)[0].output_ids) EXPECT_TRUE(tok.decode(std::vector<int32_t>{id}).is_ok()) << id;
  double sum = 0, sum_sq = 0;
  for (float v : (*results)[0].prompt_logits) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v, sum_sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>((*results)[0].prompt_logits.size());
  const double stddev = std::sqrt(sum_sq / n - (sum / n) * (sum / n));
  EXPECT_GT(stddev, 0.1);
  EXPECT_LT(stddev, 10.0);
}

TEST(Gemma4Synthetic, InMemoryPresetLoadsThroughTheRegistry) {
  SyntheticOptions options;
  options.threads = 2;
  auto synthetic = synthetic_checkpoint_in_memory("gemma-demo", options);
  ASSERT_TRUE(synthetic.is_ok()) << synthetic.status().to_string();
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  auto model = model_from_checkpoint(synthetic->config_json, "gemma-demo", synthetic->generation_config,
                                     std::move(synthetic->checkpoint), *backend);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_EQ((*model)->kv_layout().layers.size(), 2u);
}

}  // namespace
}  // namespace mx
