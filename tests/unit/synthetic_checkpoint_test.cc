// Synthetic checkpoints: the real presets have the released byte totals, a written checkpoint loads through
// the normal path (sharded via the index), is deterministic per seed and gives sane logits.
#include "model/gpt_oss/gpt_oss_synthetic.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "model/gpt_oss/gpt_oss_model.h"
#include "model/gpt_oss/gpt_oss_weights.h"
#include "model/synthetic_model.h"
#include "runtime/static_generator.h"
#include "test_util.h"

namespace mx {
namespace {

int64_t checkpoint_bytes(const GptOssConfig& c, size_t* count) {
  GptOssWeights w;
  const auto specs = gpt_oss_weight_specs(c, w);
  *count = specs.size();
  int64_t total = 0;
  for (const auto& s : specs) total += dtype_bytes(s.dtype, s.shape.numel());
  return total;
}

// The published total_size of the released model.safetensors.index.json files (ref-gpt-oss-model.md 2.2).
TEST(SyntheticCheckpoint, RealPresetsMatchTheReleasedSizes) {
  size_t count = 0;
  EXPECT_EQ(checkpoint_bytes(*gpt_oss_preset("gpt-oss-20b"), &count), 13761264768);
  EXPECT_EQ(count, 459u);
  EXPECT_EQ(checkpoint_bytes(*gpt_oss_preset("gpt-oss-120b"), &count), 65248815744);
  EXPECT_FALSE(gpt_oss_preset("gpt-oss-7b").is_ok());
}

TEST(SyntheticCheckpoint, ConfigRoundTripsThroughJson) {
  for (const auto& name : gpt_oss_preset_names()) {
    const GptOssConfig c = *gpt_oss_preset(name);
    auto back = parse_gpt_oss_config(gpt_oss_config_to_json(c), name);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    EXPECT_EQ(back->num_layers, c.num_layers);
    EXPECT_EQ(back->num_experts, c.num_experts);
    EXPECT_EQ(back->head_dim, c.head_dim);
    EXPECT_EQ(back->layer_is_sliding, c.layer_is_sliding);
    EXPECT_EQ(back->rope.factor, c.rope.factor);
    EXPECT_EQ(back->vocab_size, c.vocab_size);
  }
}

TEST(SyntheticCheckpoint, WritesShardsThatLoadAndGenerateDeterministically) {
  test::TempDir a, b, c;
  const GptOssConfig config = *gpt_oss_preset("tiny");
  SyntheticOptions options;
  options.seed = 5;
  options.threads = 2;
  options.max_shard_bytes = 100000;  // forces several shards
  ASSERT_TRUE(write_gpt_oss_checkpoint(config, a.path(), options).is_ok());
  ASSERT_TRUE(write_gpt_oss_checkpoint(config, b.path(), options).is_ok());
  options.seed = 6;
  ASSERT_TRUE(write_gpt_oss_checkpoint(config, c.path(), options).is_ok());

  const auto index = nlohmann::json::parse(test::read_file(a.file("model.safetensors.index.json")));
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) shards.insert(shard.get<std::string>());
  EXPECT_GT(shards.size(), 2u);
  for (const auto& shard : shards) {
    EXPECT_EQ(test::read_file(a.file(shard)), test::read_file(b.file(shard))) << shard;
    EXPECT_NE(test::read_file(a.file(shard)), test::read_file(c.file(shard))) << shard;
  }
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  auto model = GptOssModel::load(a.path(), *backend);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_EQ((*model)->generation_config().eos_token_ids, (std::vector<int64_t>{200002, 199999, 200012}));

  GenerateRequest r;
  r.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  r.max_new_tokens = 4;
  r.want_prompt_logits = true;
  auto results = generate_static(**model, {r}, StaticGeneratorOptions{});
  ASSERT_TRUE(results.is_ok()) << results.status().to_string();
  const auto& logits = (*results)[0].prompt_logits;
  double sum = 0, sum_sq = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(logits.size());
  const double stddev = std::sqrt(sum_sq / n - (sum / n) * (sum / n));
  EXPECT_GT(stddev, 0.1);  // decisive enough to matter, small enough to stay sane
  EXPECT_LT(stddev, 10.0);
}

// The in-memory checkpoint is made in place by all threads over one flat range of every tensor; its tensors
// must be the written checkpoint's byte for byte whatever the thread count (chunks cross tensor boundaries).
TEST(SyntheticCheckpoint, InMemoryTensorsMatchTheWrittenOnes) {
  test::TempDir dir;
  SyntheticOptions options;
  options.seed = 9;
  options.threads = 1;
  ASSERT_TRUE(write_synthetic_model("tiny", dir.path(), options).is_ok());
  auto written = Checkpoint::open_dir(dir.path());
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  for (int threads : {1, 3}) {
    options.threads = threads;
    auto memory = synthetic_checkpoint_in_memory("tiny", options);
    ASSERT_TRUE(memory.is_ok()) << memory.status().to_string();
    EXPECT_EQ(memory->checkpoint.names(), written->names());
    for (const std::string& name : written->names()) {
      const TensorView a = *written->get(name), b = *memory->checkpoint.get(name);
      ASSERT_EQ(a.bytes(), b.bytes()) << name;
      EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())), 0) << name << ", " << threads << " threads";
    }
  }
}

// The synthesis's bytes pinned: FNV-1a over every tensor of two presets (bf16 normals, random bytes, constant
// bytes), as the one-hash-an-element loops made them (session 20). A faster synthesis must keep these bits:
// benchmarks and fixtures made from presets compare across versions.
TEST(SyntheticCheckpoint, BytesArePinned) {
  const std::pair<const char*, uint64_t> pinned[] = {{"tiny", 0xb840efe8eec076cdull}, {"gemma-demo", 0x5746b9fe5884fe67ull}};
  for (const auto& [preset, digest] : pinned) {
    SyntheticOptions options;
    options.seed = 11;
    options.threads = 3;
    auto memory = synthetic_checkpoint_in_memory(preset, options);
    ASSERT_TRUE(memory.is_ok()) << memory.status().to_string();
    uint64_t h = 0xcbf29ce484222325ull;
    for (const std::string& name : memory->checkpoint.names()) {
      const TensorView t = *memory->checkpoint.get(name);
      const auto* bytes = static_cast<const uint8_t*>(t.data());
      for (int64_t i = 0; i < t.bytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
    }
    EXPECT_EQ(h, digest) << preset << ": 0x" << std::hex << h;
  }
}

TEST(SyntheticCheckpoint, CliErrors) {
  const auto r = test::run_mxserve("make-model --preset gpt-oss-7b --out /tmp/never");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.stderr_text.find("unknown preset 'gpt-oss-7b'"), std::string::npos) << r.stderr_text;
}

}  // namespace
}  // namespace mx
