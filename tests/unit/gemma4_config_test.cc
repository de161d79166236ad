// Gemma-4 config.json in both spellings (per_layer_config and the released global_head_dim), the strict
// weight table against the tiny multimodal fixture (vision tensors skipped by name, everything else
// checked), and one clear error per corrupt config or checkpoint.
#include "model/gemma4/gemma4_config.h"
#include "model/gemma4/gemma4_weights.h"

#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "test_util.h"

namespace mx {
namespace {

using nlohmann::json;

json fixture_config() { return json::parse(test::read_file(test::fixture("tiny-gemma4") + "/config.json")); }

// The fixture's config rewritten in the released spelling: global_head_dim + num_global_key_value_heads.
json released_spelling(json root) {
  json& t = root["text_config"];
  t.erase("per_layer_config");
  t["global_head_dim"] = 128;
  t["num_global_key_value_heads"] = 1;
  return root;
}

void expect_fixture_geometry(const Gemma4Config& c) {
  EXPECT_TRUE(c.multimodal);
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.layer_is_sliding, (std::vector<bool>{true, true, false, true, true, false}));
  EXPECT_EQ(c.layer_head_dim, (std::vector<int64_t>{64, 64, 128, 64, 64, 128}));
  EXPECT_EQ(c.layer_kv_heads, (std::vector<int64_t>{2, 2, 1, 2, 2, 1}));
  EXPECT_EQ(c.global_head_dim(), 128);
  EXPECT_EQ(c.global_kv_heads(), 1);
  EXPECT_TRUE(c.k_eq_v);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.experts_per_token, 2);
  EXPECT_EQ(c.moe_intermediate_size, 64);
  EXPECT_EQ(c.sliding_window, 16);
  EXPECT_EQ(c.final_logit_softcap, 30.0);
  EXPECT_EQ(c.sliding_rope.theta, 1e4);
  EXPECT_EQ(c.sliding_rope.partial_rotary_factor, 1.0);
  EXPECT_EQ(c.full_rope.theta, 1e6);
  EXPECT_EQ(c.full_rope.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.prefix(), "model.language_model.");
}

TEST(Gemma4Config, PerLayerConfigSpelling) {
  auto c = parse_gemma4_config(fixture_config().dump(), "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  expect_fixture_geometry(*c);
}

TEST(Gemma4Config, ReleasedSpelling) {
  auto c = parse_gemma4_config(released_spelling(fixture_config()).dump(), "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  expect_fixture_geometry(*c);
}

TEST(Gemma4Config, TextOnlyLayoutAndDefaultLayerPattern) {
  json text = released_spelling(fixture_config())["text_config"];
  text["architectures"] = {"Gemma4ForCausalLM"};
  text["num_hidden_layers"] = 8;
  text.erase("layer_types");
  auto c = parse_gemma4_config(text.dump(), "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_FALSE(c->multimodal);
  EXPECT_EQ(c->prefix(), "model.");
  // Every sixth layer attends fully, and the last layer always does.
  EXPECT_EQ(c->layer_is_sliding, (std::vector<bool>{true, true, true, true, true, false, true, false}));
  EXPECT_EQ(c->layer_head_dim[7], 128);
}

TEST(Gemma4Config, ValidationErrors) {
  const std::pair<std::function<void(json&)>, std::string> cases[] = {
      {[](json& t) { t.erase("hidden_size"); }, "missing field 'hidden_size'"},
      {[](json& t) { t.erase("rope_parameters"); }, "missing field 'rope_parameters'"},
      {[](json& t) { t["num_key_value_heads"] = 3; }, "must be a multiple of its KV heads"},
      {[](json& t) { t["top_k_experts"] = 9; }, "top_k_experts exceeds num_experts"},
      {[](json& t) { t["hidden_size_per_layer_input"] = 256; }, "per-layer embeddings"},
      {[](json& t) { t["num_kv_shared_layers"] = 2; }, "KV-shared layers"},
      {[](json& t) { t["hidden_activation"] = "silu"; }, "hidden_activation \"silu\" is not supported"},
      {[](json& t) { t["rope_parameters"]["full_attention"]["rope_type"] = "yarn"; }, "rope_type 'yarn'"},
      {[](json& t) { t["per_layer_config"]["9"] = json::object(); }, "layer index out of range"},
      {[](json& t) { t["per_layer_config"]["5"]["head_dim"] = 64; }, "different head dims"},
      {[](json& t) { t["layer_types"][0] = "local"; }, "layer_types[0]"},
  };
  for (const auto& [edit, message] : cases) {
    json root = fixture_config();
    edit(root["text_config"]);
    auto c = parse_gemma4_config(root.dump(), "config.json");
    ASSERT_FALSE(c.is_ok()) << message;
    EXPECT_NE(c.status().to_string().find(message), std::string::npos) << c.status().to_string();
  }
  json root = fixture_config();
  root["model_type"] = "gemma3";
  auto c = parse_gemma4_config(root.dump(), "config.json");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().to_string().find("not a Gemma-4 model"), std::string::npos);
  root.erase("text_config");
  root["model_type"] = "gemma4";
  c = parse_gemma4_config(root.dump(), "config.json");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().to_string().find("missing field 'text_config'"), std::string::npos);
}

TEST(Gemma4Weights, FixtureBindsWithVisionSkipped) {
  auto c = parse_gemma4_config(fixture_config().dump(), "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto ckpt = Checkpoint::open_dir(test::fixture("tiny-gemma4"));
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  Gemma4Weights w;
  const auto specs = gemma4_weight_specs(*c, w);
  Status s = bind_weights(*ckpt, specs, gemma4_skipped_prefixes(*c));
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(specs.size(), 2u + 4 * 22 + 2 * 21);  // embed + norm; full layers have no v_proj
  ASSERT_EQ(w.layers.size(), 6u);
  EXPECT_EQ(w.layers[2].q_weight.shape(), (Shape{512, 256}));
  EXPECT_EQ(w.layers[2].o_weight.shape(), (Shape{256, 512}));
  EXPECT_EQ(w.layers[2].v_weight.data(), nullptr);
  EXPECT_EQ(w.layers[0].v_weight.shape(), (Shape{128, 256}));
  EXPECT_EQ(w.layers[5].experts_gate_up.shape(), (Shape{8, 128, 256}));

  // Without the skip list the vision tower is an unexpected tensor: strictness is kept for everything else.
  s = bind_weights(*ckpt, specs);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("unexpected tensor 'model.embed_vision."), std::string::npos) << s.to_string();
}

TEST(Gemma4Weights, MismatchedConfigNamesTheTensor) {
  auto ckpt = Checkpoint::open_dir(test::fixture("tiny-gemma4"));
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const std::pair<std::function<void(json&)>, std::string> cases[] = {
      {[](json& t) { t["moe_intermediate_size"] = 32; }, "experts.gate_up_proj' has shape"},
      {[](json& t) { t["attention_k_eq_v"] = false; }, "layers.2.self_attn.v_proj.weight"},
      {[](json& t) {
         t["num_hidden_layers"] = 5;
         t["layer_types"].erase(5);
         t["per_layer_config"].erase("5");
       },
       "unexpected tensor 'model.language_model.layers.5."},
  };
  for (const auto& [edit, message] : cases) {
    json root = fixture_config();
    edit(root["text_config"]);
    auto c = parse_gemma4_config(root.dump(), "config.json");
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    Gemma4Weights w;
    Status s = bind_weights(*ckpt, gemma4_weight_specs(*c, w), gemma4_skipped_prefixes(*c));
    ASSERT_FALSE(s.is_ok()) << message;
    EXPECT_NE(s.to_string().find(message), std::string::npos) << s.to_string();
  }
}

}  // namespace
}  // namespace mx
