// config.json in both RoPE spellings, defaults, validation; generation_config.json; YaRN frequencies.
#include "io/generation_config.h"
#include "model/gpt_oss/gpt_oss_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include <nlohmann/json.hpp>

#include "model/rope.h"
#include "test_util.h"

namespace mx {
namespace {

// The released gpt-oss-20b config.json (ref-gpt-oss-model.md 2.1), minus layer_types.
const char* kReleased20b = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
  "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
  "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
  "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
  "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                          "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                   "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
  "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0", "use_cache": true, "vocab_size": 201088
})";

TEST(GptOssConfig, ReleasedSpelling) {
  auto c = parse_gpt_oss_config(kReleased20b, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->num_layers, 24);
  EXPECT_EQ(c->num_experts, 32);
  EXPECT_EQ(c->experts_per_token, 4);
  EXPECT_EQ(c->q_dim(), 4096);
  EXPECT_EQ(c->kv_dim(), 512);
  EXPECT_EQ(c->rope.theta, 150000.0);
  EXPECT_EQ(c->rope.factor, 32.0);
  EXPECT_EQ(c->rope.original_max_position, 4096);
  EXPECT_FALSE(c->rope.truncate);
  ASSERT_EQ(c->layer_is_sliding.size(), 24u);
  EXPECT_TRUE(c->layer_is_sliding[0]);   // even layers slide when layer_types is absent
  EXPECT_FALSE(c->layer_is_sliding[1]);
  EXPECT_TRUE(c->experts_mxfp4);
}

TEST(GptOssConfig, RopeParametersSpellingFromFixture) {
  auto text = test::read_file(test::fixture("tiny-gpt-oss") + "/config.json");
  auto c = parse_gpt_oss_config(text, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->rope.theta, 150000.0);
  EXPECT_EQ(c->rope.factor, 32.0);
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_EQ(c->swiglu_limit, 7.0);   // absent from the file: the default
  EXPECT_EQ(c->swiglu_alpha, 1.702);
  EXPECT_EQ(c->vocab_size, 1024);
}

TEST(GptOssConfig, SecondFixtureUsesReleasedSpellingWithOtherValues) {
  auto text = test::read_file(test::fixture("tiny-gpt-oss-b") + "/config.json");
  auto c = parse_gpt_oss_config(text, "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->rope.theta, 10000.0);
  EXPECT_EQ(c->rope.factor, 16.0);
  EXPECT_EQ(c->rope.original_max_position, 2048);
  EXPECT_EQ(c->swiglu_limit, 5.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->layer_is_sliding, (std::vector<bool>{true, false, true}));
}

TEST(GptOssConfig, ValidationErrors) {
  const std::pair<std::function<void(nlohmann::json&)>, std::string> cases[] = {
      {[](auto& c) { c["num_key_value_heads"] = 7; }, "must be a multiple of num_key_value_heads"},
      {[](auto& c) { c["head_dim"] = 63; }, "head_dim must be even"},
      {[](auto& c) { c["num_experts_per_tok"] = 33; }, "exceeds num_local_experts"},
      {[](auto& c) { c["hidden_size"] = 2881; }, "multiples of 32"},
      {[](auto& c) { c["layer_types"] = {"sliding_attention"}; }, "layer_types must be an array of num_hidden_layers"},
      {[](auto& c) { c["rope_scaling"]["rope_type"] = "longrope"; }, "rope_type 'longrope' is not supported"},
      {[](auto& c) { c.erase("quantization_config"); }, "only MXFP4 expert checkpoints"},
      {[](auto& c) { c["vocab_size"] = -5; }, "field 'vocab_size' is -5, must be >= 1"},
      {[](auto& c) { c["rms_norm_eps"] = "tiny"; }, "field 'rms_norm_eps' must be a number"},
      {[](auto& c) { c.erase("sliding_window"); }, "missing field 'sliding_window'"},
  };
  for (const auto& [edit, expected] : cases) {
    auto json = nlohmann::json::parse(kReleased20b);
    edit(json);
    auto c = parse_gpt_oss_config(json.dump(), "config.json");
    ASSERT_FALSE(c.is_ok()) << expected;
    EXPECT_NE(c.status().message().find(expected), std::string::npos) << c.status().message();
  }
}

TEST(GptOssConfig, GenerationConfig) {
  auto g = parse_generation_config(R"({"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012]})", "g");
  ASSERT_TRUE(g.is_ok());
  EXPECT_EQ(g->eos_token_ids, (std::vector<int64_t>{200002, 199999, 200012}));
  auto single = parse_generation_config(R"({"eos_token_id": 200002})", "g");
  ASSERT_TRUE(single.is_ok());
  EXPECT_EQ(single->eos_token_ids, (std::vector<int64_t>{200002}));
  EXPECT_FALSE(parse_generation_config(R"({"eos_token_id": "x"})", "g").is_ok());
}

TEST(YarnRope, MatchesTheReferenceConstants) {
  auto c = parse_gpt_oss_config(kReleased20b, "config.json");
  ASSERT_TRUE(c.is_ok());
  const RopeTables t = compute_yarn_rope(c->rope, c->head_dim);
  ASSERT_EQ(t.inv_freq.size(), 32u);
  EXPECT_NEAR(t.correction_low, 8.092779115512402, 1e-12);
  EXPECT_NEAR(t.correction_high, 17.39802450158856, 1e-12);
  EXPECT_NEAR(t.attention_scale, 1.3465735902799727, 1e-7);
  EXPECT_FLOAT_EQ(t.inv_freq[0], 1.0f);
  EXPECT_NEAR(t.inv_freq[1], 0.6890443, 1e-7);
  EXPECT_NEAR(t.inv_freq[30], 4.387978e-07, 1e-12);
  EXPECT_NEAR(t.inv_freq[31], 3.023511e-07, 1e-12);
  // Dimensions at or below `low` keep the original frequency; at or above `high` it is divided by 32.
  EXPECT_FLOAT_EQ(t.inv_freq[8], static_cast<float>(1.0 / std::pow(150000.0, 16.0 / 64)));
  EXPECT_FLOAT_EQ(t.inv_freq[18], static_cast<float>(1.0 / (32 * std::pow(150000.0, 36.0 / 64))));
}

}  // namespace
}  // namespace mx
