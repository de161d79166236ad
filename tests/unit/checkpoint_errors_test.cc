// Corrupt checkpoints and configs: each gives one clear error naming the problem (through the library and
// through `mxserve generate`, which exits 1 with a single "error:" line), never a crash or a hang.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/model_registry.h"
#include "test_util.h"

namespace mx {
namespace {

using test::TempDir;

// A model directory copied from a small fixture, to be damaged by each test.
class BrokenModel : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
      test::copy_file(test::fixture(source()) + "/" + f, dir_.file(f));
  }
  virtual std::string source() const { return "tiny-gpt-oss-b"; }

  std::string weights() const { return dir_.file("model.safetensors"); }

  // Loads through the library and through the CLI; both must fail with `expected` in the message.
  void expect_load_error(const std::string& expected) {
    auto backend = make_cpu_backend(CpuBackendOptions{1});
    auto model = load_model(dir_.path(), *backend);
    ASSERT_FALSE(model.is_ok());
    EXPECT_NE(model.status().message().find(expected), std::string::npos) << model.status().message();

    const auto r = test::run_mxserve("generate --model " + dir_.path() + " --prompt-ids 1,2 --max-new-tokens 1");
    EXPECT_EQ(r.exit_code, 1) << r.stderr_text;
    EXPECT_EQ(r.stderr_text.rfind("error: ", 0), 0u) << r.stderr_text;
    EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
    EXPECT_NE(r.stderr_text.find(expected), std::string::npos) << r.stderr_text;
    EXPECT_TRUE(r.stdout_text.empty());
  }

  // Rewrites model.safetensors from the fixture's tensors after `edit` changes the list.
  template <typename Edit>
  void rewrite_tensors(Edit edit) {
    auto ckpt = Checkpoint::open_file(test::fixture(source()) + "/model.safetensors");
    ASSERT_TRUE(ckpt.is_ok());
    std::vector<NamedTensor> tensors;
    for (const auto& name : ckpt->names()) tensors.push_back({name, *ckpt->get(name)});
    std::vector<std::vector<uint8_t>> storage;
    edit(tensors, storage);
    ASSERT_TRUE(write_safetensors(weights(), tensors).is_ok());
  }

  // Replaces the first occurrence of `from` in the safetensors header with `to` (same length).
  void patch_header(const std::string& from, const std::string& to) {
    ASSERT_EQ(from.size(), to.size());
    std::string bytes = test::read_file(weights());
    const auto pos = bytes.find(from);
    ASSERT_NE(pos, std::string::npos);
    bytes.replace(pos, from.size(), to);
    test::write_file(weights(), bytes);
  }

  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    auto config = nlohmann::json::parse(test::read_file(dir_.file("config.json")));
    edit(config);
    test::write_file(dir_.file("config.json"), config.dump(2));
  }

  TempDir dir_;
};

TEST_F(BrokenModel, TruncatedData) {
  std::string bytes = test::read_file(weights());
  test::write_file(weights(), bytes.substr(0, bytes.size() / 2));
  expect_load_error("run past the end of the data");
}

TEST_F(BrokenModel, TruncatedBeforeHeader) {
  test::write_file(weights(), "abc");
  expect_load_error("file is truncated");
}

TEST_F(BrokenModel, HeaderLengthPastEnd) {
  std::string bytes = test::read_file(weights());
  const uint64_t huge = 1ull << 40;
  std::memcpy(bytes.data(), &huge, 8);
  test::write_file(weights(), bytes);
  expect_load_error("header length 1099511627776 runs past the end of the file");
}

TEST_F(BrokenModel, InvalidHeaderJson) {
  std::string bytes = test::read_file(weights());
  bytes[8] = '[';  // the header's opening brace
  bytes[9] = '}';
  test::write_file(weights(), bytes);
  expect_load_error("header is not valid JSON");
}

TEST_F(BrokenModel, UnknownDtype) {
  patch_header("\"BF16\"", "\"BX16\"");
  expect_load_error("unknown dtype 'BX16'");
}

TEST_F(BrokenModel, ShapeDisagreesWithByteRange) {
  patch_header("\"shape\":[6]", "\"shape\":[7]");  // the sinks
  expect_load_error("needs 14 bytes but data_offsets cover 12");
}

TEST_F(BrokenModel, OverlappingRanges) {
  // Two tensors whose ranges overlap: written by hand.
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  std::string bytes(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes += header + std::string(12, '\0');
  test::write_file(weights(), bytes);
  expect_load_error("tensors 'a' and 'b' have overlapping byte ranges");
}

TEST_F(BrokenModel, MissingTensor) {
  rewrite_tensors([](std::vector<NamedTensor>& t, auto&) {
    std::erase_if(t, [](const NamedTensor& x) { return x.name == "model.layers.1.self_attn.sinks"; });
  });
  expect_load_error("tensor 'model.layers.1.self_attn.sinks' is missing");
}

TEST_F(BrokenModel, UnexpectedTensor) {
  rewrite_tensors([](std::vector<NamedTensor>& t, auto& storage) {
    storage.emplace_back(8, 0);
    t.push_back({"model.layers.0.mlp.shared_expert.weight", TensorView(storage.back().data(), DType::kF32, {2})});
  });
  expect_load_error("unexpected tensor 'model.layers.0.mlp.shared_expert.weight'");
}

TEST_F(BrokenModel, WrongShape) {
  rewrite_tensors([](std::vector<NamedTensor>& t, auto&) {
    for (auto& x : t)
      if (x.name == "model.layers.2.self_attn.sinks") x.view = x.view.reshaped({3, 2});
  });
  expect_load_error("tensor 'model.layers.2.self_attn.sinks' has shape [3, 2], expected [6]");
}

TEST_F(BrokenModel, WrongDtype) {
  rewrite_tensors([](std::vector<NamedTensor>& t, auto&) {
    for (auto& x : t)
      if (x.name == "model.norm.weight") x.view = TensorView(x.view.data(), DType::kF16, x.view.shape());
  });
  expect_load_error("tensor 'model.norm.weight' has dtype f16, expected bf16");
}

TEST_F(BrokenModel, MissingConfigField) {
  edit_config([](nlohmann::json& c) { c.erase("num_key_value_heads"); });
  expect_load_error("missing field 'num_key_value_heads'");
}

TEST_F(BrokenModel, MistypedConfigField) {
  edit_config([](nlohmann::json& c) { c["hidden_size"] = "320"; });
  expect_load_error("field 'hidden_size' must be an integer");
}

TEST_F(BrokenModel, ConfigNotJson) {
  test::write_file(dir_.file("config.json"), "{\"vocab_size\": 12,");
  expect_load_error("config.json: not valid JSON");
}

// The Gemma-4 text-only fixture (released config spelling), damaged the same ways.
class BrokenGemma : public BrokenModel {
 protected:
  std::string source() const override { return "tiny-gemma4-text"; }
};

TEST_F(BrokenGemma, MissingTensor) {
  rewrite_tensors([](std::vector<NamedTensor>& t, auto&) {
    std::erase_if(t, [](const NamedTensor& x) { return x.name == "model.layers.3.router.per_expert_scale"; });
  });
  expect_load_error("tensor 'model.layers.3.router.per_expert_scale' is missing");
}

TEST_F(BrokenGemma, VProjOnAKEqVLayerIsUnexpected) {
  rewrite_tensors([](std::vector<NamedTensor>& t, auto& storage) {
    storage.emplace_back(2 * 64 * 64 * 2, 0);
    t.push_back({"model.layers.1.self_attn.v_proj.weight", TensorView(storage.back().data(), DType::kBF16, {128, 64})});
  });
  expect_load_error("unexpected tensor 'model.layers.1.self_attn.v_proj.weight'");
}

TEST_F(BrokenGemma, WrongShape) {
  // A full layer's k_proj with the sliding layers' head dim (two heads of 32 instead of 64).
  rewrite_tensors([](std::vector<NamedTensor>& t, auto&) {
    for (auto& x : t)
      if (x.name == "model.layers.4.self_attn.k_proj.weight") x.view = x.view.reshaped({256, 32});
  });
  expect_load_error("tensor 'model.layers.4.self_attn.k_proj.weight' has shape [256, 32], expected [128, 64]");
}

TEST_F(BrokenGemma, UnknownModelType) {
  edit_config([](nlohmann::json& c) { c["model_type"] = "gemma5_text"; });
  expect_load_error("model_type 'gemma5_text' is not supported");
}

TEST_F(BrokenGemma, MissingConfigField) {
  edit_config([](nlohmann::json& c) { c.erase("sliding_window"); });
  expect_load_error("missing field 'sliding_window'");
  edit_config([](nlohmann::json& c) { c["sliding_window"] = 8, c.erase("rope_parameters"); });
  expect_load_error("missing field 'rope_parameters'");
}

TEST_F(BrokenGemma, MultimodalConfigWithoutTextConfig) {
  edit_config([](nlohmann::json& c) { c = {{"model_type", "gemma4"}, {"architectures", {"Gemma4ForConditionalGeneration"}}}; });
  expect_load_error("missing field 'text_config'");
}

TEST_F(BrokenModel, ModelDirectoryMissing) {
  const auto r = test::run_mxserve("generate --model /nonexistent/model --prompt-ids 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.stderr_text.find("/nonexistent/model"), std::string::npos) << r.stderr_text;
}

}  // namespace
}  // namespace mx
