// The `mxserve generate` contract other checks rely on: one JSON line per prompt, --prompt-ids-file,
// --logits-out tensors named like the fixtures, and one-line errors for bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "io/safetensors.h"
#include "test_util.h"

namespace mx {
namespace {

using test::TempDir;

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(GenerateCli, PromptFileAndLogitsOut) {
  TempDir dir;
  test::write_file(dir.file("prompts.jsonl"), "[1, 2, 3]\n\n[5]\n[7, 8]\n");
  const std::string model = test::fixture("tiny-gpt-oss");
  const auto r = test::run_mxserve("generate --model " + model + " --backend cpu --prompt-ids-file " +
                                   dir.file("prompts.jsonl") + " --max-new-tokens 5 --temperature 0 --logits-out " +
                                   dir.file("logits.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const auto lines = json_lines(r.stdout_text);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(r.stdout_text.rfind("{\"prompt_index\":0,\"output_ids\":[", 0), 0u) << r.stdout_text;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[i]["prompt_index"], i);
    EXPECT_EQ(lines[i]["output_ids"].size(), 5u);
  }
  auto logits = Checkpoint::open_file(dir.file("logits.safetensors"));
  ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
  EXPECT_EQ(logits->get("prompt_0_logits")->shape(), (Shape{3, 1024}));
  EXPECT_EQ(logits->get("prompt_1_logits")->shape(), (Shape{1, 1024}));
  EXPECT_EQ(logits->get("prompt_2_logits")->shape(), (Shape{2, 1024}));

  // The same prompt alone gives the same tokens as inside the batch.
  const auto alone = test::run_mxserve("generate --model " + model + " --prompt-ids 7,8 --max-new-tokens 5");
  ASSERT_EQ(alone.exit_code, 0) << alone.stderr_text;
  EXPECT_EQ(json_lines(alone.stdout_text)[0]["output_ids"], lines[2]["output_ids"]);
}

TEST(GenerateCli, SeededSamplingReproduces) {
  const std::string args = "generate --model " + test::fixture("tiny-gpt-oss-b") +
                           " --prompt-ids 3,4,5 --max-new-tokens 12 --temperature 1.0 --top-p 0.9 --seed ";
  const auto a = test::run_mxserve(args + "11"), b = test::run_mxserve(args + "11"), c = test::run_mxserve(args + "12");
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  EXPECT_EQ(a.stdout_text, b.stdout_text);
  EXPECT_NE(a.stdout_text, c.stdout_text);
}

TEST(GenerateCli, BadInputIsOneLineError) {
  TempDir dir;
  test::write_file(dir.file("bad.jsonl"), "[1, 2]\n[1, \"x\"]\n");
  test::write_file(dir.file("notjson.jsonl"), "[1, 2\n");
  const std::string model = " --model " + test::fixture("tiny-gpt-oss");
  const std::pair<std::string, std::string> cases[] = {
      {"generate" + model + " --prompt-ids 1,x", "'x' is not an integer"},
      {"generate" + model + " --prompt-ids 1,5000", "token id 5000 is outside the vocabulary [0, 1024)"},
      {"generate" + model + " --prompt-ids-file " + dir.file("bad.jsonl"), "bad.jsonl:2: token ids must be integers"},
      {"generate" + model + " --prompt-ids-file " + dir.file("notjson.jsonl"), "notjson.jsonl:1: not valid JSON"},
      {"generate" + model + " --prompt-ids 1 --max-new-tokens 200000", "exceed the context length 131072"},
      {"generate" + model + " --prompt-ids 1 --temperature -1", "--temperature must be >= 0"},
      {"generate" + model + " --prompt-ids 1 --backend tpu", "unknown backend 'tpu'"},
      {"generate" + model, "give exactly one of --prompt-ids or --prompt-ids-file"},
  };
  for (const auto& [args, expected] : cases) {
    const auto r = test::run_mxserve(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_EQ(r.stderr_text.rfind("error: ", 0), 0u) << r.stderr_text;
    EXPECT_NE(r.stderr_text.find(expected), std::string::npos) << args << " -> " << r.stderr_text;
  }
  const auto unknown = test::run_mxserve("generate --nope");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.stderr_text.find("unknown option --nope"), std::string::npos);
}

}  // namespace
}  // namespace mx
